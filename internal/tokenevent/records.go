package tokenevent

import (
	"encoding/hex"
	"fmt"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
)

// Event names of the log records that carry token events in the collector.
const (
	EventNameStart = "llm.session.start"
	EventNameToken = "llm.token"
	EventNameEnd   = "llm.session.end"
)

// Attribute keys of the log record form. GenAI semantic convention names are
// used where one exists.
const (
	AttrSessionID         = "llm.session.id"
	AttrOperation         = "gen_ai.operation.name"
	AttrRequestModel      = "gen_ai.request.model"
	AttrInputTokens       = "gen_ai.usage.input_tokens"
	AttrEngine            = "llm.engine"
	AttrParentSpanID      = "llm.session.parent_span_id"
	AttrSessionAttributes = "llm.session.attributes"
	AttrOutputTokens      = "gen_ai.usage.output_tokens"
	AttrFinishReasons     = "gen_ai.response.finish_reasons"
	AttrErrorType         = "error.type"

	// AttrTokenCount is the token count of a record holding one token event
	// (absent means 1).
	AttrTokenCount = "llm.token.count"
	// AttrTokenTimes and AttrTokenCounts hold a packed token record: several
	// token events of one session, as parallel int arrays of event times
	// (Unix ns) and token counts. The record's timestamp is the first time.
	AttrTokenTimes  = "llm.token.times_unix_nano"
	AttrTokenCounts = "llm.token.counts"
)

// RecordWriter appends token events to a log record slice. The token events
// of one session between its start and end are packed into a single record,
// since a pdata record per token is the dominant cost at high rates.
type RecordWriter struct {
	records  plog.LogRecordSlice
	observed pcommon.Timestamp
	open     map[string]openTokenRecord
}

type openTokenRecord struct {
	rec           plog.LogRecord
	times, counts pcommon.Slice // empty until a second event is packed
	packed        bool
}

// NewRecordWriter returns a writer with no destination; call Reset before use.
func NewRecordWriter() *RecordWriter {
	return &RecordWriter{open: make(map[string]openTokenRecord)}
}

// Reset points w at records, stamping new records with observed as their
// observed timestamp. Packing never spans two Resets.
func (w *RecordWriter) Reset(records plog.LogRecordSlice, observed pcommon.Timestamp) {
	w.records = records
	w.observed = observed
	clear(w.open)
}

// Append writes ev.
func (w *RecordWriter) Append(ev *Event) {
	if ev.Kind == KindToken {
		if o, ok := w.open[ev.SessionID]; ok {
			w.pack(ev, o)
			return
		}
	} else {
		delete(w.open, ev.SessionID)
	}
	lr := w.records.AppendEmpty()
	lr.SetTimestamp(pcommon.Timestamp(ev.TimeUnixNano))
	lr.SetObservedTimestamp(w.observed)
	attrs := lr.Attributes()
	switch ev.Kind {
	case KindStart:
		lr.SetEventName(EventNameStart)
		lr.SetTraceID(ev.TraceID)
		lr.SetSpanID(ev.SpanID)
		attrs.EnsureCapacity(7)
		attrs.PutStr(AttrSessionID, ev.SessionID)
		if !ev.ParentSpanID.IsEmpty() {
			attrs.PutStr(AttrParentSpanID, hex.EncodeToString(ev.ParentSpanID[:]))
		}
		putNonEmpty(attrs, AttrOperation, ev.Operation)
		putNonEmpty(attrs, AttrRequestModel, ev.Model)
		if ev.PromptTokens >= 0 {
			attrs.PutInt(AttrInputTokens, ev.PromptTokens)
		}
		putNonEmpty(attrs, AttrEngine, ev.Engine)
		if len(ev.Attributes) > 0 {
			m := attrs.PutEmptyMap(AttrSessionAttributes)
			m.EnsureCapacity(len(ev.Attributes))
			for _, a := range ev.Attributes {
				m.PutStr(a.Key, a.Value)
			}
		}
	case KindToken:
		lr.SetEventName(EventNameToken)
		attrs.PutStr(AttrSessionID, ev.SessionID)
		if ev.Count != 1 {
			attrs.PutInt(AttrTokenCount, ev.Count)
		}
		w.open[ev.SessionID] = openTokenRecord{rec: lr}
	case KindEnd:
		lr.SetEventName(EventNameEnd)
		attrs.EnsureCapacity(4)
		attrs.PutStr(AttrSessionID, ev.SessionID)
		if ev.CompletionTokens >= 0 {
			attrs.PutInt(AttrOutputTokens, ev.CompletionTokens)
		}
		if ev.FinishReason != "" {
			attrs.PutEmptySlice(AttrFinishReasons).AppendEmpty().SetStr(ev.FinishReason)
		}
		putNonEmpty(attrs, AttrErrorType, ev.Error)
	}
}

