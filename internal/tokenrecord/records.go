// Package tokenrecord is the log record form of token events: what the
// token_stream receiver writes (RecordWriter) and token_session reads back
// (ReadRecord), so both sides share one definition of the attributes.
package tokenrecord // import "github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"

import (
	"encoding/hex"
	"fmt"
	"math"
	"slices"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/internal/swar"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// Event names of the log records that carry token events in the collector.
const (
	EventNameStart = "llm.session.start"
	EventNameToken = "llm.token"
	EventNameEnd   = "llm.session.end"
)

// Event names of the log records token_session emits: a session's summary
// and a stall alert. They are named here, beside the records it reads, for
// what reads its output (engine_health, the demo, the bench).
const (
	EventNameSummary = "llm.session.summary"
	EventNameStall   = "llm.session.stall"
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
	// AttrRequestStream is false on the start of a request that was not
	// streamed; absent means streamed.
	AttrRequestStream = "gen_ai.request.stream"
	// AttrTraceState is the caller's W3C tracestate, on a start.
	AttrTraceState = "llm.session.tracestate"
	// AttrTokenSeq is the seq of a record holding one token event.
	AttrTokenSeq = "llm.token.seq"
	// AttrResponseModel is the model that answered, on an end.
	AttrResponseModel = "gen_ai.response.model"
	// The engine's timing on an end, in ns, and where it came from.
	AttrQueueTimeNs   = "llm.session.queue_time_ns"
	AttrPrefillTimeNs = "llm.session.prefill_time_ns"
	AttrDecodeTimeNs  = "llm.session.decode_time_ns"
	AttrTimingSource  = "llm.session.timing_source"
	// The engine's own share of its busy time (ns) and energy (mJ), on an
	// end.
	AttrEngineTimePrefillNs = "llm.session.engine_time_prefill_ns"
	AttrEngineTimeDecodeNs  = "llm.session.engine_time_decode_ns"
	AttrEnergyMilliJ        = "llm.session.energy_mj"

	// AttrTokenCount is the token count of a record holding one token event
	// (absent means 1).
	AttrTokenCount = "llm.token.count"
	// AttrTokenEvents holds a packed token record: several token events of
	// one session as one string, the events separated by single spaces, each
	// "<offset>[:<count>][#<seq>]": offset is the event's time minus the
	// record's timestamp in ns (decimal, negative for an event older than
	// the record's first), count the event's token count, written only when
	// it is not 1, seq its sequence number, written only when it has one.
	// The record's timestamp is the first event's time, so the first offset
	// is 0: "0 20000113 39998760:3 60001002".
	//
	// One string is the densest form pdata can carry at a cost per record
	// rather than per event: pdata boxes each element of an array attribute
	// in an allocation of its own.
	AttrTokenEvents = "llm.token.events"
)

// RecordWriter appends token events to a log record slice. The token events
// of one session between its start and end are packed into a single record,
// since a pdata record per token is the dominant cost at high rates.
//
// A packed record's events are written into it when packing ends (Flush,
// Reset, or the session's next start or end event), as one string of known
// length, not event by event. So the records are complete only after Flush
// or Reset.
//
// An ordered writer (SetOrdered) also puts each session's events in time
// order at Flush (start, tokens, end at one instant in that order), for a
// batch gathered from datagrams that may overtake each other: an end that
// overtook the session's last token would otherwise make that token late.
// That costs a comparison per event while the events come in order; only
// the records of a session whose events did not are rewritten (reorder).
type RecordWriter struct {
	records  plog.LogRecordSlice
	observed pcommon.Timestamp
	// open maps a session ID to its token record in opens, while packing
	// (in an unordered writer, to its latest one, completed or not); in an
	// ordered writer, to its entry in opens from its first event of the
	// batch on, open token record or not.
	open  map[string]int32
	opens []openTokenRecord
	// ordered: see SetOrdered. disordered: a session's records came out of
	// time order in this batch, so Flush sorts them.
	ordered, disordered bool
	// recent caches open by IDSlot: 1 + the index in opens of the record
	// last looked up there, a hint checked against opens. It spares most
	// token events the map's hash and probe.
	recent [swar.IDSlots]int32
	// packed holds the events of all open records, each record's events
	// chained from first to last through next.
	packed []packedEvent
	text   []byte // scratch for the AttrTokenEvents string
}

type openTokenRecord struct {
	id  string
	rec plog.LogRecord
	// first and last index packed; events counts them.
	first, last, events int32
	// In an ordered writer: unsorted is set when an event packed is older
	// than the one before it (lastTime); prevTime and prevRank are the
	// order key (recordKey) of the session's latest event in a record of
	// the batch, which the next record's first must not be less than;
	// disordered is set when one was (reorder). Beside the int32s, the
	// small ones cost no room.
	prevRank   int8
	unsorted   bool
	disordered bool
	lastTime   int64
	prevTime   int64
}

// recordKey orders a session's records: by time (a token record's is its
// earliest event's), then start, tokens, end.
type recordKey struct {
	time int64
	kind int8 // 0 none yet, then kindRank
}

func (k recordKey) less(o recordKey) bool {
	return k.time < o.time || (k.time == o.time && k.kind < o.kind)
}

// kindRank is the place of a record of kind k among a session's records at
// one instant.
func kindRank(k tokenevent.Kind) int8 {
	switch k {
	case tokenevent.KindStart:
		return 1
	case tokenevent.KindToken:
		return 2
	}
	return 3
}

type packedEvent struct {
	time, count int64
	seq         int64 // -1 for none
	next        int32 // index in packed of the session's next event; -1 for none
}

// NewRecordWriter returns a writer with no destination; call Reset before use.
func NewRecordWriter() *RecordWriter {
	return &RecordWriter{open: make(map[string]int32)}
}

// SetOrdered makes the writer put each session's events in time order at
// Flush (see RecordWriter), or not. Call it after Reset, before the
// batch's first Append. The records slice must have been empty at Reset,
// as Flush sorts all of it.
func (w *RecordWriter) SetOrdered(on bool) { w.ordered = on }

// Reset completes the records of the previous destination (see Flush) and
// points w at records, stamping new records with observed as their observed
// timestamp. Packing never spans two Resets.
func (w *RecordWriter) Reset(records plog.LogRecordSlice, observed pcommon.Timestamp) {
	w.Flush()
	w.records = records
	w.observed = observed
}

// Flush completes the packed token records written so far. Events appended
// after it go into new records.
func (w *RecordWriter) Flush() {
	for i := range w.opens {
		w.complete(&w.opens[i])
	}
	if w.disordered {
		w.disordered = false
		w.reorder()
	}
	w.clearOpen()
}

func (w *RecordWriter) clearOpen() {
	clear(w.open)
	// Cleared, not only truncated: a pooled writer must not keep the
	// records it wrote alive.
	clear(w.opens)
	w.opens = w.opens[:0]
	w.packed = w.packed[:0]
}

// openRecord returns the session's open token record, or nil.
func (w *RecordWriter) openRecord(id string) *openTokenRecord {
	slot := &w.recent[swar.IDSlot(id)]
	// Only an open record is cached under its ID, and a session has at most
	// one open record, so a record found here with that ID is the one.
	if i := int(*slot) - 1; i >= 0 && i < len(w.opens) && w.opens[i].id == id && (w.opens[i].events > 0 || w.ordered) {
		return &w.opens[i]
	}
	i, ok := w.open[id]
	// In an unordered writer a completed record stays in open (deleting it
	// was a map operation per session): it is open only while it has
	// events, as every record there has from its first.
	if !ok || (w.opens[i].events == 0 && !w.ordered) {
		return nil
	}
	*slot = i + 1
	return &w.opens[i]
}

// Append writes ev.
func (w *RecordWriter) Append(ev *tokenevent.Event) {
	o := w.openRecord(ev.SessionID)
	if o != nil && o.events > 0 {
		if ev.Kind == tokenevent.KindToken {
			w.pack(o, int64(ev.TimeUnixNano), ev.Count, seqOf(ev))
			return
		}
		// Later tokens of the session go after this event, so into a new
		// record: complete the open one now.
		w.complete(o)
		if !w.ordered {
			o = nil // a later token opens a new record (see openRecord)
		}
	}
	if w.ordered && ev.Kind != tokenevent.KindToken {
		k := recordKey{int64(ev.TimeUnixNano), kindRank(ev.Kind)}
		w.follows(w.entry(o, ev.SessionID), k, k)
	}
	lr := w.records.AppendEmpty()
	lr.SetTimestamp(pcommon.Timestamp(ev.TimeUnixNano))
	lr.SetObservedTimestamp(w.observed)
	attrs := lr.Attributes()
	switch ev.Kind {
	case tokenevent.KindStart:
		lr.SetEventName(EventNameStart)
		lr.SetTraceID(pcommon.TraceID(ev.TraceID))
		lr.SetSpanID(pcommon.SpanID(ev.SpanID))
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
		if ev.NoStream {
			attrs.PutBool(AttrRequestStream, false)
		}
		putNonEmpty(attrs, AttrTraceState, ev.TraceState)
		if len(ev.Attributes) > 0 {
			m := attrs.PutEmptyMap(AttrSessionAttributes)
			m.EnsureCapacity(len(ev.Attributes))
			for _, a := range ev.Attributes {
				m.PutStr(a.Key, a.Value)
			}
		}
	case tokenevent.KindToken:
		lr.SetEventName(EventNameToken)
		// Room for the session ID and the events (AttrTokenEvents) or a
		// single event's count or seq; both of the latter are rare.
		attrs.EnsureCapacity(2)
		attrs.PutStr(AttrSessionID, ev.SessionID)
		o = w.entry(o, ev.SessionID)
		o.rec = lr
		w.pack(o, int64(ev.TimeUnixNano), ev.Count, seqOf(ev))
	case tokenevent.KindEnd:
		lr.SetEventName(EventNameEnd)
		attrs.EnsureCapacity(5)
		attrs.PutStr(AttrSessionID, ev.SessionID)
		if ev.CompletionTokens >= 0 {
			attrs.PutInt(AttrOutputTokens, ev.CompletionTokens)
		}
		// An end may carry the input tokens when they are known only then
		// (the proxy reads them from the stream's usage chunk).
		if ev.PromptTokens >= 0 {
			attrs.PutInt(AttrInputTokens, ev.PromptTokens)
		}
		if ev.FinishReason != "" {
			attrs.PutEmptySlice(AttrFinishReasons).AppendEmpty().SetStr(ev.FinishReason)
		}
		putNonEmpty(attrs, AttrErrorType, ev.Error)
		putNonEmpty(attrs, AttrResponseModel, ev.ResponseModel)
		if ev.HasTiming() {
			attrs.PutStr(AttrTimingSource, ev.TimingSource)
			for _, t := range timingAttrs(ev) {
				if *t.ns >= 0 {
					attrs.PutInt(t.key, *t.ns)
				}
			}
		}
		for _, t := range shareAttrs(ev) {
			if *t.has && *t.v >= 0 {
				attrs.PutInt(t.key, *t.v)
			}
		}
	}
}

// shareAttrs pairs ev's engine share fields with their attributes.
func shareAttrs(ev *tokenevent.Event) [3]struct {
	key string
	v   *int64
	has *bool
} {
	return [3]struct {
		key string
		v   *int64
		has *bool
	}{
		{AttrEngineTimePrefillNs, &ev.EngineTimePrefillNs, &ev.HasEngineTime},
		{AttrEngineTimeDecodeNs, &ev.EngineTimeDecodeNs, &ev.HasEngineTime},
		{AttrEnergyMilliJ, &ev.EnergyMilliJ, &ev.HasEnergy},
	}
}

// entry returns o, or, when it is nil, a new entry in opens for the
// session id.
func (w *RecordWriter) entry(o *openTokenRecord, id string) *openTokenRecord {
	if o != nil {
		return o
	}
	i := int32(len(w.opens))
	w.open[id] = i
	w.recent[swar.IDSlot(id)] = i + 1
	w.opens = append(w.opens, openTokenRecord{id: id, first: -1, last: -1})
	return &w.opens[i]
}

// follows notes, in an ordered writer, that the session of o has a record
// with keys from first to last after those it had: the batch is out of
// order when first is less than the last key before.
func (w *RecordWriter) follows(o *openTokenRecord, first, last recordKey) {
	if first.less(recordKey{o.prevTime, o.prevRank}) {
		o.disordered, w.disordered = true, true
	}
	o.prevTime, o.prevRank = last.time, last.kind
}

// timingAttrs pairs ev's timing fields with their attributes.
func timingAttrs(ev *tokenevent.Event) [3]struct {
	key string
	ns  *int64
} {
	return [3]struct {
		key string
		ns  *int64
	}{{AttrQueueTimeNs, &ev.QueueTimeNs}, {AttrPrefillTimeNs, &ev.PrefillTimeNs}, {AttrDecodeTimeNs, &ev.DecodeTimeNs}}
}

// pack adds a token event to an open token record.
func (w *RecordWriter) pack(o *openTokenRecord, time, count, seq int64) {
	i := int32(len(w.packed))
	w.packed = append(w.packed, packedEvent{time: time, count: count, seq: seq, next: -1})
	if o.last >= 0 {
		w.packed[o.last].next = i
		o.unsorted = o.unsorted || time < o.lastTime
	} else {
		o.first = i
	}
	o.last = i
	o.lastTime = time
	o.events++
}

// complete writes an open record's events into it: one event as the
// single-event form, more as AttrTokenEvents. It leaves o empty, so
// completing it again does nothing.
func (w *RecordWriter) complete(o *openTokenRecord) {
	if w.ordered && o.events > 0 {
		if o.unsorted {
			o.disordered, w.disordered = true, true
		}
		rank := kindRank(tokenevent.KindToken)
		w.follows(o, recordKey{w.packed[o.first].time, rank}, recordKey{o.lastTime, rank})
	}
	switch {
	case o.events == 1:
		if c := w.packed[o.first].count; c != 1 {
			o.rec.Attributes().PutInt(AttrTokenCount, c)
		}
		if seq := w.packed[o.first].seq; seq >= 0 {
			o.rec.Attributes().PutInt(AttrTokenSeq, seq)
		}
	case o.events > 1:
		w.text = appendPacked(w.text[:0], w.packed, o.first)
		o.rec.Attributes().PutStr(AttrTokenEvents, string(w.text))
	}
	o.events, o.first, o.last, o.unsorted = 0, -1, -1, false
}

// reorder rewrites the records of the sessions whose events came out of
// order, each session's events in time order (recordKey), packed as an
// unordered writer packs them; they go after the other sessions' records,
// which stay as they are. It reads those records back, so it costs about
// what writing them did, for the sessions out of order only. A record that
// does not read back (none of this writer's does) leaves the batch as it
// came.
func (w *RecordWriter) reorder() {
	type item struct {
		ev      tokenevent.Event
		session int32
		key     recordKey
	}
	var items []item
	var ev tokenevent.Event
	for _, lr := range w.records.All() {
		session, ok := w.disorderedSession(lr)
		if !ok {
			continue
		}
		err := ReadRecord(lr, writtenLimits, &ev, func(e *tokenevent.Event) {
			c := *e
			c.Attributes = slices.Clone(e.Attributes)
			items = append(items, item{ev: c, session: session, key: recordKey{int64(e.TimeUnixNano), kindRank(e.Kind)}})
		})
		if err != nil {
			return
		}
	}
	slices.SortStableFunc(items, func(a, b item) int {
		switch {
		case a.session != b.session:
			return int(a.session - b.session)
		case a.key.less(b.key):
			return -1
		case b.key.less(a.key):
			return 1
		}
		return 0
	})
	w.records.RemoveIf(func(lr plog.LogRecord) bool {
		_, ok := w.disorderedSession(lr)
		return ok
	})
	w.clearOpen()
	w.ordered = false
	for i := range items {
		w.Append(&items[i].ev)
	}
	for i := range w.opens {
		w.complete(&w.opens[i])
	}
	w.ordered = true
}

// disorderedSession reports whether lr is a record of a session whose
// events came out of order, and that session's index in opens.
func (w *RecordWriter) disorderedSession(lr plog.LogRecord) (int32, bool) {
	v, ok := lr.Attributes().Get(AttrSessionID)
	if !ok {
		return 0, false
	}
	i, ok := w.open[v.Str()]
	return i, ok && w.opens[i].disordered
}

// writtenLimits read back what the writer wrote: its events were held to
// their limits when parsed.
var writtenLimits = tokenevent.Limits{MaxLineBytes: math.MaxInt, MaxSessionIDBytes: math.MaxInt, MaxAttributes: math.MaxInt}

// appendPacked appends the AttrTokenEvents form of the events chained from
// packed[first] to dst. Event times are positive int64s, so no offset
// overflows.
func appendPacked(dst []byte, packed []packedEvent, first int32) []byte {
	base := packed[first].time
	for i := first; i >= 0; i = packed[i].next {
		if i != first {
			dst = append(dst, ' ')
		}
		off := packed[i].time - base
		if off < 0 {
			dst = append(dst, '-')
			off = -off
		}
		dst = appendDecimal(dst, uint64(off))
		if c := packed[i].count; c != 1 {
			dst = append(dst, ':')
			dst = appendDecimal(dst, uint64(c)) // CheckCount: at least 1
		}
		if seq := packed[i].seq; seq >= 0 {
			dst = append(dst, '#')
			dst = appendDecimal(dst, uint64(seq))
		}
	}
	return dst
}

// seqOf is ev's seq in the record form, -1 for none.
func seqOf(ev *tokenevent.Event) int64 {
	if !ev.HasSeq {
		return -1
	}
	return int64(ev.Seq) // at most MaxInt64 (tokenevent.CheckSeq)
}

func setSeq(ev *tokenevent.Event, seq int64) {
	ev.Seq, ev.HasSeq = uint64(max(seq, 0)), seq >= 0
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
// ev is the Event passed to fn, reused between calls. Every event is held to
// the rules and limits the wire parser applies (tokenevent's Validate with
// limits): a record from any OTLP sender is trusted no more than a hook's
// line. It returns a *tokenevent.FieldError naming the attribute at fault
// when lr is not a valid token event record; fn is not called then.
func ReadRecord(lr plog.LogRecord, limits tokenevent.Limits, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	ev.Reset()
	switch lr.EventName() {
	case EventNameStart:
		ev.Kind = tokenevent.KindStart
	case EventNameToken:
		ev.Kind = tokenevent.KindToken
	case EventNameEnd:
		ev.Kind = tokenevent.KindEnd
	default:
		return &tokenevent.FieldError{Field: "event_name", Reason: fmt.Sprintf("want a token event, got %q", lr.EventName())}
	}
	attrs := lr.Attributes()
	sid, err := strAttr(attrs, AttrSessionID)
	if err != nil {
		return err
	}
	if sid == "" {
		return &tokenevent.FieldError{Field: AttrSessionID, Reason: "missing"}
	}
	if err := tokenevent.CheckSessionID(sid, limits.MaxSessionIDBytes); err != nil {
		err.Field = AttrSessionID
		return err
	}
	ev.SessionID = sid
	ev.TimeUnixNano = uint64(lr.Timestamp())
	if ev.TimeUnixNano == 0 {
		return &tokenevent.FieldError{Field: "time_unix_nano", Reason: "missing"}
	}
	if err := tokenevent.CheckTime(ev.TimeUnixNano); err != nil {
		return err
	}
	switch ev.Kind {
	case tokenevent.KindStart:
		return readStart(lr, attrs, limits, ev, fn)
	case tokenevent.KindToken:
		return readToken(attrs, ev, fn)
	default:
		return readEnd(attrs, ev, fn)
	}
}

func readStart(lr plog.LogRecord, attrs pcommon.Map, limits tokenevent.Limits, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	ev.TraceID = tokenevent.TraceID(lr.TraceID())
	ev.SpanID = tokenevent.SpanID(lr.SpanID())
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
	if ev.TraceState, err = strAttr(attrs, AttrTraceState); err != nil {
		return err
	}
	if v, ok := attrs.Get(AttrRequestStream); ok {
		if v.Type() != pcommon.ValueTypeBool {
			return &tokenevent.FieldError{Field: AttrRequestStream, Reason: "want a bool, got " + v.Type().String()}
		}
		ev.NoStream = !v.Bool()
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
			return &tokenevent.FieldError{Field: AttrParentSpanID, Reason: fmt.Sprintf("want 16 hex digits, got %d", len(parent))}
		}
		if _, err := hex.Decode(ev.ParentSpanID[:], []byte(parent)); err != nil {
			return &tokenevent.FieldError{Field: AttrParentSpanID, Reason: "want 16 hex digits"}
		}
	}
	if v, ok := attrs.Get(AttrSessionAttributes); ok {
		if v.Type() != pcommon.ValueTypeMap {
			return &tokenevent.FieldError{Field: AttrSessionAttributes, Reason: "want a map, got " + v.Type().String()}
		}
		for k, a := range v.Map().All() {
			ev.Attributes = append(ev.Attributes, tokenevent.Attribute{Key: k, Value: a.AsString()})
		}
	}
	if err := ev.Validate(limits); err != nil {
		return err
	}
	fn(ev)
	return nil
}

func readToken(attrs pcommon.Map, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	if v, ok := attrs.Get(AttrTokenEvents); ok {
		if v.Type() != pcommon.ValueTypeStr {
			return &tokenevent.FieldError{Field: AttrTokenEvents, Reason: "want a string, got " + v.Type().String()}
		}
		return readPacked(v.Str(), int64(ev.TimeUnixNano), ev, fn) // CheckTime: within an int64
	}
	n, err := intAttr(attrs, AttrTokenCount, 1)
	if err != nil {
		return err
	}
	if err := tokenevent.CheckCount(n); err != nil {
		err.Field = AttrTokenCount
		return err
	}
	seq, err := intAttr(attrs, AttrTokenSeq, -1)
	if err != nil {
		return err
	}
	setSeq(ev, seq)
	ev.Count = n
	fn(ev)
	return nil
}

// readPacked reads the AttrTokenEvents form s of a record stamped base,
// all of it before fn sees any event: a record is valid or not. Up to
// len(buf) events are decoded once into buf, more are scanned twice.
func readPacked(s string, base int64, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	var buf [64]packedEvent
	n, err := scanPacked(s, base, buf[:])
	if err != nil {
		return err
	}
	if n > len(buf) {
		scanPackedTo(s, base, ev, fn)
		return nil
	}
	for _, p := range buf[:n] {
		ev.TimeUnixNano, ev.Count = uint64(p.time), p.count
		setSeq(ev, p.seq)
		fn(ev)
	}
	return nil
}

// scanPacked checks s, storing its first len(buf) events in buf, and
// returns the number of events.
func scanPacked(s string, base int64, buf []packedEvent) (int, error) {
	for i, n := 0, 0; ; n++ {
		t, count, seq, j, err := packedEntry(s, i, base, n)
		if err != nil {
			return 0, err
		}
		if n < len(buf) {
			buf[n] = packedEvent{time: t, count: count, seq: seq}
		}
		if j == len(s) {
			return n + 1, nil
		}
		i = j + 1
	}
}

// scanPackedTo calls fn for each event of s, which scanPacked accepted.
func scanPackedTo(s string, base int64, ev *tokenevent.Event, fn func(*tokenevent.Event)) {
	for i, n := 0, 0; ; n++ {
		t, count, seq, j, _ := packedEntry(s, i, base, n)
		ev.TimeUnixNano, ev.Count = uint64(t), count
		setSeq(ev, seq)
		fn(ev)
		if j == len(s) {
			return
		}
		i = j + 1
	}
}

// packedEntry reads event n, "<offset>[:<count>][#<seq>]", from s[i:],
// returning its time, count and seq (-1 for none) and where it ends: at the
// end of s or at the space before the next event.
func packedEntry(s string, i int, base int64, n int) (t, count, seq int64, next int, err error) {
	off, j, ok := packedInt(s, i, true)
	count, seq = 1, -1
	if ok && j < len(s) && s[j] == ':' {
		count, j, ok = packedInt(s, j+1, false)
		ok = ok && count >= 1
	}
	if ok && j < len(s) && s[j] == '#' {
		seq, j, ok = packedInt(s, j+1, false)
	}
	if !ok || (j < len(s) && s[j] != ' ') {
		return 0, 0, 0, 0, &tokenevent.FieldError{Field: AttrTokenEvents, Reason: fmt.Sprintf("event %d: want <offset ns>[:<count>][#<seq>], events separated by one space", n)}
	}
	if ferr := tokenevent.CheckCount(count); ferr != nil {
		return 0, 0, 0, 0, &tokenevent.FieldError{Field: AttrTokenEvents, Reason: fmt.Sprintf("event %d: count %s", n, ferr.Reason)}
	}
	// base >= 0, so only a positive offset can overflow, and it wraps
	// below zero.
	if t = base + off; t <= 0 {
		return 0, 0, 0, 0, &tokenevent.FieldError{Field: AttrTokenEvents, Reason: fmt.Sprintf("event %d: time is not a positive int64", n)}
	}
	return t, count, seq, j, nil
}

// packedInt reads a decimal int64 from s[i:], with a leading '-' if signed:
// 1 to 19 digits.
func packedInt(s string, i int, signed bool) (v int64, next int, ok bool) {
	neg := signed && i < len(s) && s[i] == '-'
	if neg {
		i++
	}
	start := i
	var u uint64
	// Eight digits at a time while there are (an offset has about eight:
	// tens of ms), as tokenparse reads a line's times; digit by digit this
	// was the reader's largest cost per packed event.
	for i+8 <= len(s) && i-start <= 19-8 {
		x := swar.LoadLE64(s[i : i+8])
		if !swar.EightDigits(x) {
			break
		}
		u = u*100_000_000 + swar.EightDigitsValue(x)
		i += 8
	}
	for i < len(s) && i-start < 19 && s[i]-'0' <= 9 {
		u = u*10 + uint64(s[i]-'0')
		i++
	}
	if i == start || u > math.MaxInt64 || (i < len(s) && s[i]-'0' <= 9) {
		return 0, i, false
	}
	if neg {
		return -int64(u), i, true
	}
	return int64(u), i, true
}

func readEnd(attrs pcommon.Map, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	var err error
	if ev.CompletionTokens, err = intAttr(attrs, AttrOutputTokens, -1); err != nil {
		return err
	}
	if ev.PromptTokens, err = intAttr(attrs, AttrInputTokens, -1); err != nil {
		return err
	}
	if ev.Error, err = strAttr(attrs, AttrErrorType); err != nil {
		return err
	}
	if ev.ResponseModel, err = strAttr(attrs, AttrResponseModel); err != nil {
		return err
	}
	if ev.TimingSource, err = strAttr(attrs, AttrTimingSource); err != nil {
		return err
	}
	for _, t := range timingAttrs(ev) {
		if *t.ns, err = intAttr(attrs, t.key, -1); err != nil {
			return err
		}
		if *t.ns >= 0 && ev.TimingSource == "" {
			ev.TimingSource = tokenevent.TimingHook // an SDK's record that did not say
		}
	}
	for _, t := range shareAttrs(ev) {
		if *t.v, err = intAttr(attrs, t.key, -1); err != nil {
			return err
		}
		if *t.v >= 0 {
			*t.has = true
		} else {
			*t.v = 0
		}
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
			return &tokenevent.FieldError{Field: AttrFinishReasons, Reason: "want a string array, got " + v.Type().String()}
		}
	}
	// The limits are those of the other kinds (session ID, time): checked
	// above, before the kind's own attributes.
	fn(ev)
	return nil
}

func strAttr(m pcommon.Map, k string) (string, error) {
	v, ok := m.Get(k)
	if !ok {
		return "", nil
	}
	if v.Type() != pcommon.ValueTypeStr {
		return "", &tokenevent.FieldError{Field: k, Reason: "want a string, got " + v.Type().String()}
	}
	return v.Str(), nil
}

func intAttr(m pcommon.Map, k string, absent int64) (int64, error) {
	v, ok := m.Get(k)
	if !ok {
		return absent, nil
	}
	if v.Type() != pcommon.ValueTypeInt || v.Int() < 0 {
		return 0, &tokenevent.FieldError{Field: k, Reason: "want a non-negative int, got " + v.AsString()}
	}
	return v.Int(), nil
}
