// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/otlpsink"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

const hookPath = "/v1/token-events"

// tokenPathResult is the side-by-side of the token path.
type tokenPathResult struct {
	Workload workload `json:"workload"`
	HTTP     cpuRun   `json:"hooks_http"`
	UDP      cpuRun   `json:"hooks_udp"`
	Stock    cpuRun   `json:"stock"`
	// MemOurs is the median run's of e.repeat, by heap per session, each
	// on a fresh collector; MemOursHeapRuns every run's heap per session.
	MemOurs         memRun    `json:"memory_hooks_http"`
	MemOursHeapRuns []float64 `json:"memory_hooks_http_heap_per_session_runs"`
	MemStock        memRun    `json:"memory_stock"`
	// MemOursNoAttribution is one run with attribution::enabled: false:
	// GPU-time attribution by steps holds each token for settle_after (16
	// B a token), which the tokens sent at once here are all inside.
	MemOursNoAttribution memRun `json:"memory_hooks_http_attribution_off"`
	// Ratios: ours over stock for throughput, stock over ours for memory.
	HTTPvsStock        float64 `json:"tokens_per_cpu_second_ratio_http_vs_stock"`
	UDPvsStock         float64 `json:"tokens_per_cpu_second_ratio_udp_vs_stock"`
	MemoryStockVsOurs  float64 `json:"memory_per_session_ratio_stock_vs_ours_heap"`
	RSSStockVsOurs     float64 `json:"memory_per_session_ratio_stock_vs_ours_rss"`
	StockSpansExpected int64   `json:"stock_spans_sent"`
	UDPDatagramBytes   int     `json:"udp_datagram_bytes"`
	UDPRate            float64 `json:"udp_events_per_second_offered"`
}

type env struct {
	out      string
	ours     string // the otelcol-llm binary
	stock    string // the otelcol-stock binary
	workers  int
	udpRate  float64
	memK     int
	memToks  int
	ctx      context.Context
	sink     *otlpsink.Sink
	udpBytes int
	// profile, when not zero: our collector is CPU-profiled for this long
	// from the start of each token path, shape and scale run (profiled).
	profile time.Duration
	// hookTransport is our side's hook transport in shapes and busynode:
	// unix or http.
	hookTransport string
	// repeat is how many runs of each side shapes and busynode make.
	repeat int
	// shapeTokens is about how many tokens each shape sends.
	shapeTokens int
}

// profiled wraps a run's send: when e.profile is set, our collector c is
// CPU-profiled meanwhile, into <out>/<name>.cpu.pprof.
func (e *env) profiled(c *collector, name string, send func() (sendResult, error)) func() (sendResult, error) {
	if e.profile <= 0 {
		return send
	}
	return func() (sendResult, error) {
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := c.cpuProfile(e.ctx, e.profile, filepath.Join(e.out, name+".cpu.pprof")); err != nil {
				log.Printf("%s: profile: %v", name, err)
			}
		})
		defer wg.Wait()
		return send()
	}
}

func (e *env) startOurs(name string) (*collector, addrs, error) {
	return e.startOursWith(name, func(cfg string) string { return cfg })
}

// startOursWith starts our collector on fresh addresses with its config
// changed by edit.
func (e *env) startOursWith(name string, edit func(string) string) (*collector, addrs, error) {
	a := newAddrs(e.sink.Addr())
	a.proxy, a.upstream = "", ""
	c, err := startCollector(name, e.ours, e.out, edit(oursConfig(a, "")), a.pprof, a.telemetry, a.hooksHTTP)
	return c, a, err
}

// startStock starts the stock baseline on fresh addresses.
func (e *env) startStock(name string) (*collector, addrs, error) {
	a := newAddrs(e.sink.Addr())
	c, err := startCollector(name, e.stock, e.out, stockConfig(a), a.pprof, a.telemetry, a.otlp)
	return c, a, err
}

// hookPoster posts NDJSON batches to our collector's hook, workers at once.
func hookPoster(a addrs, workers int) *poster {
	return newPoster("http://"+a.hooksHTTP+hookPath, "application/x-ndjson", workers, true)
}

// spanPoster posts OTLP/HTTP span batches to the stock collector.
func spanPoster(a addrs, workers int) *poster {
	return newPoster("http://"+a.otlp+"/v1/traces", "application/x-protobuf", workers, false)
}

