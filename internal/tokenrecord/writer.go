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

// RecordWriter appends token events to a log record slice. A pdata record
// per token event is the dominant cost at high rates, and one per session
// and batch where a batch holds few tokens of each session, so the token
// events of many sessions share one record (AttrTokenSessions).
//
// Where a session's token events are folded matters beyond the session: a
// session's first token ends its prefill in token_session's division of
// the engine's time among its sessions, so it must come between the other
// sessions' starts and ends as it came. So a token record takes its place
// in records where its first event came, and holds a run of tokens of
// each session that came before any other event since: the session's
// tokens from that first on, up to the session's next event of another
// kind (start, end, move), which ends its run. A session's later tokens
// start a run in the latest token record, or in a new one when an event
// other than a token came after that one's place. The events of a record
// that holds one session's run only are written in that session's own
// record (AttrSessionID with AttrTokenEvents, or a single event's count).
//
// So each session's order is kept, every run's first token keeps its
// place among the other events, and the records are written once, at
// Flush or Reset, each as one string of known length.
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
	// index maps a session ID to its entry in sessions: every session with
	// a token in the batch, and in an ordered writer every session with an
	// event.
	index    map[string]int32
	sessions []sessionTokens
	// runs are the sessions' runs of tokens, in the order they began:
	// those of one token record are consecutive.
	runs []tokenRun
	// tokenRecords are the token records placed in records, in order; the
	// latest takes new runs while open, until an event that is no token.
	tokenRecords []plog.LogRecord
	open         bool
	// ordered: see SetOrdered. disordered: a session's records came out of
	// time order in this batch, so Flush sorts them.
	ordered, disordered bool
	// recent caches index by IDSlot: 1 + the index in sessions of the
	// entry last looked up there, a hint checked against sessions. It
	// spares most token events the map's hash and probe.
	recent [swar.IDSlots]int32
	// packed holds the runs' events, each run's linked from first to
	// last through next.
	packed []packedEvent
	text   []byte // scratch for the AttrTokenEvents or AttrTokenSessions string
}

// sessionTokens is a session in a writer's batch.
type sessionTokens struct {
	id string
	// run is the index in runs of the session's run under way, -1
	// for none.
	run int32
	// In an ordered writer: prevTime and prevRank are the order key
	// (recordKey) of the session's latest event in a record of the batch,
	// which the next record's first must not be less than; disordered is
	// set when one was (reorder).
	prevRank   int8
	disordered bool
	prevTime   int64
}

