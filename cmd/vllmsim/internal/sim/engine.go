// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package sim is the engine of the vLLM simulator: a continuous-batching
// scheduler with a paged KV block pool, pre-emption by recomputation,
// chunked prefill and a cost model that turns each scheduled batch into a
// step duration. It has no HTTP in it and no sleeping in its core: Plan and
// Commit (or Step, which is both) can be driven with any clock, and Run
// drives them in real time.
package sim // import "github.com/otelcol-llm/otelcol-llm/cmd/vllmsim/internal/sim"

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// BlockSize is the number of tokens per KV block (vLLM's default on CUDA).
const BlockSize = 16

// Finish reasons, as vLLM's FinishReason prints them.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
	FinishError  = "error"
)

// Speed profiles.
const (
	ProfileFP16 = "fp16"
	ProfileFP8  = "fp8"
)

// Cost is the step cost model, a roofline. A step that computes P prefill
// tokens and D decode tokens (one per decoding sequence) lasts
//
//	StepOverhead + max(compute, memory)
//	compute = (P + D) * PrefillPerToken * pf
//	memory  = (DecodeBase + D*DecodePerSeq) * df
//
// where pf and df are 1 for fp16 and FP8PrefillFactor / FP8DecodeFactor for
// fp8. On a GPU the matrix units and the memory traffic of one forward pass
// overlap, so the pass takes as long as the slower of the two, not their
// sum. Every token of the step costs the same arithmetic (PrefillPerToken);
// every step reads all weights once (DecodeBase) and, per decoding
// sequence, its KV cache (DecodePerSeq). A decode-only step is therefore
// bandwidth-bound: with the defaults, 64 sequences need 3.5 ms of arithmetic
// but 24.8 ms of reads. A prefill of a few hundred tokens rides along in
// that spare arithmetic almost for free, which is where chunked prefill's
// throughput comes from (Sarathi-Serve's "piggybacking"); a prefill of
// thousands of tokens is compute-bound and stretches the step for every
// decode in it.
type Cost struct {
	StepOverhead     time.Duration
	PrefillPerToken  time.Duration
	DecodeBase       time.Duration
	DecodePerSeq     time.Duration
	FP8PrefillFactor float64
	FP8DecodeFactor  float64
}

// DefaultCost gives a ~12-25 ms fp16 decode step (batch 1-64) and a ~110 ms
// fp16 prefill of 2000 tokens.
func DefaultCost() Cost {
	return Cost{
		StepOverhead:     500 * time.Microsecond,
		PrefillPerToken:  55 * time.Microsecond,
		DecodeBase:       12 * time.Millisecond,
		DecodePerSeq:     200 * time.Microsecond,
		FP8PrefillFactor: 0.6,
		FP8DecodeFactor:  0.5,
	}
}

// Config configures an Engine.
type Config struct {
	Model               string
	Profile             string // ProfileFP16 or ProfileFP8
	KVBlocks            int    // blocks of BlockSize tokens in the pool
	MaxNumSeqs          int    // most sequences in one batch
	MaxModelLen         int    // longest prompt+output accepted
	ChunkedPrefill      bool   // split prefills across steps to fit the budget
	MaxNumBatchedTokens int    // token budget of one step
	// PrefillPriority makes the scheduler admit waiting requests first, and
	// a step that admits new prefills runs no decodes: vLLM V0's scheduler
	// without chunked prefill. Off: running requests first, waiting ones
	// fill the rest of the budget, which is what V0 switches to when
	// chunked prefill is on, and how V1 always schedules.
	PrefillPriority bool
	Seed            uint64
	Cost            Cost
	// Power is the GPU's power model (attribution.go).
	Power Power
}

// DefaultConfig returns the simulator's defaults.
func DefaultConfig() Config {
	return Config{
		Model:               "meta-llama/Llama-3.1-8B-Instruct",
		Profile:             ProfileFP16,
		KVBlocks:            2048,
		MaxNumSeqs:          256,
		MaxModelLen:         4096,
		ChunkedPrefill:      true,
		MaxNumBatchedTokens: 2048,
		Seed:                1,
		Cost:                DefaultCost(),
		Power:               DefaultPower(),
	}
}

