// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenrecord

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// tok is a token event of session id at t ns with count tokens and seq
// (-1: none).
func tok(id string, t uint64, count, seq int64) tokenevent.Event {
	e := tokenevent.Event{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: t, Count: count, PromptTokens: -1, CompletionTokens: -1, QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1}
	setSeq(&e, seq)
	return e
}

func write(evs ...tokenevent.Event) plog.LogRecordSlice {
	records := plog.NewLogRecordSlice()
	w := NewRecordWriter()
	w.Reset(records, 42)
	for i := range evs {
		w.Append(&evs[i])
	}
	w.Flush()
	return records
}

// The tokens of several sessions that no event of theirs follows in the
// batch go into one record, whatever their session IDs hold.
func TestRecordsBatchShape(t *testing.T) {
	evs := []tokenevent.Event{
		tok("a", 1000, 1, -1), tok("b c\nd", 1500, 3, 7), tok("a", 2000, 1, -1), tok("é", 900, 1, -1), tok("a", 2500, 2, 4),
	}
	records := write(evs...)
	require.Equal(t, 1, records.Len())
	lr := records.At(0)
	assert.Equal(t, EventNameToken, lr.EventName())
	assert.Equal(t, pcommon.Timestamp(1000), lr.Timestamp(), "the first session's first event")
	assert.Equal(t, pcommon.Timestamp(42), lr.ObservedTimestamp())
	assert.Equal(t, map[string]any{AttrTokenSessions: "1 a 0 1000 1500:2#4\n5 b c\nd 500:3#7\n2 é -100"}, lr.Attributes().AsRaw())
	assert.True(t, IsTokenBatch(lr))

	got := readAll(t, records)
	assert.Equal(t, []tokenevent.Event{evs[0], evs[2], evs[4], evs[1], evs[3]}, got, "each session's events in order, session by session")
}

// A token record takes its place where its first token came and holds the
// runs of tokens of each session that began before any other event came:
// every run's first token keeps its place among the other events (a
// session's first token ends its prefill in the division of the engine's
// time), and a run ends at its session's next event.
func TestRecordsTokenRecordPlaces(t *testing.T) {
	at := func(kind tokenevent.Kind, id string, t uint64) tokenevent.Event {
		e := tok(id, t, 1, -1)
		e.Kind = kind
		return e
	}
	in := []tokenevent.Event{
		at(tokenevent.KindStart, "a", 10), tok("a", 20, 1, -1), tok("b", 21, 1, -1), at(tokenevent.KindStart, "c", 22),
		tok("c", 30, 1, -1), tok("a", 31, 1, -1), at(tokenevent.KindEnd, "b", 32), tok("d", 33, 1, -1),
		at(tokenevent.KindMove, "a", 34), tok("a", 35, 1, -1), tok("b", 36, 1, -1), tok("c", 37, 1, -1),
	}
	records := write(in...)
	var shape []string
	for _, lr := range records.All() {
		id, _ := lr.Attributes().Get(AttrSessionID)
		sessions, _ := lr.Attributes().Get(AttrTokenSessions)
		shape = append(shape, strings.TrimSpace(lr.EventName()+" "+id.Str()+" "+strings.ReplaceAll(sessions.Str(), "\n", " | ")))
	}
	assert.Equal(t, []string{
		"llm.session.start a",
		"llm.token  1 a 0 11 | 1 b 1",
		"llm.session.start c",
		"llm.token c",
		"llm.session.end b",
		"llm.token d",
		"llm.session.move a",
		"llm.token  1 a 0 | 1 b 1",
	}, shape)

	perSession := func(evs []tokenevent.Event) map[string][]string {
		m := map[string][]string{}
		for _, e := range evs {
			m[e.SessionID] = append(m[e.SessionID], fmt.Sprint(e.Kind, " ", e.TimeUnixNano))
		}
		return m
	}
	assert.Equal(t, perSession(in), perSession(readAll(t, records)))
}

// batchRecord is a batch token record stamped ts whose AttrTokenSessions is
// sessions.
func batchRecord(ts uint64, sessions string) plog.LogRecord {
	lr := plog.NewLogRecord()
	lr.SetEventName(EventNameToken)
	lr.SetTimestamp(pcommon.Timestamp(ts))
	lr.Attributes().PutStr(AttrTokenSessions, sessions)
	return lr
}

