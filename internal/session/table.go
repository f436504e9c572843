package session

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenevent"
)

// Observer keeps the Table user's per-session state S: Started makes it
// and Gap updates it, on the per-token path, where a Report per gap would
// cost. They are called inside Table methods, so they must not block and
// must not call back into the Table. What needs more than S (outputs, held
// spans) comes out as Reports instead, handled after the Table returns.
type Observer[S any] interface {
	// Started: a new session. HasStart is false when a token event arrived
	// before the start; its start fields are filled in later.
	Started(s *Session) S
	// Gap: n per-token gaps of g each (a chunk of n tokens arriving g·n
	// after the previous one); state is what Started returned for s.
	Gap(s *Session, state S, g time.Duration, n int64)
}

// ReportKind is what a Report tells.
type ReportKind uint8

const (
	// ReportStalled: a stall episode began (Report.Stall, StallCount and
	// Chunks).
	ReportStalled ReportKind = iota + 1
	// ReportKeptEarly: the session's verdict became keep before its end (a
	// TTFT breach at the first token, or a stall), so the trace can be
	// released.
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
	// State is the session's state as the Observer left it.
	State S

	// Stall is the episode of a ReportStalled; StallCount and Chunks are
	// the session's when it was detected.
	Stall      Stall
	StallCount int
	Chunks     int64

	// End and Trace are those of a ReportEnded: what the end event said,
	// and whether this was the last active session of its trace (Done) and
	// any session of the trace was kept (Kept).
	End   End
	Trace TraceVerdict

	// entry is where Session and State live, for Release.
	entry *entry[S]
}

// entry is a Session with its Observer state beside it: both are read on
// every token, so they share the allocation and its cache lines (a
// pointer-sized S makes the entry 232 B, in the 240 B size class).
type entry[S any] struct {
	Session
	state S
}

// TraceVerdict is the state of a session's trace when the session ends.
type TraceVerdict struct {
	// Done: no other active session shares the trace ID.
	Done bool
	// Kept: some session of the trace was kept.
	Kept bool
}

// Counters count the events the table could not use as they came; they
// only grow.
type Counters struct {
	// OrphanTokens opened a session before its start arrived.
	OrphanTokens uint64
	// OrphanEnds ended a session never seen; they are dropped.
	OrphanEnds uint64
	// LateEvents arrived for a session already ended (duplicates of the end
	// included); they are dropped.
	LateEvents uint64
	// DuplicateStarts arrived for a session already started; ignored.
	DuplicateStarts uint64
	// OutOfOrder token events were older than the session's latest token
	// (or its start); they count as tokens but make no gap.
	OutOfOrder uint64
}

// Table holds the active sessions and the state S its Observer keeps for
// each. It is not safe for concurrent use.
type Table[S any] struct {
	cfg         Config
	obs         Observer[S]
	normal      sampling.Threshold
	freezeAfter int64

	sessions map[string]*entry[S]
	// last is the session Apply found last, checked before the map: the
	// events of a packed token record come in a row for one session.
	last   *entry[S]
	traces map[pcommon.TraceID]traceRef
	ended  endedSet
	free   []*entry[S]

	// slots and clocks are dense, indexed by Session.slot: the per-token
	// path writes one clocks entry instead of relinking lists (which would
	// touch neighbouring sessions' memory), and Tick scans clocks
	// sequentially, which for 100 000 sessions takes a fraction of a ms.
	slots  []*entry[S]
	clocks []clock
	// gaps holds each session's window of the latest per-token gaps, in µs,
	// Window entries per slot: dense rather than a slice per session, which
	// would cost a slice header and an allocation rounded up to its size
	// class (issue 7).
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

type traceRef struct {
	active int32
	kept   bool
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
		freezeAfter: int64(cfg.StallGap) * int64(cfg.StallConsecutive),
		sessions:    make(map[string]*entry[S]),
		traces:      make(map[pcommon.TraceID]traceRef),
		ended:       newEndedSet(cfg.EndedMemory),
	}, nil
}

// Active returns the number of active sessions.
func (t *Table[S]) Active() int { return len(t.sessions) }

// Contains reports whether the session is active.
func (t *Table[S]) Contains(id string) bool {
	_, ok := t.sessions[id]
	return ok
}

