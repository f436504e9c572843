// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// Observer keeps the Table user's per-session state S, which lives in the
// Table's entry beside the Session (one allocation, its cache lines read
// together): Started fills it in and Gap updates it, on the per-token path,
// where a Report per gap would cost. They are called inside Table methods,
// so they must not block and must not call back into the Table. What needs
// more than S (outputs, held spans) comes out as Reports instead, handled
// after the Table returns. state stays where it is until the session's
// ReportEnded is released; then it is zeroed for a next session.
type Observer[S any] interface {
	// Started: a new session; state is zero. HasStart is false when a
	// token event arrived before the start; its start fields are filled in
	// later.
	Started(s *Session, state *S)
	// Gap: n per-token gaps of g each (a chunk of n tokens arriving g·n
	// after the previous one).
	Gap(s *Session, state *S, g time.Duration, n int64)
	// FirstToken: s's first token (s.FirstTokenTime), the end of its
	// prefill; once per session.
	FirstToken(s *Session, state *S)
	// Restarted: the start of a session opened by an earlier token event
	// arrived and filled in its model, engine and attributes.
	Restarted(s *Session, state *S)
}

// ReportKind is what a Report tells.
type ReportKind uint8

const (
	// ReportStalled: a stall episode began (Report.Stall, StallCount and
	// Chunks).
	ReportStalled ReportKind = iota + 1
	// ReportKeptEarly: the session's verdict became keep before its end (a
	// TTFT breach at the first token, or a stall), so the trace can be
	// released (Report.Trace).
	ReportKeptEarly
	// ReportEnded: the session ended and its verdict is final (Report.End
	// and Trace). It is the session's last report.
	ReportEnded
)

// Report is something the Table learned that its user acts on after the
// call that made it: Apply, Tick and Shutdown append Reports to a slice the
// caller owns, in the order things happened. The Session stays valid until
// the caller hands the Reports back with Release; what may change before
// that (a later event of the same batch) is copied into the Report.
type Report[S any] struct {
	Kind    ReportKind
	Session *Session
	// State is the session's state, as the Observer keeps it, until
	// Release.
	State *S

	// Stall is the episode of a ReportStalled; StallCount and Chunks are
	// the session's when it was detected.
	Stall      Stall
	StallCount int
	Chunks     int32

	// End is that of a ReportEnded: what the end event said. Trace is the
	// verdict on the session's trace after a ReportEnded or
	// ReportKeptEarly.
	End   End
	Trace TraceVerdict
	// At is when (engine time) the early verdict of a ReportKeptEarly was
	// reached: the first token for a TTFT breach, the detection of a stall.
	At int64

	// entry is where Session and State live, for Release.
	entry *entry[S]
}

// entry is a Session with its Observer state beside it: both are read on
// every token, so they share the allocation and its cache lines.
type entry[S any] struct {
	Session
	state S
}

// TraceVerdict is the state of a session's trace when the session ends
// or is kept early.
type TraceVerdict struct {
	// Done: no other active session shares the trace ID.
	Done bool
	// Kept: some session of the trace was kept, now or before (a keep
	// holds for the whole trace).
	Kept bool
	// Threshold is the trace's sampling threshold when Kept: the lowest of
	// its kept sessions', which every kept span of the trace carries.
	Threshold sampling.Threshold
}

// TraceMemory tells the verdict given to a trace whose sessions have all
// ended: kept, and with which threshold. The token_session processor
// answers from its verdict cache, so that a trace once kept stays kept
// when it calls the model again.
type TraceMemory func(pcommon.TraceID) (th sampling.Threshold, kept bool)

