package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"cmp"
	"encoding/json"
	"math"
	"slices"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/exphist"
	"github.com/otelcol-llm/otelcol-llm/internal/session"
)

// liveState is what the live view keeps between snapshots, under the
// sessions' lock: the latest ended sessions and each engine's TTFTs of the
// last minute. It is fed once per ended session (never per token), and
// only when the view is configured; the sessions in flight are read from
// the table when a snapshot is taken.
type liveState struct {
	cfg   *LiveConfig
	allow map[string]struct{}

	// recent is a ring of the latest ended sessions; next is where the
	// next goes, n how many it holds.
	recent []liveEnded
	next   int
	n      int

	// ttft holds each engine's TTFTs of the last minute, by second.
	ttft map[string]*ttftMinute
}

// liveEnded is an ended session as the view lists it.
type liveEnded struct {
	id, model, engine, operation, errorType string
	outcome                                 session.Outcome
	traceID                                 [16]byte
	endedAt                                 int64 // collector time
	ttft, tpot, duration, maxGap            time.Duration
	hasTTFT, hasTPOT                        bool
	tokens                                  int64
	stalls                                  int32
	keep                                    bool
	reasons                                 session.Reason
}

func newLiveState(cfg *LiveConfig) *liveState {
	l := &liveState{cfg: cfg, recent: make([]liveEnded, cfg.Recent), ttft: make(map[string]*ttftMinute)}
	if len(cfg.Attributes) > 0 {
		l.allow = make(map[string]struct{}, len(cfg.Attributes))
		for _, k := range cfg.Attributes {
			l.allow[k] = struct{}{}
		}
	}
	return l
}

// maxLiveEngines bounds the engines whose TTFTs the view keeps: engine
// names come from the senders, and a minute of TTFTs is 5 KiB per engine.
const maxLiveEngines = 1024

// ended records an ended session, at collector time now. Call with the
// sessions' lock held.
func (l *liveState) ended(s *session.Session, e *session.End, now int64) {
	ttft, hasTTFT := s.TTFT()
	tpot, hasTPOT := s.TPOT(e.CompletionTokens)
	if len(l.recent) > 0 {
		l.recent[l.next] = liveEnded{
			id: s.ID, model: s.Model, engine: s.Engine, operation: s.Operation, errorType: errorType(s, e),
			outcome: s.Outcome, traceID: s.TraceID, endedAt: now,
			ttft: ttft, hasTTFT: hasTTFT, tpot: tpot, hasTPOT: hasTPOT, duration: s.Duration(e), maxGap: s.MaxGap,
			tokens: max(outputTokens(s, e), 0), stalls: s.StallCount, keep: s.Keep, reasons: s.Reasons,
		}
		l.next = (l.next + 1) % len(l.recent)
		l.n = min(l.n+1, len(l.recent))
	}
	if !hasTTFT {
		return
	}
	// Counted in the second its first token came: a long stream that ends
	// now had its first token long ago. Engine time is moved onto the
	// collector's clock by the session's last event.
	last := max(e.Time, s.LastTokenTime)
	firstAt := now - max(0, last-s.FirstTokenTime)
	if now-firstAt >= int64(time.Minute) {
		return
	}
	m := l.ttft[s.Engine]
	if m == nil {
		if len(l.ttft) >= maxLiveEngines {
			return
		}
		m = &ttftMinute{}
		l.ttft[s.Engine] = m
	}
	m.add(firstAt, ttft)
}

// The TTFT histograms are base-2 exponential ones at scale 2 (four buckets
// an octave, a bucket 19% wide) over [2^-12 s, 2^8 s): 0.24 ms to 256 s,
// read with internal/exphist as engine_health reads the session metrics.
const (
	ttftScale   = 2
	ttftOffset  = -12 << ttftScale
	ttftBuckets = 20 << ttftScale
)

type ttftHist [ttftBuckets]uint32