// Where a batch record's frame breaks, where the next entry begins is
// unknown: the entries before are read, the rest is skipped (one skip),
// and a record that breaks at its first entry is not read at all.
func TestReadBatchFrameErrors(t *testing.T) {
	const frame = "want <session ID length> <session ID> <events>, entries separated by a newline"
	for _, tt := range []struct {
		sessions, want string
		read           []string
	}{
		{"", "entry 0: " + frame, nil},
		{"1 a", "entry 0: " + frame, nil},
		{"1 a0", "entry 0: " + frame, nil},
		{"2 a 0", "entry 0: " + frame, nil},
		{"9 a 0", "entry 0: " + frame, nil},
		{"x a 0", "entry 0: " + frame, nil},
		{"-1 a 0", "entry 0: " + frame, nil},
		{" 1 a 0", "entry 0: " + frame, nil},
		{"1  a 0", "entry 0: " + frame, nil},
		{"1 a 0\n", "entry 1: " + frame + "; the rest not read; entries skipped: 1", []string{"a"}},
		{"1 a 0\n\n1 b 0", "entry 1: " + frame + "; the rest not read; entries skipped: 1", []string{"a"}},
		{"1 a 0\n1 b x\n99999999999999999999 c 0\n1 d 0", "entry 1: event 0: want <offset ns>[:<count>][#<seq>], events separated by one space; entries skipped: 2", []string{"a"}},
		{"1 a 0\n1 b 0\n9223372036854775807 c 0", "entry 2: " + frame + "; the rest not read; entries skipped: 1", []string{"a", "b"}},
	} {
		t.Run(tt.sessions, func(t *testing.T) {
			var ev tokenevent.Event
			var read []string
			err := ReadRecord(batchRecord(1000, tt.sessions), tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { read = append(read, e.SessionID) })
			require.EqualError(t, err, AttrTokenSessions+": "+tt.want)
			var ee *EntryError
			assert.Equal(t, tt.read != nil, errors.As(err, &ee), "some entries read, or the record invalid")
			assert.Equal(t, tt.read, read)
		})
	}
	var ev tokenevent.Event
	fail := func(*tokenevent.Event) { t.Fatal("fn called for an invalid record") }
	lr := batchRecord(1000, "1 a 0")
	lr.Attributes().PutInt(AttrTokenSessions, 1)
	require.EqualError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, fail), AttrTokenSessions+": want a string, got Int")
	for _, k := range []string{AttrSessionID, AttrTokenEvents, AttrTokenCount, AttrTokenSeq} {
		lr = batchRecord(1000, "1 a 0")
		lr.Attributes().PutStr(k, "s")
		require.EqualError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, fail), AttrTokenSessions+": a batch record has no "+k)
	}
	require.EqualError(t, ReadRecord(batchRecord(0, "1 a 0"), tokenevent.Limits{}, &ev, fail), "time_unix_nano: missing")
}

// A malformed entry of a batch record whose frame is whole loses that
// session's entry only: the others are read, and the error counts it.
func TestReadBatchEntryErrors(t *testing.T) {
	for _, tt := range []struct {
		name, sessions string
		want           []string
		err            string
	}{
		{"bad events", "1 a 0\n1 b 0 x\n1 c 5:2", []string{"a 1000", "c 1005"}, "entry 1: event 1: want <offset ns>[:<count>][#<seq>], events separated by one space; entries skipped: 1"},
		{"count beyond the bound", "1 a 0 1:65537\n1 b 3", []string{"b 1003"}, "entry 0: event 1: count at most 65536, got 65537; entries skipped: 1"},
		{"before time began", "1 a -1000\n1 b 3", []string{"b 1003"}, "entry 0: event 0: time is not a positive int64; entries skipped: 1"},
		{"empty session ID", "0  1\n1 b 3", []string{"b 1003"}, "entry 0: session ID must not be empty; entries skipped: 1"},
		{"session ID too long", "300 " + strings.Repeat("x", 300) + " 1\n1 b 3\n1 c ", []string{"b 1003"}, "entry 0: session ID 300 bytes, limit is 256; entries skipped: 2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var ev tokenevent.Event
			var got []string
			lr := batchRecord(1000, tt.sessions)
			err := ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
				got = append(got, fmt.Sprint(e.SessionID, " ", e.TimeUnixNano))
			})
			require.EqualError(t, err, AttrTokenSessions+": "+tt.err)
			var ee *EntryError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, tt.want, got)

			// The sessions read are those BatchSessions gives.
			var split []string
			BatchSessions(lr, tokenevent.Limits{}, func(id, _ string) { split = append(split, id) })
			var read []string
			for _, g := range got {
				read = append(read, strings.Fields(g)[0])
			}
			assert.Equal(t, read, split)
		})
	}
}

// Each entry of a batch record, written as a record of its session, reads
// back as the same events.
func TestAppendSessionRecord(t *testing.T) {
	evs := []tokenevent.Event{tok("a", 5000, 1, -1), tok("b", 4000, 2, 3), tok("a", 7000, 1, 9), tok("c", 6000, 1, -1)}
	records := write(evs...)
	require.Equal(t, 1, records.Len())
	batch := records.At(0)
	split := plog.NewLogRecordSlice()
	BatchSessions(batch, tokenevent.Limits{}, func(id, events string) { AppendSessionRecord(split, batch, id, events) })
	require.Equal(t, 3, split.Len())
	id, _ := split.At(1).Attributes().Get(AttrSessionID)
	assert.Equal(t, "b", id.Str())
	assert.Equal(t, pcommon.Timestamp(42), split.At(1).ObservedTimestamp())
	assert.Equal(t, readAll(t, records), readAll(t, split))
}