// TraceActive reports whether an active session belongs to the trace, and
// whether one of them has already been kept.
func (t *Table[S]) TraceActive(id pcommon.TraceID) (active, kept bool) {
	r, ok := t.traces[id]
	return ok, r.kept
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
		s = t.sessions[ev.SessionID]
		t.last = s
	}
	switch ev.Kind {
	case tokenevent.KindStart:
		switch {
		case s == nil && t.ended.has(ev.SessionID):
			t.Counters.LateEvents++
		case s == nil:
			s = t.create(ev.SessionID, now, out)
			t.fillStart(s, ev)
			t.started(s)
		case s.HasStart:
			t.Counters.DuplicateStarts++
			t.touch(s, now)
		default:
			t.fillStart(s, ev)
			t.touch(s, now)
			t.checkTTFT(s, out)
		}
	case tokenevent.KindToken:
		if s == nil {
			if t.ended.has(ev.SessionID) {
				t.Counters.LateEvents++
				return
			}
			t.Counters.OrphanTokens++
			s = t.create(ev.SessionID, now, out)
			t.started(s)
		}
		t.token(s, int64(ev.TimeUnixNano), ev.Count, now, out)
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
		e := End{Time: int64(ev.TimeUnixNano), CompletionTokens: ev.CompletionTokens, FinishReason: ev.FinishReason, ErrorType: ev.Error}
		if s.PromptTokens < 0 && ev.PromptTokens >= 0 {
			s.PromptTokens = ev.PromptTokens // known only at the end (the proxy's usage chunk)
		}
		outcome := OutcomeCompleted
		switch {
		case ev.Error == tokenevent.ErrorShutdown:
			outcome = OutcomeShutdown
		case ev.Error != "":
			outcome = OutcomeError
		case ev.FinishReason == finishReasonAbort:
			outcome = OutcomeAborted
		}
		t.end(s, outcome, &e, out)
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
		case now-c.lastSeen > int64(t.cfg.IdleTimeout):
			t.end(s, OutcomeTimeout, &End{CompletionTokens: -1}, &reports)
		case c.lastTokenSeen != 0 && now-c.lastTokenSeen > t.freezeAfter:
			c.lastTokenSeen = 0
			// Stamped on the engine's clock, like everything else about
			// the session: the moment the freeze threshold was crossed.
			t.stall(s, Stall{DetectedAt: s.LastTokenTime + t.freezeAfter, Since: s.LastTokenTime, Freeze: true}, &reports)
		}
	}
	return reports
}

// Shutdown ends every active session with OutcomeShutdown, appending their
// reports to reports.
func (t *Table[S]) Shutdown(reports []Report[S]) []Report[S] {
	for i := len(t.slots) - 1; i >= 0; i-- {
		t.end(t.slots[i], OutcomeShutdown, &End{CompletionTokens: -1}, &reports)
	}
	return reports
}

// evictionSamples is how many sessions an eviction compares: evicting the
// least recently active of a random sample approximates LRU at O(1) cost.
const evictionSamples = 8

func (t *Table[S]) evict(out *[]Report[S]) {
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
	t.end(t.slots[victim], OutcomeEvicted, &End{CompletionTokens: -1}, out)
}

func (t *Table[S]) create(id string, now int64, out *[]Report[S]) *entry[S] {
	if len(t.sessions) >= t.cfg.MaxActive {
		t.evict(out)
	}
	var s *entry[S]
	if n := len(t.free); n > 0 {
		s, t.free = t.free[n-1], t.free[:n-1]
	} else {
		s = new(entry[S])
	}
	s.reset()
	s.ID = id
	randomID(s.TraceID[:])
	randomID(s.SpanID[:])
	t.sessions[id] = s
	t.traceAdd(s.TraceID)
	s.slot = int32(len(t.slots))
	t.slots = append(t.slots, s)
	t.clocks = append(t.clocks, clock{lastSeen: now})
	n := len(t.gaps)
	t.gaps = slices.Grow(t.gaps, t.cfg.Window)[:n+t.cfg.Window]
	clear(t.gaps[n:])
	return s
}

// started has the Observer make the state of the new session s.
func (t *Table[S]) started(s *entry[S]) { s.state = t.obs.Started(&s.Session) }

func randomID(b []byte) {
	for i := 0; i < len(b); i += 8 {
		v := rand.Uint64()
		for j := i; j < min(i+8, len(b)); j++ {
			b[j] = byte(v)
			v >>= 8
		}
	}
}

