// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"fmt"
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

// BenchmarkTokenPathAttribution: whole sessions (start, 10 tokens, end;
// 100 a batch) folded beside `open` sessions that stay open and decoding on
// the same engine, with the attribution on and off: the token path's cost
// with it, per event, must not grow with the open sessions.
func BenchmarkTokenPathAttribution(b *testing.B) {
	for _, open := range []int{1000, 100_000} {
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("open=%d/attribution=%v", open, on), func(b *testing.B) {
				cfg := createDefaultConfig()
				cfg.Metrics.FlushInterval = time.Hour
				cfg.Session.MaxActive = 2 * open
				cfg.Attribution.Enabled = on
				// The open sessions stay open and decoding however long
				// the benchmark runs: no freeze, no timeout.
				cfg.Stall.Gap = time.Hour
				cfg.Session.IdleTimeout = 10 * time.Hour
				set := processortest.NewNopSettings(metadata.Type)
				lp, err := NewFactory().CreateLogs(context.Background(), set, cfg, consumertest.NewNop())
				if err != nil {
					b.Fatal(err)
				}
				if err := lp.Start(context.Background(), componenttest.NewNopHost()); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = lp.Shutdown(context.Background()) })
				now := time.Now().UnixNano()
				bg := make([]tokenevent.Event, 0, 2*open)
				for i := range open {
					id := fmt.Sprintf("open-%08d", i)
					bg = append(bg,
						tokenevent.Event{Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: uint64(now), Model: "llama", Operation: "chat", Engine: "vllm-0", PromptTokens: 100, Count: 1, CompletionTokens: -1},
						tokenevent.Event{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: uint64(now + 1e6), Count: 1, PromptTokens: -1, CompletionTokens: -1})
				}
				if err := lp.ConsumeLogs(context.Background(), events(bg...)); err != nil {
					b.Fatal(err)
				}
				const batch, tokens = 100, 10
				ids := make([]string, batch)
				w := tokenrecord.NewRecordWriter()
				t, n, total := now+2e6, 0, 0
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					ld := plog.NewLogs()
					w.Reset(ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords(), 1)
					t = benchEventClock(t)
					for i := range ids {
						ids[i] = fmt.Sprintf("req-%010d", n)
						n++
						w.Append(&tokenevent.Event{Kind: tokenevent.KindStart, SessionID: ids[i], TimeUnixNano: uint64(t), Model: "llama", Operation: "chat", Engine: "vllm-0", PromptTokens: 500, Count: 1, CompletionTokens: -1})
					}
					for range tokens {
						t += int64(2 * time.Microsecond)
						for _, id := range ids {
							w.Append(&tokenevent.Event{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: uint64(t), Count: 1, PromptTokens: -1, CompletionTokens: -1})
						}
					}
					for _, id := range ids {
						w.Append(&tokenevent.Event{Kind: tokenevent.KindEnd, SessionID: id, TimeUnixNano: uint64(t), CompletionTokens: tokens, FinishReason: "stop", PromptTokens: -1, Count: 1})
					}
					w.Flush()
					b.StartTimer()
					if err := lp.ConsumeLogs(context.Background(), ld); err != nil {
						b.Fatal(err)
					}
					total += batch * (tokens + 2)
				}
				requireNoRejects(b, lp)
				b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(total), "ns/event")
			})
		}
	}
}
