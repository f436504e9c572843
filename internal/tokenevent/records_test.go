package tokenevent

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
)

// clone copies ev so it can outlive the callback that received it.
func clone(ev *Event) Event {
	c := *ev
	c.Attributes = append([]Attribute(nil), ev.Attributes...)
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
	p := NewParser(Limits{})
	for i, l := range lines {
		var ev Event
		require.NoError(t, p.Parse([]byte(l), &ev), "line %d", i+1)
		w.Append(&ev)
	}
	return records
}

func readAll(t *testing.T, records plog.LogRecordSlice) []Event {
	t.Helper()
	var out []Event
	var ev Event
	for i := range records.Len() {
		require.NoError(t, ReadRecord(records.At(i), &ev, func(e *Event) { out = append(out, clone(e)) }))
	}
	return out
}

func TestRecordsRoundTrip(t *testing.T) {
	lines := []string{
		startLine,
		`{"event":"start","session_id":"s-2","time_unix_nano":1700000000000000001}`,
		tokenLine,
		`{"event":"token","session_id":"s-2","time_unix_nano":1700000000260000000,"count":2}`,
		`{"event":"token","session_id":"s-1","time_unix_nano":1700000000270000000,"count":3}`,
		`{"event":"token","session_id":"s-1","time_unix_nano":1700000000280000000}`,
		endLine,
		`{"event":"token","session_id":"s-2","time_unix_nano":1700000000290000000}`,
		`{"event":"end","session_id":"s-2","time_unix_nano":1700000000300000000,"error":"aborted"}`,
	}
	var want []Event
	p := NewParser(Limits{})
	for _, l := range lines {
		var ev Event
		require.NoError(t, p.Parse([]byte(l), &ev))
		want = append(want, clone(&ev))
	}
	records := writeAll(t, lines...)

	// Two starts, one packed record per session, two ends.
	require.Equal(t, 6, records.Len())
	names := make([]string, records.Len())
	for i := range names {
		names[i] = records.At(i).EventName()
		assert.Equal(t, pcommon.Timestamp(42), records.At(i).ObservedTimestamp())
	}
	assert.Equal(t, []string{EventNameStart, EventNameStart, EventNameToken, EventNameToken, EventNameEnd, EventNameEnd}, names)
	assert.Equal(t, pcommon.TraceID(want[0].TraceID), records.At(0).TraceID())
	assert.Equal(t, want[0].SpanID, records.At(0).SpanID())

	// Per session the order is kept; across sessions packing regroups them.
	got := readAll(t, records)
	bySession := func(evs []Event) map[string][]Event {
		m := map[string][]Event{}
		for _, e := range evs {
			m[e.SessionID] = append(m[e.SessionID], e)
		}
		return m
	}
	assert.Equal(t, bySession(want), bySession(got))
}

func TestRecordsSingleTokenNotPacked(t *testing.T) {
	records := writeAll(t, `{"event":"token","session_id":"a","time_unix_nano":5,"count":7}`, `{"event":"token","session_id":"b","time_unix_nano":6}`)
	require.Equal(t, 2, records.Len())
	assert.Equal(t, map[string]any{AttrSessionID: "a", AttrTokenCount: int64(7)}, records.At(0).Attributes().AsRaw())
	assert.Equal(t, map[string]any{AttrSessionID: "b"}, records.At(1).Attributes().AsRaw())
	assert.Equal(t, pcommon.Timestamp(5), records.At(0).Timestamp())
}

func TestRecordsPackedShape(t *testing.T) {
	records := writeAll(t, `{"event":"token","session_id":"a","time_unix_nano":5,"count":7}`, `{"event":"token","session_id":"a","time_unix_nano":9}`)
	require.Equal(t, 1, records.Len())
	assert.Equal(t, map[string]any{
		AttrSessionID:   "a",
		AttrTokenTimes:  []any{int64(5), int64(9)},
		AttrTokenCounts: []any{int64(7), int64(1)},
	}, records.At(0).Attributes().AsRaw())
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
		{"ragged packed", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameToken)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
			lr.Attributes().PutEmptySlice(AttrTokenTimes).AppendEmpty().SetInt(1)
			lr.Attributes().PutEmptySlice(AttrTokenCounts)
		}, AttrTokenTimes + ": want int arrays " + AttrTokenTimes + " and " + AttrTokenCounts + " of equal length"},
		{"bad parent", func(lr plog.LogRecord) {
			lr.SetEventName(EventNameStart)
			lr.SetTimestamp(1)
			lr.Attributes().PutStr(AttrSessionID, "s")
			lr.Attributes().PutStr(AttrParentSpanID, "xyz")
		}, AttrParentSpanID + ": want 16 hex digits, got 3"},
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
			var ev Event
			err := ReadRecord(lr, &ev, func(*Event) { called = true })
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
	var got []Event
	var ev Event
	require.NoError(t, ReadRecord(lr, &ev, func(e *Event) { got = append(got, clone(e)) }))
	require.Len(t, got, 1)
	assert.Equal(t, "length", got[0].FinishReason)
	assert.True(t, IsTokenEvent(lr))
}

// BenchmarkRecordWriter measures the receiver's per-event cost of building
// log records from a parsed hook batch (100 sessions × 10 tokens).
func BenchmarkRecordWriter(b *testing.B) {
	evs := make([]Event, 0, 1000)
	for step := range 10 {
		for s := range 100 {
			evs = append(evs, Event{Kind: KindToken, SessionID: fmt.Sprintf("req-%08d", s), TimeUnixNano: uint64(1700000000000000000 + step*25_000_000), Count: 1})
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
	}
	b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N*len(evs)), "ns/event")
}