func (c Config) validate() error {
	switch {
	case c.Profile != ProfileFP16 && c.Profile != ProfileFP8:
		return fmt.Errorf("profile %q: want fp16 or fp8", c.Profile)
	case c.KVBlocks < 1:
		return errors.New("kv blocks must be >= 1")
	case c.MaxNumSeqs < 1:
		return errors.New("max num seqs must be >= 1")
	case c.MaxModelLen < 2:
		return errors.New("max model len must be >= 2")
	case c.MaxNumBatchedTokens < 1:
		return errors.New("max num batched tokens must be >= 1")
	case !c.ChunkedPrefill && c.MaxNumBatchedTokens < c.MaxModelLen:
		return fmt.Errorf("without chunked prefill max num batched tokens (%d) must be >= max model len (%d)", c.MaxNumBatchedTokens, c.MaxModelLen)
	case c.Cost.PrefillPerToken < 0 || c.Cost.DecodeBase < 0 || c.Cost.DecodePerSeq < 0 || c.Cost.StepOverhead < 0:
		return errors.New("cost constants must be >= 0")
	case c.Cost.FP8DecodeFactor <= 0 || c.Cost.FP8PrefillFactor <= 0:
		return errors.New("fp8 factors must be > 0")
	}
	return c.Power.validate()
}

// StepCost is the duration of a step computing prefillTokens prompt tokens
// and decodeSeqs decode tokens (see Cost). An empty step costs nothing.
func (c Config) StepCost(prefillTokens, decodeSeqs int) time.Duration {
	if prefillTokens+decodeSeqs == 0 {
		return 0
	}
	pf, df := 1.0, 1.0
	if c.Profile == ProfileFP8 {
		pf, df = c.Cost.FP8PrefillFactor, c.Cost.FP8DecodeFactor
	}
	compute := float64(prefillTokens+decodeSeqs) * float64(c.Cost.PrefillPerToken) * pf
	memory := (float64(c.Cost.DecodeBase) + float64(decodeSeqs)*float64(c.Cost.DecodePerSeq)) * df
	return c.Cost.StepOverhead + time.Duration(max(compute, memory))
}

// Params are what a request asks for.
type Params struct {
	PromptTokens int
	MaxTokens    int
	// IgnoreEOS: the last token is text and the finish reason "length".
	// Otherwise the simulated model emits EOS as its max_tokens-th token:
	// an empty text and finish reason "stop".
	IgnoreEOS bool
	// Operation is an opaque label for observers ("chat", "text_completion").
	Operation string
	// TraceParent is the request's W3C traceparent header, for observers
	// that emit the engine's span ("" without one).
	TraceParent string
	// Tenant is an opaque label for observers (the truth's per-tenant
	// totals); "" without one.
	Tenant string
}

// Event is one output token of a request, delivered as the step that
// produced it ends. The last one has Finish set.
type Event struct {
	Text   string
	Time   time.Time
	Finish string
	// Index is the 1-based position of the token in the output.
	Index int
}

type state int

const (
	stateWaiting state = iota
	stateRunning
	stateFinished
)

// Request is a submitted request. Its events arrive on Events, which is
// buffered for the whole output (the engine never blocks on a reader) and
// closed after the last event, on abort, or when the engine stops.
type Request struct {
	ID     string
	Params Params
	Seq    uint64
	// Arrival is when the engine received the request.
	Arrival time.Time

	events chan Event
	rng    *rand.Rand

	state       state
	computed    int // tokens whose KV is computed
	generated   int // output tokens sampled
	blocks      int // KV blocks held
	preemptions int
	scheduled   time.Time // first scheduled
	firstToken  time.Time
	lastToken   time.Time
	share       Share // the true share of engine time and energy
}

// Events returns the request's event channel.
func (r *Request) Events() <-chan Event { return r.events }

// Timing is the engine's own split of the request's time, as vLLM's
// RequestStateStats measure it: queue from arrival to first scheduled,
// prefill from then to the first token, decode from the first token to the
// last. A part not reached yet is -1. Read it from the engine's Observer, or
// once the request's last event has been received.
func (r *Request) Timing() (queue, prefill, decode time.Duration) {
	queue, prefill, decode = -1, -1, -1
	if !r.scheduled.IsZero() {
		queue = r.scheduled.Sub(r.Arrival)
		if !r.firstToken.IsZero() {
			prefill = r.firstToken.Sub(r.scheduled)
			decode = r.lastToken.Sub(r.firstToken)
		}
	}
	return queue, prefill, decode
}

// needed is how many tokens must be computed before the next sample.
func (r *Request) needed() int { return r.Params.PromptTokens + r.generated - r.computed }

// Entry is one request's share of a step.
type Entry struct {
	Req     *Request
	Tokens  int  // tokens computed this step
	Prefill bool // prompt (or recomputation) tokens, not a decode
}