// pack adds a token event to the session's open token record, turning a
// single-event record into a packed one on the second event.
func (w *RecordWriter) pack(ev *Event, o openTokenRecord) {
	if !o.packed {
		attrs := o.rec.Attributes()
		first := int64(1)
		if v, ok := attrs.Get(AttrTokenCount); ok {
			first = v.Int()
			attrs.Remove(AttrTokenCount)
		}
		attrs.PutEmptySlice(AttrTokenTimes)
		attrs.PutEmptySlice(AttrTokenCounts)
		// Fetch both after both Puts: a Put may move the attributes.
		times, _ := attrs.Get(AttrTokenTimes)
		counts, _ := attrs.Get(AttrTokenCounts)
		o = openTokenRecord{rec: o.rec, times: times.Slice(), counts: counts.Slice(), packed: true}
		o.times.AppendEmpty().SetInt(int64(o.rec.Timestamp()))
		o.counts.AppendEmpty().SetInt(first)
		w.open[ev.SessionID] = o
	}
	o.times.AppendEmpty().SetInt(int64(ev.TimeUnixNano))
	o.counts.AppendEmpty().SetInt(ev.Count)
}

func putNonEmpty(m pcommon.Map, k, v string) {
	if v != "" {
		m.PutStr(k, v)
	}
}

// IsTokenEvent reports whether lr is one of the token event records.
func IsTokenEvent(lr plog.LogRecord) bool {
	switch lr.EventName() {
	case EventNameStart, EventNameToken, EventNameEnd:
		return true
	}
	return false
}

// ReadRecord decodes a token event record, calling fn once per event: once
// for a start, end or single token record, once per packed event otherwise.
// ev is the Event passed to fn, reused between calls. It returns a
// *FieldError naming the attribute at fault when lr is not a valid token
// event record; fn is not called then.
func ReadRecord(lr plog.LogRecord, ev *Event, fn func(*Event)) error {
	ev.Reset()
	switch lr.EventName() {
	case EventNameStart:
		ev.Kind = KindStart
	case EventNameToken:
		ev.Kind = KindToken
	case EventNameEnd:
		ev.Kind = KindEnd
	default:
		return &FieldError{Field: "event_name", Reason: fmt.Sprintf("want a token event, got %q", lr.EventName())}
	}
	attrs := lr.Attributes()
	sid, err := strAttr(attrs, AttrSessionID)
	if err != nil {
		return err
	}
	if sid == "" {
		return &FieldError{Field: AttrSessionID, Reason: "missing"}
	}
	ev.SessionID = sid
	ev.TimeUnixNano = uint64(lr.Timestamp())
	if ev.TimeUnixNano == 0 {
		return &FieldError{Field: "time_unix_nano", Reason: "missing"}
	}
	switch ev.Kind {
	case KindStart:
		return readStart(lr, attrs, ev, fn)
	case KindToken:
		return readToken(attrs, ev, fn)
	default:
		return readEnd(attrs, ev, fn)
	}
}

