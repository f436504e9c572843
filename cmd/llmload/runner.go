// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// maxErrorClasses bounds the error-class map; further classes go to "other".
const maxErrorClasses = 32

// runner holds the state of one benchmark run.
type runner struct {
	cfg    Config
	url    string
	client *http.Client

	mu          sync.Mutex
	rng         *rand.Rand // request specs; used only under mu
	runStart    time.Time
	windowStart time.Time // issue time of the first measured request
	issued      int
	measured    int // measured (non-warm-up) requests issued
	stopped     bool
	agg         aggregator
	requestLog  *requestLog // -requests-out; nil when not asked for

	inflight    atomic.Int64
	maxInflight atomic.Int64
}

// aggregator accumulates measured results; guarded by runner.mu.
type aggregator struct {
	completed, failed, interrupted int
	retried                        int // attempts cut by a stall breaker and sent again
	warmupDone                     int
	good                           int
	errors                         map[string]int
	ttft, tpot, itl, e2e           []float64 // ms
	inputTokens, outputTokens      int64
	lastEnd                        time.Time
}

func newRunner(cfg Config) *runner {
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // compression would buffer SSE and distort timings
	}
	return &runner{
		cfg:    cfg,
		url:    endpointURL(cfg.URL, cfg.Endpoint),
		client: &http.Client{Transport: tr},
		rng:    rand.New(rand.NewPCG(cfg.Seed, 0x6c6c6d6c6f6164)),
		agg:    aggregator{errors: map[string]int{}},
	}
}

// Run executes the benchmark until -requests or -duration is reached or ctx
// is cancelled (SIGINT); in the latter case in-flight requests are aborted,
// not counted, and what was measured so far is reported.
// progress, when non-nil, receives one status line per second.
func Run(ctx context.Context, cfg Config, progress io.Writer) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := newRunner(cfg)
	defer r.client.CloseIdleConnections()
	if cfg.RequestsOut != "" {
		l, err := createRequestLog(cfg.RequestsOut)
		if err != nil {
			return nil, err
		}
		r.requestLog = l
	}

	reqCtx, cancelReqs := context.WithCancelCause(context.Background())
	defer cancelReqs(nil)
	stopWatch := context.AfterFunc(ctx, func() { cancelReqs(errInterrupted) })
	defer stopWatch()

	r.runStart = time.Now()
	startWall := time.Now().UTC()

	var progWG sync.WaitGroup
	progDone := make(chan struct{})
	if progress != nil {
		progWG.Add(1)
		go func() {
			defer progWG.Done()
			r.progressLoop(progress, progDone)
		}()
	}

	if cfg.Rate > 0 {
		r.runOpenLoop(ctx, reqCtx)
	} else {
		r.runClosedLoop(ctx, reqCtx)
	}
	close(progDone)
	progWG.Wait()

	interrupted := ctx.Err() != nil
	end := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.requestLog != nil {
		if err := r.requestLog.close(); err != nil {
			return nil, fmt.Errorf("-requests-out: %w", err)
		}
	}
	if !interrupted && !r.agg.lastEnd.IsZero() {
		end = r.agg.lastEnd
	}
	return r.buildReport(startWall, end, interrupted), nil
}

// next hands out the next request, or false when the run must stop issuing.
func (r *runner) next(ctx context.Context) (*RequestSpec, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || ctx.Err() != nil {
		r.stopped = true
		return nil, false
	}
	now := time.Now()
	warm := r.issued < r.cfg.WarmupRequests ||
		(r.cfg.WarmupDuration > 0 && now.Sub(r.runStart) < r.cfg.WarmupDuration)
	if !warm {
		if r.windowStart.IsZero() {
			r.windowStart = now
		}
		if (r.cfg.Requests > 0 && r.measured >= r.cfg.Requests) ||
			(r.cfg.Duration > 0 && now.Sub(r.windowStart) >= r.cfg.Duration) {
			r.stopped = true
			return nil, false
		}
		r.measured++
	}
	spec := &RequestSpec{Index: r.issued, Warmup: warm}
	r.issued++
	spec.PromptWords = r.cfg.PromptTokens.Sample(r.rng)
	if r.cfg.LongShare > 0 && r.rng.Float64() < r.cfg.LongShare {
		spec.Long = true
		spec.PromptWords = r.cfg.LongPromptTokens
	}
	spec.MaxTokens = r.cfg.OutputTokens.Sample(r.rng)
	spec.Prompt = buildPrompt(r.rng, spec.Index, spec.PromptWords)
	if r.cfg.Traceparent {
		// From crypto/rand, not the seeded generator: trace IDs must not
		// repeat across runs with the same seed.
		spec.TraceID, spec.ParentSpanID = newTraceContext()
	}
	return spec, true
}

// deadlinePassed reports whether a duration-bounded run is over (used by the
// open loop so it does not sleep past the end waiting for an arrival).
func (r *runner) deadlinePassed(at time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfg.Duration == 0 {
		return false
	}
	start := r.windowStart
	if start.IsZero() {
		if r.cfg.WarmupRequests > 0 {
			return false // window not started yet
		}
		start = r.runStart.Add(r.cfg.WarmupDuration)
	}
	return at.Sub(start) >= r.cfg.Duration
}

