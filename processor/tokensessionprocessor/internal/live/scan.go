// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// One pass of the live view over the session table: the filters, the
// worst sessions' heaps, the engine-and-model cells and the engines' totals.

// maxLiveCells bounds the engine-and-model pairs one pass over the table
// tallies (about 500 B each), whatever names the senders choose; the
// sessions of further pairs are still listed, but left out of the engines'
// totals.
const maxLiveCells = 4096

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
	filter   Filter
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
	json SessionJSON
}

// liveScan is one pass over the table and the snapshots it makes, one per
// distinct filter: a session is tallied once, in its engine-and-model
// cell, and offered to the heaps of the (at most four) filters that match
// it, so that the pass costs the same whatever the number of filters. Its
// buffers are kept from one pass to the next.
type liveScan struct {
	queries []liveQuery
	index   map[Filter]int
	cells   map[liveKey]*liveCell
	// few are the first cells made, checked before the map: there are few
	// engines and models, and the map would hash every session's names.
	few []*liveCell
	// untallied counts the sessions of the pairs past maxLiveCells.
	untallied int
	recent    []liveEnded
}

func (sc *liveScan) reset(filters []Filter, maxSessions int) {
	if sc.index == nil {
		sc.index = make(map[Filter]int, len(filters))
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
	for _, f := range [...]Filter{{}, {Engine: k.engine}, {Model: k.model}, {Engine: k.engine, Model: k.model}} {
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
	EngineJSON
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
func (sc *liveScan) engines(maxEngines int) (lists [][]EngineJSON, leftOut []int) {
	byName := make([]map[string]*engineTally, len(sc.queries))
	for i := range byName {
		byName[i] = make(map[string]*engineTally)
	}
	for _, c := range sc.cells {
		for _, qi := range c.queries[:c.nq] {
			t := byName[qi][c.key.engine]
			if t == nil {
				t = &engineTally{EngineJSON: EngineJSON{Engine: c.key.engine}}
				byName[qi][c.key.engine] = t
			}
			t.add(c)
		}
	}
	lists, leftOut = make([][]EngineJSON, len(sc.queries)), make([]int, len(sc.queries))
	for qi, m := range byName {
		tallies := make([]*engineTally, 0, len(m))
		for _, t := range m {
			tallies = append(tallies, t)
		}
		slices.SortFunc(tallies, worseEngine)
		leftOut[qi] = max(0, len(tallies)-maxEngines)
		tallies = tallies[:len(tallies)-leftOut[qi]]
		list := make([]EngineJSON, len(tallies))
		for i, t := range tallies {
			if t.hasTTFT {
				p50, p99, n := t.ttft.quantiles()
				t.TTFTP50Ms, t.TTFTP99Ms, t.TTFTCount = &p50, &p99, n
			}
			t.MaxWaitingMs = millis(time.Duration(t.maxWaiting))
			t.TokensPerSec = math.Round(t.TokensPerSec*10) / 10
			list[i] = t.EngineJSON
		}
		// By name, so that each engine's bar keeps its place.
		slices.SortFunc(list, func(a, b EngineJSON) int { return cmp.Compare(a.Engine, b.Engine) })
		lists[qi] = list
	}
	return lists, leftOut
}
