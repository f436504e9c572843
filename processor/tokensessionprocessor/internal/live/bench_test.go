// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

const liveBenchSessions = 100_000

// benchHarness is a view with its defaults (a snapshot a second, 500
// sessions) but at most maxViewers viewers, over n open sessions on four
// engines, every fourth waiting for its first token, the others decoding,
// as the processor's live benchmarks have them.
func benchHarness(b *testing.B, n, maxViewers int) *harness {
	b.Helper()
	h := newHarness(b, nil, func(l *Config) { l.Interval = time.Second; l.MaxViewers = maxViewers })
	now := time.Now().UnixNano()
	evs := make([]tokenevent.Event, 0, 2*n)
	for i := range n {
		id := fmt.Sprintf("req-%08d", i)
		evs = append(evs, tokenevent.Event{
			Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: uint64(now), Model: "llama", Operation: "chat",
			Engine: fmt.Sprintf("vllm-%d", i%4), PromptTokens: 100, Count: 1, CompletionTokens: -1,
		})
		if i%4 != 0 {
			evs = append(evs, tokenevent.Event{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: uint64(now + 1e8), Count: 1, PromptTokens: -1, CompletionTokens: -1})
		}
	}
	h.fold(now+1e8, evs...)
	if h.table.Active() != n {
		b.Fatalf("%d sessions open, want %d", h.table.Active(), n)
	}
	return h
}

// BenchmarkLiveSnapshot takes the snapshot of 100 000 open sessions (the
// worst 500, four engines' totals), encoded: lock-ns is the part that
// holds the sessions' lock, B/snapshot the JSON a viewer is sent.
func BenchmarkLiveSnapshot(b *testing.B) {
	h := benchHarness(b, liveBenchSessions, 16)
	var sc liveScan
	var size int
	var locked time.Duration
	b.ReportAllocs()
	for b.Loop() {
		t := time.Now()
		snap := h.state.take(t, []Filter{{}}, &sc)[0]
		locked += time.Since(t)
		body := h.state.snapshot(t, Filter{}, &sc)
		size = len(body)
		if len(snap.Sessions) != 500 {
			b.Fatalf("%d sessions in the snapshot, want 500", len(snap.Sessions))
		}
	}
	// Each iteration took the snapshot twice: once alone, for the lock's
	// share, once encoded.
	b.ReportMetric(float64(b.Elapsed()-locked)/float64(b.N), "encoded-ns/snapshot")
	b.ReportMetric(float64(locked)/float64(b.N), "lock-ns/snapshot")
	b.ReportMetric(float64(size), "B/snapshot")
}

// BenchmarkLiveViewerMemory measures the server's memory (heap and
// goroutine stacks) per GET /sessions/stream viewer: 100 viewers, reading
// every snapshot, of a collector with 1000 open sessions, after three
// snapshots. The viewers run in a process of their own (this test binary
// again, TestLiveViewerClients), so that only the server's side is
// counted; the snapshot they share counts once, not per viewer.
func BenchmarkLiveViewerMemory(b *testing.B) {
	const viewers = 100
	h := benchHarness(b, 1000, viewers)
	ls, url := h.server(b)
	connected := func() int {
		ls.mu.Lock()
		defer ls.mu.Unlock()
		return len(ls.viewers)
	}
	var perViewer float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ctx, cancel := context.WithCancel(context.Background())
		//nolint:gosec // this test binary, run again as the viewers' process
		clients := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestLiveViewerClients$")
		clients.Env = append(os.Environ(), fmt.Sprintf("LIVE_VIEWER_CLIENTS=%d", viewers),
			"LIVE_VIEWER_URL="+url+"/sessions/stream")
		if err := clients.Start(); err != nil {
			b.Fatal(err)
		}
		for connected() < viewers {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(3 * h.cfg.Interval)
		runtime.GC()
		runtime.ReadMemStats(&after)
		used := func(m *runtime.MemStats) float64 { return float64(m.HeapAlloc + m.StackInuse) }
		perViewer = (used(&after) - used(&before)) / viewers
		cancel()
		_ = clients.Wait()
		for connected() > 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	b.ReportMetric(perViewer, "B/viewer")
}

// TestLiveViewerClients is BenchmarkLiveViewerMemory's viewers, in a
// process of their own; it does nothing in a test run.
func TestLiveViewerClients(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("LIVE_VIEWER_CLIENTS"))
	if n == 0 {
		t.Skip("the viewers of BenchmarkLiveViewerMemory, run by it")
	}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(os.Getenv("LIVE_VIEWER_URL")) //nolint:gosec // the benchmark's own server
			if err != nil {
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
		}()
	}
	wg.Wait()
}
