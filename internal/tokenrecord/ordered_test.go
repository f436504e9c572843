// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenrecord

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// ev is a compact event for the ordered writer's tests: kind, session,
// time in ms after t0.
func ev(kind tokenevent.Kind, id string, ms int64) tokenevent.Event {
	return tokenevent.Event{
		Kind: kind, SessionID: id, TimeUnixNano: uint64(t0 + ms*1_000_000), Count: 1,
		PromptTokens: -1, CompletionTokens: -1,
	}
}

const t0 = int64(1_700_000_000_000_000_000)

// orderedWrite writes evs with an ordered writer (or not) and reads back
// what the records say, in record order, as "kind session ms".
func orderedWrite(t *testing.T, ordered bool, evs ...tokenevent.Event) []string {
	t.Helper()
	records := plog.NewLogRecordSlice()
	w := NewRecordWriter()
	w.Reset(records, 42)
	w.SetOrdered(ordered)
	for i := range evs {
		w.Append(&evs[i])
	}
	w.Flush()
	var out []string
	for _, e := range readAll(t, records) {
		out = append(out, fmt.Sprintf("%s %s %d", [...]string{"?", "start", "token", "end"}[e.Kind], e.SessionID, (int64(e.TimeUnixNano)-t0)/1_000_000))
	}
	return out
}

const (
	start = tokenevent.KindStart
	token = tokenevent.KindToken
	end   = tokenevent.KindEnd
)

// A batch of datagrams that overtook each other: an ordered writer puts
// each session's events in time order, whatever order they came in.
func TestOrderedWriter(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []tokenevent.Event
		want []string
	}{
		{
			name: "an end overtakes the last token",
			in:   []tokenevent.Event{ev(start, "a", 0), ev(token, "a", 100), ev(token, "a", 120), ev(end, "a", 140), ev(token, "a", 140)},
			want: []string{"start a 0", "token a 100", "token a 120", "token a 140", "end a 140"},
		},
		{
			name: "an end alone overtakes tokens",
			in:   []tokenevent.Event{ev(end, "a", 140), ev(token, "a", 120), ev(token, "a", 130)},
			want: []string{"token a 120", "token a 130", "end a 140"},
		},
		{
			name: "a token overtakes its start",
			in:   []tokenevent.Event{ev(token, "a", 100), ev(start, "a", 0), ev(token, "a", 120)},
			want: []string{"start a 0", "token a 100", "token a 120"},
		},
		{
			name: "tokens overtake each other",
			in:   []tokenevent.Event{ev(token, "a", 140), ev(token, "a", 100), ev(token, "a", 120), ev(end, "a", 150)},
			want: []string{"token a 100", "token a 120", "token a 140", "end a 150"},
		},
		{
			name: "a token after the end stays after it",
			in:   []tokenevent.Event{ev(token, "a", 100), ev(end, "a", 140), ev(token, "a", 150)},
			want: []string{"token a 100", "end a 140", "token a 150"},
		},
		{
			name: "a session out of order is rewritten after the others",
			in: []tokenevent.Event{
				ev(token, "b", 10), ev(token, "a", 100), ev(end, "a", 140), ev(token, "b", 20),
				ev(token, "a", 130), ev(end, "b", 30),
			},
			want: []string{"token b 10", "token b 20", "end b 30", "token a 100", "token a 130", "end a 140"},
		},
		{
			name: "a session out of order is rewritten after the batch record of the others",
			in: []tokenevent.Event{
				ev(token, "b", 10), ev(token, "a", 100), ev(end, "a", 140), ev(token, "a", 130),
				ev(token, "c", 5), ev(token, "b", 20),
			},
			want: []string{"token b 10", "token b 20", "token c 5", "token a 100", "token a 130", "end a 140"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, orderedWrite(t, true, tt.in...))
		})
	}
	t.Run("an unordered writer keeps the order of arrival", func(t *testing.T) {
		assert.Equal(t, []string{"token a 100", "end a 140", "token a 120"},
			orderedWrite(t, false, ev(token, "a", 100), ev(end, "a", 140), ev(token, "a", 120)))
	})
}

// The ordered writer writes every event once, and each session's in time
// order (start, tokens, end at one instant), whatever the input.
func FuzzOrderedWriter(f *testing.F) {
	f.Add([]byte{0x21, 0x12, 0x13, 0x34, 0x14})
	f.Add([]byte{0x35, 0x24, 0x10, 0x11})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 200 {
			return
		}
		// Each byte is an event: kind (bits 6-7), session (bit 5), time.
		var evs []tokenevent.Event
		for _, b := range in {
			kind := tokenevent.Kind(b>>6%3 + 1)
			evs = append(evs, ev(kind, fmt.Sprint("s", b>>5&1), int64(b&0x1f)))
		}
		got := orderedWrite(t, true, evs...)
		var want []string
		for _, e := range evs {
			want = append(want, fmt.Sprintf("%s %s %d", [...]string{"?", "start", "token", "end"}[e.Kind], e.SessionID, (int64(e.TimeUnixNano)-t0)/1_000_000))
		}
		require.ElementsMatch(t, want, got)
		rank := map[string]int{"start": 0, "token": 1, "end": 2}
		last := map[string][2]int{}
		for _, g := range got {
			var kind, id string
			var ms int
			_, err := fmt.Sscanf(g, "%s %s %d", &kind, &id, &ms)
			require.NoError(t, err)
			k := [2]int{ms, rank[kind]}
			if p, ok := last[id]; ok && cmp.Or(cmp.Compare(k[0], p[0]), cmp.Compare(k[1], p[1])) < 0 {
				t.Fatalf("%s out of order in %v (from %v)", g, got, want)
			}
			last[id] = k
		}
	})
}

// BenchmarkRecordWriterOrdered is BenchmarkRecordWriter's batch (100
// sessions × 10 tokens) with sessions coming and going (a start and an end
// for 10 of them), as the UDP hook writes a batch window's datagrams:
// ordered, in time order ("in-order") or with one session's end read before
// its last token ("overtaken", the batch rewritten).
func BenchmarkRecordWriterOrdered(b *testing.B) {
	build := func(overtaken bool) []tokenevent.Event {
		var evs []tokenevent.Event
		for s := range 10 {
			evs = append(evs, ev(start, fmt.Sprintf("req-%08d", s), 0))
		}
		for step := range 10 {
			for s := range 100 {
				evs = append(evs, ev(token, fmt.Sprintf("req-%08d", s), int64(1+step*25)))
			}
		}
		for s := 90; s < 100; s++ {
			evs = append(evs, ev(end, fmt.Sprintf("req-%08d", s), 1+9*25))
		}
		if overtaken { // the end of req-00000099 before its last token
			n := len(evs)
			last := slices.IndexFunc(evs, func(e tokenevent.Event) bool {
				return e.Kind == token && e.SessionID == "req-00000099" && e.TimeUnixNano == uint64(t0+(1+9*25)*1_000_000)
			})
			evs = append(evs[:last:last], append(evs[last+1:n:n], evs[last])...)
		}
		return evs
	}
	for _, overtaken := range []bool{false, true} {
		name := "in-order"
		if overtaken {
			name = "overtaken"
		}
		b.Run(name, func(b *testing.B) {
			evs := build(overtaken)
			w := NewRecordWriter()
			b.ReportAllocs()
			for b.Loop() {
				logs := plog.NewLogs()
				w.Reset(logs.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords(), 1)
				w.SetOrdered(true)
				for i := range evs {
					w.Append(&evs[i])
				}
				w.Flush()
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N*len(evs)), "ns/event")
		})
	}
}