// tokenPath runs the comparison: the same workload through hooks HTTP, hooks
// UDP and the stock pipeline, then K sessions in flight in ours and in stock.
func (e *env) tokenPath(w workload) (*tokenPathResult, error) {
	res := &tokenPathResult{Workload: w, UDPDatagramBytes: e.udpBytes, UDPRate: e.udpRate}

	ours, a, err := e.startOurs("ours")
	if err != nil {
		return nil, err
	}
	defer ours.stop()
	stock, sa, err := e.startStock("stock")
	if err != nil {
		return nil, err
	}
	defer stock.stop()
	hp := hookPoster(a, e.workers)
	defer hp.close()
	sp := spanPoster(sa, e.workers)
	defer sp.close()

	// Memory first, on collectors that have done nothing yet, so that the
	// idle RSS is a fresh process's and not one grown by the throughput runs.
	if res.MemOurs, err = measureMemory(e.ctx, ours, e.sink, "hooks_http", e.memK, e.memToks,
		func(b []batch) sendResult { return hp.run(e.ctx, b, e.workers) },
		func(*generator) func([]wEvent) []byte { return ndjson }, settleHTTP(ours), ""); err != nil {
		return nil, err
	}
	if res.MemStock, err = measureMemory(e.ctx, stock, e.sink, "stock", e.memK, e.memToks,
		func(b []batch) sendResult { return sp.run(e.ctx, b, e.workers) },
		func(g *generator) func([]wEvent) []byte { return g.otlpSpans }, settleStock(stock), ""); err != nil {
		return nil, err
	}
	if res.MemOurs, res.MemOursHeapRuns, err = e.memoryRuns(res.MemOurs); err != nil {
		return nil, err
	}
	if res.MemOursNoAttribution, err = e.memoryRun("ours-memory-attribution-off", withoutAttribution); err != nil {
		return nil, err
	}
	if res.MemStock.SecondsToMeasure >= 5 {
		log.Printf("warning: stock memory measured %.1fs after the first span, after decision_wait", res.MemStock.SecondsToMeasure)
	}

	// One generator per path, the same seed: the same events, new session IDs
	// would be the same too, so each collector sees each session once.
	gen := func() (*generator, []wEvent) { g := newGenerator(w, 1); return g, g.all() }
	_, evs := gen()
	nd := chunk(evs, w.BatchLines, ndjson)
	if res.HTTP, err = measureCPU(ours, e.sink, "hooks_http", e.profiled(ours, "tokenpath-http", hp.sendAll(e.ctx, nd, e.workers)), settleHTTP(ours)); err != nil {
		return nil, err
	}

	// UDP: the Go hook client's datagrams (8 KiB by default) of a fresh
	// stream (the HTTP run's sessions have ended in this collector).
	_, evs = gen()
	for i := range evs {
		evs[i].s.id = "u" + evs[i].s.id[1:]
	}
	nd = chunk(evs, w.BatchLines, ndjson)
	m, err := ours.metrics()
	if err != nil {
		return nil, err
	}
	before := m.sum("otelcol_receiver_token_stream_accepted_events", map[string]string{"transport": "udp"})
	var total int64
	for _, b := range nd {
		total += int64(b.events)
	}
	if res.UDP, err = measureCPU(ours, e.sink, "hooks_udp", e.profiled(ours, "tokenpath-udp", func() (sendResult, error) {
		return sendUDPGrams(e.ctx, a.hooksUDP, nd, e.udpBytes, e.udpRate)
	}), settleAccepted(ours, "udp", before, total)); err != nil {
		return nil, err
	}
	if m, err = ours.metrics(); err == nil {
		res.UDP.Send.Accepted = int64(m.sum("otelcol_receiver_token_stream_accepted_events", map[string]string{"transport": "udp"}) - before)
		// The CPU was spent on the events that arrived: charge it to the
		// tokens among them.
		if lost := total - res.UDP.Send.Accepted; lost > 0 && res.UDP.CPUSeconds > 0 {
			log.Printf("hooks_udp: %d of %d events lost before the receiver", lost, total)
			arrived := float64(res.UDP.TokenEvents) * float64(res.UDP.Send.Accepted) / float64(total)
			res.UDP.TokensPerCPUSecond = arrived / res.UDP.CPUSeconds
			res.UDP.CPUSecPerMTokens = res.UDP.CPUSeconds / arrived * 1e6
		}
	}

	g, evs := gen()
	ot := chunk(evs, w.BatchLines, g.otlpSpans)
	for _, b := range ot {
		res.StockSpansExpected += int64(b.tokens)
	}
	res.StockSpansExpected += int64(w.Sessions * w.Waves)
	if res.Stock, err = measureCPU(stock, e.sink, "stock", sp.sendAll(e.ctx, ot, e.workers), settleStock(stock)); err != nil {
		return nil, err
	}

	res.HTTPvsStock = ratio(res.HTTP.TokensPerCPUSecond, res.Stock.TokensPerCPUSecond)
	res.UDPvsStock = ratio(res.UDP.TokensPerCPUSecond, res.Stock.TokensPerCPUSecond)
	res.MemoryStockVsOurs = ratio(res.MemStock.HeapPerSession, res.MemOurs.HeapPerSession)
	res.RSSStockVsOurs = ratio(res.MemStock.RSSPerSession, res.MemOurs.RSSPerSession)
	return res, nil
}

