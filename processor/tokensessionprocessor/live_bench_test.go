// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

const liveBenchSessions = 100_000

// liveBenchCore is a started token_session with the live view on
// 127.0.0.1:0 (defaults otherwise: a snapshot a second, 500 sessions) and
// n open sessions on four engines, every fourth waiting for its first
// token, the others decoding. It returns the core and the engine time of
// the sessions' latest event.
func liveBenchCore(b *testing.B, n, maxViewers int) (*core, int64) {
	b.Helper()
	cfg := createDefaultConfig()
	cfg.Metrics.FlushInterval = time.Hour
	cfg.Live.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	cfg.Live.MaxViewers = maxViewers
	// No freeze checks: the benchmarks run the engine's clock at their own
	// pace (20 ms a round of tokens), which the collector's clock would
	// take for frozen streams. Tick's cost is not the live view's.
	cfg.Stall.CheckInterval = time.Hour
	c, err := newCore(cfg, processortest.NewNopSettings(metadata.Type))
	if err != nil {
		b.Fatal(err)
	}
	if err := c.setNext(consumertest.NewNop(), nil, nil); err != nil {
		b.Fatal(err)
	}
	if err := c.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Shutdown(context.Background()) })
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
	if _, _, err := c.sessions.fold(events(evs...), time.Unix(0, now+1e8)); err != nil {
		b.Fatal(err)
	}
	if c.sessions.table.Active() != n {
		b.Fatalf("%d sessions open, want %d", c.sessions.table.Active(), n)
	}
	return c, now + 1e8
}

// startLiveViewers connects n viewers to GET /sessions/stream, each reading
// every snapshot, until the benchmark ends; snapshots counts what they
// read.
func startLiveViewers(b *testing.B, c *core, n int, snapshots *atomic.Int64) {
	b.Helper()
	url := "http://" + c.live.Addr().String() + "/sessions/stream"
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })
	for range n {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
		if err != nil {
			b.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer resp.Body.Close()
			r := bufio.NewReaderSize(resp.Body, 64<<10)
			for {
				line, err := r.ReadSlice('\n')
				if bytes.HasPrefix(line, []byte("data: ")) {
					snapshots.Add(1)
				}
				if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
					return
				}
			}
		}()
	}
	// The first snapshot of each, sent as it connects, is not the
	// benchmark's: wait for them.
	for snapshots.Load() < int64(n) {
		time.Sleep(10 * time.Millisecond)
	}
	snapshots.Store(0)
}

// BenchmarkLiveFoldToken is BenchmarkFoldToken of internal/session (one
// token event folded, round-robin over the open sessions) in the processor,
// under the sessions' lock as a batch takes it, at 100 000 open sessions,
// with no viewer and with 10 on GET /sessions/stream: the view's only cost
// to the fold is the lock its snapshot holds once a second.
func BenchmarkLiveFoldToken(b *testing.B) {
	for _, viewers := range []int{0, 10} {
		b.Run(fmt.Sprintf("sessions=%d/viewers=%d", liveBenchSessions, viewers), func(b *testing.B) {
			c, now := liveBenchCore(b, liveBenchSessions, 16)
			var snapshots atomic.Int64
			startLiveViewers(b, c, viewers, &snapshots)
			p := c.sessions
			ids := make([]string, liveBenchSessions)
			for i := range ids {
				ids[i] = fmt.Sprintf("req-%08d", i)
			}
			ev := tokenevent.Event{Kind: tokenevent.KindToken, Count: 1, PromptTokens: -1, CompletionTokens: -1}
			i := 0
			var waited time.Duration
			b.ReportAllocs()
			for b.Loop() {
				ev.SessionID, ev.TimeUnixNano = ids[i], uint64(now)
				// The fold's own wait for the lock, timed only when it has
				// to wait: a snapshot holds it.
				if !p.mu.TryLock() {
					t := time.Now()
					p.mu.Lock()
					waited += time.Since(t)
				}
				p.nowNanos = now
				p.reports = p.table.Apply(&ev, now, p.reports)
				if len(p.reports) > 0 {
					p.handleReports(nil)
				}
				p.mu.Unlock()
				if i++; i == len(ids) {
					i = 0
					now += 20 * ms
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(100*float64(waited)/float64(b.Elapsed()), "%lock-wait")
			if viewers > 0 {
				b.ReportMetric(float64(snapshots.Load())/float64(viewers), "snapshots/viewer")
			}
		})
	}
}

// BenchmarkLiveTokenPath is BenchmarkConsumeLogsTokens at 100 000 open
// sessions, one token event each per batch (a packed record per session),
// with no viewer and with 10.
func BenchmarkLiveTokenPath(b *testing.B) {
	for _, viewers := range []int{0, 10} {
		b.Run(fmt.Sprintf("sessions=%d/viewers=%d", liveBenchSessions, viewers), func(b *testing.B) {
			c, now := liveBenchCore(b, liveBenchSessions, 16)
			var snapshots atomic.Int64
			startLiveViewers(b, c, viewers, &snapshots)
			ids := make([]string, liveBenchSessions)
			for i := range ids {
				ids[i] = fmt.Sprintf("req-%08d", i)
			}
			w := tokenrecord.NewRecordWriter()
			ev := tokenevent.Event{Kind: tokenevent.KindToken, Count: 1, PromptTokens: -1, CompletionTokens: -1}
			var folded int
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				ld := plog.NewLogs()
				w.Reset(ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords(), 1)
				now += 20 * ms
				for _, id := range ids {
					ev.SessionID, ev.TimeUnixNano = id, uint64(now)
					w.Append(&ev)
				}
				w.Flush()
				b.StartTimer()
				if _, _, err := c.sessions.fold(ld, time.Unix(0, now)); err != nil {
					b.Fatal(err)
				}
				folded += liveBenchSessions
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(folded), "ns/event")
			if viewers > 0 {
				b.ReportMetric(float64(snapshots.Load())/float64(viewers), "snapshots/viewer")
			}
		})
	}
}

// startFilteredViewers connects n viewers to GET /sessions/stream, viewer i
// with ?model=m-(i mod filters) (a model no session has: a filter costs its
// snapshot whatever it matches), each reading every snapshot until the
// benchmark ends. It returns how many were let in; the others were refused.
func startFilteredViewers(b *testing.B, c *core, n, filters int) int {
	b.Helper()
	base := "http://" + c.live.Addr().String() + "/sessions/stream?model=m-"
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })
	var first atomic.Int64
	accepted := 0
	for i := range n {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+strconv.Itoa(i%filters), http.NoBody)
		if err != nil {
			b.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			continue
		}
		accepted++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer resp.Body.Close()
			r := bufio.NewReaderSize(resp.Body, 64<<10)
			seen := false
			for {
				line, err := r.ReadSlice('\n')
				if !seen && bytes.HasPrefix(line, []byte("data: ")) {
					seen = true
					first.Add(1)
				}
				if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
					return
				}
			}
		}()
	}
	// Every viewer let in has had its first snapshot: the broadcaster
	// serves them all.
	for first.Load() < int64(accepted) {
		time.Sleep(10 * time.Millisecond)
	}
	return accepted
}