func (t *Table[S]) fillStart(s *entry[S], ev *tokenevent.Event) {
	s.HasStart = true
	s.StartTime = int64(ev.TimeUnixNano)
	if trace := pcommon.TraceID(ev.TraceID); !trace.IsEmpty() && trace != s.TraceID {
		t.traceRemove(s.TraceID, false)
		s.TraceID = trace
		t.traceAdd(s.TraceID)
	}
	if !ev.SpanID.IsEmpty() {
		s.SpanID = pcommon.SpanID(ev.SpanID)
	}
	s.ParentSpanID = pcommon.SpanID(ev.ParentSpanID)
	s.Model, s.Operation, s.Engine = ev.Model, ev.Operation, ev.Engine
	s.PromptTokens = ev.PromptTokens
	if len(ev.Attributes) > 0 {
		x := s.ensureExtra()
		x.attributes = append(x.attributes[:0], ev.Attributes...)
	}
	if s.FirstTokenTime != 0 && s.FirstTokenTime < s.StartTime {
		t.Counters.OutOfOrder++
	}
}

func (t *Table[S]) token(s *entry[S], at, count, now int64, out *[]Report[S]) {
	s.Chunks++
	s.Tokens += count
	c := &t.clocks[s.slot]
	c.lastSeen = now
	if !s.inStall {
		c.lastTokenSeen = now
	}
	if s.FirstTokenTime == 0 {
		s.FirstTokenTime, s.LastTokenTime = at, at
		if s.StartTime != 0 && at < s.StartTime {
			t.Counters.OutOfOrder++
		}
		t.checkTTFT(s, out)
		return
	}
	if at < s.LastTokenTime {
		t.Counters.OutOfOrder++
		s.FirstTokenTime = min(s.FirstTokenTime, at)
		return
	}
	gap := time.Duration(at-s.LastTokenTime) / time.Duration(count)
	if gap > t.cfg.StallGap && s.slowRun == 0 {
		s.slowSince = s.LastTokenTime
	}
	s.LastTokenTime = at
	s.MaxGap = max(s.MaxGap, gap)
	t.pushGap(s, gap, count)
	t.obs.Gap(&s.Session, s.state, gap, count)
	if gap <= t.cfg.StallGap {
		s.slowRun = 0
		if s.inStall {
			s.inStall = false
			c.lastTokenSeen = now
		}
		return
	}
	s.slowRun = int32(min(int64(s.slowRun)+count, math.MaxInt32))
	if !s.inStall && int(s.slowRun) >= t.cfg.StallConsecutive {
		c.lastTokenSeen = 0
		t.stall(s, Stall{DetectedAt: at, Since: s.slowSince, Gaps: t.latestGaps(s, t.cfg.StallConsecutive)}, out)
	}
}

// window returns s's window of per-token gaps.
func (t *Table[S]) window(s *entry[S]) []uint32 {
	w := t.cfg.Window
	return t.gaps[int(s.slot)*w : (int(s.slot)+1)*w : (int(s.slot)+1)*w]
}

// pushGap adds n per-token gaps of g to s's window and updates its
// maximum window TPOT.
func (t *Table[S]) pushGap(s *entry[S], g time.Duration, n int64) {
	gaps := t.window(s)
	us := uint32(min(g/time.Microsecond, 1<<32-1))
	for range min(n, int64(len(gaps))) {
		// The slot overwritten is 0 until the window is full.
		s.gapSum += uint64(us) - uint64(gaps[s.gapNext])
		gaps[s.gapNext] = us
		s.gapNext = uint16((int(s.gapNext) + 1) % len(gaps))
		s.gapLen = uint16(min(int(s.gapLen)+1, len(gaps)))
	}
	if w, _ := s.WindowTPOT(); w > s.WindowTPOTMax {
		s.WindowTPOTMax = w
	}
}

// latestGaps returns up to n of s's latest gaps, oldest first.
func (t *Table[S]) latestGaps(s *entry[S], n int) []time.Duration {
	gaps := t.window(s)
	n = min(n, int(s.gapLen))
	out := make([]time.Duration, n)
	for i := range n {
		j := (int(s.gapNext) - n + i + len(gaps)) % len(gaps)
		out[i] = time.Duration(gaps[j]) * time.Microsecond
	}
	return out
}

func (t *Table[S]) stall(s *entry[S], st Stall, out *[]Report[S]) {
	s.inStall = true
	s.StallCount++
	if len(s.Stalls()) < t.cfg.MaxStallRecords {
		x := s.ensureExtra()
		x.stalls = append(x.stalls, st)
	}
	*out = append(*out, Report[S]{Kind: ReportStalled, Session: &s.Session, State: s.state, entry: s,
		Stall: st, StallCount: s.StallCount, Chunks: s.Chunks})
	if t.cfg.Sampling.Stalls {
		t.keepEarly(s, ReasonStall, out)
	}
}

