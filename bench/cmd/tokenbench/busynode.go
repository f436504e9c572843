// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"
)

// busyNodeResult is a busy GPU node: engines streaming rate tokens/s each
// for a while, through our hooks (the clients' default transport) and,
// the same load, through the stock pipeline (a span per token). Targets:
// our collector at most 0.05 cores, and at least 10× fewer than stock's.
type busyNodeResult struct {
	Engines        int       `json:"engines"`
	RatePerEngine  float64   `json:"tokens_per_second_per_engine"`
	Seconds        float64   `json:"seconds"`
	SessionsOpen   int       `json:"sessions_open_per_engine"`
	FlushInterval  string    `json:"client_flush_interval"`
	Transport      string    `json:"hook_transport"`
	Ours           cpuRun    `json:"ours"`
	Stock          cpuRun    `json:"stock"`
	OursCores      float64   `json:"ours_cores"`
	StockCores     float64   `json:"stock_cores"`
	Ratio          float64   `json:"stock_over_ours_cores"`
	Ratios         []float64 `json:"ratios"`
	OursCoresRuns  []float64 `json:"ours_cores_runs"`
	StockCoresRuns []float64 `json:"stock_cores_runs"`
}

const (
	// busySessions is each engine's open sessions: a vLLM batch, each
	// session at rate/busySessions tokens/s (50/s at 5000: 20 ms a token).
	busySessions = 100
	busyTokens   = 200
	// busyFlush is how often an engine's client writes what it queued:
	// the clients' default FlushInterval.
	busyFlush = 100 * time.Millisecond
)

// engineStream is one engine's token stream, cut into the writes its
// client makes every busyFlush, encoded by enc.
type engineStream struct {
	g       *generator
	pending []wEvent
	perTick int
	enc     func([]wEvent) []byte
	tick    int
	limit   time.Duration
}

func newEngineStream(engine int, rate float64, limit time.Duration, stock bool) *engineStream {
	w := workload{Sessions: busySessions, Tokens: busyTokens, Waves: 1 << 30, BatchLines: 1}
	g := newGenerator(w, uint64(7000+engine))
	s := &engineStream{g: g, limit: limit, enc: ndjson}
	if stock {
		s.enc = g.otlpSpans
	}
	// Each tick's events: its tokens, with the starts and ends among them.
	s.perTick = int(rate * busyFlush.Seconds() * float64(busyTokens+2) / busyTokens)
	return s
}

// next is the engine's next write and when it is due.
func (s *engineStream) next() (batch, time.Duration, bool) {
	at := time.Duration(s.tick) * busyFlush
	if at >= s.limit {
		return batch{}, 0, false
	}
	for len(s.pending) < s.perTick {
		s.g.newWave()
		s.pending = s.g.steps(s.pending, 0, busyTokens+2)
	}
	evs := s.pending[:s.perTick]
	b := batch{body: s.enc(evs), tokens: tokensIn(evs), events: len(evs)}
	s.pending = append(s.pending[:0], s.pending[s.perTick:]...)
	s.tick++
	return b, at, true
}

// busyNode runs the node's load e.repeat times on each side, alternating.
func (e *env) busyNode(engines int, rate float64, d time.Duration) (*busyNodeResult, error) {
	res := &busyNodeResult{
		Engines: engines, RatePerEngine: rate, Seconds: d.Seconds(), SessionsOpen: busySessions,
		FlushInterval: busyFlush.String(), Transport: e.hookTransport,
	}
	var pairs []runPair
	for run := range e.repeat {
		var p runPair
		ours, a, err := e.startOurs(fmt.Sprintf("busynode-ours-%d", run))
		if err != nil {
			return nil, err
		}
		streams := make([]*engineStream, engines)
		for i := range streams {
			streams[i] = newEngineStream(i, rate, d, false)
		}
		var send func() (sendResult, error)
		if e.hookTransport == "unix" {
			send = func() (sendResult, error) {
				return streamSender{path: a.hooksUnix}.send(e.ctx, engines, func(w int) (batch, time.Duration, bool) { return streams[w].next() })
			}
		} else {
			hp := hookPoster(a, engines)
			defer hp.close()
			send = func() (sendResult, error) { return pacedPost(e.ctx, hp, streams) }
		}
		p.ours, err = measureCPU(ours, e.sink, "busy node ours", e.profiled(ours, fmt.Sprintf("busynode-ours-%d", run), send), settleHTTP(ours))
		ours.stop()
		if err != nil {
			return nil, err
		}

		stock, sa, err := e.startStock(fmt.Sprintf("busynode-stock-%d", run))
		if err != nil {
			return nil, err
		}
		for i := range streams {
			streams[i] = newEngineStream(i, rate, d, true)
		}
		sp := spanPoster(sa, engines)
		p.stock, err = measureCPU(stock, e.sink, "busy node stock", func() (sendResult, error) { return pacedPost(e.ctx, sp, streams) }, settleStock(stock))
		sp.close()
		stock.stop()
		if err != nil {
			return nil, err
		}
		oursCores, stockCores := p.ours.CPUSeconds/d.Seconds(), p.stock.CPUSeconds/d.Seconds()
		p.ratio = ratio(stockCores, oursCores)
		res.OursCoresRuns = append(res.OursCoresRuns, oursCores)
		res.StockCoresRuns = append(res.StockCoresRuns, stockCores)
		res.Ratios = append(res.Ratios, p.ratio)
		pairs = append(pairs, p)
		log.Printf("busy node run %d: ours %.4f cores, stock %.4f cores: %.1f× fewer", run, oursCores, stockCores, p.ratio)
	}
	m := medianPair(pairs)
	res.Ours, res.Stock, res.Ratio = m.ours, m.stock, m.ratio
	res.OursCores, res.StockCores = m.ours.CPUSeconds/d.Seconds(), m.stock.CPUSeconds/d.Seconds()
	log.Printf("busy node, %d engines × %.0f tokens/s for %s over %s: ours %.4f cores, stock %.4f cores: %.1f× (runs: %s)",
		engines, rate, d, e.hookTransport, res.OursCores, res.StockCores, res.Ratio, ratiosText(res.Ratios))
	return res, nil
}

// pacedPost posts each engine's writes at their time, one goroutine an
// engine.
func pacedPost(ctx context.Context, p *poster, streams []*engineStream) (sendResult, error) {
	var (
		res sendResult
		mu  sync.Mutex
		wg  sync.WaitGroup
	)
	start := time.Now()
	for _, s := range streams {
		wg.Go(func() {
			for ctx.Err() == nil {
				b, at, ok := s.next()
				if !ok {
					return
				}
				if wait := time.Until(start.Add(at)); wait > 0 {
					time.Sleep(wait)
				}
				p.post(ctx, b, &res, &mu)
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, failed(res)
}