// Counters count the events the table could not use as they came; they
// only grow.
type Counters struct {
	// OrphanTokens opened a session before its start arrived.
	OrphanTokens uint64
	// OrphanEnds ended a session never seen; they are dropped.
	OrphanEnds uint64
	// OrphanMoves moved a session not active and not ended (never seen,
	// or its start still on its way); they are dropped.
	OrphanMoves uint64
	// ExcessMoves came for a session that had tokenevent.MaxMigrations
	// moves already; they are dropped.
	ExcessMoves uint64
	// LateEvents arrived for a session already ended (duplicates of the end
	// included); they are dropped.
	LateEvents uint64
	// DuplicateStarts arrived for a session already started; ignored.
	DuplicateStarts uint64
	// OutOfOrder token events were older than the session's latest token
	// (or its start); they count as tokens but make no gap.
	OutOfOrder uint64
	// FutureEvents were stamped more than MaxFutureSkew ahead of the
	// collector's clock, by kind (EventKinds); they are dropped.
	FutureEvents [len(EventKinds)]uint64
	// EventsBeforeStart were stamped more than a second before their
	// session's start, by kind (token, end, move; a start is never);
	// dropped.
	EventsBeforeStart [len(EventKinds)]uint64
	// DuplicateTokens repeated the seq of a token event already folded
	// (a retry), or were too old to tell; they are dropped.
	DuplicateTokens uint64
	// WithdrawnFreezes were reported and then withdrawn, because a token
	// stamped before the freeze began arrived late.
	WithdrawnFreezes uint64
	// ReinstatedFreezes were withdrawn and then counted again: the gap
	// the alert's moment fell in proved longer than the freeze time.
	ReinstatedFreezes uint64
	// InvalidTraceStates came on a start and could not be parsed; the
	// session is sampled on its trace ID alone.
	InvalidTraceStates uint64
	// InvalidTimings came on an end and could not be the session's (a
	// negative part, or more than its duration): the end is taken without.
	InvalidTimings uint64
	// UnreportedKeeps are early keeps (a stall) of sessions opened by a
	// token that ended before their start came: the keep was held for the
	// start's trace and never reported (no ReportKeptEarly), as the random
	// trace it had has no other span.
	UnreportedKeeps uint64
}

// EventKinds are the kinds of the events the Table takes, in the order of
// the Counters' arrays by kind (eventIndex).
var EventKinds = [...]tokenevent.Kind{tokenevent.KindStart, tokenevent.KindToken, tokenevent.KindEnd, tokenevent.KindMove}

// eventIndex is the place of kind k in EventKinds.
func eventIndex(k tokenevent.Kind) int {
	if k == tokenevent.KindMove {
		return 3
	}
	return int(k) - 1
}

// Table holds the active sessions and the state S its Observer keeps for
// each. It is not safe for concurrent use.
type Table[S any] struct {
	cfg         Config
	obs         Observer[S]
	normal      sampling.Threshold
	freezeAfter int64
	memory      TraceMemory

	// sources are the watermarks of the sources sessions come from, by
	// engine, each counting the active sessions that point to it.
	sources map[string]*source

	// sessions indexes slots by session ID (hashed with seed): 8 B a slot
	// at most half full, where a Go map's slot held the ID and a pointer.
	sessions index
	seed     maphash.Seed
	// last is the session Apply found last, checked before the index: the
	// events of a packed token record come in a row for one session.
	last *entry[S]
	// traces indexes the active traces by ID (hashed with seed). A trace
	// of one session and no keep, the most, is indexed by its session's
	// slot; one of more sessions, or kept, by its record in traceRecords
	// (traceRecord). A Go map of a record per trace (its ID, count and
	// keep: 40 B a slot) cost every session one.
	traces       index
	traceRecords []traceRecord
	ended        endedSet
	free         []*entry[S]

	// slots and clocks are dense, indexed by Session.slot: the per-token
	// path writes one clocks entry instead of relinking lists (which would
	// touch neighboring sessions' memory), and Tick scans clocks
	// sequentially, which for 100 000 sessions takes a fraction of a ms.
	slots  []*entry[S]
	clocks []clock
	// firstSeen is when each session's first event arrived (collector
	// time), apart from clocks: only a session's end reads it, and Tick's
	// scan and the per-token write stay on 16 B per session.
	firstSeen []int64
	// gaps holds each session's window of the latest per-token gaps, in µs,
	// Window entries per slot: dense rather than a slice per session, which
	// would cost a slice header and an allocation rounded up to its size
	// class (every byte counts against 512 B per in-flight session).
	gaps []uint32

	Counters Counters
}

// clock holds the collector times Tick looks at.
type clock struct {
	// lastSeen is when the latest event arrived.
	lastSeen int64
	// lastTokenSeen is when the latest token arrived while decoding; 0
	// before the first token and during a stall episode.
	lastTokenSeen int64
}