// FuzzBatchRecord checks that the reader never panics on an arbitrary
// AttrTokenSessions string, that what it reads of it, written again, reads
// back the same, and that BatchSessions gives the entries it read.
func FuzzBatchRecord(f *testing.F) {
	f.Add("1 a 0 20000113 -5:3\n3 b\nc 7#2")
	f.Add("1 a 0\n1 b x\n0  1")
	f.Add("2 a 0")
	f.Fuzz(func(t *testing.T, sessions string) {
		lr := batchRecord(1_700_000_000_000_000_000, sessions)
		var read []tokenevent.Event
		var ev tokenevent.Event
		err := ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { read = append(read, clone(e)) })
		var ee *EntryError
		if err != nil && !errors.As(err, &ee) {
			require.Empty(t, read, "an invalid record is read not at all")
			return
		}
		split := plog.NewLogRecordSlice()
		BatchSessions(lr, tokenevent.Limits{}, func(id, events string) { AppendSessionRecord(split, lr, id, events) })
		var fromSplit []tokenevent.Event
		for _, s := range split.All() {
			require.NoError(t, ReadRecord(s, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { fromSplit = append(fromSplit, clone(e)) }))
		}
		assert.Equal(t, read, fromSplit)

		again := write(read...)
		bySession := map[string][]tokenevent.Event{}
		for _, e := range read {
			bySession[e.SessionID] = append(bySession[e.SessionID], e)
		}
		rebySession := map[string][]tokenevent.Event{}
		for _, a := range again.All() {
			require.NoError(t, ReadRecord(a, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
				rebySession[e.SessionID] = append(rebySession[e.SessionID], clone(e))
			}))
		}
		assert.Equal(t, bySession, rebySession, "written again, each session's events read back in order")
	})
}

// FuzzTokenRecordPlaces checks, for any events of a few sessions, that the
// records read back in order give each session's events in the order they
// came, and put the first token of each run (a session's token after an
// event of another kind of it, or its first) where it came among the
// events that are no tokens.
func FuzzTokenRecordPlaces(f *testing.F) {
	f.Add([]byte{0x01, 0x41, 0x42, 0x81, 0x43, 0xc2, 0x41, 0x03})
	f.Add([]byte{0x40, 0x41, 0x00, 0x42, 0x80, 0x40, 0xc1, 0x41})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 300 {
			return
		}
		// Each byte is an event: kind (bits 6-7: start, token, end, move),
		// session (bits 0-1).
		kinds := [...]tokenevent.Kind{tokenevent.KindStart, tokenevent.KindToken, tokenevent.KindEnd, tokenevent.KindMove}
		var evs []tokenevent.Event
		for i, b := range in {
			e := tok(fmt.Sprint("s", b&3), uint64(1000+i), 1, int64(i))
			e.Kind = kinds[b>>6]
			if e.Kind != tokenevent.KindToken {
				e.Seq, e.HasSeq = 0, false
			}
			evs = append(evs, e)
		}
		var got []tokenevent.Event
		var ev tokenevent.Event
		for _, lr := range write(evs...).All() {
			require.NoError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { got = append(got, clone(e)) }))
		}
		require.Len(t, got, len(evs))
		// An event is known by its time, unique here: its index in evs.
		place := make([]int, len(evs))
		for i, e := range got {
			place[e.TimeUnixNano-1000] = i
		}
		last := map[string]int{}
		for i, e := range evs {
			if p, ok := last[e.SessionID]; ok && place[i] < place[p] {
				t.Fatalf("event %d of %s read before its session's event %d", i, e.SessionID, p)
			}
			last[e.SessionID] = i
		}
		prev := map[string]tokenevent.Kind{}
		for i, e := range evs {
			k, seen := prev[e.SessionID]
			prev[e.SessionID] = e.Kind
			if e.Kind != tokenevent.KindToken || (seen && k == tokenevent.KindToken) {
				continue
			}
			for j, x := range evs {
				if x.Kind != tokenevent.KindToken && (j < i) != (place[j] < place[i]) {
					t.Fatalf("the first token of a run, event %d, read on the wrong side of event %d", i, j)
				}
			}
		}
	})
}

// BenchmarkReadRecordBatch measures token_session's per-event cost of
// reading a batch record back (what it folds is left out): 100 sessions ×
// 10 tokens (BenchmarkRecordWriter's batch), and 1000 sessions × 1 token, a
// batch of a busy node's hooks, where the cost per session entry shows.
func BenchmarkReadRecordBatch(b *testing.B) {
	for _, tc := range []struct {
		name             string
		sessions, rounds int
	}{{"100x10", 100, 10}, {"1000x1", 1000, 1}} {
		b.Run(tc.name, func(b *testing.B) {
			var evs []tokenevent.Event
			for step := range tc.rounds {
				for s := range tc.sessions {
					evs = append(evs, tok(fmt.Sprintf("req-%08d", s), uint64(1700000000000000000+step*25_000_000+s*1000), 1, -1))
				}
			}
			records := write(evs...)
			require.Equal(b, 1, records.Len())
			lr := records.At(0)
			var ev tokenevent.Event
			var n int64
			fn := func(e *tokenevent.Event) { n += e.Count }
			b.ReportAllocs()
			for b.Loop() {
				if err := ReadRecord(lr, tokenevent.Limits{}, &ev, fn); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N*len(evs)), "ns/event")
		})
	}
}
