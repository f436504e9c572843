// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package attribution divides an engine's busy time and energy among the
// sessions it computes, in O(1) per session event, with conservation by
// construction: the sessions' shares plus the engine's idle time are its
// wall time.
//
// The model (the processor README states it for users): an engine step's
// time is shared among the sessions in the step in proportion to the tokens
// each computes in it — a prefill chunk's tokens, one token per decoding
// sequence —, as vLLM's scheduler budgets its steps in tokens. The
// collector does not see steps, so each session carries a weight, its
// tokens per step, over each phase:
//
//   - decoding (first token to end): 1;
//   - prefilling (admitted to end of prefill at the first token): its prompt
//     tokens P spread over the steps they need, P / ceil(P / (B - D)), for a
//     step token budget B and D sessions decoding when it is admitted;
//   - waiting: 0. Sessions are admitted first come, first served, while the
//     budget has room (B - D - the admitted prefills' weights > 0), the KV
//     cache has room for its prompt and half the engine's mean output,
//     and the batch has a sequence to spare, the way vLLM's scheduler fills
//     a step's budget with waiting prompts after its decodes.
//
// With W(t) the sum of the weights in compute, the engine's virtual time
// V(t) = ∫ dt / W(t) over the time W > 0 (fair queueing's trick); a session
// of constant weight w from t0 to t1 is charged w · (V(t1) - V(t0)), and
// a weight change is a new segment. Every interval's length is split
// exactly among the weights it had (Σ w · ΔV = W · ΔV = Δ), the time with
// W = 0 is idle, so the shares plus idle are the wall time whatever the
// weights. Energy is the same integral of the engine's power:
// U(t) = ∫ P(t) / W(t) dt, a session's energy w · (U(t1) - U(t0)).
//
// The collector's approximations: a session is admitted when the model
// says the budget has room, not when the engine scheduled it (the
// engine's queue and KV limits are not modeled); a chunked prefill's
// chunks are taken as equal; pre-emptions are not seen (a pre-empted
// session keeps its decode weight while it waits, and its recomputation is
// charged to no one in particular); power is the latest reading, held until the
// next; a session whose prompt length is unknown at its start weighs the
// engine's mean prompt length so far.
package attribution // import "github.com/otelcol-llm/otelcol-llm/internal/attribution"

import "math"

// Phase is where a session stands in the model.
type Phase uint8

// Phases of a Share.
const (
	PhaseNone Phase = iota
	PhaseWaiting
	PhasePrefill
	PhaseDecode
	PhaseDone
)

// Share is one session's account on its engine. The caller owns it (a
// field of its session state) and passes it to the Engine's methods;
// its zero value is a session not yet arrived.
type Share struct {
	// Prefill and Decode are the session's engine time in seconds so far
	// (final after End); Energy its energy in joules, meaningful when
	// EnergyKnown.
	Prefill, Decode float64
	// Energy is the whole session's, PrefillEnergy its prefill's part.
	Energy, PrefillEnergy float64
	// EnergyKnown: the engine had a power reading for the whole session.
	EnergyKnown bool

	phase Phase
	// powerRun is the engine's power run the session arrived in.
	powerRun uint32
	prompt   float64 // prompt tokens (the engine's mean when unknown)
	kv       float64 // KV tokens taken while admitted
	w        float64 // weight of the current segment
	v0, u0   float64 // V and U when the current segment began
}

// Phase is the session's phase.
func (s *Share) Phase() Phase { return s.phase }

// EngineTime is Prefill + Decode.
func (s *Share) EngineTime() float64 { return s.Prefill + s.Decode }

// Totals are an engine's account: Wall = Busy + Idle by construction, and
// Busy is the sum of every share charged (Charged, the ended sessions'
// shares) and those still accruing.
type Totals struct {
	Wall, Busy, Idle                       float64 // seconds
	BusyEnergy, IdleEnergy                 float64 // joules, while a power reading was known
	Charged, ChargedPrefill, ChargedDecode float64 // seconds, ended sessions
	ChargedEnergy                          float64
	// Unadmitted counts sessions whose first token came while the model
	// still had them waiting: a measure of how far the model's queue is
	// from the engine's.
	Unadmitted int64
}

// Limits are what an engine's scheduler admits by: the step's token budget
// (vLLM's max_num_batched_tokens), the KV cache's size in tokens (0:
// unlimited) and the most sequences in a batch (max_num_seqs; 0:
// unlimited).
type Limits struct {
	StepTokens int
	KVTokens   int
	MaxSeqs    int
	// PrefillFirst: a step that computes prompts runs no decodes (vLLM
	// V0's scheduler without chunked prefill); otherwise every step runs
	// every decode and prompts fill the rest of its budget.
	PrefillFirst bool
}

