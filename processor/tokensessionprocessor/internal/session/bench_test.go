// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// nopObserver keeps no state of a session.
type nopObserver struct{}

func (nopObserver) Started(*Session, *struct{})                   {}
func (nopObserver) Restarted(*Session, *struct{})                 {}
func (nopObserver) Gap(*Session, *struct{}, time.Duration, int64) {}
func (nopObserver) FirstToken(*Session, *struct{})                {}

func sessionIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("req-%08d", i)
	}
	return ids
}

// BenchmarkFoldToken folds token events round-robin over a table of active
// sessions, as interleaved streams arrive: the per-token hot path.
func BenchmarkFoldToken(b *testing.B) {
	for _, active := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("active=%d", active), func(b *testing.B) {
			tbl, err := NewTable(DefaultConfig(), nopObserver{})
			if err != nil {
				b.Fatal(err)
			}
			ids := sessionIDs(active)
			var reports []Report[struct{}]
			now := t0
			for _, id := range ids {
				reports = tbl.Release(tbl.Apply(&tokenevent.Event{Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: uint64(now), PromptTokens: -1, CompletionTokens: -1, Count: 1}, now, reports))
			}
			ev := tokenevent.Event{Kind: tokenevent.KindToken, Count: 1, PromptTokens: -1, CompletionTokens: -1}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ev.SessionID = ids[i]
				ev.TimeUnixNano = uint64(now)
				// Tokens 20 ms apart make no report: nothing to release,
				// as the processor releases after a record, not an event.
				if reports = tbl.Apply(&ev, now, reports); len(reports) > 0 {
					reports = tbl.Release(reports)
				}
				if i++; i == len(ids) {
					// Every session gets a token every 20 ms: decoding at
					// 50 tokens/s, no stall path taken.
					i = 0
					now += 20 * ms
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkRetainedPerSession measures the heap a session holds while
// active: the Session, its gap window, its index slots and its ID.
func BenchmarkRetainedPerSession(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		ids := sessionIDs(n) // the IDs count: the table keeps them
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tbl, err := NewTable(DefaultConfig(), nopObserver{})
		if err != nil {
			b.Fatal(err)
		}
		var reports []Report[struct{}]
		for i, id := range ids {
			ev := tokenevent.Event{Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: uint64(t0 + int64(i)), Model: "m", PromptTokens: 100, CompletionTokens: -1, Count: 1}
			reports = tbl.Release(tbl.Apply(&ev, t0, reports))
			ev = tokenevent.Event{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: uint64(t0 + int64(i) + 1e6), Count: 1}
			reports = tbl.Release(tbl.Apply(&ev, t0, reports))
		}
		runtime.GC() // ids is dead here: collected with the batch's garbage
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/session")
		runtime.KeepAlive(tbl)
	}
}
