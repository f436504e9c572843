// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenrecord // import "github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"

import (
	"encoding/hex"
	"math"
	"slices"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/internal/swar"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
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
	case tokenevent.KindToken, tokenevent.KindMove:
		// At one instant a move stays where it came among the tokens:
		// after those it carried, before the continuation's.
		return 2
	}
	return 3
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
	if ev.Kind == tokenevent.KindShare {
		w.appendShare(ev)
		return
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
		if ev.PromptBytes > 0 {
			attrs.PutInt(AttrPromptBytes, ev.PromptBytes)
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
		if ev.Migrations > 0 {
			attrs.PutInt(AttrMigrations, ev.Migrations)
		}
	case tokenevent.KindMove:
		lr.SetEventName(EventNameMove)
		attrs.EnsureCapacity(4)
		attrs.PutStr(AttrSessionID, ev.SessionID)
		putNonEmpty(attrs, AttrMigrationTo, ev.Engine)
		putNonEmpty(attrs, AttrMigrationReason, ev.Error)
		attrs.PutInt(AttrMigrationTokensCarried, ev.Count)
	}
}

// appendShare writes a share: a record of its own, of no session, so in no
// session's order.
func (w *RecordWriter) appendShare(ev *tokenevent.Event) {
	lr := w.records.AppendEmpty()
	lr.SetEventName(EventNameShare)
	lr.SetTimestamp(pcommon.Timestamp(ev.TimeUnixNano))
	lr.SetObservedTimestamp(w.observed)
	attrs := lr.Attributes()
	attrs.EnsureCapacity(5)
	attrs.PutStr(AttrEngineRequestID, ev.EngineRequestID)
	putNonEmpty(attrs, AttrEngine, ev.Engine)
	for _, t := range shareAttrs(ev) {
		if *t.has && *t.v >= 0 {
			attrs.PutInt(t.key, *t.v)
		}
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

func putNonEmpty(m pcommon.Map, k, v string) {
	if v != "" {
		m.PutStr(k, v)
	}
}