// Batch is a planned step.
type Batch struct {
	Start         time.Time
	Entries       []Entry
	PrefillTokens int
	DecodeSeqs    int
	Duration      time.Duration
	Preempted     []uint64 // Seq of requests pre-empted while planning
	// acctStart is when the step began for the attribution ledger.
	acctStart time.Time
}

// StepRecord summarizes a step for schedule comparisons.
type StepRecord struct {
	Duration  time.Duration
	Entries   []string // "seq:tokens[p]"
	Preempted []uint64
	FreeAfter int
}

// Clock is the time source of Run.
type Clock interface {
	Now() time.Time
	// Sleep waits d or until ctx is done.
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RealClock is the wall clock.
var RealClock Clock = realClock{}

// Engine is the scheduler. All methods are safe for concurrent use.
type Engine struct {
	cfg     Config
	mu      sync.Mutex
	waiting []*Request
	running []*Request
	free    int
	nextSeq uint64
	stopped bool
	wake    chan struct{}
	m       *Metrics
	acct    ledger
	obs     Observer
	// degrade, when freeze is set, stretches every every-th step with
	// decodes in it by freeze: a replica whose decode freezes now and then
	// (a bad GPU, a noisy neighbor), for the load balancer story.
	degrade     Degradation
	decodeSteps uint64
}

// Degradation makes an engine freeze mid-decode: every Every-th step that
// decodes lasts Freeze longer. The zero Degradation is a healthy engine.
type Degradation struct {
	Freeze time.Duration
	Every  int
}

// Degrade sets how the engine freezes from its next step on; the zero
// Degradation heals it.
func (e *Engine) Degrade(d Degradation) error {
	if d.Freeze < 0 || (d.Freeze > 0 && d.Every < 1) {
		return fmt.Errorf("degradation: freeze must be positive and every at least 1, got freeze %s every %d", d.Freeze, d.Every)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.degrade, e.decodeSteps = d, 0
	return nil
}

// Degradation returns how the engine freezes now.
func (e *Engine) Degradation() Degradation {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.degrade
}

// Observer is told about request lifecycle events (e.g. to send engine
// hook events). It is called with the engine lock held: it must not block
// or call back into the Engine.
type Observer interface {
	Started(r *Request)
	Token(r *Request, ev Event)
	Finished(r *Request, reason string, t time.Time)
}

// New returns an Engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Engine{
		cfg:  cfg,
		free: cfg.KVBlocks,
		wake: make(chan struct{}, 1),
		m:    newMetrics(cfg, time.Now()),
		acct: ledger{power: cfg.Power, watts: cfg.Power.IdleWatts},
	}, nil
}

// SetObserver sets the Observer; call before Submit.
func (e *Engine) SetObserver(o Observer) { e.mu.Lock(); e.obs = o; e.mu.Unlock() }

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// ErrTooLong is returned by Submit for requests that can never fit.
var ErrTooLong = errors.New("request too long")

// ErrStopped is returned by Submit after Stop.
var ErrStopped = errors.New("engine stopped")

func blocksFor(tokens int) int { return (tokens + BlockSize - 1) / BlockSize }

// Submit queues a request that arrived at now.
func (e *Engine) Submit(id string, p Params, now time.Time) (*Request, error) {
	if p.PromptTokens < 1 {
		p.PromptTokens = 1
	}
	if p.MaxTokens < 1 {
		return nil, fmt.Errorf("max_tokens must be at least 1, got %d", p.MaxTokens)
	}
	if total := p.PromptTokens + p.MaxTokens; total > e.cfg.MaxModelLen {
		return nil, fmt.Errorf("%w: this model's maximum context length is %d tokens, but %d were requested (%d in the prompt, %d for the completion)",
			ErrTooLong, e.cfg.MaxModelLen, total, p.PromptTokens, p.MaxTokens)
	}
	if blocksFor(p.PromptTokens+p.MaxTokens) > e.cfg.KVBlocks {
		return nil, fmt.Errorf("%w: needs more KV blocks than the pool has (%d)", ErrTooLong, e.cfg.KVBlocks)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return nil, ErrStopped
	}
	seq := e.nextSeq
	e.nextSeq++
	r := &Request{
		ID: id, Params: p, Seq: seq, Arrival: now,
		events: make(chan Event, p.MaxTokens),
		rng:    rand.New(rand.NewPCG(e.cfg.Seed, seq)),
	}
	e.waiting = append(e.waiting, r)
	if e.obs != nil {
		e.obs.Started(r)
	}
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return r, nil
}