func (r *runner) execute(reqCtx context.Context, spec *RequestSpec) {
	n := r.inflight.Add(1)
	for {
		m := r.maxInflight.Load()
		if n <= m || r.maxInflight.CompareAndSwap(m, n) {
			break
		}
	}
	res := doRequest(reqCtx, r.client, &r.cfg, r.url, spec)
	for res.Stalled && res.Attempt < r.cfg.RetryStalled && reqCtx.Err() == nil {
		res.Retried = true
		r.record(res)
		attempt := res.Attempt + 1
		res = doRequest(reqCtx, r.client, &r.cfg, r.url, spec)
		res.Attempt = attempt
	}
	r.inflight.Add(-1)
	r.record(res)
}

// runClosedLoop keeps cfg.Concurrency requests in flight.
func (r *runner) runClosedLoop(ctx, reqCtx context.Context) {
	var wg sync.WaitGroup
	for i := range r.cfg.Concurrency {
		wg.Go(func() {
			if !r.rampDelay(ctx, i) {
				return
			}
			for {
				spec, ok := r.next(ctx)
				if !ok {
					return
				}
				r.execute(reqCtx, spec)
			}
		})
	}
	wg.Wait()
}

// rampDelay waits worker i's share of -ramp-up; false if ctx ended first.
func (r *runner) rampDelay(ctx context.Context, i int) bool {
	if r.cfg.RampUp <= 0 || i == 0 {
		return true
	}
	t := time.NewTimer(r.cfg.RampUp * time.Duration(i) / time.Duration(r.cfg.Concurrency))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// runOpenLoop issues requests at Poisson arrivals of cfg.Rate per second,
// optionally capped at cfg.Concurrency in flight (arrivals then wait).
func (r *runner) runOpenLoop(ctx, reqCtx context.Context) {
	arrivals := rand.New(rand.NewPCG(r.cfg.Seed, 0x61727269766c))
	var sem chan struct{}
	if r.cfg.Concurrency > 0 {
		sem = make(chan struct{}, r.cfg.Concurrency)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	nextAt := time.Now()
	for {
		if r.deadlinePassed(nextAt) {
			return
		}
		if d := time.Until(nextAt); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		if sem != nil {
			select {
			case <-ctx.Done():
				return
			case sem <- struct{}{}:
			}
		}
		spec, ok := r.next(ctx)
		if !ok {
			if sem != nil {
				<-sem
			}
			return
		}
		wg.Go(func() {
			r.execute(reqCtx, spec)
			if sem != nil {
				<-sem
			}
		})
		gap := arrivals.ExpFloat64() / r.cfg.Rate
		nextAt = nextAt.Add(time.Duration(gap * float64(time.Second)))
	}
}

func (r *runner) record(res *Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := &r.agg
	if r.requestLog != nil {
		r.requestLog.write(recordOf(res, r.cfg.RequestsITL))
	}
	if res.Retried {
		// Not the request's outcome: its retry's is.
		if !res.Spec.Warmup {
			a.retried++
		}
		return
	}
	if res.Spec.Warmup {
		a.warmupDone++
		return
	}
	if res.Interrupted {
		a.interrupted++
		return
	}
	if res.End.After(a.lastEnd) {
		a.lastEnd = res.End
	}
	if !res.OK {
		a.failed++
		key := res.Err
		if _, ok := a.errors[key]; !ok && len(a.errors) >= maxErrorClasses {
			key = "other"
		}
		a.errors[key]++
		return
	}
	a.completed++
	ttft, e2e, tpot := ms(res.TTFT), ms(res.E2E), ms(res.TPOT())
	a.ttft = append(a.ttft, ttft)
	a.e2e = append(a.e2e, e2e)
	if res.OutputTokens > 1 {
		a.tpot = append(a.tpot, tpot)
	}
	for _, s := range res.ITLs {
		a.itl = append(a.itl, s*1000)
	}
	a.outputTokens += int64(res.OutputTokens)
	if res.PromptTokens > 0 {
		a.inputTokens += int64(res.PromptTokens)
	} else {
		a.inputTokens += int64(res.Spec.PromptWords)
	}
	if r.meetsSLOs(ttft, tpot, e2e) {
		a.good++
	}
}

// meetsSLOs: every SLO given must hold (TPOT is 0 for single-token outputs,
// as in vllm bench's goodput).
func (r *runner) meetsSLOs(ttft, tpot, e2e float64) bool {
	c := &r.cfg
	if c.SLOTTFT > 0 && ttft > ms(c.SLOTTFT) {
		return false
	}
	if c.SLOTPOT > 0 && tpot > ms(c.SLOTPOT) {
		return false
	}
	if c.SLOE2E > 0 && e2e > ms(c.SLOE2E) {
		return false
	}
	return true
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r *runner) progressLoop(w io.Writer, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		r.mu.Lock()
		a := &r.agg
		elapsed := time.Since(r.runStart)
		var rps, tps float64
		if !r.windowStart.IsZero() {
			if s := time.Since(r.windowStart).Seconds(); s > 0 {
				rps = float64(a.completed) / s
				tps = float64(a.outputTokens) / s
			}
		}
		line := fmt.Sprintf("[%6.1fs] completed %d  failed %d  warm-up %d  in-flight %d  %.2f req/s  %.1f out tok/s\n",
			elapsed.Seconds(), a.completed, a.failed, a.warmupDone, r.inflight.Load(), rps, tps)
		r.mu.Unlock()
		_, _ = io.WriteString(w, line)
	}
}
