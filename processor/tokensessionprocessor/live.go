package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"cmp"
	"context"
	"encoding/json"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/otelcol-llm/otelcol-llm/internal/exphist"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// liveState is what the live view keeps between snapshots, under the
// fold's lock: the latest ended sessions and the TTFTs of the last minute
// by engine and model. The fold feeds it once per ended session (never per
// token), and only when the view is configured; the sessions in flight are
// read from the table when a snapshot is taken, through locked.
type liveState struct {
	cfg    *LiveConfig
	allow  map[string]struct{}
	tel    *metadata.TelemetryBuilder
	locked lockedTable

	// recent is a ring of the latest ended sessions; next is where the
	// next goes, n how many it holds.
	recent []liveEnded
	next   int
	n      int

	// ttft holds the TTFTs of the last minute by engine and model, by
	// second; at most maxLiveTTFTKeys of them.
	ttft map[liveKey]*ttftMinute
}

// liveEnded is an ended session as the view lists it, its names as shown
// (liveName).
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

// liveTable is what a snapshot reads of the sessions in flight.
type liveTable interface {
	Active() int
	Scan(now int64, fn func(s *session.Session, phase session.Phase, engineNow int64))
}

// lockedTable runs fn with the fold's lock held, on the session table: the
// view's own state is guarded by the same lock.
type lockedTable func(fn func(liveTable))

func newLiveState(cfg *LiveConfig, tel *metadata.TelemetryBuilder, locked lockedTable) *liveState {
	l := &liveState{cfg: cfg, tel: tel, locked: locked, recent: make([]liveEnded, cfg.Recent), ttft: make(map[liveKey]*ttftMinute)}
	if len(cfg.Attributes) > 0 {
		l.allow = make(map[string]struct{}, len(cfg.Attributes))
		for _, k := range cfg.Attributes {
			l.allow[k] = struct{}{}
		}
	}
	return l
}

// Bounds of the view's own state, whatever names the senders choose.
const (
	// maxLiveTTFTKeys bounds the engine-and-model pairs whose TTFTs of the
	// last minute the view keeps: about 20 KB each.
	maxLiveTTFTKeys = 1024
	// maxLiveCells bounds the engine-and-model pairs one pass over the
	// table tallies (about 500 B each); the sessions of further pairs are
	// still listed, but left out of the engines' totals.
	maxLiveCells = 4096
	// liveMaxName bounds each name the view shows (session ID, model,
	// engine, operation, error type, attribute value), so that a
	// snapshot's size does not depend on what the senders send: a longer
	// one is cut, on a rune boundary, and ends in liveCut. Filters match
	// the names as shown.
	liveMaxName = 256
	liveCut     = "…"
)

// liveName is name as the view shows it: itself, or cut to liveMaxName
// bytes. The cut one is a new string, which does not keep the long one.
func liveName(name string) string {
	if len(name) <= liveMaxName {
		return name
	}
	i := liveMaxName
	for i > 0 && !utf8.RuneStart(name[i]) {
		i--
	}
	return name[:i] + liveCut
}

