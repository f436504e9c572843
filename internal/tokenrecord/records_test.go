// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenrecord

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenparse"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// startLine is a start event with every field set.
const startLine = `{"event":"start","session_id":"s-1","time_unix_nano":1700000000000000000,` +
	`"trace_id":"0af7651916cd43dd8448eb211c80319c","span_id":"b7ad6b7169203331","parent_span_id":"00f067aa0ba902b7",` +
	`"model":"meta-llama/Llama-3.1-8B-Instruct","operation":"chat","prompt_tokens":812,"engine":"vllm-0",` +
	`"attributes":{"quantization":"fp8","tenant":"a"}}`

const (
	tokenLine = `{"event":"token","session_id":"s-1","time_unix_nano":1700000000250000000}`
	endLine   = `{"event":"end","session_id":"s-1","time_unix_nano":1700000001000000000,"completion_tokens":42,"finish_reason":"stop"}`
)

// clone copies ev so it can outlive the callback that received it.
func clone(ev *tokenevent.Event) tokenevent.Event {
	c := *ev
	c.Attributes = append([]tokenevent.Attribute(nil), ev.Attributes...)
	if len(c.Attributes) == 0 {
		c.Attributes = nil
	}
	return c
}

func writeAll(t *testing.T, lines ...string) plog.LogRecordSlice {
	t.Helper()
	records := plog.NewLogRecordSlice()
	w := NewRecordWriter()
	w.Reset(records, 42)
	p := tokenparse.NewParser(tokenevent.Limits{})
	for i, l := range lines {
		var ev tokenevent.Event
		require.NoError(t, p.Parse([]byte(l), &ev), "line %d", i+1)
		w.Append(&ev)
	}
	w.Flush()
	return records
}

func readAll(t *testing.T, records plog.LogRecordSlice) []tokenevent.Event {
	t.Helper()
	var out []tokenevent.Event
	var ev tokenevent.Event
	for i := range records.Len() {
		require.NoError(t, ReadRecord(records.At(i), tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { out = append(out, clone(e)) }))
	}
	return out
}

func TestRecordsRoundTrip(t *testing.T) {
	lines := []string{
		startLine,
		`{"event":"start","session_id":"s-2","time_unix_nano":1700000000000000001,"stream":false,"tracestate":"ot=th:c;rv:0123456789abcd"}`,
		tokenLine,
		`{"event":"token","session_id":"s-2","time_unix_nano":1700000000260000000,"count":2,"seq":0}`,
		`{"event":"token","session_id":"s-1","time_unix_nano":1700000000270000000,"count":3}`,
		`{"event":"token","session_id":"s-1","time_unix_nano":1700000000280000000}`,
		endLine,
		`{"event":"token","session_id":"s-2","time_unix_nano":1700000000290000000,"seq":1}`,
		`{"event":"end","session_id":"s-2","time_unix_nano":1700000000300000000,"error":"aborted","response_model":"m-fp8","queue_time_ns":120000000,"decode_time_ns":0}`,
		`{"event":"end","session_id":"s-3","time_unix_nano":1700000000300000000,"engine_time_prefill_ns":1500,"engine_time_decode_ns":0,"energy_mj":42}`,
		`{"event":"end","session_id":"s-4","time_unix_nano":1700000000300000000,"engine_time_decode_ns":7,"migrations":2}`,
	}
	want := parseAll(t, lines...)
	records := writeAll(t, lines...)

	// Two starts, one token record for the tokens of both sessions, where
	// the first came, four ends.
	require.Equal(t, 7, records.Len())
	names := make([]string, records.Len())
	for i := range names {
		names[i] = records.At(i).EventName()
		assert.Equal(t, pcommon.Timestamp(42), records.At(i).ObservedTimestamp())
	}
	assert.Equal(t, []string{EventNameStart, EventNameStart, EventNameToken, EventNameEnd, EventNameEnd, EventNameEnd, EventNameEnd}, names)
	assert.Equal(t, pcommon.TraceID(want[0].TraceID), records.At(0).TraceID())
	assert.Equal(t, pcommon.SpanID(want[0].SpanID), records.At(0).SpanID())

	// Per session the order is kept; across sessions packing regroups them.
	got := readAll(t, records)
	bySession := func(evs []tokenevent.Event) map[string][]tokenevent.Event {
		m := map[string][]tokenevent.Event{}
		for _, e := range evs {
			m[e.SessionID] = append(m[e.SessionID], e)
		}
		return m
	}
	assert.Equal(t, bySession(want), bySession(got))
}

