// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// State is what the live view keeps between snapshots, under the
// fold's lock: the latest ended sessions and the TTFTs of the last minute
// by engine and model. The fold feeds it once per ended session (never per
// token), and only when the view is configured; the sessions in flight are
// read from the table when a snapshot is taken, through locked.
type State struct {
	cfg    *Config
	allow  map[string]struct{}
	tel    *metadata.TelemetryBuilder
	locked LockedTable

	// recent is a ring of the latest ended sessions; next is where the
	// next goes, n how many it holds.
	recent []liveEnded
	next   int
	n      int

	// ttft holds the TTFTs of the last minute by engine and model, by
	// second; at most maxLiveTTFTKeys of them.
	ttft map[liveKey]*ttftMinute
}

// Table is what a snapshot reads of the sessions in flight.
type Table interface {
	Active() int
	Scan(now int64, fn func(s *session.Session, phase session.Phase, engineNow int64))
}

// LockedTable runs fn with the fold's lock held, on the session table: the
// view's own state is guarded by the same lock.
type LockedTable func(fn func(Table))

// NewState is the view of cfg, which reads the table through locked.
func NewState(cfg *Config, tel *metadata.TelemetryBuilder, locked LockedTable) *State {
	l := &State{cfg: cfg, tel: tel, locked: locked, recent: make([]liveEnded, cfg.Recent), ttft: make(map[liveKey]*ttftMinute)}
	if len(cfg.Attributes) > 0 {
		l.allow = make(map[string]struct{}, len(cfg.Attributes))
		for _, k := range cfg.Attributes {
			l.allow[k] = struct{}{}
		}
	}
	return l
}

// maxLiveTTFTKeys bounds the engine-and-model pairs whose TTFTs of the
// last minute the view keeps, whatever names the senders choose: about 20
// KB each.
const maxLiveTTFTKeys = 1024

// Ended records an ended session, at collector time now. Call with the
// fold's lock held.
func (l *State) Ended(s *session.Session, e *session.End, now int64) {
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

// Snapshot is the snapshot of the sessions in flight that f picks, at
// collector time now, encoded as GET /sessions answers it.
func (l *State) Snapshot(now time.Time, f Filter) []byte {
	return l.snapshot(now, f, &liveScan{})
}

// snapshot is Snapshot with the buffers of sc.
func (l *State) snapshot(now time.Time, f Filter, sc *liveScan) []byte {
	return l.snapshots(now, []Filter{f}, sc)[0]
}

// snapshots are the snapshots for each of filters (distinct), taken in
// one pass over the table (take) and encoded after the lock is released.
func (l *State) snapshots(now time.Time, filters []Filter, sc *liveScan) [][]byte {
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
func (l *State) take(now time.Time, filters []Filter, sc *liveScan) []*Snapshot {
	nowNs := now.UnixNano()
	sc.reset(filters, l.cfg.MaxSessions)
	var inFlight int
	l.locked(func(table Table) {
		l.scan(table, nowNs, sc, &inFlight)
	})
	l.report(sc)
	return l.build(now, sc, inFlight)
}

// scan is take's part under the lock: one pass over table, the worst
// sessions' rows copied, the TTFT minutes and the ended sessions' ring
// read.
func (l *State) scan(table Table, nowNs int64, sc *liveScan, inFlight *int) {
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
			it := &q.heap.items[j]
			q.rows[j] = liveRow{key: it.key, json: sessionJSON(it.s, it.phase, it.engineNow, l.allow)}
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
func (l *State) report(sc *liveScan) {
	ctx := context.Background()
	l.tel.ProcessorTokenSessionLiveScans.Add(ctx, 1)
	if sc.untallied > 0 {
		l.tel.ProcessorTokenSessionLiveSessionsUntallied.Add(ctx, int64(sc.untallied))
	}
}

// build makes take's snapshots after the lock is released: the engines'
// totals, each filter's rows in order, its ended sessions.
func (l *State) build(now time.Time, sc *liveScan, inFlight int) []*Snapshot {
	ctx := context.Background()
	engines, leftOut := sc.engines(l.cfg.MaxEngines)
	snaps := make([]*Snapshot, len(sc.queries))
	for i := range sc.queries {
		q := &sc.queries[i]
		snap := &Snapshot{
			Time: now.UTC(), IntervalMs: millis(l.cfg.Interval), TraceURL: l.cfg.TraceURL,
			Filter:   FilterJSON{Engine: q.filter.Engine, Model: q.filter.Model},
			InFlight: inFlight, Matching: q.matching, Sessions: make([]SessionJSON, len(q.rows)),
			Engines: engines[i], EnginesLeftOut: leftOut[i], SessionsUntallied: q.untallied,
			Recent: make([]EndedJSON, 0, len(sc.recent)),
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