// traceRecord is an active trace of more than one session, or kept.
type traceRecord struct {
	id pcommon.TraceID
	traceRef
	active int32
}

// traceRecordPos is where the positions in traces of traceRecords begin,
// after those of slots.
const traceRecordPos = 1 << 30

// traceRef is what the table knows of an active trace's keep.
type traceRef struct {
	kept bool
	// th is the lowest threshold of the trace's kept sessions.
	th sampling.Threshold
}

// source is the engine clock as one source's events show it: the latest
// engine time seen and when (collector time) the source last sent
// anything. A session is frozen when the source has moved on past its last
// token, whatever the delivery lag; a silent source's clock is taken to run
// on after the delivery slack.
type source struct {
	engineTime int64
	seenAt     int64
	sessions   int32
	key        string
}

// engineNow estimates the source's engine clock at collector time now.
func (src *source) engineNow(now int64, slack int64) int64 {
	return src.engineTime + max(0, now-src.seenAt-slack)
}

func (src *source) observe(at, now int64) {
	src.engineTime = max(src.engineTime, at)
	src.seenAt = now
}

// NewTable returns an empty table.
func NewTable[S any](cfg Config, obs Observer[S]) (*Table[S], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	normal := sampling.NeverSampleThreshold
	if p := cfg.Sampling.NormalPercent; p > 0 {
		// Four significant hex digits, as the probabilistic sampler writes by
		// default: "fd70a" for 1%, not a 14-digit threshold in every tracestate.
		th, err := sampling.ProbabilityToThresholdWithPrecision(p/100, 4)
		if err != nil {
			return nil, err
		}
		normal = th
	}
	return &Table[S]{
		cfg:         cfg,
		obs:         obs,
		normal:      normal,
		freezeAfter: int64(cfg.Stall.Gap) * int64(cfg.Stall.Consecutive),
		sessions:    newIndex(0),
		seed:        maphash.MakeSeed(),
		sources:     make(map[string]*source),
		traces:      newIndex(0),
		ended:       newEndedSet(cfg.Table.EndedMemory),
	}, nil
}

// Active returns the number of active sessions.
func (t *Table[S]) Active() int { return len(t.slots) }

// Contains reports whether the session is active.
func (t *Table[S]) Contains(id string) bool { return t.lookup(id) != nil }

// lookup returns the active session id, or nil.
func (t *Table[S]) lookup(id string) *entry[S] {
	pos, ok := t.sessions.find(maphash.String(t.seed, id), func(pos int) bool { return t.slots[pos].ID == id })
	if !ok {
		return nil
	}
	return t.slots[pos]
}

// SetTraceMemory gives the table the verdicts of traces whose sessions
// have ended, so that a later session of a kept trace is kept too.
func (t *Table[S]) SetTraceMemory(m TraceMemory) { t.memory = m }

// TraceActive reports whether an active session belongs to the trace, and
// whether one of them has already been kept, with the trace's threshold.
func (t *Table[S]) TraceActive(id pcommon.TraceID) (active, kept bool, th sampling.Threshold) {
	pos, ok := t.traces.find(t.traceHash(id), t.isTrace(id))
	r := t.traceRefAt(pos, ok)
	return ok, r.kept, r.th
}

// Apply folds one event in and appends what the caller must act on to
// reports. now is the collector's clock (Unix ns) when the event arrived;
// the event's own time is the engine's.
func (t *Table[S]) Apply(ev *tokenevent.Event, now int64, reports []Report[S]) []Report[S] {
	t.apply(ev, now, &reports)
	return reports
}

// Release hands the ended sessions of reports back to the table for reuse
// and returns reports emptied, for the next call. Call it once the reports
// are handled; a Report's Session must not be used afterwards.
func (t *Table[S]) Release(reports []Report[S]) []Report[S] {
	for i := range reports {
		if reports[i].Kind == ReportEnded {
			t.recycle(reports[i].entry)
		}
	}
	// Cleared so that the stall gaps and states they hold can be collected.
	clear(reports)
	return reports[:0]
}