// A share is a record of its own, keyed by the engine's request id, with no
// llm.session.id, in an ordered writer as in a plain one; it reads back as
// it was parsed.
func TestRecordsShare(t *testing.T) {
	shares := []string{
		`{"event":"share","engine_request_id":"cmpl-7-0a1b2c3d","time_unix_nano":1700000000300000000,"engine":"vllm-0","engine_time_prefill_ns":1200,"engine_time_decode_ns":3400,"energy_mj":56}`,
		`{"event":"share","engine_request_id":"cmpl-8-0a1b2c3d","time_unix_nano":1700000000300000001}`,
	}
	p := tokenparse.NewParser(tokenevent.Limits{})
	want := parseAll(t, shares...)
	for _, ordered := range []bool{false, true} {
		records := plog.NewLogRecordSlice()
		w := NewRecordWriter()
		w.Reset(records, 42)
		w.SetOrdered(ordered)
		for _, l := range []string{startLine, shares[0], tokenLine, endLine, shares[1]} {
			var ev tokenevent.Event
			require.NoError(t, p.Parse([]byte(l), &ev))
			w.Append(&ev)
		}
		w.Flush()
		var got []tokenevent.Event
		for i := range records.Len() {
			lr := records.At(i)
			if lr.EventName() != EventNameShare {
				continue
			}
			assert.True(t, IsTokenEvent(lr))
			_, hasSession := lr.Attributes().Get(AttrSessionID)
			assert.False(t, hasSession)
			v, _ := lr.Attributes().Get(AttrEngineRequestID)
			assert.Equal(t, want[len(got)].EngineRequestID, v.Str())
			var ev tokenevent.Event
			require.NoError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { got = append(got, clone(e)) }))
		}
		assert.Equal(t, want, got, "ordered %v", ordered)
		assert.Equal(t, 5, records.Len(), "start, share, token, end, share")
	}
}

// A move is a record of its session, between the tokens it carried and the
// continuation's (it ends the packed record before it), in an ordered
// writer as in a plain one; it reads back as it was parsed.
func TestRecordsMove(t *testing.T) {
	lines := []string{
		startLine,
		tokenLine,
		`{"event":"token","session_id":"s-1","time_unix_nano":1700000000260000000,"count":3}`,
		`{"event":"move","session_id":"s-1","time_unix_nano":1700000000500000000,"engine":"vllm:8000","error":"engine_stalled","count":4}`,
		`{"event":"token","session_id":"s-1","time_unix_nano":1700000000700000000}`,
		`{"event":"move","session_id":"s-1","time_unix_nano":1700000000800000000}`,
		endLine,
	}
	want := parseAll(t, lines...)
	for _, ordered := range []bool{false, true} {
		records := plog.NewLogRecordSlice()
		w := NewRecordWriter()
		w.Reset(records, 42)
		w.SetOrdered(ordered)
		for i := range want {
			w.Append(&want[i])
		}
		w.Flush()
		names := make([]string, records.Len())
		for i := range names {
			names[i] = records.At(i).EventName()
		}
		assert.Equal(t, []string{EventNameStart, EventNameToken, EventNameMove, EventNameToken, EventNameMove, EventNameEnd}, names, "ordered %v", ordered)
		mv := records.At(2)
		assert.True(t, IsTokenEvent(mv))
		assert.Equal(t, map[string]any{
			AttrSessionID: "s-1", AttrMigrationTo: "vllm:8000", AttrMigrationReason: "engine_stalled", AttrMigrationTokensCarried: int64(4),
		}, mv.Attributes().AsRaw())
		assert.Equal(t, pcommon.Timestamp(1700000000500000000), mv.Timestamp())
		assert.Equal(t, want, readAll(t, records), "ordered %v", ordered)
	}
}

