// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

func newBenchProcessor(b *testing.B) processor.Logs {
	cfg := createDefaultConfig()
	cfg.Metrics.FlushInterval = time.Hour
	set := processortest.NewNopSettings(metadata.Type)
	lp, err := NewFactory().CreateLogs(context.Background(), set, cfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	mp, err := NewFactory().CreateMetrics(context.Background(), set, cfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	if err := lp.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = lp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return lp
}

// benchEventClock is the time of a benchmark batch's first event: the
// collector's clock, and never before the last batch's (after). The events
// of a batch follow it a few microseconds apart. A benchmark whose event
// times run ahead of the clock (tokens 20 ms apart, batches microseconds
// apart) is past max_future_skew within a second, and then measures only
// the rejection of its events.
func benchEventClock(after int64) int64 {
	return max(time.Now().UnixNano(), after+1)
}

// requireNoRejects fails a benchmark whose events the session table
// rejected (stamped too far ahead, or before their start): its figure
// would be the rejection's cost, not the fold's.
func requireNoRejects(b *testing.B, lp processor.Logs) {
	b.Helper()
	s := lp.(*logsProcessor).Unwrap().sessions
	s.mu.Lock()
	defer s.mu.Unlock()
	for reason, byKind := range rejectedCounts(&s.table.Counters) {
		for kind, n := range byKind {
			if n > 0 {
				b.Fatalf("%d %s events rejected (%s): the benchmark's event times are wrong", n, eventKinds[kind], rejectReasons[reason])
			}
		}
	}
}

// BenchmarkConsumeLogsTokens folds hook batches as the receiver produces
// them: `sessions` concurrent sessions, 10 token events each per batch
// (packed into one record for all sessions), through the logs pipeline with the
// metrics pipeline attached. Building the batches is not timed.
func BenchmarkConsumeLogsTokens(b *testing.B) {
	for _, sessions := range []int{100, 10_000} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) {
			lp := newBenchProcessor(b)
			ids := make([]string, sessions)
			now := time.Now().UnixNano()
			starts := make([]tokenevent.Event, sessions)
			for i := range ids {
				ids[i] = fmt.Sprintf("req-%08d", i)
				starts[i] = tokenevent.Event{
					Kind: tokenevent.KindStart, SessionID: ids[i], TimeUnixNano: uint64(now), Model: "llama",
					Operation: "chat", Engine: "vllm-0", PromptTokens: 100, Count: 1, CompletionTokens: -1,
				}
			}
			if err := lp.ConsumeLogs(context.Background(), events(starts...)); err != nil {
				b.Fatal(err)
			}
			const perSession = 10
			w := tokenrecord.NewRecordWriter()
			ev := tokenevent.Event{Kind: tokenevent.KindToken, Count: 1, PromptTokens: -1, CompletionTokens: -1}
			t := now
			var events int
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				ld := plog.NewLogs()
				w.Reset(ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords(), 1)
				t = benchEventClock(t)
				for range perSession {
					t += int64(time.Microsecond)
					for _, id := range ids {
						ev.SessionID, ev.TimeUnixNano = id, uint64(t)
						w.Append(&ev)
					}
				}
				w.Flush()
				b.StartTimer()
				if err := lp.ConsumeLogs(context.Background(), ld); err != nil {
					b.Fatal(err)
				}
				events += perSession * sessions
			}
			requireNoRejects(b, lp)
			b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(events), "ns/event")
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkRetainedPerSessionProcessor measures the heap one active session
// holds inside the processor: the state machine's session and its metric
// series handle (sessions of one model share a series).
func BenchmarkRetainedPerSessionProcessor(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		cfg := createDefaultConfig()
		set := processortest.NewNopSettings(metadata.Type)
		c, err := newCore(cfg, set)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.setNext(consumertest.NewNop(), nil, nil); err != nil {
			b.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		evs := make([]tokenevent.Event, 0, 2*n)
		now := time.Now().UnixNano()
		for i := range n {
			id := fmt.Sprintf("req-%08d", i)
			evs = append(evs,
				tokenevent.Event{Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: uint64(now), Model: "llama", Operation: "chat", PromptTokens: 100, Count: 1, CompletionTokens: -1},
				tokenevent.Event{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: uint64(now + 1e8), Count: 1, PromptTokens: -1, CompletionTokens: -1})
		}
		ld := events(evs...)
		if err := c.consumeLogs(context.Background(), ld); err != nil {
			b.Fatal(err)
		}
		runtime.GC() // evs and ld are dead here: collected before after is read
		runtime.ReadMemStats(&after)
		// Measured from before the batch was built to after it was
		// collected: what remains is what the sessions hold, their IDs
		// included.
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/session")
		if c.sessions.table.Active() != n {
			b.Fatalf("%d active sessions, want %d", c.sessions.table.Active(), n)
		}
		c.telemetry.shutdown()
	}
}

// BenchmarkConsumeLogsApplication passes a batch of 100 application log
// records (no token events) through the logs pipeline, as a pipeline shared
// with an application's logs does: checked and passed on without a lock.
// Building the batches is not timed.
func BenchmarkConsumeLogsApplication(b *testing.B) {
	lp := newBenchProcessor(b)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		ld := appLogs(100)
		b.StartTimer()
		if err := lp.ConsumeLogs(context.Background(), ld); err != nil {
			b.Fatal(err)
		}
	}
}
