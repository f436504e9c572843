// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package demo is `make demo`: it runs scenario points (each a fresh
// vllmsim, a collector proxying it and llmload through the proxy), reads
// what the collector exported in an OTLP sink of its own, and writes a
// report folder in which the client's figures and the collector's stand
// side by side. cmd/llmdemo is its command line; e2e_test.go runs a short
// form of the same pipeline against the built collector.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Report is the result of a demo run (report.json).
type Report struct {
	StartedAt time.Time `json:"started_at"`
	WallS     float64   `json:"wall_s"`
	// LoadAvg is /proc/loadavg's 1-minute figure at the start and the end:
	// timings are wall-clock, so other work on the machine moves them.
	LoadAvg [2]float64     `json:"load_avg"`
	Points  []*PointResult `json:"points"`
	Plots   []string       `json:"plots"`
}

// Run runs the points one after the other, with their files under
// out/points/<name> and each collector's live view on live ("" for none), and writes out/report.md, out/report.json and the
// plots. When a point fails or ctx ends (Ctrl-C) the report is still
// written with the points done so far, and the error returned.
func Run(ctx context.Context, bins Binaries, points []Point, out, live string, progress Progress) (*Report, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	rep := &Report{StartedAt: time.Now().UTC()}
	rep.LoadAvg[0] = loadAvg()
	var runErr error
	for i, p := range points {
		step := func(format string, args ...any) {
			progress("[%d/%d] %s: %s", i+1, len(points), p.Name(), fmt.Sprintf(format, args...))
		}
		step("%s; vllmsim %s, kv-blocks %d, chunked prefill %v, prefill priority %v", ScenarioTitles[p.Scenario],
			p.Engine.Profile, p.Engine.KVBlocks, p.Engine.ChunkedPrefill, p.Engine.PrefillPriority)
		t0 := time.Now()
		res, err := RunPoint(ctx, bins, p, filepath.Join(out, "points", p.Name()), live, step)
		if err != nil {
			if ctx.Err() != nil {
				err = errors.New("interrupted; every process it started is stopped")
			}
			runErr = fmt.Errorf("%s: %w", p.Name(), err)
			break
		}
		rep.Points = append(rep.Points, res)
		step("done in %.1fs: TTFT p99 client %s / collector %s ms, TPOT p50 client %s / collector %s ms, "+
			"engine split on %.0f of %.0f sessions, %d spans, %d stall alerts, %g pre-emptions, max KV %.0f%%, %.2f cores",
			time.Since(t0).Seconds(), f1(res.Client.TTFT.P99), f1(res.Collector.TTFT.P99),
			f1(res.Client.TPOT.P50), f1(res.Collector.TPOT.P50), res.Collector.SplitSessions, res.Collector.Sessions, res.Collector.SpansKept,
			len(res.Collector.StallAlerts), res.Collector.PreemptionCount, 100*res.Collector.MaxKVUsage, res.CPUCores())
	}
	rep.WallS = time.Since(rep.StartedAt).Seconds()
	rep.LoadAvg[1] = loadAvg()
	if len(rep.Points) == 0 {
		return rep, runErr
	}
	plots, err := writePlots(rep, out)
	rep.Plots = plots
	if err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("plots: %w", err))
	}
	if err := writeJSON(rep, filepath.Join(out, "report.json")); err != nil {
		return rep, errors.Join(runErr, err)
	}
	if err := os.WriteFile(filepath.Join(out, "report.md"), []byte(markdown(rep, runErr)), 0o644); err != nil {
		return rep, errors.Join(runErr, err)
	}
	return rep, runErr
}

func writeJSON(rep any, path string) error {
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// loadAvg is the 1-minute load average, 0 where /proc/loadavg is missing.
func loadAvg() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var v float64
	_, _ = fmt.Sscan(string(data), &v)
	return v
}