// An end carries the input tokens when they are known only then (the
// proxy reads them from the usage chunk); the NDJSON end has no field for
// them, so the event is built here.
func TestRecordsEndCarriesInputTokens(t *testing.T) {
	records := plog.NewLogRecordSlice()
	w := NewRecordWriter()
	w.Reset(records, 42)
	var ev tokenevent.Event
	ev.Reset()
	ev.Kind, ev.SessionID, ev.TimeUnixNano, ev.PromptTokens, ev.CompletionTokens = tokenevent.KindEnd, "s-1", 1700000000300000000, 42, 8
	w.Append(&ev)
	w.Flush()
	require.Equal(t, 1, records.Len())
	v, ok := records.At(0).Attributes().Get(AttrInputTokens)
	require.True(t, ok)
	assert.Equal(t, int64(42), v.Int())
	got := readAll(t, records)
	require.Len(t, got, 1)
	assert.Equal(t, int64(42), got[0].PromptTokens)
	assert.Equal(t, int64(8), got[0].CompletionTokens)
}

func TestRecordsSingleTokenNotPacked(t *testing.T) {
	records := writeAll(t, `{"event":"token","session_id":"a","time_unix_nano":5,"count":7}`)
	require.Equal(t, 1, records.Len())
	assert.Equal(t, map[string]any{AttrSessionID: "a", AttrTokenCount: int64(7)}, records.At(0).Attributes().AsRaw())
	assert.Equal(t, pcommon.Timestamp(5), records.At(0).Timestamp())
	records = writeAll(t, `{"event":"token","session_id":"b","time_unix_nano":6}`, `{"event":"end","session_id":"b","time_unix_nano":7}`)
	require.Equal(t, 2, records.Len())
	assert.Equal(t, map[string]any{AttrSessionID: "b"}, records.At(0).Attributes().AsRaw())
}

func TestRecordsPackedShape(t *testing.T) {
	records := writeAll(t,
		`{"event":"token","session_id":"a","time_unix_nano":1000,"count":7}`,
		`{"event":"token","session_id":"a","time_unix_nano":20001000}`,
		`{"event":"token","session_id":"a","time_unix_nano":400,"count":2}`,
		`{"event":"token","session_id":"a","time_unix_nano":40001000}`)
	require.Equal(t, 1, records.Len())
	assert.Equal(t, pcommon.Timestamp(1000), records.At(0).Timestamp())
	assert.Equal(t, map[string]any{
		AttrSessionID:   "a",
		AttrTokenEvents: "0:7 20000000 -600:2 40000000",
	}, records.At(0).Attributes().AsRaw())
}

// packedRecord is a token record of session "s" stamped ts whose events are
// the AttrTokenEvents string events.
func packedRecord(ts uint64, events string) plog.LogRecord {
	lr := plog.NewLogRecord()
	lr.SetEventName(EventNameToken)
	lr.SetTimestamp(pcommon.Timestamp(ts))
	lr.Attributes().PutStr(AttrSessionID, "s")
	lr.Attributes().PutStr(AttrTokenEvents, events)
	return lr
}

func TestReadPackedEvents(t *testing.T) {
	var got [][2]int64
	var ev tokenevent.Event
	var seqs []int64
	lr := packedRecord(1000, "0 5:2#7 -999#8 9223372036854774807:65536")
	require.NoError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
		got = append(got, [2]int64{int64(e.TimeUnixNano), e.Count})
		seqs = append(seqs, seqOf(e))
	}))
	assert.Equal(t, [][2]int64{{1000, 1}, {1005, 2}, {1, 1}, {math.MaxInt64, tokenevent.MaxCount}}, got)
	assert.Equal(t, []int64{-1, 7, 8, -1}, seqs, "seq where written, none elsewhere")

	err := ReadRecord(packedRecord(1000, "0 5:65537"), tokenevent.Limits{}, &ev, func(*tokenevent.Event) { t.Fatal("an invalid record is read whole or not at all") })
	require.EqualError(t, err, AttrTokenEvents+": event 1: count at most 65536, got 65537")
}