// BenchmarkLiveTokenPathViewers is the token path's latency while viewers
// watch with filters of their own: a batch of 100 token events (a hook
// POST's worth) folded at a time, round-robin over 100 000 open sessions,
// with no viewer, with live::max_viewers' default of 16 on as many filters,
// and with 1000 viewers each asking for a filter of its own. p99-ns/batch
// is the fold's 99th percentile, its wait for the sessions' lock included
// (a snapshot's scan holds it).
func BenchmarkLiveTokenPathViewers(b *testing.B) {
	const batch = 100
	for _, tc := range []struct{ viewers, filters int }{{0, 0}, {16, 16}, {1000, 1000}} {
		b.Run(fmt.Sprintf("sessions=%d/viewers=%d/filters=%d", liveBenchSessions, tc.viewers, tc.filters), func(b *testing.B) {
			c, now := liveBenchCore(b, liveBenchSessions, max(tc.viewers, 1))
			accepted := 0
			if tc.viewers > 0 {
				accepted = startFilteredViewers(b, c, tc.viewers, tc.filters)
			}
			ids := make([]string, liveBenchSessions)
			for i := range ids {
				ids[i] = fmt.Sprintf("req-%08d", i)
			}
			w := tokenrecord.NewRecordWriter()
			ev := tokenevent.Event{Kind: tokenevent.KindToken, Count: 1, PromptTokens: -1, CompletionTokens: -1}
			var took []time.Duration
			next := 0
			b.ReportAllocs()
			for b.Loop() {
				ld := plog.NewLogs()
				w.Reset(ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords(), 1)
				for range batch {
					ev.SessionID, ev.TimeUnixNano = ids[next], uint64(now)
					w.Append(&ev)
					if next++; next == len(ids) {
						next = 0
						now += 20 * ms
					}
				}
				w.Flush()
				t := time.Now()
				if _, _, err := c.sessions.fold(ld, time.Unix(0, now)); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(t))
			}
			slices.Sort(took)
			var sum time.Duration
			for _, d := range took {
				sum += d
			}
			b.ReportMetric(float64(sum)/float64(len(took)*batch), "ns/event")
			b.ReportMetric(float64(took[len(took)/2]), "p50-ns/batch")
			b.ReportMetric(float64(took[len(took)*99/100]), "p99-ns/batch")
			b.ReportMetric(float64(took[len(took)-1]), "max-ns/batch")
			if tc.viewers > 0 {
				b.ReportMetric(float64(accepted), "viewers-let-in")
			}
		})
	}
}