// add counts d in its bucket: the one whose (lower, upper] holds it.
// math.Frexp, not math.Log2: the snapshot does this for every session in
// flight, under the lock.
func (h *ttftHist) add(d time.Duration) {
	i := ttftOffset
	if sec := d.Seconds(); sec > 0 {
		frac, exp := math.Frexp(sec) // sec = frac·2^exp, frac in [0.5, 1)
		m := 2 * frac                // sec = m·2^(exp-1), m in [1, 2)
		i = (exp - 1) << ttftScale
		switch {
		case m == 1:
			i-- // a power of two is the upper bound of the bucket below
		case m > ttftQuarter[2]:
			i += 3
		case m > ttftQuarter[1]:
			i += 2
		case m > ttftQuarter[0]:
			i++
		}
	}
	h[min(max(i-ttftOffset, 0), ttftBuckets-1)]++
}

// ttftQuarter are the bucket bounds within an octave at scale 2:
// 2^(1/4), 2^(2/4), 2^(3/4).
var ttftQuarter = [3]float64{math.Exp2(0.25), math.Exp2(0.5), math.Exp2(0.75)}

// ttftMinute is one engine's TTFTs by the second their first token came
// in, over the last minute.
type ttftMinute struct {
	seconds [60]int64
	hists   [60]ttftHist
}

func (m *ttftMinute) add(at int64, d time.Duration) {
	sec := at / int64(time.Second)
	i := int(sec % 60)
	if m.seconds[i] != sec {
		m.seconds[i] = sec
		m.hists[i] = ttftHist{}
	}
	m.hists[i].add(d)
}

// sumInto adds the seconds of the minute before now to h; it reports
// whether any was.
func (m *ttftMinute) sumInto(now int64, h *ttftHist) bool {
	nowSec := now / int64(time.Second)
	found := false
	for i := range m.seconds {
		if s := m.seconds[i]; s > nowSec-60 && s <= nowSec {
			for j, c := range m.hists[i] {
				h[j] += c
			}
			found = true
		}
	}
	return found
}

// quantiles are h's p50 and p99 in ms; NaN for an empty h.
func (h *ttftHist) quantiles() (p50, p99 float64, n uint64) {
	hist := exphist.Histogram{Scale: ttftScale, Offset: ttftOffset, Counts: make([]uint64, ttftBuckets)}
	for i, c := range h {
		hist.Counts[i] = uint64(c)
		hist.Count += uint64(c)
	}
	if hist.Count == 0 {
		return math.NaN(), math.NaN(), 0
	}
	return hist.Quantile(0.5) * 1e3, hist.Quantile(0.99) * 1e3, hist.Count
}

// liveFilter picks the sessions a snapshot lists (the engine totals count
// every session): "" matches every engine or model.
type liveFilter struct {
	engine, model string
}

func (f liveFilter) match(engine, model string) bool {
	return (f.engine == "" || f.engine == engine) && (f.model == "" || f.model == model)
}

// liveCandidate is a session the scan may list: its badness key and where
// to read the rest, while the lock is held.
type liveCandidate struct {
	key       int64
	s         *session.Session
	phase     session.Phase
	engineNow int64
}

// badness orders the sessions worst first: frozen, then stalled, then by
// how long since the session last made progress (its last token, or its
// start while it waits for the first), which puts a stuck wait above a
// stream decoding at pace.
func badness(phase session.Phase, sinceProgress int64) int64 {
	rank := int64(0)
	switch phase {
	case session.PhaseFrozen:
		rank = 2
	case session.PhaseStalled:
		rank = 1
	}
	return rank<<60 | min(max(sinceProgress, 0), 1<<60-1)
}

// worstHeap keeps the k candidates of highest key: a min-heap on key, the
// best of the worst at its root, replaced when a worse one comes. Bounded
// work: O(n log k) for a scan of n, with k items held.
type worstHeap struct {
	items []liveCandidate
	k     int
}