// The OTLP record form is held to the wire's limits: a record from any
// sender is trusted no more than a hook's line.
func TestReadRecordLimits(t *testing.T) {
	var ev tokenevent.Event
	fail := func(*tokenevent.Event) { t.Fatal("fn called for an invalid record") }
	record := func(name string) plog.LogRecord {
		lr := plog.NewLogRecordSlice().AppendEmpty()
		lr.SetEventName(name)
		lr.SetTimestamp(1000)
		lr.Attributes().PutStr(AttrSessionID, "s")
		return lr
	}
	lr := record(EventNameToken)
	lr.Attributes().PutStr(AttrSessionID, strings.Repeat("x", 300))
	require.EqualError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, fail), AttrSessionID+": 300 bytes, limit is 256")
	require.NoError(t, ReadRecord(lr, tokenevent.Limits{MaxSessionIDBytes: 300}, &ev, func(*tokenevent.Event) {}), "the limit is the configured one")

	lr = record(EventNameToken)
	lr.Attributes().PutInt(AttrTokenCount, 1_000_000_000_000)
	require.EqualError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, fail), AttrTokenCount+": at most 65536, got 1000000000000")

	lr = record(EventNameStart)
	m := lr.Attributes().PutEmptyMap(AttrSessionAttributes)
	for i := range 33 {
		m.PutStr(fmt.Sprint("k", i), "v")
	}
	require.EqualError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, fail), "attributes: more than 32 entries")

	lr = record(EventNameStart)
	lr.Attributes().PutStr(AttrOperation, "embeddings")
	require.EqualError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, fail), `operation: want chat or text_completion, got "embeddings"`)

	lr = record(EventNameStart)
	lr.Attributes().PutBool(AttrRequestStream, false)
	lr.Attributes().PutStr(AttrTraceState, "ot=th:8")
	require.NoError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
		assert.True(t, e.NoStream)
		assert.Equal(t, "ot=th:8", e.TraceState)
	}))
}

// A record of more events than the reader decodes in one pass is read in
// two.
func TestPackedRoundTripLong(t *testing.T) {
	for _, n := range []int{2, 63, 64, 65, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var want []tokenevent.Event
			for i := range n {
				want = append(want, tokenevent.Event{
					Kind: tokenevent.KindToken, SessionID: "s", TimeUnixNano: uint64(1_700_000_000_000_000_000 + i*20_000_017 - (i%7)*1000),
					Count: int64(1 + i%3), PromptTokens: -1, CompletionTokens: -1, QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1,
				})
			}
			records := plog.NewLogRecordSlice()
			w := NewRecordWriter()
			w.Reset(records, 1)
			for i := range want {
				w.Append(&want[i])
			}
			w.Flush()
			require.Equal(t, 1, records.Len())
			assert.Equal(t, want, readAll(t, records))
			// Invalid at the very end: no event reaches fn.
			lr := records.At(0)
			v, _ := lr.Attributes().Get(AttrTokenEvents)
			lr.Attributes().PutStr(AttrTokenEvents, v.Str()+" x")
			called := false
			var ev tokenevent.Event
			require.Error(t, ReadRecord(lr, tokenevent.Limits{}, &ev, func(*tokenevent.Event) { called = true }))
			assert.False(t, called)
		})
	}
}

func TestReadPackedEventsErrors(t *testing.T) {
	for _, tt := range []struct{ events, want string }{
		{"", "event 0: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0 ", "event 1: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0  5", "event 1: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{" 0", "event 0: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0 5:0", "event 1: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0 5:-1", "event 1: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0 5:", "event 1: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0,5", "event 0: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0 x", "event 1: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"-", "event 0: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0 12345678901234567890", "event 1: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0 9223372036854775808", "event 1: want <offset ns>[:<count>][#<seq>], events separated by one space"},
		{"0 -1000", "event 1: time is not a positive int64"},
		{"0 9223372036854775807", "event 1: time is not a positive int64"},
	} {
		t.Run(tt.events, func(t *testing.T) {
			called := false
			var ev tokenevent.Event
			err := ReadRecord(packedRecord(1000, tt.events), tokenevent.Limits{}, &ev, func(*tokenevent.Event) { called = true })
			require.EqualError(t, err, AttrTokenEvents+": "+tt.want)
			assert.False(t, called, "fn called for an invalid record")
		})
	}
	lr := packedRecord(1000, "0")
	lr.Attributes().PutInt(AttrTokenEvents, 3)
	var ev tokenevent.Event
	require.EqualError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, func(*tokenevent.Event) {}), AttrTokenEvents+": want a string, got Int")
	lr = packedRecord(math.MaxInt64+1, "0")
	require.EqualError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, func(*tokenevent.Event) {}), "time_unix_nano: integer out of range")
}