// Abort cancels a request (the client went away). Its blocks are freed at
// once and it finishes with reason abort.
func (e *Engine) Abort(r *Request, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.state == stateFinished {
		return
	}
	e.waiting = remove(e.waiting, r)
	e.running = remove(e.running, r)
	e.finish(r, FinishAbort, now)
}

func remove(q []*Request, r *Request) []*Request {
	for i, x := range q {
		if x == r {
			return append(q[:i], q[i+1:]...)
		}
	}
	return q
}

// finish releases r and records it; the lock is held.
func (e *Engine) finish(r *Request, reason string, now time.Time) {
	e.free += r.blocks
	r.blocks = 0
	r.state = stateFinished
	close(r.events)
	e.m.finished(r, reason, now)
	e.m.setQueues(len(e.running), len(e.waiting), e.usage())
	if e.obs != nil {
		e.obs.Finished(r, reason, now)
	}
}

func (e *Engine) usage() float64 {
	return float64(e.cfg.KVBlocks-e.free) / float64(e.cfg.KVBlocks)
}

// allocate grows r's blocks to cover computed+n tokens; false if the pool
// has too few free blocks.
func (e *Engine) allocate(r *Request, n int) bool {
	need := blocksFor(r.computed+n) - r.blocks
	if need <= 0 {
		return true
	}
	if need > e.free {
		return false
	}
	e.free -= need
	r.blocks += need
	return true
}

// preempt frees the newest running request's blocks and puts it back at
// the head of the waiting queue: it is recomputed when rescheduled.
func (e *Engine) preempt(b *Batch, budget *int) *Request {
	v := e.running[len(e.running)-1]
	e.running = e.running[:len(e.running)-1]
	e.free += v.blocks
	v.blocks = 0
	v.computed = 0
	v.preemptions++
	v.state = stateWaiting
	e.waiting = append([]*Request{v}, e.waiting...)
	for i, en := range b.Entries {
		if en.Req == v {
			*budget += en.Tokens
			b.Entries = append(b.Entries[:i], b.Entries[i+1:]...)
			break
		}
	}
	b.Preempted = append(b.Preempted, v.Seq)
	e.m.preemptions++
	return v
}

// Plan chooses the next batch at now, allocating its KV blocks and
// pre-empting when the pool runs out. An empty batch means nothing can run.
func (e *Engine) Plan(now time.Time) *Batch {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := &Batch{Start: now}
	budget := e.cfg.MaxNumBatchedTokens
	if e.cfg.PrefillPriority {
		e.scheduleWaiting(b, &budget, now)
		if len(b.Entries) == 0 {
			e.scheduleRunning(b, &budget)
		}
	} else {
		e.scheduleRunning(b, &budget)
		if len(b.Preempted) == 0 {
			e.scheduleWaiting(b, &budget, now)
		}
	}
	for _, en := range b.Entries {
		if en.Prefill {
			b.PrefillTokens += en.Tokens
		} else {
			b.DecodeSeqs++
		}
	}
	if len(b.Entries) > 0 {
		b.Duration = e.cfg.StepCost(b.PrefillTokens, b.DecodeSeqs)
	}
	if b.DecodeSeqs > 0 && e.degrade.Freeze > 0 {
		e.decodeSteps++
		if e.decodeSteps%uint64(e.degrade.Every) == 0 {
			b.Duration += e.degrade.Freeze
		}
	}
	e.acct.planned(b, now)
	e.m.setQueues(len(e.running), len(e.waiting), e.usage())
	return b
}

// take is how many of r's needed tokens fit the budget (0: none).
func (e *Engine) take(r *Request, budget int) int {
	n := r.needed()
	if n <= budget {
		return n
	}
	if e.cfg.ChunkedPrefill {
		return budget
	}
	return 0
}

func (e *Engine) scheduleRunning(b *Batch, budget *int) {
	for i := 0; i < len(e.running) && *budget > 0; i++ {
		r := e.running[i]
		n := e.take(r, *budget)
		if n == 0 {
			continue
		}
		prefill := r.needed() > 1 || r.generated == 0
		for !e.allocate(r, n) {
			v := e.preempt(b, budget)
			if v == r {
				n = 0
				break
			}
		}
		if n == 0 {
			// r itself was pre-empted; everything after it is gone too.
			break
		}
		b.Entries = append(b.Entries, Entry{Req: r, Tokens: n, Prefill: prefill})
		*budget -= n
	}
}