func (h *worstHeap) offer(c liveCandidate) {
	if len(h.items) < h.k {
		h.items = append(h.items, c)
		for i := len(h.items) - 1; i > 0; {
			p := (i - 1) / 2
			if h.items[p].key <= h.items[i].key {
				break
			}
			h.items[p], h.items[i] = h.items[i], h.items[p]
			i = p
		}
		return
	}
	if c.key <= h.items[0].key {
		return
	}
	h.items[0] = c
	for i := 0; ; {
		l, r, least := 2*i+1, 2*i+2, i
		if l < len(h.items) && h.items[l].key < h.items[least].key {
			least = l
		}
		if r < len(h.items) && h.items[r].key < h.items[least].key {
			least = r
		}
		if least == i {
			return
		}
		h.items[least], h.items[i] = h.items[i], h.items[least]
		i = least
	}
}

// The snapshot as JSON. Durations are in milliseconds; a figure not known
// (a TTFT before the first token) is null.

type liveSnapshot struct {
	Time       time.Time         `json:"time"`
	IntervalMs float64           `json:"interval_ms"`
	TraceURL   string            `json:"trace_url,omitempty"`
	Filter     liveFilterJSON    `json:"filter"`
	InFlight   int               `json:"in_flight"`
	Matching   int               `json:"matching"`
	Sessions   []liveSessionJSON `json:"sessions"`
	Engines    []liveEngineJSON  `json:"engines"`
	Recent     []liveEndedJSON   `json:"recent"`
}

type liveFilterJSON struct {
	Engine string `json:"engine,omitempty"`
	Model  string `json:"model,omitempty"`
}

type liveSessionJSON struct {
	ID           string            `json:"id"`
	Model        string            `json:"model"`
	Engine       string            `json:"engine"`
	Operation    string            `json:"operation"`
	Phase        string            `json:"phase"`
	AgeMs        float64           `json:"age_ms"`
	TTFTMs       *float64          `json:"ttft_ms"`
	WaitingMs    *float64          `json:"waiting_ms"`
	Tokens       int64             `json:"tokens"`
	TokensPerSec float64           `json:"tokens_per_s"`
	GapMs        float64           `json:"gap_ms"`
	MaxGapMs     float64           `json:"max_gap_ms"`
	Stalls       int32             `json:"stalls"`
	TraceID      string            `json:"trace_id"`
	Sampled      bool              `json:"sampled"`
	KeepReason   string            `json:"keep_reason,omitempty"`
	Attributes   map[string]string `json:"attributes,omitempty"`
}

type liveEngineJSON struct {
	Engine       string   `json:"engine"`
	InFlight     int      `json:"in_flight"`
	Waiting      int      `json:"waiting"`
	Decoding     int      `json:"decoding"`
	Stalled      int      `json:"stalled"`
	Frozen       int      `json:"frozen"`
	TokensPerSec float64  `json:"tokens_per_s"`
	MaxWaitingMs float64  `json:"max_waiting_ms"`
	TTFTP50Ms    *float64 `json:"ttft_p50_ms"`
	TTFTP99Ms    *float64 `json:"ttft_p99_ms"`
	TTFTCount    uint64   `json:"ttft_count"`
}

type liveEndedJSON struct {
	ID         string    `json:"id"`
	Model      string    `json:"model"`
	Engine     string    `json:"engine"`
	Operation  string    `json:"operation"`
	Outcome    string    `json:"outcome"`
	ErrorType  string    `json:"error_type,omitempty"`
	Ended      time.Time `json:"ended"`
	TTFTMs     *float64  `json:"ttft_ms"`
	TPOTMs     *float64  `json:"tpot_ms"`
	DurationMs float64   `json:"duration_ms"`
	MaxGapMs   float64   `json:"max_gap_ms"`
	Tokens     int64     `json:"tokens"`
	Stalls     int32     `json:"stalls"`
	TraceID    string    `json:"trace_id"`
	Sampled    bool      `json:"sampled"`
	KeepReason string    `json:"keep_reason,omitempty"`
}