// Engine is one engine's virtual-time integral. It is not safe for
// concurrent use.
type Engine struct {
	budget float64
	kvCap  float64
	seqCap int
	// kvUsed is the KV the admitted sessions are taken to hold: each its
	// prompt plus half the engine's mean output length so far (what it
	// holds on average over its decode; its own length is not known before
	// its end); seqs how many.
	kvUsed float64
	seqs   int

	started   bool
	wallStart int64
	now       int64

	// v and u are the virtual time (s per unit weight) and energy (J per
	// unit weight) of the prefills, vd and ud those of the decodes: the
	// same clock unless prefillFirst, where a step with prompts runs no
	// decodes (vLLM V0 without chunked prefill) and each runs apart.
	v, u         float64
	vd, ud       float64
	prefillFirst bool
	w            float64 // sum of the weights in compute
	decoding     int
	prefillW     float64
	// waiting is the FIFO of sessions not admitted; head is its first
	// live entry. Entries that left (first token, end) before admission
	// stay until they reach the head.
	waiting []*Share
	head    int

	watts    float64
	hasPower bool
	// powerRun counts the unbroken runs of power readings.
	powerRun uint32

	promptSum   float64
	promptCount float64
	outSum      float64
	outCount    float64

	totals Totals
}

// DefaultBudget is vLLM's default max_num_batched_tokens with chunked
// prefill (2048).
const DefaultBudget = 2048

// NewEngine returns an engine with the scheduler's limits l (a StepTokens
// below 1 is DefaultBudget).
func NewEngine(l Limits) *Engine {
	if l.StepTokens < 1 {
		l.StepTokens = DefaultBudget
	}
	return &Engine{budget: float64(l.StepTokens), kvCap: float64(max(l.KVTokens, 0)), seqCap: max(l.MaxSeqs, 0), prefillFirst: l.PrefillFirst}
}

// advance moves the integrals to at (ns). Times before the engine's latest
// count as the latest: events are not always in order, and the integral
// cannot run backwards.
func (e *Engine) advance(at int64) {
	if !e.started {
		e.started, e.wallStart, e.now = true, at, at
		return
	}
	if at <= e.now {
		return
	}
	d := float64(at-e.now) / 1e9
	e.now = at
	if e.w > 0 {
		e.totals.Busy += d
		if e.hasPower {
			e.totals.BusyEnergy += d * e.watts
		}
		switch {
		case !e.prefillFirst:
			// Every step computes the prefills and the decodes: one clock.
			e.v += d / e.w
			e.vd = e.v
			if e.hasPower {
				e.u += d * e.watts / e.w
				e.ud = e.u
			}
		case e.prefillW > 0:
			// Prefill first: while prompts are computed, the decodes wait.
			e.v += d / e.prefillW
			if e.hasPower {
				e.u += d * e.watts / e.prefillW
			}
		default:
			e.vd += d / float64(e.decoding)
			if e.hasPower {
				e.ud += d * e.watts / float64(e.decoding)
			}
		}
		return
	}
	e.totals.Idle += d
	if e.hasPower {
		e.totals.IdleEnergy += d * e.watts
	}
}

// SetPower records the engine's power draw (W) read at at; it holds until
// the next reading. A negative or NaN reading ends the power run (energy
// is unknown for the sessions open across it).
func (e *Engine) SetPower(at int64, watts float64) {
	e.advance(at)
	if watts < 0 || math.IsNaN(watts) || math.IsInf(watts, 0) {
		e.hasPower = false
		return
	}
	if !e.hasPower {
		e.hasPower = true
		e.powerRun++
	}
	e.watts = watts
}

// Arrive is a session's start at at with prompt tokens (< 0: unknown).
func (e *Engine) Arrive(s *Share, at, prompt int64) {
	e.advance(at)
	if s.phase != PhaseNone {
		return
	}
	if prompt >= 0 {
		s.prompt = float64(max(prompt, 1))
		e.promptSum += s.prompt
		e.promptCount++
	} else {
		s.prompt = e.meanPrompt()
	}
	s.EnergyKnown, s.powerRun = e.hasPower, e.powerRun
	s.phase = PhaseWaiting
	e.waiting = append(e.waiting, s)
	e.admit()
}

func (e *Engine) meanOutput() float64 {
	if e.outCount == 0 {
		return 0
	}
	return e.outSum / e.outCount
}

func (e *Engine) meanPrompt() float64 {
	if e.promptCount == 0 {
		return 1
	}
	return e.promptSum / e.promptCount
}