func (e *Engine) scheduleWaiting(b *Batch, budget *int, now time.Time) {
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs && *budget > 0 {
		r := e.waiting[0]
		n := e.take(r, *budget)
		if n == 0 || !e.allocate(r, n) {
			break // FCFS: no skipping ahead
		}
		e.waiting = e.waiting[1:]
		r.state = stateRunning
		if r.scheduled.IsZero() {
			r.scheduled = now
		}
		e.running = append(e.running, r)
		b.Entries = append(b.Entries, Entry{Req: r, Tokens: n, Prefill: true})
		*budget -= n
	}
}

// Commit applies a planned batch as having ended at end: KV advances, the
// requests whose prefill (or decode) completed sample a token, finished
// ones release their blocks.
func (e *Engine) Commit(b *Batch, end time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	// Charged before any request of the step finishes, so that its
	// Observer sees its whole share.
	e.acct.committed(b, end)
	for _, en := range b.Entries {
		r := en.Req
		if r.state != stateRunning {
			continue // aborted meanwhile
		}
		r.computed += en.Tokens
		if r.needed() > 0 {
			continue // partial (chunked) prefill
		}
		r.generated++
		ev := Event{Time: end, Index: r.generated}
		last := r.generated >= r.Params.MaxTokens
		if last && !r.Params.IgnoreEOS {
			ev.Finish = FinishStop // EOS: no text
		} else {
			ev.Text = nextWord(r.rng, r.generated == 1)
			if last {
				ev.Finish = FinishLength
			}
		}
		e.m.token(r, end)
		if r.firstToken.IsZero() {
			r.firstToken = end
		}
		r.lastToken = end
		r.events <- ev
		if e.obs != nil {
			e.obs.Token(r, ev)
		}
		if last {
			e.running = remove(e.running, r)
			e.finish(r, ev.Finish, end)
		}
	}
	e.m.setQueues(len(e.running), len(e.waiting), e.usage())
}

// Step plans a batch at now and commits it at now+Duration.
func (e *Engine) Step(now time.Time) *Batch {
	b := e.Plan(now)
	e.Commit(b, now.Add(b.Duration))
	return b
}

// Record summarizes a batch.
func (e *Engine) Record(b *Batch) StepRecord {
	rec := StepRecord{Duration: b.Duration, Preempted: b.Preempted}
	for _, en := range b.Entries {
		p := ""
		if en.Prefill {
			p = "p"
		}
		rec.Entries = append(rec.Entries, fmt.Sprintf("%d:%d%s", en.Req.Seq, en.Tokens, p))
	}
	e.mu.Lock()
	rec.FreeAfter = e.free
	e.mu.Unlock()
	return rec
}

// Snapshot is the scheduler's state.
type Snapshot struct {
	Running, Waiting, FreeBlocks, Preemptions int
}

// Snapshot returns the scheduler's state.
func (e *Engine) Snapshot() Snapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Snapshot{Running: len(e.running), Waiting: len(e.waiting), FreeBlocks: e.free, Preemptions: e.m.preemptions}
}

// Run steps the engine in real time on clock until ctx is done, then stops
// it (see Stop).
func (e *Engine) Run(ctx context.Context, clock Clock) {
	defer e.Stop(clock.Now())
	for ctx.Err() == nil {
		b := e.Plan(clock.Now())
		if len(b.Entries) == 0 {
			// Idle. (A non-empty queue that cannot be scheduled is not
			// expected; the timeout only keeps the loop from sleeping
			// forever if it happens.)
			e.mu.Lock()
			idle := len(e.running)+len(e.waiting) == 0
			e.mu.Unlock()
			wait := time.Hour
			if !idle {
				wait = 10 * time.Millisecond
			}
			t := time.NewTimer(wait)
			select {
			case <-e.wake:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			continue
		}
		if clock.Sleep(ctx, b.Duration) != nil {
			return
		}
		e.Commit(b, clock.Now())
	}
}

// Stop aborts every request and refuses new ones.
func (e *Engine) Stop(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopped = true
	e.acct.closeAt(now)
	for _, r := range append(e.running, e.waiting...) {
		e.finish(r, FinishAbort, now)
	}
	e.running, e.waiting = nil, nil
}

// Generated is the number of output tokens produced so far. Call it from
// an Observer or after the request finished.
func (r *Request) Generated() int { return r.generated }
