// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"cmp"
	"fmt"
	"log"
	"slices"
	"strconv"
	"strings"
)

// The token path's workload shapes: ours (the hooks over -hook-transport,
// by default the Unix socket the clients use where the node offers it →
// token_session → otlp) against the stock pipeline (a span per token →
// tail_sampling + span_metrics) on each of eight shapes, one dimension at a
// time around a middle shape of 10 sessions per batch, 40 tokens per
// session and 3 concurrent posters, and one token per session per batch at
// 100 000 sessions. The target is 10× stock on every shape. Over the Unix
// socket a shape's batch is one write of a connection (posters are
// connections), and the collector forms its batches by time, as it does for
// the clients' streams.

// shape is one workload shape.
type shape struct {
	// Index is the shape's place among defaultShapes: it names its files
	// and seeds its workload, whichever shapes a run picks.
	Index int    `json:"index"`
	Name  string `json:"name"`
	// SessionsPerBatch complete sessions per request (start, tokens, end),
	// or 0 for a batch of one token per session across many sessions.
	SessionsPerBatch int `json:"sessions_per_batch"`
	Tokens           int `json:"tokens_per_session"`
	Posters          int `json:"posters"`
	// Sessions open at once, for the one-token-per-batch shape.
	Concurrent int `json:"concurrent_sessions,omitempty"`
}

// shapeTokens is about how many tokens each shape sends: enough CPU time
// to measure on each side (ours spends 0.3–4 CPU-s on it; at 400 000 the
// cheapest shapes were a few /proc ticks and moved by ±20% between runs),
// little enough to keep make bench short.
// -shape-tokens changes it, for a short trial of the harness.
const shapeTokens = 1_000_000

func defaultShapes() []shape {
	list := []shape{
		{Name: "middle", SessionsPerBatch: 10, Tokens: 40, Posters: 3},
		{Name: "1 session per batch", SessionsPerBatch: 1, Tokens: 40, Posters: 3},
		{Name: "50 sessions per batch", SessionsPerBatch: 50, Tokens: 40, Posters: 3},
		{Name: "10 tokens per session", SessionsPerBatch: 10, Tokens: 10, Posters: 3},
		{Name: "200 tokens per session", SessionsPerBatch: 10, Tokens: 200, Posters: 3},
		{Name: "1 poster", SessionsPerBatch: 10, Tokens: 40, Posters: 1},
		{Name: "8 posters", SessionsPerBatch: 10, Tokens: 40, Posters: 8},
		{Name: "1 token per session per batch, 100 000 sessions", Tokens: 4, Posters: 3, Concurrent: 100_000},
	}
	for i := range list {
		list[i].Index = i
	}
	return list
}

// workload is the shape's token stream: waves of complete sessions, one
// wave per batch; or, for the one-token shape, one wave of Concurrent
// sessions cut into batches of 1024 events, which holds one token of each
// session it touches.
func (s shape) workload(tokens int) workload {
	if s.Concurrent > 0 {
		return workload{Sessions: s.Concurrent, Tokens: s.Tokens, Waves: 1, BatchLines: 1024}
	}
	perBatch := s.SessionsPerBatch * s.Tokens
	return workload{
		Sessions: s.SessionsPerBatch, Tokens: s.Tokens, Waves: max(1, tokens/perBatch),
		BatchLines: s.SessionsPerBatch * (s.Tokens + 2),
	}
}

// shapeResult is one shape, both sides.
type shapeResult struct {
	Shape     shape    `json:"shape"`
	Workload  workload `json:"workload"`
	Transport string   `json:"hook_transport"`
	// Ours and Stock are the runs of the median ratio's pair.
	Ours  cpuRun  `json:"ours"`
	Stock cpuRun  `json:"stock"`
	Ratio float64 `json:"tokens_per_cpu_second_ratio"`
	// Ratios are every pair's, in run order; their spread is min to max.
	Ratios []float64 `json:"ratios"`
}

// shapesResult is the matrix, with its worst ratio.
type shapesResult struct {
	Shapes     []shapeResult `json:"shapes"`
	WorstRatio float64       `json:"worst_ratio"`
	WorstShape string        `json:"worst_shape"`
}

