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

// RecordWriter appends token events to a log record slice. It writes no
// record per token event, since a pdata record per token is the dominant
// cost at high rates, nor one per session and batch, the cost where a batch
// holds few tokens of each session: a session's token events are held
// until an event of its own must follow them (its start, end or move, which
// first writes the tokens held as one record of the session), or until
// Flush, which writes the tokens still held of every session as one batch
// record (AttrTokenSessions), or as the session's own record when only one
// session has any.
//
// So the token events are written as each session's tokens end, not event
// by event, each record as one string of known length, and the records are
// complete only after Flush or Reset. Each session's order is kept; the
// records of different sessions are regrouped.
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
	// index maps a session ID to its entry in sessions, while it holds
	// tokens (in an unordered writer, to its latest entry, holding tokens
	// or not); in an ordered writer, from its first event of the batch on,
	// holding tokens or not.
	index    map[string]int32
	sessions []sessionTokens
	// ordered: see SetOrdered. disordered: a session's records came out of
	// time order in this batch, so Flush sorts them.
	ordered, disordered bool
	// recent caches index by IDSlot: 1 + the index in sessions of the
	// entry last looked up there, a hint checked against sessions. It
	// spares most token events the map's hash and probe.
	recent [swar.IDSlots]int32
	// packed holds the events of all held tokens, each session's chained
	// from first to last through next.
	packed []packedEvent
	text   []byte // scratch for the AttrTokenEvents or AttrTokenSessions string
}

// sessionTokens are the token events a session holds in a writer.
type sessionTokens struct {
	id string
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
	return &RecordWriter{index: make(map[string]int32)}
}

// SetOrdered makes the writer put each session's events in time order at
// Flush (see RecordWriter), or not. Call it after Reset, before the
// batch's first Append. The records slice must have been empty at Reset,
// as Flush sorts all of it.
func (w *RecordWriter) SetOrdered(on bool) { w.ordered = on }

// Reset completes the records of the previous destination (see Flush) and
// points w at records, stamping new records with observed as their observed
// timestamp. A record never spans two Resets.
func (w *RecordWriter) Reset(records plog.LogRecordSlice, observed pcommon.Timestamp) {
	w.Flush()
	w.records = records
	w.observed = observed
}

// Flush writes the token events held so far (see RecordWriter). Events
// appended after it go into new records.
func (w *RecordWriter) Flush() {
	w.writeHeld()
	if w.disordered {
		w.disordered = false
		w.reorder()
	}
	w.clearSessions()
}

func (w *RecordWriter) clearSessions() {
	clear(w.index)
	// Cleared, not only truncated: a pooled writer must not keep the
	// session IDs it wrote alive.
	clear(w.sessions)
	w.sessions = w.sessions[:0]
	w.packed = w.packed[:0]
}

// held returns the session's entry while it holds tokens (in an ordered
// writer, from its first event on), or nil.
func (w *RecordWriter) held(id string) *sessionTokens {
	slot := &w.recent[swar.IDSlot(id)]
	// Only a held entry is cached under its ID, and a session has at most
	// one, so an entry found here with that ID is the one.
	if i := int(*slot) - 1; i >= 0 && i < len(w.sessions) && w.sessions[i].id == id && (w.sessions[i].events > 0 || w.ordered) {
		return &w.sessions[i]
	}
	i, ok := w.index[id]
	// In an unordered writer an entry whose tokens were written stays in
	// index (deleting it was a map operation per session): it is held only
	// while it has events, as every entry there has from its first.
	if !ok || (w.sessions[i].events == 0 && !w.ordered) {
		return nil
	}
	*slot = i + 1
	return &w.sessions[i]
}