func (t *Table[S]) apply(ev *tokenevent.Event, now int64, out *[]Report[S]) {
	s := t.last
	if s == nil || s.ID != ev.SessionID {
		s = t.lookup(ev.SessionID)
		t.last = s
	}
	at := int64(ev.TimeUnixNano)
	kind := eventIndex(ev.Kind)
	if at-now > int64(t.cfg.Table.MaxFutureSkew) {
		// One token a year ahead would make a TPOT of thousands of hours
		// and poison the cumulative sums for the life of the process.
		t.Counters.FutureEvents[kind]++
		return
	}
	if s != nil && s.HasStart && ev.Kind != tokenevent.KindStart && at < s.StartTime-int64(maxBeforeStart) {
		t.Counters.EventsBeforeStart[kind]++
		return
	}
	switch ev.Kind {
	case tokenevent.KindStart:
		switch {
		case s == nil && t.ended.has(ev.SessionID):
			t.Counters.LateEvents++
		case s == nil:
			s = t.create(ev.SessionID, pcommon.TraceID(ev.TraceID), pcommon.SpanID(ev.SpanID), now, out)
			t.fillStart(s, ev)
			t.started(s)
		case s.HasStart:
			t.Counters.DuplicateStarts++
			t.touch(s, now)
		default:
			t.fillStart(s, ev)
			t.obs.Restarted(&s.Session, &s.state)
			t.touch(s, now)
			t.checkTTFT(s, out)
			if s.keepHeld {
				t.releaseHeldKeep(s, out)
			}
		}
		if s != nil {
			s.source.observe(at, now)
		}
	case tokenevent.KindToken:
		if s == nil {
			if t.ended.has(ev.SessionID) {
				t.Counters.LateEvents++
				return
			}
			t.Counters.OrphanTokens++
			// A token's ID may be part of a batch record's string
			// (tokenrecord): a copy keeps the session from holding it.
			s = t.create(strings.Clone(ev.SessionID), pcommon.TraceID{}, pcommon.SpanID{}, now, out)
			t.setSource(s, "")
			t.started(s)
		}
		if ev.HasSeq && !s.seqNew(int64(ev.Seq)) {
			t.Counters.DuplicateTokens++
			return
		}
		s.source.observe(at, now)
		t.token(s, at, ev.Count, now, out)
	case tokenevent.KindEnd:
		if s == nil {
			if t.ended.has(ev.SessionID) {
				t.Counters.LateEvents++
			} else {
				t.Counters.OrphanEnds++
				t.ended.add(ev.SessionID)
			}
			return
		}
		e := End{
			Time: int64(ev.TimeUnixNano), CompletionTokens: ev.CompletionTokens, FinishReason: ev.FinishReason, ErrorType: ev.Error,
			ResponseModel: ev.ResponseModel, Migrations: ev.Migrations,
		}
		if ev.HasTiming() {
			e.Timing = Timing{
				Queue: time.Duration(ev.QueueTimeNs), Prefill: time.Duration(ev.PrefillTimeNs),
				Decode: time.Duration(ev.DecodeTimeNs), Source: ev.TimingSource,
			}
			if !e.Timing.Plausible(s.Duration(&e)) {
				t.Counters.InvalidTimings++
				e.Timing = Timing{}
			}
		}
		if ev.HasEngineTime {
			e.Share = EngineShareOf(ev)
		}
		if s.PromptTokens < 0 && ev.PromptTokens >= 0 {
			s.PromptTokens = promptTokens(ev.PromptTokens) // known only at the end (the proxy's usage chunk)
		}
		outcome := OutcomeCompleted
		switch {
		case ev.Error == tokenevent.ErrorShutdown:
			outcome = OutcomeShutdown
		case ev.Error != "":
			outcome = OutcomeError
		case ev.FinishReason == finishReasonError:
			// Newer vLLM ends a request that failed in the engine with
			// finish_reason "error" and no error object.
			outcome, e.ErrorType = OutcomeError, ErrorTypeEngine
		case ev.FinishReason == finishReasonAbort:
			outcome = OutcomeAborted
		}
		s.source.observe(at, now)
		t.end(s, outcome, &e, out)
	case tokenevent.KindMove:
		switch {
		case s == nil && t.ended.has(ev.SessionID):
			t.Counters.LateEvents++
		case s == nil:
			t.Counters.OrphanMoves++
		case len(s.Moves()) >= tokenevent.MaxMigrations:
			t.Counters.ExcessMoves++
			t.touch(s, now)
		default:
			x := s.ensureExtra()
			x.moves = append(x.moves, Move{Time: at, To: ev.Engine, Reason: ev.Error, TokensCarried: ev.Count})
			s.source.observe(at, now)
			t.touch(s, now)
		}
	}
}