func readStart(lr plog.LogRecord, attrs pcommon.Map, ev *Event, fn func(*Event)) error {
	ev.TraceID = lr.TraceID()
	ev.SpanID = lr.SpanID()
	var err error
	if ev.Operation, err = strAttr(attrs, AttrOperation); err != nil {
		return err
	}
	if ev.Model, err = strAttr(attrs, AttrRequestModel); err != nil {
		return err
	}
	if ev.Engine, err = strAttr(attrs, AttrEngine); err != nil {
		return err
	}
	if ev.PromptTokens, err = intAttr(attrs, AttrInputTokens, -1); err != nil {
		return err
	}
	parent, err := strAttr(attrs, AttrParentSpanID)
	if err != nil {
		return err
	}
	if parent != "" {
		if len(parent) != 16 {
			return &FieldError{Field: AttrParentSpanID, Reason: fmt.Sprintf("want 16 hex digits, got %d", len(parent))}
		}
		if _, err := hex.Decode(ev.ParentSpanID[:], []byte(parent)); err != nil {
			return &FieldError{Field: AttrParentSpanID, Reason: "want 16 hex digits"}
		}
	}
	if v, ok := attrs.Get(AttrSessionAttributes); ok {
		if v.Type() != pcommon.ValueTypeMap {
			return &FieldError{Field: AttrSessionAttributes, Reason: "want a map, got " + v.Type().String()}
		}
		for k, a := range v.Map().All() {
			ev.Attributes = append(ev.Attributes, Attribute{Key: k, Value: a.AsString()})
		}
	}
	fn(ev)
	return nil
}

func readToken(attrs pcommon.Map, ev *Event, fn func(*Event)) error {
	tv, packed := attrs.Get(AttrTokenTimes)
	if !packed {
		n, err := intAttr(attrs, AttrTokenCount, 1)
		if err != nil {
			return err
		}
		if n < 1 {
			return &FieldError{Field: AttrTokenCount, Reason: "must be at least 1"}
		}
		ev.Count = n
		fn(ev)
		return nil
	}
	cv, ok := attrs.Get(AttrTokenCounts)
	if tv.Type() != pcommon.ValueTypeSlice || !ok || cv.Type() != pcommon.ValueTypeSlice || tv.Slice().Len() != cv.Slice().Len() {
		return &FieldError{Field: AttrTokenTimes, Reason: "want int arrays " + AttrTokenTimes + " and " + AttrTokenCounts + " of equal length"}
	}
	times, counts := tv.Slice(), cv.Slice()
	for i := range times.Len() {
		t, c := times.At(i), counts.At(i)
		if t.Type() != pcommon.ValueTypeInt || t.Int() <= 0 {
			return &FieldError{Field: AttrTokenTimes, Reason: fmt.Sprintf("element %d: want a positive int", i)}
		}
		if c.Type() != pcommon.ValueTypeInt || c.Int() < 1 {
			return &FieldError{Field: AttrTokenCounts, Reason: fmt.Sprintf("element %d: want an int of at least 1", i)}
		}
	}
	for i := range times.Len() {
		ev.TimeUnixNano = uint64(times.At(i).Int())
		ev.Count = counts.At(i).Int()
		fn(ev)
	}
	return nil
}

func readEnd(attrs pcommon.Map, ev *Event, fn func(*Event)) error {
	var err error
	if ev.CompletionTokens, err = intAttr(attrs, AttrOutputTokens, -1); err != nil {
		return err
	}
	if ev.Error, err = strAttr(attrs, AttrErrorType); err != nil {
		return err
	}
	if v, ok := attrs.Get(AttrFinishReasons); ok {
		switch v.Type() {
		case pcommon.ValueTypeSlice:
			if v.Slice().Len() > 0 {
				ev.FinishReason = v.Slice().At(0).AsString()
			}
		case pcommon.ValueTypeStr:
			ev.FinishReason = v.Str()
		default:
			return &FieldError{Field: AttrFinishReasons, Reason: "want a string array, got " + v.Type().String()}
		}
	}
	fn(ev)
	return nil
}

func strAttr(m pcommon.Map, k string) (string, error) {
	v, ok := m.Get(k)
	if !ok {
		return "", nil
	}
	if v.Type() != pcommon.ValueTypeStr {
		return "", &FieldError{Field: k, Reason: "want a string, got " + v.Type().String()}
	}
	return v.Str(), nil
}

func intAttr(m pcommon.Map, k string, absent int64) (int64, error) {
	v, ok := m.Get(k)
	if !ok {
		return absent, nil
	}
	if v.Type() != pcommon.ValueTypeInt || v.Int() < 0 {
		return 0, &FieldError{Field: k, Reason: "want a non-negative int, got " + v.AsString()}
	}
	return v.Int(), nil
}