// ended records an ended session, at collector time now. Call with the
// fold's lock held.
func (l *liveState) ended(s *session.Session, e *session.End, now int64) {
	ttft, hasTTFT := s.TTFT()
	tpot, hasTPOT := s.TPOT(e.CompletionTokens)
	key := liveKey{engine: liveName(s.Engine), model: liveName(s.Model)}
	if len(l.recent) > 0 {
		l.recent[l.next] = liveEnded{
			id: liveName(s.ID), model: key.model, engine: key.engine, operation: liveName(s.Operation),
			errorType: liveName(s.ErrorType(e)), outcome: s.Outcome, traceID: s.TraceID, endedAt: now,
			ttft: ttft, hasTTFT: hasTTFT, tpot: tpot, hasTPOT: hasTPOT, duration: s.Duration(e), maxGap: s.MaxGap,
			tokens: max(s.OutputTokens(e), 0), stalls: s.StallCount, keep: s.Keep, reasons: s.Reasons,
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
	m := l.ttft[key]
	if m == nil {
		if len(l.ttft) >= maxLiveTTFTKeys {
			l.tel.ProcessorTokenSessionLiveTtftsOverflowed.Add(context.Background(), 1)
			return
		}
		m = &ttftMinute{}
		l.ttft[key] = m
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

// liveFilter picks the sessions, engines and ended sessions a snapshot
// lists, by their names as shown: "" matches every engine or model.
type liveFilter struct {
	engine, model string
}

func (f liveFilter) match(k liveKey) bool {
	return (f.engine == "" || f.engine == k.engine) && (f.model == "" || f.model == k.model)
}

// liveKey is an engine and a model, as shown: what a pass over the table
// tallies, and the TTFT minutes are kept by.
type liveKey struct {
	engine, model string
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
	// EnginesLeftOut are the engines the filter picks past max_engines;
	// SessionsUntallied the sessions it picks that no engine's totals
	// count, past maxLiveCells engine-and-model pairs in flight.
	EnginesLeftOut    int             `json:"engines_left_out"`
	SessionsUntallied int             `json:"sessions_untallied"`
	Recent            []liveEndedJSON `json:"recent"`
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

// liveCell is the sessions in flight of one engine and model as a pass
// over the table tallies them, and the queries that pick them.
type liveCell struct {
	key liveKey
	// engine and model as the first session met has them: the scan's
	// cache compares them, not the names as shown.
	engine, model string

	inFlight, waiting, decoding, stalled, frozen int
	tokensPerSec                                 float64
	maxWaiting                                   int64
	ttft                                         ttftHist
	hasTTFT                                      bool

	// queries are the indexes in liveScan.queries of the filters that
	// match the cell: at most four (any, its engine, its model, both).
	queries [4]int16
	nq      int
}

// tally counts s, whose phase is phase, at engine time engineNow.
func (c *liveCell) tally(s *session.Session, phase session.Phase, engineNow, since int64) {
	c.inFlight++
	switch phase {
	case session.PhaseWaiting:
		c.waiting++
		c.maxWaiting = max(c.maxWaiting, since)
		return
	case session.PhaseDecoding:
		c.decoding++
	case session.PhaseStalled:
		c.stalled++
	case session.PhaseFrozen:
		c.frozen++
	}
	if phase != session.PhaseFrozen {
		if w, ok := s.WindowTPOT(); ok && w > 0 {
			c.tokensPerSec += float64(time.Second) / float64(w)
		}
	}
	if ttft, ok := s.TTFT(); ok && engineNow-s.FirstTokenTime < int64(time.Minute) {
		c.ttft.add(ttft)
		c.hasTTFT = true
	}
}

// liveQuery is one filter's part of a pass: the worst sessions it picks,
// how many it picks, and their rows, copied under the lock.
type liveQuery struct {
	filter   liveFilter
	heap     worstHeap
	matching int
	// untallied counts the sessions it picks of the pairs past
	// maxLiveCells.
	untallied int
	rows      []liveRow
}

// liveRow is a session's row and its badness, sorted after the lock.
type liveRow struct {
	key  int64
	json liveSessionJSON
}

// liveScan is one pass over the table and the snapshots it makes, one per
// distinct filter: a session is tallied once, in its engine-and-model
// cell, and offered to the heaps of the (at most four) filters that match
// it, so that the pass costs the same whatever the number of filters. Its
// buffers are kept from one pass to the next.
type liveScan struct {
	queries []liveQuery
	index   map[liveFilter]int
	cells   map[liveKey]*liveCell
	// few are the first cells made, checked before the map: there are few
	// engines and models, and the map would hash every session's names.
	few []*liveCell
	// untallied counts the sessions of the pairs past maxLiveCells.
	untallied int
	recent    []liveEnded
}

func (sc *liveScan) reset(filters []liveFilter, maxSessions int) {
	if sc.index == nil {
		sc.index = make(map[liveFilter]int, len(filters))
	}
	clear(sc.index)
	sc.queries = slices.Grow(sc.queries[:0], len(filters))[:len(filters)]
	for i, f := range filters {
		sc.index[f] = i
		q := &sc.queries[i]
		q.filter, q.matching, q.untallied, q.rows = f, 0, 0, nil
		q.heap.k, q.heap.items = maxSessions, q.heap.items[:0]
	}
	sc.cells = make(map[liveKey]*liveCell)
	clear(sc.few)
	sc.few = sc.few[:0]
	sc.untallied = 0
	clear(sc.recent)
	sc.recent = sc.recent[:0]
}

// queriesOf are the queries whose filters match k.
func (sc *liveScan) queriesOf(k liveKey) (qs [4]int16, n int) {
	for _, f := range [...]liveFilter{{}, {engine: k.engine}, {model: k.model}, {engine: k.engine, model: k.model}} {
		if i, ok := sc.index[f]; ok && !slices.Contains(qs[:n], int16(i)) {
			qs[n] = int16(i)
			n++
		}
	}
	return qs, n
}

func (sc *liveScan) newCell(key liveKey, engine, model string) *liveCell {
	c := &liveCell{key: key, engine: engine, model: model}
	c.queries, c.nq = sc.queriesOf(key)
	sc.cells[key] = c
	if len(sc.few) < 8 {
		sc.few = append(sc.few, c)
	}
	return c
}

// cellOf is the cell of engine and model, made if need be; nil past
// maxLiveCells.
func (sc *liveScan) cellOf(engine, model string) *liveCell {
	for _, c := range sc.few {
		if c.engine == engine && c.model == model {
			return c
		}
	}
	key := liveKey{engine: liveName(engine), model: liveName(model)}
	if c := sc.cells[key]; c != nil {
		return c
	}
	if len(sc.cells) >= maxLiveCells {
		return nil
	}
	return sc.newCell(key, engine, model)
}

// engineTally is one engine's totals over the cells a filter picks.
type engineTally struct {
	liveEngineJSON
	maxWaiting int64
	ttft       ttftHist
	hasTTFT    bool
}

func (t *engineTally) add(c *liveCell) {
	t.InFlight += c.inFlight
	t.Waiting += c.waiting
	t.Decoding += c.decoding
	t.Stalled += c.stalled
	t.Frozen += c.frozen
	t.TokensPerSec += c.tokensPerSec
	t.maxWaiting = max(t.maxWaiting, c.maxWaiting)
	if c.hasTTFT {
		for i, n := range c.ttft {
			t.ttft[i] += n
		}
		t.hasTTFT = true
	}
}

// worseEngine orders engines worst first: the most frozen sessions, then
// stalled, then in flight; among equals by name.
func worseEngine(a, b *engineTally) int {
	return cmp.Or(cmp.Compare(b.Frozen, a.Frozen), cmp.Compare(b.Stalled, a.Stalled),
		cmp.Compare(b.InFlight, a.InFlight), cmp.Compare(a.Engine, b.Engine))
}

// engines are the engines each query's filter picks: the worst maxEngines
// of them, listed by name, and how many are left out.
func (sc *liveScan) engines(maxEngines int) (lists [][]liveEngineJSON, leftOut []int) {
	byName := make([]map[string]*engineTally, len(sc.queries))
	for i := range byName {
		byName[i] = make(map[string]*engineTally)
	}
	for _, c := range sc.cells {
		for _, qi := range c.queries[:c.nq] {
			t := byName[qi][c.key.engine]
			if t == nil {
				t = &engineTally{liveEngineJSON: liveEngineJSON{Engine: c.key.engine}}
				byName[qi][c.key.engine] = t
			}
			t.add(c)
		}
	}
	lists, leftOut = make([][]liveEngineJSON, len(sc.queries)), make([]int, len(sc.queries))
	for qi, m := range byName {
		tallies := make([]*engineTally, 0, len(m))
		for _, t := range m {
			tallies = append(tallies, t)
		}
		slices.SortFunc(tallies, worseEngine)
		leftOut[qi] = max(0, len(tallies)-maxEngines)
		tallies = tallies[:len(tallies)-leftOut[qi]]
		list := make([]liveEngineJSON, len(tallies))
		for i, t := range tallies {
			if t.hasTTFT {
				p50, p99, n := t.ttft.quantiles()
				t.TTFTP50Ms, t.TTFTP99Ms, t.TTFTCount = &p50, &p99, n
			}
			t.MaxWaitingMs = millis(time.Duration(t.maxWaiting))
			t.TokensPerSec = math.Round(t.TokensPerSec*10) / 10
			list[i] = t.liveEngineJSON
		}
		// By name, so that each engine's bar keeps its place.
		slices.SortFunc(list, func(a, b liveEngineJSON) int { return cmp.Compare(a.Engine, b.Engine) })
		lists[qi] = list
	}
	return lists, leftOut
}

// snapshot is the snapshot of the sessions in flight that f picks, at
// collector time now, encoded.
func (l *liveState) snapshot(now time.Time, f liveFilter, sc *liveScan) []byte {
	return l.snapshots(now, []liveFilter{f}, sc)[0]
}

// snapshots are the snapshots for each of filters (distinct), taken in
// one pass over the table (take) and encoded after the lock is released.
func (l *liveState) snapshots(now time.Time, filters []liveFilter, sc *liveScan) [][]byte {
	snaps := l.take(now, filters, sc)
	bodies := make([][]byte, len(snaps))
	for i, snap := range snaps {
		body, err := json.Marshal(snap)
		if err != nil {
			// Nothing in it can fail to encode (NaN never reaches it).
			panic(err)
		}
		bodies[i] = body
	}
	return bodies
}

// take takes the snapshot for each of filters at collector time now.
// The table is read under the lock in one pass, whatever the number of
// filters: each session is tallied in its engine-and-model cell and
// offered to the bounded heaps of the filters that match it; the rows of
// each filter's worst are copied, and the ended sessions' ring. The
// engines' totals and the filtering of the ended sessions are done after
// the lock is released.
func (l *liveState) take(now time.Time, filters []liveFilter, sc *liveScan) []*liveSnapshot {
	nowNs := now.UnixNano()
	sc.reset(filters, l.cfg.MaxSessions)
	var inFlight int
	l.locked(func(table liveTable) {
		l.scan(table, nowNs, sc, &inFlight)
	})
	l.report(sc)
	return l.build(now, sc, inFlight)
}

// scan is take's part under the lock: one pass over table, the worst
// sessions' rows copied, the TTFT minutes and the ended sessions' ring
// read.
func (l *liveState) scan(table liveTable, nowNs int64, sc *liveScan, inFlight *int) {
	var (
		last  *liveCell
		spill [4]int16
	)
	*inFlight = table.Active()
	table.Scan(nowNs, func(s *session.Session, phase session.Phase, engineNow int64) {
		// An engine's sessions often come in runs: the last cell first.
		if last == nil || s.Engine != last.engine || s.Model != last.model {
			last = sc.cellOf(s.Engine, s.Model)
		}
		since := engineNow - s.LastTokenTime
		if phase == session.PhaseWaiting {
			since = engineNow - s.StartedAt()
		}
		var qs []int16
		untallied := last == nil
		if !untallied {
			last.tally(s, phase, engineNow, since)
			qs = last.queries[:last.nq]
		} else {
			sc.untallied++
			var n int
			spill, n = sc.queriesOf(liveKey{engine: liveName(s.Engine), model: liveName(s.Model)})
			qs = spill[:n]
		}
		if len(qs) == 0 {
			return
		}
		c := liveCandidate{key: badness(phase, since), s: s, phase: phase, engineNow: engineNow}
		for _, qi := range qs {
			q := &sc.queries[qi]
			q.matching++
			if untallied {
				q.untallied++
			}
			q.heap.offer(c)
		}
	})
	for i := range sc.queries {
		q := &sc.queries[i]
		q.rows = make([]liveRow, len(q.heap.items))
		for j := range q.heap.items {
			q.rows[j] = liveRow{key: q.heap.items[j].key, json: l.sessionJSON(&q.heap.items[j])}
		}
		clear(q.heap.items) // no session kept past the lock
	}
	var h ttftHist
	for key, m := range l.ttft {
		h = ttftHist{}
		if !m.sumInto(nowNs, &h) {
			delete(l.ttft, key) // nothing of it in the last minute
			continue
		}
		// A pair with no session in flight has a cell of its own, past
		// maxLiveCells too: at most maxLiveTTFTKeys of them.
		c := sc.cells[key]
		if c == nil {
			c = sc.newCell(key, key.engine, key.model)
		}
		for i, n := range h {
			c.ttft[i] += n
		}
		c.hasTTFT = true
	}
	for i := range l.n {
		sc.recent = append(sc.recent, l.recent[(l.next-1-i+2*len(l.recent))%len(l.recent)])
	}
}

// report counts a pass in the self-telemetry.
func (l *liveState) report(sc *liveScan) {
	ctx := context.Background()
	l.tel.ProcessorTokenSessionLiveScans.Add(ctx, 1)
	if sc.untallied > 0 {
		l.tel.ProcessorTokenSessionLiveSessionsUntallied.Add(ctx, int64(sc.untallied))
	}
}

// build makes take's snapshots after the lock is released: the engines'
// totals, each filter's rows in order, its ended sessions.
func (l *liveState) build(now time.Time, sc *liveScan, inFlight int) []*liveSnapshot {
	ctx := context.Background()
	engines, leftOut := sc.engines(l.cfg.MaxEngines)
	snaps := make([]*liveSnapshot, len(sc.queries))
	for i := range sc.queries {
		q := &sc.queries[i]
		snap := &liveSnapshot{
			Time: now.UTC(), IntervalMs: millis(l.cfg.Interval), TraceURL: l.cfg.TraceURL,
			Filter:   liveFilterJSON{Engine: q.filter.engine, Model: q.filter.model},
			InFlight: inFlight, Matching: q.matching, Sessions: make([]liveSessionJSON, len(q.rows)),
			Engines: engines[i], EnginesLeftOut: leftOut[i], SessionsUntallied: q.untallied,
			Recent: make([]liveEndedJSON, 0, len(sc.recent)),
		}
		// Worst first; among equals by ID, so that rows keep their order
		// between snapshots.
		slices.SortFunc(q.rows, func(a, b liveRow) int {
			return cmp.Or(cmp.Compare(b.key, a.key), cmp.Compare(a.json.ID, b.json.ID))
		})
		for j := range q.rows {
			snap.Sessions[j] = q.rows[j].json
		}
		q.rows = nil
		for j := range sc.recent {
			if e := &sc.recent[j]; q.filter.match(liveKey{engine: e.engine, model: e.model}) {
				snap.Recent = append(snap.Recent, e.json())
			}
		}
		if leftOut[i] > 0 {
			l.tel.ProcessorTokenSessionLiveEnginesLeftOut.Add(ctx, int64(leftOut[i]))
		}
		snaps[i] = snap
	}
	// The cells are the pass's alone: not kept until the next.
	sc.cells = nil
	clear(sc.few)
	sc.few = sc.few[:0]
	return snaps
}

// sessionJSON copies what the view shows of c's session; called under the
// lock, as the session may be reused after it.
func (l *liveState) sessionJSON(c *liveCandidate) liveSessionJSON {
	s := c.s
	age := time.Duration(max(0, c.engineNow-s.StartedAt()))
	out := liveSessionJSON{
		ID: liveName(s.ID), Model: liveName(s.Model), Engine: liveName(s.Engine), Operation: liveName(s.Operation),
		Phase: c.phase.String(),
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
				out.Attributes[a.Key] = liveName(a.Value)
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