// memoryRuns measures our memory per in-flight session e.repeat-1 times
// more, each on a fresh collector, beside first; it returns the median run
// by heap per session (the lower middle one of an even count) and every
// run's heap per session.
func (e *env) memoryRuns(first memRun) (memRun, []float64, error) {
	runs := []memRun{first}
	for i := 1; i < e.repeat; i++ {
		m, err := e.memoryRun(fmt.Sprintf("ours-memory-%d", i), func(cfg string) string { return cfg })
		if err != nil {
			return memRun{}, nil, err
		}
		runs = append(runs, m)
	}
	heaps := make([]float64, len(runs))
	for i, m := range runs {
		heaps[i] = m.HeapPerSession
	}
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b memRun) int { return cmp.Compare(a.HeapPerSession, b.HeapPerSession) })
	return sorted[(len(sorted)-1)/2], heaps, nil
}

// memoryRun measures our memory per in-flight session on a fresh collector
// whose config edit changed.
func (e *env) memoryRun(name string, edit func(string) string) (memRun, error) {
	c, a, err := e.startOursWith(name, edit)
	if err != nil {
		return memRun{}, err
	}
	defer c.stop()
	hp := hookPoster(a, e.workers)
	defer hp.close()
	return measureMemory(e.ctx, c, e.sink, "hooks_http", e.memK, e.memToks,
		func(b []batch) sendResult { return hp.run(e.ctx, b, e.workers) },
		func(*generator) func([]wEvent) []byte { return ndjson }, settleHTTP(c), "")
}

func sendUDPGrams(ctx context.Context, addr string, bs []batch, size int, rate float64) (sendResult, error) {
	var split []batch
	for _, b := range bs {
		grams := datagrams(b.body, size)
		for _, d := range grams {
			n := countLines(d)
			split = append(split, batch{body: d, events: n, tokens: b.tokens * n / b.events})
		}
	}
	r, err := sendUDP(ctx, addr, split, rate)
	// Token counts were split proportionally; report the exact total.
	r.Tokens = 0
	for _, b := range bs {
		r.Tokens += int64(b.tokens)
	}
	return r, err
}

func countLines(b []byte) int {
	n := 0
	for _, c := range b {
		if c == '\n' {
			n++
		}
	}
	return n
}