// FuzzPackedEvents checks that any token events of one session, in any
// order, come back from the record the writer packs them into, and that the
// reader never panics on an arbitrary AttrTokenEvents string; what it
// accepts the writer writes back as the same events.
func FuzzPackedEvents(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, "0 20000113 -5:3")
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 127, 1, 0, 0, 0, 0, 0, 0, 0}, "0:1")
	f.Fuzz(func(t *testing.T, raw []byte, text string) {
		var want []tokenevent.Event
		for len(raw) >= 9 {
			tm := binary.LittleEndian.Uint64(raw) & math.MaxInt64
			c := int64(raw[8]) + 1
			if raw[8] == 255 {
				c = tokenevent.MaxCount // the most the parser passes; the reader takes no more
			}
			raw = raw[9:]
			if tm == 0 {
				continue
			}
			want = append(want, tokenevent.Event{Kind: tokenevent.KindToken, SessionID: "s", TimeUnixNano: tm, Count: c, PromptTokens: -1, CompletionTokens: -1, QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1})
		}
		records := plog.NewLogRecordSlice()
		w := NewRecordWriter()
		w.Reset(records, 1)
		for i := range want {
			w.Append(&want[i])
		}
		w.Flush()
		var got []tokenevent.Event
		var ev tokenevent.Event
		for i := range records.Len() {
			require.NoError(t, ReadRecord(records.At(i), tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { got = append(got, clone(e)) }))
		}
		assert.Equal(t, want, got)

		lr := packedRecord(1_700_000_000_000_000_000, text)
		var read []tokenevent.Event
		if ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { read = append(read, clone(e)) }) != nil {
			return
		}
		again := plog.NewLogRecordSlice()
		w.Reset(again, 1)
		for i := range read {
			w.Append(&read[i])
		}
		w.Flush()
		var reread []tokenevent.Event
		for i := range again.Len() {
			require.NoError(t, ReadRecord(again.At(i), tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { reread = append(reread, clone(e)) }))
		}
		assert.Equal(t, read, reread)
	})
}

func TestReadRecordErrors(t *testing.T) {
	tests := []struct {
		name  string
		build func(lr plog.LogRecord)
		want  string
	}{
		{"other event", func(lr plog.LogRecord) { lr.SetEventName("app.click") }, `event_name: want a token event, got "app.click"`},
		{"no session", func(lr plog.LogRecord) { lr.SetEventName(EventNameToken); lr.SetTimestamp(1) }, AttrSessionID + ": missing"},
		{"int session", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameToken)
			lr.Attributes().PutInt(AttrSessionID, 1)
		}, AttrSessionID + ": want a string, got Int"},
		{"no time", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameToken)
			lr.Attributes().PutStr(AttrSessionID, "s")
		}, "time_unix_nano: missing"},
		{"zero count", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameToken)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
			lr.Attributes().PutInt(AttrTokenCount, 0)
		}, AttrTokenCount + ": must be at least 1"},
		{"packed not a string", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameToken)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
			lr.Attributes().PutEmptySlice(AttrTokenEvents)
		}, AttrTokenEvents + ": want a string, got Slice"},
		{"bad parent", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameStart)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
			lr.Attributes().PutStr(AttrParentSpanID, "xyz")
		}, AttrParentSpanID + ": want 16 hex digits, got 3"},
		{"share without its id", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameShare)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
		}, AttrEngineRequestID + ": missing"},
		{"share's id too long", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameShare)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrEngineRequestID, strings.Repeat("r", 257))
		}, AttrEngineRequestID + ": 257 bytes, limit is 256"},
		{"share without time", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameShare)
			lr.Attributes().PutStr(AttrEngineRequestID, "r")
		}, "time_unix_nano: missing"},
		{"share's negative part", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameShare)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrEngineRequestID, "r")
			lr.Attributes().PutInt(AttrEngineTimeDecodeNs, -3)
		}, AttrEngineTimeDecodeNs + ": want a non-negative int, got -3"},
		{"move without its session", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameMove)
			lr.SetTimestamp(1)
		}, AttrSessionID + ": missing"},
		{"move's negative tokens carried", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameMove)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
			lr.Attributes().PutInt(AttrMigrationTokensCarried, -1)
		}, AttrMigrationTokensCarried + ": want a non-negative int, got -1"},
		{"move's int reason", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameMove)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
			lr.Attributes().PutInt(AttrMigrationReason, 3)
		}, AttrMigrationReason + ": want a string, got Int"},
		{"migrations over the cap", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameEnd)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
			lr.Attributes().PutInt(AttrMigrations, 65)
		}, AttrMigrations + ": at most 64, got 65"},
		{"negative output", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameEnd)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
			lr.Attributes().PutInt(AttrOutputTokens, -3)
		}, AttrOutputTokens + ": want a non-negative int, got -3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lr := plog.NewLogRecord()
			tt.build(lr)
			called := false
			var ev tokenevent.Event
			err := ReadRecord(lr, tokenevent.Limits{}, &ev, func(*tokenevent.Event) { called = true })
			require.EqualError(t, err, tt.want)
			assert.False(t, called)
		})
	}
}