// Append writes ev.
func (w *RecordWriter) Append(ev *tokenevent.Event) {
	o := w.held(ev.SessionID)
	if o != nil && o.events > 0 {
		if ev.Kind == tokenevent.KindToken {
			w.pack(o, int64(ev.TimeUnixNano), ev.Count, seqOf(ev))
			return
		}
		// ev follows the session's tokens held: they go first, in a record
		// of the session's own.
		w.settle(o)
		w.writeSession(o)
		if !w.ordered {
			o = nil // a later token starts a new entry (see held)
		}
	}
	switch ev.Kind {
	case tokenevent.KindToken:
		w.pack(w.entry(o, ev.SessionID), int64(ev.TimeUnixNano), ev.Count, seqOf(ev))
		return
	case tokenevent.KindShare:
		w.appendShare(ev)
		return
	}
	if w.ordered {
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

// entry returns o, or, when it is nil, a new entry in sessions for the
// session id.
func (w *RecordWriter) entry(o *sessionTokens, id string) *sessionTokens {
	if o != nil {
		return o
	}
	i := int32(len(w.sessions))
	w.index[id] = i
	w.recent[swar.IDSlot(id)] = i + 1
	w.sessions = append(w.sessions, sessionTokens{id: id, first: -1, last: -1})
	return &w.sessions[i]
}

// follows notes, in an ordered writer, that the session of o has a record
// with keys from first to last after those it had: the batch is out of
// order when first is less than the last key before.
func (w *RecordWriter) follows(o *sessionTokens, first, last recordKey) {
	if first.less(recordKey{o.prevTime, o.prevRank}) {
		o.disordered, w.disordered = true, true
	}
	o.prevTime, o.prevRank = last.time, last.kind
}

// pack holds a token event of the session of o.
func (w *RecordWriter) pack(o *sessionTokens, time, count, seq int64) {
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

// settle notes, in an ordered writer, the place in its session's order of
// the tokens o holds, which are about to be written (see follows).
func (w *RecordWriter) settle(o *sessionTokens) {
	if !w.ordered {
		return
	}
	if o.unsorted {
		o.disordered, w.disordered = true, true
	}
	rank := kindRank(tokenevent.KindToken)
	w.follows(o, recordKey{w.packed[o.first].time, rank}, recordKey{o.lastTime, rank})
}

// writeHeld writes the tokens held at the batch's end, which no event of
// their sessions follows: those of several sessions as one batch record,
// those of one as its own record. In an ordered writer the tokens of a
// session out of order get a record of their own, which reorder finds by
// its AttrSessionID.
func (w *RecordWriter) writeHeld() {
	var held int
	var only *sessionTokens
	for i := range w.sessions {
		o := &w.sessions[i]
		if o.events == 0 {
			continue
		}
		w.settle(o)
		if o.disordered {
			w.writeSession(o)
			continue
		}
		held++
		only = o
	}
	switch {
	case held == 1:
		w.writeSession(only)
	case held > 1:
		w.writeBatch()
	}
}

// writeSession writes the tokens o holds as a record of their session: one
// event as the single-event form, more as AttrTokenEvents. It leaves o
// empty.
func (w *RecordWriter) writeSession(o *sessionTokens) {
	lr := w.records.AppendEmpty()
	lr.SetEventName(EventNameToken)
	base := w.packed[o.first].time
	lr.SetTimestamp(pcommon.Timestamp(base))
	lr.SetObservedTimestamp(w.observed)
	attrs := lr.Attributes()
	// Room for the session ID and the events (AttrTokenEvents) or a
	// single event's count or seq; both of the latter are rare.
	attrs.EnsureCapacity(2)
	attrs.PutStr(AttrSessionID, o.id)
	if o.events == 1 {
		if c := w.packed[o.first].count; c != 1 {
			attrs.PutInt(AttrTokenCount, c)
		}
		if seq := w.packed[o.first].seq; seq >= 0 {
			attrs.PutInt(AttrTokenSeq, seq)
		}
	} else {
		w.text = appendPacked(w.text[:0], w.packed, o.first, base)
		attrs.PutStr(AttrTokenEvents, string(w.text))
	}
	o.events, o.first, o.last, o.unsorted = 0, -1, -1, false
}

// writeBatch writes the tokens every session holds as one AttrTokenSessions
// record, the sessions in the order of their first token, stamped with the
// first one's first event; it leaves every entry empty.
func (w *RecordWriter) writeBatch() {
	w.text = w.text[:0]
	var base int64
	for i := range w.sessions {
		o := &w.sessions[i]
		if o.events == 0 {
			continue
		}
		if len(w.text) == 0 {
			base = w.packed[o.first].time
		} else {
			w.text = append(w.text, '\n')
		}
		w.text = appendDecimal(w.text, uint64(len(o.id)))
		w.text = append(w.text, ' ')
		w.text = append(w.text, o.id...)
		w.text = append(w.text, ' ')
		w.text = appendPacked(w.text, w.packed, o.first, base)
		o.events, o.first, o.last, o.unsorted = 0, -1, -1, false
	}
	lr := w.records.AppendEmpty()
	lr.SetEventName(EventNameToken)
	lr.SetTimestamp(pcommon.Timestamp(base))
	lr.SetObservedTimestamp(w.observed)
	lr.Attributes().PutStr(AttrTokenSessions, string(w.text))
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
	w.clearSessions()
	w.ordered = false
	for i := range items {
		w.Append(&items[i].ev)
	}
	w.writeHeld()
	w.ordered = true
}

// disorderedSession reports whether lr is a record of a session whose
// events came out of order, and that session's index in sessions.
func (w *RecordWriter) disorderedSession(lr plog.LogRecord) (int32, bool) {
	v, ok := lr.Attributes().Get(AttrSessionID)
	if !ok {
		return 0, false
	}
	i, ok := w.index[v.Str()]
	return i, ok && w.sessions[i].disordered
}

// writtenLimits read back what the writer wrote: its events were held to
// their limits when parsed.
var writtenLimits = tokenevent.Limits{MaxLineBytes: math.MaxInt, MaxSessionIDBytes: math.MaxInt, MaxAttributes: math.MaxInt}

func putNonEmpty(m pcommon.Map, k, v string) {
	if v != "" {
		m.PutStr(k, v)
	}
}