// Tick ends the sessions idle for longer than the idle timeout and reports
// the sessions whose decoding froze, appending to reports. Call it often
// (every few tens of ms) for freezes to be reported promptly; it scans a
// dense array of two timestamps per session.
func (t *Table[S]) Tick(now int64, reports []Report[S]) []Report[S] {
	// Backwards, since ending a session moves the last slot into its place.
	for i := len(t.slots) - 1; i >= 0; i-- {
		c := &t.clocks[i]
		s := t.slots[i]
		switch {
		case now-c.lastSeen > int64(t.cfg.Table.IdleTimeout):
			e := t.endedAt(s, now)
			t.end(s, OutcomeTimeout, &e, &reports)
		case c.lastTokenSeen != 0 && now-c.lastTokenSeen > t.freezeAfter &&
			s.source.engineNow(now, int64(t.cfg.Stall.DeliverySlack))-s.LastTokenTime > t.freezeAfter:
			// No token arrived for the freeze time, and the engine's clock
			// as the session's source shows it has moved on that far: late
			// delivery alone (a batch upstream, a busy CPU) raises nothing.
			c.lastTokenSeen = 0
			// Stamped on the engine's clock, like everything else about
			// the session: the moment the freeze threshold was crossed.
			t.stall(s, Stall{DetectedAt: s.LastTokenTime + t.freezeAfter, Since: s.LastTokenTime, Freeze: true}, &reports)
		}
	}
	return reports
}

// Shutdown ends every active session with OutcomeShutdown, appending their
// reports to reports; now is the collector's clock.
func (t *Table[S]) Shutdown(now int64, reports []Report[S]) []Report[S] {
	for i := len(t.slots) - 1; i >= 0; i-- {
		s := t.slots[i]
		e := t.endedAt(s, now)
		t.end(s, OutcomeShutdown, &e, &reports)
	}
	return reports
}

// endedAt is the End of a session the table ends without an end event at
// collector time now. A session that had a token ends at its last one; one
// that had none (stuck in the queue, or before its first token) at now,
// moved onto the engine's clock by the offset its first event showed.
func (t *Table[S]) endedAt(s *entry[S], now int64) End {
	e := End{CompletionTokens: -1}
	if s.LastTokenTime == 0 && s.StartTime != 0 {
		e.Time = s.StartTime + max(0, now-t.firstSeen[s.slot])
	}
	return e
}

// evictionSamples is how many sessions an eviction compares: evicting the
// least recently active of a random sample approximates LRU at O(1) cost.
const evictionSamples = 8

func (t *Table[S]) evict(now int64, out *[]Report[S]) {
	victim := -1
	if len(t.slots) <= evictionSamples {
		for i := range t.slots {
			if victim < 0 || t.clocks[i].lastSeen < t.clocks[victim].lastSeen {
				victim = i
			}
		}
	} else {
		for range evictionSamples {
			i := rand.IntN(len(t.slots))
			if victim < 0 || t.clocks[i].lastSeen < t.clocks[victim].lastSeen {
				victim = i
			}
		}
	}
	s := t.slots[victim]
	e := t.endedAt(s, now)
	t.end(s, OutcomeEvicted, &e, out)
}