// ms is d in milliseconds, to the µs.
func millis(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func msPtr(d time.Duration, ok bool) *float64 {
	if !ok {
		return nil
	}
	v := millis(d)
	return &v
}

// engineTally is one engine's totals while the scan runs.
type engineTally struct {
	liveEngineJSON
	ttft    ttftHist
	hasTTFT bool
}

// liveSnapshot takes the snapshot of the sessions in flight that f picks,
// at collector time now, and encodes it. The table is read under the lock
// in one pass (the worst max_sessions kept in a bounded heap, the engine
// totals summed); the encoding runs after the lock is released.
func (p *sessions) liveSnapshot(now time.Time, f liveFilter, heap *worstHeap) []byte {
	snap, err := json.Marshal(p.takeLive(now, f, heap))
	if err != nil {
		// Nothing in it can fail to encode (NaN never reaches it).
		panic(err)
	}
	return snap
}

func (p *sessions) takeLive(now time.Time, f liveFilter, heap *worstHeap) *liveSnapshot {
	l := p.live
	nowNs := now.UnixNano()
	snap := &liveSnapshot{
		Time: now.UTC(), IntervalMs: millis(l.cfg.Interval), TraceURL: l.cfg.TraceURL,
		Filter: liveFilterJSON{Engine: f.engine, Model: f.model},
	}
	heap.k = l.cfg.MaxSessions
	heap.items = heap.items[:0]
	tallies := make(map[string]*engineTally)
	few := make([]*engineTally, 0, 8)
	var last *engineTally

	p.mu.Lock()
	snap.InFlight = p.table.Active()
	p.table.Scan(nowNs, func(s *session.Session, phase session.Phase, engineNow int64) {
		// An engine's sessions often come in runs, and there are few
		// engines: the last one, then a short list, are checked before the
		// map, which would hash every session's engine name.
		if last == nil || s.Engine != last.Engine {
			last = nil
			for _, t := range few {
				if t.Engine == s.Engine {
					last = t
					break
				}
			}
			if last == nil {
				last = tallies[s.Engine]
			}
			if last == nil {
				last = &engineTally{liveEngineJSON: liveEngineJSON{Engine: s.Engine}}
				tallies[s.Engine] = last
				if len(few) < cap(few) {
					few = append(few, last)
				}
			}
		}
		t := last
		t.InFlight++
		var since int64
		switch phase {
		case session.PhaseWaiting:
			t.Waiting++
			since = engineNow - startOf(s)
			t.MaxWaitingMs = max(t.MaxWaitingMs, millis(time.Duration(since)))
		case session.PhaseDecoding:
			t.Decoding++
		case session.PhaseStalled:
			t.Stalled++
		case session.PhaseFrozen:
			t.Frozen++
		}
		if phase != session.PhaseWaiting {
			since = engineNow - s.LastTokenTime
			if phase != session.PhaseFrozen {
				if w, ok := s.WindowTPOT(); ok && w > 0 {
					t.TokensPerSec += float64(time.Second) / float64(w)
				}
			}
			if ttft, ok := s.TTFT(); ok && engineNow-s.FirstTokenTime < int64(time.Minute) {
				t.ttft.add(ttft)
				t.hasTTFT = true
			}
		}
		if f.match(s.Engine, s.Model) {
			snap.Matching++
			heap.offer(liveCandidate{key: badness(phase, since), s: s, phase: phase, engineNow: engineNow})
		}
	})
	// Worst first; among equals by ID, so that rows keep their order
	// between snapshots.
	slices.SortFunc(heap.items, func(a, b liveCandidate) int {
		return cmp.Or(cmp.Compare(b.key, a.key), cmp.Compare(a.s.ID, b.s.ID))
	})
	snap.Sessions = make([]liveSessionJSON, len(heap.items))
	for i, c := range heap.items {
		snap.Sessions[i] = l.sessionJSON(&c)
	}
	for engine, m := range l.ttft {
		t := tallies[engine]
		if t == nil {
			t = &engineTally{liveEngineJSON: liveEngineJSON{Engine: engine}}
		}
		if m.sumInto(nowNs, &t.ttft) {
			t.hasTTFT = true
			tallies[engine] = t
		} else if t.InFlight == 0 {
			delete(l.ttft, engine) // nothing of it in the last minute
		}
	}
	snap.Recent = make([]liveEndedJSON, 0, l.n)
	for i := range l.n {
		e := &l.recent[(l.next-1-i+2*len(l.recent))%len(l.recent)]
		if f.match(e.engine, e.model) {
			snap.Recent = append(snap.Recent, e.json())
		}
	}
	p.mu.Unlock()

	snap.Engines = make([]liveEngineJSON, 0, len(tallies))
	for _, t := range tallies {
		if t.hasTTFT {
			p50, p99, n := t.ttft.quantiles()
			t.TTFTP50Ms, t.TTFTP99Ms, t.TTFTCount = &p50, &p99, n
		}
		t.TokensPerSec = math.Round(t.TokensPerSec*10) / 10
		snap.Engines = append(snap.Engines, t.liveEngineJSON)
	}
	slices.SortFunc(snap.Engines, func(a, b liveEngineJSON) int { return cmp.Compare(a.Engine, b.Engine) })
	return snap
}

// startOf is when s started, on the engine's clock: its start event, or
// its first token when the start has not come.
func startOf(s *session.Session) int64 {
	if s.StartTime != 0 {
		return s.StartTime
	}
	return s.FirstTokenTime
}

// sessionJSON copies what the view shows of c's session; called under the
// lock, as the session may be reused after it.
func (l *liveState) sessionJSON(c *liveCandidate) liveSessionJSON {
	s := c.s
	age := time.Duration(max(0, c.engineNow-startOf(s)))
	out := liveSessionJSON{
		ID: s.ID, Model: s.Model, Engine: s.Engine, Operation: s.Operation, Phase: c.phase.String(),
		AgeMs: millis(age), Tokens: s.Tokens, MaxGapMs: millis(s.MaxGap), Stalls: s.StallCount,
		TraceID: traceHex(s.TraceID), Sampled: s.Keep,
	}
	if s.Keep {
		out.KeepReason = s.Reasons.String()
	}
	if ttft, ok := s.TTFT(); ok {
		out.TTFTMs = msPtr(ttft, true)
	}
	if c.phase == session.PhaseWaiting {
		out.WaitingMs = msPtr(age, true)
		out.GapMs = millis(age)
	} else {
		out.GapMs = millis(time.Duration(max(0, c.engineNow-s.LastTokenTime)))
		if w, ok := s.WindowTPOT(); ok && w > 0 && c.phase != session.PhaseFrozen {
			out.TokensPerSec = math.Round(float64(time.Second)/float64(w)*10) / 10
		}
	}
	if l.allow != nil {
		for _, a := range s.Attributes() {
			if _, ok := l.allow[a.Key]; ok {
				if out.Attributes == nil {
					out.Attributes = make(map[string]string)
				}
				out.Attributes[a.Key] = a.Value
			}
		}
	}
	return out
}

func (e *liveEnded) json() liveEndedJSON {
	out := liveEndedJSON{
		ID: e.id, Model: e.model, Engine: e.engine, Operation: e.operation, Outcome: e.outcome.String(),
		ErrorType: e.errorType, Ended: time.Unix(0, e.endedAt).UTC(),
		TTFTMs: msPtr(e.ttft, e.hasTTFT), TPOTMs: msPtr(e.tpot, e.hasTPOT), DurationMs: millis(e.duration),
		MaxGapMs: millis(e.maxGap), Tokens: e.tokens, Stalls: e.stalls, TraceID: traceHex(e.traceID), Sampled: e.keep,
	}
	if e.keep {
		out.KeepReason = e.reasons.String()
	}
	return out
}

const hexDigits = "0123456789abcdef"

func traceHex(id [16]byte) string {
	var b [32]byte
	for i, c := range id {
		b[2*i], b[2*i+1] = hexDigits[c>>4], hexDigits[c&0xf]
	}
	return string(b[:])
}