// tokenRun is a run of a session's token events with no other event of
// the session among them, in one token record.
type tokenRun struct {
	session int32 // index in sessions
	record  int32 // index in tokenRecords
	// first and last index packed; events counts them.
	first, last, events int32
	// unsorted is set when an event packed is older than the one before
	// it (lastTime).
	unsorted bool
	lastTime int64
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

// Flush writes the token records (see RecordWriter). Events appended
// after it go into new records.
func (w *RecordWriter) Flush() {
	w.writeTokens()
	if w.disordered {
		w.disordered = false
		w.reorder()
	}
	w.clearBatch()
}

func (w *RecordWriter) clearBatch() {
	clear(w.index)
	// Cleared, not only truncated: a pooled writer must not keep the
	// session IDs and records it wrote alive.
	clear(w.sessions)
	w.sessions = w.sessions[:0]
	clear(w.tokenRecords)
	w.tokenRecords = w.tokenRecords[:0]
	w.runs = w.runs[:0]
	w.packed = w.packed[:0]
	w.open = false
}

// session returns the index of the session's entry in sessions, or -1.
func (w *RecordWriter) session(id string) int32 {
	slot := &w.recent[swar.IDSlot(id)]
	if i := *slot - 1; i >= 0 && int(i) < len(w.sessions) && w.sessions[i].id == id {
		return i
	}
	i, ok := w.index[id]
	if !ok {
		return -1
	}
	*slot = i + 1
	return i
}

// Append writes ev.
func (w *RecordWriter) Append(ev *tokenevent.Event) {
	i := w.session(ev.SessionID)
	if ev.Kind == tokenevent.KindToken {
		if i < 0 {
			i = w.entry(ev.SessionID)
		}
		o := &w.sessions[i]
		if o.run < 0 {
			o.run = w.startRun(i)
		}
		w.pack(&w.runs[o.run], int64(ev.TimeUnixNano), ev.Count, seqOf(ev))
		return
	}
	// ev follows every token so far: a run that begins after it goes
	// into a record after it, and its session's run ends before it.
	w.open = false
	if i >= 0 && w.sessions[i].run >= 0 {
		o := &w.sessions[i]
		w.settle(o, &w.runs[o.run])
		o.run = -1
	}
	if ev.Kind == tokenevent.KindShare {
		w.appendShare(ev)
		return
	}
	if w.ordered {
		if i < 0 {
			i = w.entry(ev.SessionID)
		}
		k := recordKey{int64(ev.TimeUnixNano), kindRank(ev.Kind)}
		w.follows(&w.sessions[i], k, k)
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

// entry adds an entry for the session id to sessions and returns its
// index.
func (w *RecordWriter) entry(id string) int32 {
	i := int32(len(w.sessions))
	w.index[id] = i
	w.recent[swar.IDSlot(id)] = i + 1
	w.sessions = append(w.sessions, sessionTokens{id: id, run: -1})
	return i
}

// startRun starts a run of session (its index in sessions) in the
// latest token record, or in a new one when that one is closed, and
// returns its index in runs.
func (w *RecordWriter) startRun(session int32) int32 {
	if !w.open {
		w.tokenRecords = append(w.tokenRecords, w.records.AppendEmpty())
		w.open = true
	}
	i := int32(len(w.runs))
	w.runs = append(w.runs, tokenRun{session: session, record: int32(len(w.tokenRecords) - 1), first: -1, last: -1})
	return i
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

// pack adds a token event to a run.
func (w *RecordWriter) pack(c *tokenRun, time, count, seq int64) {
	i := int32(len(w.packed))
	w.packed = append(w.packed, packedEvent{time: time, count: count, seq: seq, next: -1})
	if c.last >= 0 {
		w.packed[c.last].next = i
		c.unsorted = c.unsorted || time < c.lastTime
	} else {
		c.first = i
	}
	c.last = i
	c.lastTime = time
	c.events++
}

// settle notes, in an ordered writer, the place in its session's order of
// the run c of the session of o, which has ended (see follows).
func (w *RecordWriter) settle(o *sessionTokens, c *tokenRun) {
	if !w.ordered {
		return
	}
	if c.unsorted {
		o.disordered, w.disordered = true, true
	}
	rank := kindRank(tokenevent.KindToken)
	w.follows(o, recordKey{w.packed[c.first].time, rank}, recordKey{c.lastTime, rank})
}

// writeTokens writes the token records placed: the runs of each, as one
// AttrTokenSessions string, or as its session's own record when it holds
// one. In an ordered writer the runs of a session out of order go into
// records of their own at the end, which reorder finds by their
// AttrSessionID (and removes a token record left with none).
func (w *RecordWriter) writeTokens() {
	for i := range w.sessions {
		if o := &w.sessions[i]; o.run >= 0 {
			w.settle(o, &w.runs[o.run])
			o.run = -1
		}
	}
	for from := 0; from < len(w.runs); {
		rec := w.runs[from].record
		to := from + 1
		for to < len(w.runs) && w.runs[to].record == rec {
			to++
		}
		runs := w.runs[from:to]
		from = to
		if w.disordered {
			runs = w.takeDisordered(runs)
		}
		lr := w.tokenRecords[rec]
		switch len(runs) {
		case 0:
			// Its runs went to records of their own; reorder removes it.
		case 1:
			w.writeSession(lr, &runs[0])
		default:
			w.writeBatch(lr, runs)
		}
	}
}

// takeDisordered writes the runs of sessions out of order as records of
// their own at the end, and returns the others.
func (w *RecordWriter) takeDisordered(runs []tokenRun) []tokenRun {
	kept := runs[:0]
	for _, c := range runs {
		if w.sessions[c.session].disordered {
			w.writeSession(w.records.AppendEmpty(), &c)
		} else {
			kept = append(kept, c)
		}
	}
	return kept
}

// writeSession writes run c into lr as a record of its session: one
// event as the single-event form, more as AttrTokenEvents.
func (w *RecordWriter) writeSession(lr plog.LogRecord, c *tokenRun) {
	lr.SetEventName(EventNameToken)
	base := w.packed[c.first].time
	lr.SetTimestamp(pcommon.Timestamp(base))
	lr.SetObservedTimestamp(w.observed)
	attrs := lr.Attributes()
	// Room for the session ID and the events (AttrTokenEvents) or a
	// single event's count or seq; both of the latter are rare.
	attrs.EnsureCapacity(2)
	attrs.PutStr(AttrSessionID, w.sessions[c.session].id)
	if c.events == 1 {
		if n := w.packed[c.first].count; n != 1 {
			attrs.PutInt(AttrTokenCount, n)
		}
		if seq := w.packed[c.first].seq; seq >= 0 {
			attrs.PutInt(AttrTokenSeq, seq)
		}
		return
	}
	w.text = appendPacked(w.text[:0], w.packed, c.first, base)
	attrs.PutStr(AttrTokenEvents, string(w.text))
}

// writeBatch writes runs into lr as one AttrTokenSessions record, in
// the order they began, stamped with the first one's first event.
func (w *RecordWriter) writeBatch(lr plog.LogRecord, runs []tokenRun) {
	base := w.packed[runs[0].first].time
	w.text = w.text[:0]
	for i := range runs {
		c := &runs[i]
		if i > 0 {
			w.text = append(w.text, '\n')
		}
		id := w.sessions[c.session].id
		w.text = appendDecimal(w.text, uint64(len(id)))
		w.text = append(w.text, ' ')
		w.text = append(w.text, id...)
		w.text = append(w.text, ' ')
		w.text = appendPacked(w.text, w.packed, c.first, base)
	}
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
// came, less the token records that takeDisordered emptied.
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
			w.records.RemoveIf(func(lr plog.LogRecord) bool { return lr.EventName() == "" })
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
		return ok || lr.EventName() == "" // a token record whose runs all went
	})
	w.clearBatch()
	w.ordered = false
	for i := range items {
		w.Append(&items[i].ev)
	}
	w.writeTokens()
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