// shapes runs each shape e.repeat times with our side's hooks over
// transport (unix or http), alternating ours and stock, each run on a fresh
// collector, so that one run's sessions and traces do not weigh on the next;
// a shape's ratio is the median pair's.
func (e *env) shapes(list []shape, transport string) (*shapesResult, error) {
	res := &shapesResult{}
	for _, sh := range list {
		w := sh.workload(e.shapeTokens)
		r := shapeResult{Shape: sh, Workload: w, Transport: transport}
		var pairs []runPair
		for run := range e.repeat {
			// The transport in the names of all but the default side's
			// files, so that a run of both keeps both.
			tag := ""
			if transport != e.hookTransport {
				tag = transport + "-"
			}
			name := fmt.Sprintf("shape%d-%sours-%d", sh.Index, tag, run)
			ours, a, err := e.startOurs(name)
			if err != nil {
				return nil, err
			}
			g := newGenerator(w, uint64(100+sh.Index))
			nd := chunk(g.all(), w.BatchLines, ndjson)
			var send func() (sendResult, error)
			var closeSend func()
			if transport == "unix" {
				send, closeSend = streamSender{path: a.hooksUnix}.sendAll(e.ctx, nd, sh.Posters), func() {}
			} else {
				hp := hookPoster(a, sh.Posters)
				send, closeSend = hp.sendAll(e.ctx, nd, sh.Posters), hp.close
			}
			var p runPair
			p.ours, err = measureCPU(ours, e.sink, "ours "+sh.Name, e.profiled(ours, name, send), settleHTTP(ours))
			closeSend()
			ours.stop()
			if err != nil {
				return nil, err
			}

			stock, sa, err := e.startStock(fmt.Sprintf("shape%d-%sstock-%d", sh.Index, tag, run))
			if err != nil {
				return nil, err
			}
			g = newGenerator(w, uint64(100+sh.Index))
			evs := g.all()
			ot := chunk(evs, w.BatchLines, g.otlpSpans)
			sp := spanPoster(sa, sh.Posters)
			p.stock, err = measureCPU(stock, e.sink, "stock "+sh.Name, sp.sendAll(e.ctx, ot, sh.Posters), settleStock(stock))
			sp.close()
			stock.stop()
			if err != nil {
				return nil, err
			}
			p.ratio = ratio(p.ours.TokensPerCPUSecond, p.stock.TokensPerCPUSecond)
			pairs = append(pairs, p)
			r.Ratios = append(r.Ratios, p.ratio)
		}
		m := medianPair(pairs)
		r.Ours, r.Stock, r.Ratio = m.ours, m.stock, m.ratio
		log.Printf("shape %q over %s: ours %.0f, stock %.0f tokens/CPU-s: %.1f× (runs: %s)", sh.Name, transport,
			r.Ours.TokensPerCPUSecond, r.Stock.TokensPerCPUSecond, r.Ratio, ratiosText(r.Ratios))
		if res.WorstShape == "" || r.Ratio < res.WorstRatio {
			res.WorstRatio, res.WorstShape = r.Ratio, sh.Name
		}
		res.Shapes = append(res.Shapes, r)
	}
	return res, nil
}

// runPair is one run of each side and their ratio.
type runPair struct {
	ours, stock cpuRun
	ratio       float64
}

// medianPair is the pair of the median ratio (the lower middle one of an
// even count).
func medianPair(pairs []runPair) runPair {
	sorted := slices.Clone(pairs)
	slices.SortFunc(sorted, func(a, b runPair) int { return cmp.Compare(a.ratio, b.ratio) })
	return sorted[(len(sorted)-1)/2]
}

// ratiosText is every run's ratio and their spread, for logs and reports.
func ratiosText(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%.1f×", r)
	}
	return fmt.Sprintf("%s; spread %.1f–%.1f×", strings.Join(parts, ", "), slices.Min(rs), slices.Max(rs))
}

// pickShapes keeps the shapes whose indices sel lists (comma-separated), or
// all of them when sel is empty.
func pickShapes(all []shape, sel string) ([]shape, error) {
	if sel == "" {
		return all, nil
	}
	var out []shape
	for _, f := range strings.Split(sel, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || i < 0 || i >= len(all) {
			return nil, fmt.Errorf("-shapes: %q is not a shape index from 0 to %d", f, len(all)-1)
		}
		out = append(out, all[i])
	}
	return out, nil
}