func (t *Table[S]) checkTTFT(s *entry[S], out *[]Report[S]) {
	if ttft, ok := s.TTFT(); ok && t.cfg.Sampling.TTFT > 0 && ttft > t.cfg.Sampling.TTFT {
		t.keepEarly(s, ReasonTTFT, out)
	}
}

func (t *Table[S]) keepEarly(s *entry[S], r Reason, out *[]Report[S]) {
	s.Reasons |= r
	if s.Keep {
		return
	}
	s.Keep = true
	s.Threshold = sampling.AlwaysSampleThreshold
	ref := t.traces[s.TraceID]
	ref.kept = true
	t.traces[s.TraceID] = ref
	*out = append(*out, Report[S]{Kind: ReportKeptEarly, Session: &s.Session, State: s.state, entry: s})
}

// decide sets the final verdict: kept when a rule matches, else by the
// consistent probabilistic draw on the trace ID (OTEP 235).
func (t *Table[S]) decide(s *entry[S], e *End) {
	p := t.cfg.Sampling
	if ttft, ok := s.TTFT(); ok && p.TTFT > 0 && ttft > p.TTFT {
		s.Reasons |= ReasonTTFT
	}
	if tpot, ok := s.TPOT(e.CompletionTokens); ok && p.TPOT > 0 && tpot > p.TPOT {
		s.Reasons |= ReasonTPOT
	}
	if p.Stalls && s.StallCount > 0 {
		s.Reasons |= ReasonStall
	}
	if p.Errors && s.Outcome == OutcomeError {
		s.Reasons |= ReasonError
	}
	if p.Errors && s.Outcome == OutcomeTimeout {
		s.Reasons |= ReasonTimeout
	}
	switch {
	case s.Reasons != 0:
		s.Keep, s.Threshold = true, sampling.AlwaysSampleThreshold
	case t.normal.ShouldSample(sampling.TraceIDToRandomness(s.TraceID)):
		s.Keep, s.Threshold, s.Reasons = true, t.normal, ReasonProbabilistic
	default:
		s.Keep, s.Threshold = false, t.normal
	}
}

// end ends s and reports it; s goes back to the free list when the caller
// releases the report.
func (t *Table[S]) end(s *entry[S], outcome Outcome, e *End, out *[]Report[S]) {
	s.Outcome = outcome
	t.decide(s, e)
	trace := t.traceRemove(s.TraceID, s.Keep)
	*out = append(*out, Report[S]{Kind: ReportEnded, Session: &s.Session, State: s.state, entry: s, End: *e, Trace: trace})
	delete(t.sessions, s.ID)
	if t.last == s {
		t.last = nil
	}
	last := int32(len(t.slots) - 1)
	moved := t.slots[last]
	t.slots[s.slot], t.clocks[s.slot] = moved, t.clocks[last]
	// The moved session's window goes with it: Window entries (40 B by
	// default) copied per ended session.
	copy(t.window(s), t.window(moved))
	moved.slot = s.slot
	t.slots[last] = nil
	w := t.cfg.Window
	t.slots, t.clocks, t.gaps = t.slots[:last], t.clocks[:last], t.gaps[:int(last)*w]
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
	}
	t.free = append(t.free, s)
}

func (t *Table[S]) traceAdd(id pcommon.TraceID) {
	r := t.traces[id]
	r.active++
	t.traces[id] = r
}

func (t *Table[S]) traceRemove(id pcommon.TraceID, kept bool) TraceVerdict {
	r := t.traces[id]
	r.active--
	r.kept = r.kept || kept
	if r.active <= 0 {
		delete(t.traces, id)
		return TraceVerdict{Done: true, Kept: r.kept}
	}
	t.traces[id] = r
	return TraceVerdict{Kept: r.kept}
}

// touch records activity on s.
func (t *Table[S]) touch(s *entry[S], now int64) { t.clocks[s.slot].lastSeen = now }

// endedSet remembers the latest ended session IDs, oldest forgotten first.
type endedSet struct {
	ids  map[string]struct{}
	ring []string
	next int
}

func newEndedSet(n int) endedSet {
	return endedSet{ids: make(map[string]struct{}, n), ring: make([]string, n)}
}

func (e *endedSet) has(id string) bool {
	_, ok := e.ids[id]
	return ok
}

func (e *endedSet) add(id string) {
	if e.has(id) {
		return
	}
	if old := e.ring[e.next]; old != "" {
		delete(e.ids, old)
	}
	e.ring[e.next] = id
	e.ids[id] = struct{}{}
	e.next = (e.next + 1) % len(e.ring)
}