// create opens the session id on trace and span, each random when empty.
// A start event's session is created on the start's own IDs: created on
// random ones, fillStart would move it off a trace it was only just added
// to (two index operations on traces, and two random IDs, per session).
func (t *Table[S]) create(id string, trace pcommon.TraceID, span pcommon.SpanID, now int64, out *[]Report[S]) *entry[S] {
	if len(t.slots) >= t.cfg.Table.MaxActive {
		t.evict(now, out)
	}
	var s *entry[S]
	if n := len(t.free); n > 0 {
		s, t.free = t.free[n-1], t.free[:n-1]
	} else {
		s = new(entry[S])
	}
	s.reset()
	s.ID = id
	s.TraceID, s.SpanID = trace, span
	if trace.IsEmpty() {
		randomID(s.TraceID[:])
	}
	if span.IsEmpty() {
		randomID(s.SpanID[:])
	}
	s.slot = int32(len(t.slots))
	t.sessions.add(maphash.String(t.seed, id), int(s.slot))
	t.traceAdd(s)
	t.slots = append(t.slots, s)
	t.clocks = append(t.clocks, clock{lastSeen: now})
	t.firstSeen = append(t.firstSeen, now)
	n := len(t.gaps)
	t.gaps = slices.Grow(t.gaps, t.cfg.Window)[:n+t.cfg.Window]
	clear(t.gaps[n:])
	return s
}

// started has the Observer fill in the state of the new session s.
func (t *Table[S]) started(s *entry[S]) { t.obs.Started(&s.Session, &s.state) }

// NewSpanID returns a random span ID, for a span made beside a session's
// own (its verdict span).
func NewSpanID() [8]byte {
	var id [8]byte
	randomID(id[:])
	return id
}

func randomID(b []byte) {
	for i := 0; i < len(b); i += 8 {
		v := rand.Uint64()
		for j := i; j < min(i+8, len(b)); j++ {
			b[j] = byte(v)
			v >>= 8
		}
	}
}

// end ends s and reports it; s goes back to the free list when the caller
// releases the report.
func (t *Table[S]) end(s *entry[S], outcome Outcome, e *End, out *[]Report[S]) {
	s.Outcome = outcome
	if s.keepHeld {
		t.Counters.UnreportedKeeps++
	}
	// The trace's keep, read once for the verdict and the removal: nothing
	// between them changes traces.
	ref := t.traceRef(s.TraceID)
	t.decide(s, e, ref)
	trace := t.traceRemoveRef(s, ref, s.Keep, s.Threshold)
	if s.source != nil {
		t.releaseSource(s)
	}
	*out = append(*out, Report[S]{Kind: ReportEnded, Session: &s.Session, State: &s.state, entry: s, End: *e, Trace: trace})
	t.sessions.remove(maphash.String(t.seed, s.ID), int(s.slot))
	if t.last == s {
		t.last = nil
	}
	last := int32(len(t.slots) - 1)
	moved := t.slots[last]
	if moved != s {
		t.sessions.move(maphash.String(t.seed, moved.ID), int(last), int(s.slot))
		if h := t.traceHash(moved.TraceID); t.traces.holds(h, int(last)) {
			t.traces.move(h, int(last), int(s.slot))
		}
	}
	t.slots[s.slot], t.clocks[s.slot], t.firstSeen[s.slot] = moved, t.clocks[last], t.firstSeen[last]
	// The moved session's window goes with it: Window entries (40 B by
	// default) copied per ended session.
	copy(t.window(s), t.window(moved))
	moved.slot = s.slot
	t.slots[last] = nil
	w := t.cfg.Window
	t.slots, t.clocks, t.firstSeen, t.gaps = t.slots[:last], t.clocks[:last], t.firstSeen[:last], t.gaps[:int(last)*w]
	t.ended.add(s.ID)
}

// recycle puts an ended session, its report handled, on the free list.
func (t *Table[S]) recycle(s *entry[S]) {
	var zero S
	s.state = zero
	if x := s.extra; x != nil {
		// Emptied, not dropped: the next session in this Session reuses the
		// storage. Cleared so the old attributes' strings can be collected.
		clear(x.attributes)
		x.attributes = x.attributes[:0]
		// The stall records' gap slices may be large; let them go.
		x.stalls = nil
		clear(x.moves)
		x.moves = x.moves[:0]
		x.withdrawnSince = 0
		x.traceState, x.hasRV, x.hasUpstream = "", false, false
	}
	t.free = append(t.free, s)
}

// touch records activity on s.
func (t *Table[S]) touch(s *entry[S], now int64) { t.clocks[s.slot].lastSeen = now }