// admit admits waiting sessions first come, first served while the step
// budget has room; with no prefill admitted one always is (the engine
// always schedules a waiting prompt when it has no other prompt work).
func (e *Engine) admit() {
	for e.head < len(e.waiting) {
		s := e.waiting[e.head]
		if s.phase != PhaseWaiting {
			e.waiting[e.head] = nil
			e.head++
			continue
		}
		room := e.budget - float64(e.decoding) - e.prefillW
		if room < 1 && e.prefillW > 0 {
			break
		}
		kv := s.prompt + e.meanOutput()/2
		if e.seqs > 0 && ((e.kvCap > 0 && e.kvUsed+kv > e.kvCap) || (e.seqCap > 0 && e.seqs >= e.seqCap)) {
			break
		}
		avail := max(e.budget-float64(e.decoding), 1)
		s.w = s.prompt / math.Ceil(s.prompt/avail)
		s.v0, s.u0 = e.v, e.u
		s.kv = kv
		e.kvUsed += kv
		e.seqs++
		s.phase = PhasePrefill
		e.prefillW += s.w
		e.w += s.w
		e.waiting[e.head] = nil
		e.head++
	}
	if e.head == len(e.waiting) {
		e.waiting, e.head = e.waiting[:0], 0
	} else if e.head > 64 && e.head > len(e.waiting)/2 {
		n := copy(e.waiting, e.waiting[e.head:])
		clear(e.waiting[n:])
		e.waiting, e.head = e.waiting[:n], 0
	}
}

// close charges s's current segment and takes its weight out.
func (e *Engine) close(s *Share) {
	if s.phase != PhasePrefill && s.phase != PhaseDecode {
		return
	}
	v, u := e.v, e.u
	if s.phase == PhaseDecode {
		v, u = e.vd, e.ud
	}
	t := s.w * (v - s.v0)
	if s.phase == PhasePrefill {
		s.Prefill += t
		e.prefillW -= s.w
	} else {
		s.Decode += t
		e.decoding--
	}
	if s.EnergyKnown {
		j := s.w * (u - s.u0)
		s.Energy += j
		if s.phase == PhasePrefill {
			s.PrefillEnergy += j
		}
	}
	e.w -= s.w
	if e.prefillW < 1e-9 {
		// No prompt left: the float sum's rounding must not stand for one.
		e.prefillW, e.w = 0, float64(e.decoding)
	}
	if e.decoding == 0 && e.prefillW < 1e-9 {
		// Nothing in compute: no segment holds V or U, so they restart at
		// zero (and the float sums of weights lose their rounding).
		e.w, e.prefillW, e.v, e.u, e.vd, e.ud = 0, 0, 0, 0, 0, 0
	}
}

// FirstToken is a session's first token at at: its prefill ends and it
// decodes from now on, one token a step.
func (e *Engine) FirstToken(s *Share, at int64) {
	e.advance(at)
	if s.phase == PhaseNone || s.phase >= PhaseDecode {
		return
	}
	if s.phase == PhaseWaiting {
		// The engine scheduled it before the model had room: its prefill
		// is charged to no one (the others' shares absorbed it).
		e.totals.Unadmitted++
		s.kv = s.prompt + e.meanOutput()
		e.kvUsed += s.kv
		e.seqs++
	}
	e.checkPower(s)
	e.close(s)
	s.phase = PhaseDecode
	s.w = 1
	s.v0, s.u0 = e.vd, e.ud
	e.decoding++
	e.w++
	e.admit()
}

// End is a session's end at at, with its output tokens (< 0: unknown);
// its Share is final.
func (e *Engine) End(s *Share, at, output int64) {
	e.advance(at)
	if s.phase == PhaseNone || s.phase == PhaseDone {
		return
	}
	if output >= 0 {
		e.outSum += float64(output)
		e.outCount++
	}
	e.checkPower(s)
	e.close(s)
	if s.phase != PhaseWaiting {
		e.kvUsed -= s.kv
		e.seqs--
		if e.seqs == 0 {
			e.kvUsed = 0
		}
	}
	s.phase = PhaseDone
	e.totals.Charged += s.Prefill + s.Decode
	e.totals.ChargedPrefill += s.Prefill
	e.totals.ChargedDecode += s.Decode
	if s.EnergyKnown {
		e.totals.ChargedEnergy += s.Energy
	}
	e.admit()
}

// checkPower drops s's energy when the engine's power run broke since s
// arrived.
func (e *Engine) checkPower(s *Share) {
	if s.EnergyKnown && (!e.hasPower || e.powerRun != s.powerRun) {
		s.EnergyKnown = false
	}
}

// Totals returns the engine's account up to at.
func (e *Engine) Totals(at int64) Totals {
	e.advance(at)
	t := e.totals
	if e.started {
		t.Wall = float64(e.now-e.wallStart) / 1e9
	}
	return t
}

// Latest is the latest time the engine's integrals reached (ns).
func (e *Engine) Latest() int64 { return e.now }

// HasPower reports whether the engine has a power reading.
func (e *Engine) HasPower() bool { return e.hasPower }