func failed(r sendResult) error {
	if r.Failed > 0 {
		return fmt.Errorf("%d of %d requests failed: %s", r.Failed, r.Requests, r.FirstErr)
	}
	return nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// scaleStep is one concurrency step of the token path.
type scaleStep struct {
	Sessions int    `json:"sessions"`
	Tokens   int    `json:"tokens_per_session"`
	Waves    int    `json:"waves"` // of Sessions sessions, one after the other
	CPU      cpuRun `json:"cpu"`
	Memory   memRun `json:"memory"`
	Evicted  int64  `json:"sessions_evicted"`
	// HeapProfile (largest step only) is taken with the K sessions open.
	HeapProfile string   `json:"heap_profile,omitempty"`
	HeapTop     []string `json:"heap_profile_top,omitempty"`
}

// scale: K sessions in flight at once for each K, one token per session per
// batch (a hook batch at high concurrency), on a fresh collector each.
// Every step streams the same sessions, as many and as long (tokensTotal
// over the largest K tokens each, 10 at least): the largest K in one wave,
// a smaller K in waves of K. So the steps differ only in how many sessions
// are open at once, what the target is about; with sessions of
// tokensTotal/K tokens instead, the largest step also paid 100 times the
// session starts and ends per token.
func (e *env) scale(ks []int, tokensTotal int) ([]scaleStep, error) {
	var out []scaleStep
	largest := slices.Max(ks)
	perSession := max(10, tokensTotal/largest)
	for _, k := range ks {
		c, a, err := e.startOurs(fmt.Sprintf("scale-%d", k))
		if err != nil {
			return nil, err
		}
		hp := hookPoster(a, e.workers)
		step := scaleStep{Sessions: k, Tokens: perSession, Waves: max(1, largest/k)}
		if k == ks[len(ks)-1] {
			// What the sessions' memory is made of, at the largest step.
			step.HeapProfile = filepath.Join(e.out, fmt.Sprintf("heap-%d.pprof", k))
		}
		step.Memory, err = measureMemory(e.ctx, c, e.sink, fmt.Sprintf("scale %d", k), k, 4,
			func(b []batch) sendResult { return hp.run(e.ctx, b, e.workers) },
			func(*generator) func([]wEvent) []byte { return ndjson }, settleHTTP(c), step.HeapProfile)
		if err == nil {
			w := workload{Sessions: k, Tokens: step.Tokens, Waves: step.Waves, BatchLines: 1024, SlowShare: 0.02}
			evs := newGenerator(w, uint64(k)).all()
			for i := range evs {
				evs[i].s.id = "k" + evs[i].s.id[1:]
			}
			nd := chunk(evs, w.BatchLines, ndjson)
			step.CPU, err = measureCPU(c, e.sink, fmt.Sprintf("scale %d", k), e.profiled(c, fmt.Sprintf("scale-%d", k), hp.sendAll(e.ctx, nd, e.workers)), settleHTTP(c))
		}
		if err == nil && step.HeapProfile != "" {
			step.HeapTop, err = pprofTop(step.HeapProfile, 12, false, "-sample_index=inuse_space")
		}
		if m, merr := c.metrics(); merr == nil {
			step.Evicted = int64(m.sum("otelcol_processor_token_session_sessions_ended", map[string]string{"outcome": "evicted"}))
		}
		hp.close()
		c.stop()
		if err != nil {
			return nil, err
		}
		out = append(out, step)
	}
	return out, nil
}

// rateStep is one offered rate of the saturation sweep.
type rateStep struct {
	Offered      float64 `json:"offered_events_per_second"`
	Achieved     float64 `json:"achieved_events_per_second"`
	CollectorCPU float64 `json:"collector_cores"`
	DriverCPU    float64 `json:"load_generator_and_sink_cores"`
	OtherCPU     float64 `json:"other_processes_cores"`
	CPUPerMEv    float64 `json:"cpu_seconds_per_million_events"`
	Dropped      int64   `json:"events_dropped"`
	Failed       int64   `json:"failed_requests"`
	Saturated    bool    `json:"saturated"`
}

type saturation struct {
	Sessions    int        `json:"sessions"`
	StepSeconds float64    `json:"step_seconds"`
	Steps       []rateStep `json:"steps"`
	Saturation  float64    `json:"saturation_events_per_second"`
	Profile     string     `json:"profile"`
	TopFuncs    []string   `json:"profile_top_flat"`
	TopCum      []string   `json:"profile_top_cum"`
}

// tokenStream is an endless stream of token events of sessions concurrent
// sessions (their starts first), encoded on the fly in batches.
type tokenStream struct {
	ids   []string
	last  []uint64
	next  int
	start bool
	ev    tokenevent.Event
}

func newTokenStream(prefix string, sessions int) *tokenStream {
	ts := &tokenStream{start: true}
	now := uint64(time.Now().UnixNano())
	for i := range sessions {
		ts.ids = append(ts.ids, fmt.Sprintf("chatcmpl-%s%031x", prefix, i))
		ts.last = append(ts.last, now)
	}
	return ts
}

func (ts *tokenStream) batch(lines int) batch {
	buf := make([]byte, 0, lines*100)
	b := batch{events: lines}
	for range lines {
		ts.ev.Reset()
		i := ts.next
		ts.ev.SessionID = ts.ids[i]
		if ts.start {
			ts.ev.Kind, ts.ev.TimeUnixNano = tokenevent.KindStart, ts.last[i]
			ts.ev.Model, ts.ev.Operation, ts.ev.Engine = benchModel, tokenevent.OperationChat, "vllm-0"
		} else {
			ts.last[i] += uint64(30 * time.Millisecond)
			ts.ev.Kind, ts.ev.TimeUnixNano = tokenevent.KindToken, ts.last[i]
			b.tokens++
		}
		buf = tokenevent.AppendJSON(buf, &ts.ev)
		if ts.next++; ts.next == len(ts.ids) {
			ts.next, ts.start = 0, false
		}
	}
	b.body = buf
	return b
}

// saturate offers rising event rates until the achieved rate falls below 95%
// of the offered one or events are lost, then profiles the collector at the
// rate that saturated it.
func (e *env) saturate(rates []float64, sessions int, stepDur time.Duration) (*saturation, error) {
	c, a, err := e.startOurs("saturation")
	if err != nil {
		return nil, err
	}
	defer c.stop()
	hp := hookPoster(a, e.workers)
	defer hp.close()
	ts := newTokenStream("s", sessions)
	// Each step's batches are encoded before it starts, so that the driver's
	// CPU during the step goes to sending only.
	prepared := func(rate float64, d time.Duration) func() (batch, bool) {
		bs := make([]batch, int(rate*d.Seconds()/1000)+1)
		for i := range bs {
			bs[i] = ts.batch(1000)
		}
		return func() (batch, bool) {
			if len(bs) == 0 {
				return batch{}, false
			}
			b := bs[0]
			bs = bs[1:]
			return b, true
		}
	}
	// Open the sessions first.
	hp.paced(e.ctx, e.workers, 0, 0, func() (batch, bool) {
		if !ts.start {
			return batch{}, false
		}
		return ts.batch(min(1000, sessions-ts.next)), true
	})
	s := &saturation{Sessions: sessions, StepSeconds: stepDur.Seconds()}
	retried := false
	for i := 0; i < len(rates); i++ {
		rate := rates[i]
		next := prepared(rate, stepDur)
		c.waitIdle(5 * time.Second)
		t0, d0, m0 := c.cpuSeconds(), driverCPUSeconds(), machineBusySeconds()
		r := hp.paced(e.ctx, e.workers, rate, stepDur, next)
		cpu, driver := c.cpuSeconds()-t0, driverCPUSeconds()-d0
		st := rateStep{
			Offered: rate, Achieved: float64(r.Accepted) / r.Elapsed.Seconds(), CollectorCPU: cpu / r.Elapsed.Seconds(),
			DriverCPU: driver / r.Elapsed.Seconds(), OtherCPU: (machineBusySeconds() - m0 - cpu - driver) / r.Elapsed.Seconds(),
			Dropped: r.Events - r.Accepted, Failed: r.Failed,
		}
		if r.Accepted > 0 {
			st.CPUPerMEv = cpu / float64(r.Accepted) * 1e6
		}
		st.Saturated = st.Achieved < 0.95*rate || st.Dropped > 0
		log.Printf("saturation: offered %.0f/s achieved %.0f/s, collector %.2f cores (driver %.2f, other processes %.2f), %.2f CPU-s per M events, dropped %d",
			rate, st.Achieved, st.CollectorCPU, st.DriverCPU, st.OtherCPU, st.CPUPerMEv, st.Dropped)
		s.Steps = append(s.Steps, st)
		// On a shared machine another process may have taken the cores for
		// a while: a step that fell short while others used more than half a
		// core is run once more before it counts as saturation.
		if st.Saturated && st.OtherCPU > 0.5 && !retried {
			retried = true
			i--
			continue
		}
		if st.Saturated {
			s.Saturation = st.Achieved
			break
		}
	}
	if s.Saturation == 0 && len(s.Steps) > 0 {
		s.Saturation = s.Steps[len(s.Steps)-1].Achieved
	}
	// Profile at the saturating rate (or the highest offered).
	s.Profile = filepath.Join(e.out, "saturation-cpu.pprof")
	rate := s.Steps[len(s.Steps)-1].Offered
	next := prepared(rate, 6*time.Second)
	done := make(chan error, 1)
	go func() { done <- c.cpuProfile(e.ctx, 5*time.Second, s.Profile) }()
	hp.paced(e.ctx, e.workers, rate, 6*time.Second, next)
	if err := <-done; err != nil {
		return s, fmt.Errorf("profile: %w", err)
	}
	if s.TopFuncs, err = pprofTop(s.Profile, 15, false); err != nil {
		return s, err
	}
	s.TopCum, err = pprofTop(s.Profile, 30, true, "-cum")
	return s, err
}

// pprofTop is the table `go tool pprof -top` prints: the n functions with the
// most CPU of their own (flat), or with their callees (cum).
func pprofTop(profile string, n int, cum bool, extra ...string) ([]string, error) {
	args := append([]string{"tool", "pprof", "-top", fmt.Sprintf("-nodecount=%d", n)}, extra...)
	suffix := ".top.txt"
	if cum {
		suffix = ".topcum.txt"
	}
	out, err := exec.Command("go", append(args, profile)...).Output() //nolint:gosec // G204: go tool pprof on a profile this program wrote
	if err != nil {
		return nil, fmt.Errorf("go tool pprof: %w", err)
	}
	var lines []string
	table := false
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "flat ") {
			table = true
		}
		if table && strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	_ = os.WriteFile(profile+suffix, out, 0o644)
	return lines, nil
}
