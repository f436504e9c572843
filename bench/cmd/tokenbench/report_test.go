// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The report's summary holds a verdict for each target that its inputs
// measure: the HTTP hook's shapes, the in-process Unix token path (the
// median of its benchmark runs, the other benchmarks' lines ignored), the
// proxy at the outside check's shape (the median of the runs' ratios) and
// our memory per in-flight session (the median run's, with the spread).
func TestReportTargetRows(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, v any) {
		t.Helper()
		b, ok := v.([]byte)
		if !ok {
			var err error
			if b, err = json.Marshal(v); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	shapeOf := func(i int, transport string, ratios ...float64) shapeResult {
		return shapeResult{Shape: defaultShapes()[i], Transport: transport, Ratio: median(ratios), Ratios: ratios}
	}
	write("tokenbench.json", result{
		TokenPath: &tokenPathResult{
			Workload:        workload{Sessions: 256, Tokens: 256, Waves: 16, BatchLines: 1024},
			MemOurs:         memRun{Sessions: 1000, HeapPerSession: 430},
			MemOursHeapRuns: []float64{520, 430, 410},
			MemStock:        memRun{HeapPerSession: 40000},
		},
		Shapes:     &shapesResult{Shapes: []shapeResult{shapeOf(7, "unix", 12, 14, 13)}, WorstRatio: 13, WorstShape: defaultShapes()[7].Name},
		ShapesHTTP: &shapesResult{Shapes: []shapeResult{shapeOf(1, "http", 9, 9.5, 8), shapeOf(2, "http", 11, 12, 10)}},
	})
	write("proxy-outside/proxy.json", []byte(`{"params": {"n": 200, "gap": "20ms", "client_asks_usage": false}, "summary": [
		{"path": "direct", "c": 100, "runs": 3},
		{"path": "collector", "c": 100, "runs": 3, "cpu_us_per_event": 20, "cpu_ratio_collector_nginx": 1.3, "cpu_ratio_runs": [1.1, 1.3, 1.4]},
		{"path": "nginx", "c": 100, "runs": 3, "cpu_us_per_event": 15.4}]}`))
	write(tokenPathBenchFile, []byte(`goos: linux
BenchmarkTokenPathUnix/batch1000/stream-2  	 100	 322662 ns/op	 277.1 cpu-ns/event	 1000 events/op	 160.5 ns/event	 34543 B/op
BenchmarkTokenPathUnix/batch1000/stream-2  	 100	 474596 ns/op	 254.8 cpu-ns/event	 1000 events/op	 140.2 ns/event	 34558 B/op
BenchmarkTokenPathUnix/batch1000/socket-2  	 100	 474596 ns/op	 254.8 cpu-ns/event	 1000 events/op	 999.0 ns/event	 34558 B/op
BenchmarkTokenPathUnix/batch1000/stream-2  	 100	 257923 ns/op	 226.3 cpu-ns/event	 1000 events/op	 120.9 ns/event	 34540 B/op
PASS
`))
	if err := writeReport(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep fullReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		what, shown string
		met         bool
	}{
		{"shape: 1 session per batch, tokens per collector CPU-second: ours (hooks HTTP)", "9.0× (spread 8.0–9.5×)", false},
		{"shape: 50 sessions per batch, tokens per collector CPU-second: ours (hooks HTTP)", "11.0× (spread 10.0–12.0×)", true},
		{"shape: 1 token per session per batch, 100 000 sessions, tokens per collector CPU-second: ours (hooks Unix socket)", "13.0× (spread 12.0–14.0×)", true},
		{"the worst (1 token per session per batch", "13.0×", true},
		{"`BenchmarkTokenPathUnix/batch1000/stream`), wall time per event, median of 3 runs", "140.2 ns/event (spread 120.9–160.5)", true},
		{"outside check's shape, CPU per SSE event: 100 streams × 200 events 20ms apart, the client not asking for usage", "1.30× (spread 1.10–1.40)", false},
		{"memory per in-flight session, live heap after GC (1000 sessions × 0 tokens in flight), median of 3 runs", "430 B (spread 410 B–520 B)", true},
	} {
		var found *summaryRow
		for i, r := range rep.Summary {
			if strings.Contains(r.What, want.what) {
				found = &rep.Summary[i]
			}
		}
		if found == nil {
			t.Errorf("no row %q", want.what)
			continue
		}
		if shown := firstNonEmpty(found.RatioS, found.Ours); shown != want.shown && found.Ours != want.shown {
			t.Errorf("%q: shows %q / %q, want %q", want.what, found.RatioS, found.Ours, want.shown)
		}
		if found.Met == nil || *found.Met != want.met {
			t.Errorf("%q: met %v, want %v", want.what, found.Met, want.met)
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "## Token path by workload shape (hooks HTTP") {
		t.Error("results.md has no section for the HTTP hook's shapes")
	}
	// A miss names the figure its verdict is on.
	if !strings.Contains(string(md), "so the proxy asks and folds the usage chunk; collector vs nginx, median of 3 runs (1.3×, target ≤ 1.25×)") {
		t.Error("results.md's misses do not give the outside check's ratio")
	}
}