// An OTel SDK can produce the record form itself: a plain string
// finish_reasons and no packing are read as well.
func TestReadRecordFromSDK(t *testing.T) {
	lr := plog.NewLogRecord()
	lr.SetEventName(EventNameEnd)
	lr.SetTimestamp(10)
	lr.Attributes().PutStr(AttrSessionID, "s")
	lr.Attributes().PutStr(AttrFinishReasons, "length")
	var got []tokenevent.Event
	var ev tokenevent.Event
	require.NoError(t, ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { got = append(got, clone(e)) }))
	require.Len(t, got, 1)
	assert.Equal(t, "length", got[0].FinishReason)
	assert.True(t, IsTokenEvent(lr))
}

// BenchmarkRecordWriter measures the receiver's per-event cost of building
// log records from a parsed hook batch (100 sessions × 10 tokens).
func BenchmarkRecordWriter(b *testing.B) {
	evs := make([]tokenevent.Event, 0, 1000)
	for step := range 10 {
		for s := range 100 {
			evs = append(evs, tokenevent.Event{Kind: tokenevent.KindToken, SessionID: fmt.Sprintf("req-%08d", s), TimeUnixNano: uint64(1700000000000000000 + step*25_000_000), Count: 1})
		}
	}
	w := NewRecordWriter()
	b.ReportAllocs()
	for b.Loop() {
		logs := plog.NewLogs()
		w.Reset(logs.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords(), 1)
		for i := range evs {
			w.Append(&evs[i])
		}
		w.Flush()
	}
	b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N*len(evs)), "ns/event")
}

// appendDecimal writes what strconv does, for every number of digits and
// the values around each power of ten.
func TestAppendDecimal(t *testing.T) {
	check := func(v uint64) {
		t.Helper()
		if got, want := string(appendDecimal([]byte("x"), v)), "x"+strconv.FormatUint(v, 10); got != want {
			t.Fatalf("appendDecimal(%d) = %q, want %q", v, got, want)
		}
	}
	for p := uint64(1); ; p *= 10 {
		for _, v := range []uint64{p - 1, p, p + 1, 2*p - 1, 9 * p, p + p/2} {
			check(v)
		}
		if p > math.MaxUint64/10 {
			break
		}
	}
	for _, v := range []uint64{0, math.MaxInt64, math.MaxUint64, 1e8 - 1, 1e16 - 1, 12345678, 10000001, 99990000, 1e15 + 7} {
		check(v)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		check(rng.Uint64() >> rng.UintN(64))
	}
	for v := range uint64(200_000) {
		check(v)
	}
}

// packedInt reads what strconv reads, whatever the number's digits.
func TestPackedIntDigits(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 100_000 {
		v := int64(rng.Uint64()>>1) >> rng.UintN(63)
		for _, s := range []string{strconv.FormatInt(v, 10), strconv.FormatInt(-v, 10)} {
			for _, tail := range []string{"", " 1", ":3", "#7"} {
				got, next, ok := packedInt(s+tail, 0, true)
				if !ok || got != [2]int64{v, -v}[btoi(s[0] == '-')] || next != len(s) {
					t.Fatalf("packedInt(%q) = %d, %d, %v", s+tail, got, next, ok)
				}
			}
		}
	}
	for _, s := range []string{"", "-", "12345678901234567890", "99999999999999999999", "9223372036854775808", "1234567890123456789012"} {
		if _, _, ok := packedInt(s, 0, true); ok {
			t.Fatalf("packedInt(%q) accepted", s)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// parseAll parses wire lines into events of their own.
func parseAll(t *testing.T, lines ...string) []tokenevent.Event {
	t.Helper()
	p := tokenparse.NewParser(tokenevent.Limits{})
	out := make([]tokenevent.Event, 0, len(lines))
	for _, l := range lines {
		var ev tokenevent.Event
		require.NoError(t, p.Parse([]byte(l), &ev))
		out = append(out, clone(&ev))
	}
	return out
}
