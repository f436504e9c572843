// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package attribution // import "github.com/otelcol-llm/otelcol-llm/internal/attribution"

import (
	"math"
	"slices"
	"sort"
)

// Steps is one engine's account settled from its steps as the token
// stream shows them, for a collector that sees every token but not the
// engine's scheduler. Each step's time is split among the sessions in it
// by the tokens each computes, the steps read after the fact:
//
//   - A step ends with a token of every sequence it decoded or whose
//     prompt it finished, so the engine's step ends are the distinct times
//     of its tokens (a token within StepsConfig.Join of another of a step
//     is of it: they come spread a little, each later than the step
//     ended), and a step lasts from the previous step's end to its own.
//   - A session's token in the step right after its previous token's is a
//     decode: weight 1 (n for a chunk of n tokens).
//   - Its first token ends its prefill: its prompt's tokens are spread
//     over the steps before, back to its arrival, each step taking what
//     its budget left after its decodes (chunked prefill), or all in the
//     one step (prefill first).
//   - A token after steps that decoded without it is a resume after a
//     pre-emption: its prompt and its output so far are computed again,
//     spread the same way, and the steps it missed are not its. (Prefill
//     first, steps that computed only prompts are skipped by every
//     decode: missing those is not a pre-emption.)
//   - A step's time is split by these weights; the time before a step
//     that no session present had arrived for is idle.
//
// The spread needs the steps after a first token's and the tokens of every
// session in a step, so a step is settled (charged) only Lag after it
// ended, and a session's share is final once its last step is:
// Settle reports it. Conservation holds by construction: every settled
// step's time goes to the weights in it, or is idle.
type Steps struct {
	cfg    StepsConfig
	budget float64
	// join is how close a token is to another of a step to be of it:
	// StepsConfig.Join, or less, a third of the median time between a
	// session's two tokens (at least a step: the steps' own durations
	// would be those of steps taken together), so that an engine of short
	// steps (a small model) does not have two of them taken for one.
	join int64
	// gaps are a sample of the latest times between a session's two
	// tokens (ns), a ring of gapsKept, for join; gapsN counts them all.
	gaps  [gapsKept]int64
	gapsN int

	// steps are the steps not settled yet, in time order; classified of
	// them have their tokens read (decodes counted, prefills spread).
	steps      []*step
	classified int
	// settledTo is the end of the last settled step (the start of
	// steps[0]), from the engine's first arrival on (started).
	settledTo int64
	started   bool
	latest    int64

	watts    float64
	hasPower bool
	powerRun uint32

	promptSum, promptCount float64

	open   int
	totals Totals
	// Late counts tokens that came after their step was settled: their
	// weight is lost to the others in it.
	late int64
	// final are the accounts made final by the last Settle (finalTaken:
	// handed out), or since.
	final      []*Account
	finalTaken bool
	free       []*step
}

// gapsKept is how many of the latest times between a session's tokens set
// join.
const gapsKept = 32

// StepsConfig configures a Steps.
type StepsConfig struct {
	// StepTokens is the step's token budget (a value below 1 is
	// DefaultBudget). PrefillFirst: a step that computes prompts decodes
	// nothing and computes each prompt whole (vLLM V0 without chunked
	// prefill).
	StepTokens   int
	PrefillFirst bool
	// Join is how close a token's time is to another of a step to be of it
	// (ns), at most: a third of the median time between a session's two
	// tokens, if that is less.
	Join int64
	// Lag is how long after a step's end it is settled (ns): the tokens
	// of every session in it, and the first tokens whose prefill it
	// computed, must have been seen by then.
	Lag int64
}

type step struct {
	// at is its end, the earliest of its tokens; last the latest. anchor
	// is its first token's time, which its tokens' previous times are
	// kept relative to (at and last move as tokens join).
	at, last, anchor int64
	decoders         float64
	prefill          float64
	tokens           []stepToken
	chunks           []stepChunk
}

// stepToken is one of a step's tokens: 16 B, every token the engine's
// steps hold until they settle (settle_after: 57 tokens of a session
// decoding at 35 ms).
type stepToken struct {
	a *Account
	// prevUs is the session's previous token's time as µs before the
	// step's anchor (negative: after it), the time it gives within a µs
	// after the truth, far under any step's join; at most MaxInt32 (35
	// min: long before any step held).
	prevUs int32
	// bits holds the event's tokens (at most tokenCountMax) and the flags.
	bits uint32
}

const (
	tokenFirst  uint32 = 1 << 29 // the session's first token (no previous)
	tokenRead   uint32 = 1 << 30 // classified
	tokenDecode uint32 = 1 << 31 // a decode of its step (not the end of a prefill or a recomputation, whose weight is its chunks)
	// tokenCountMax bounds an event's tokens as a step takes them.
	tokenCountMax = 1<<29 - 1
)

func (t *stepToken) is(f uint32) bool { return t.bits&f != 0 }

// n is the event's tokens.
func (t *stepToken) n() float64 { return float64(t.bits & tokenCountMax) }

// prevOf is the previous token's time of a token of s (not its first).
func (s *step) prevOf(t *stepToken) int64 { return s.anchor - int64(t.prevUs)*1000 }

// newStepToken is a's token of n tokens in s, its previous token's time
// prev (0: none).
func (s *step) newStepToken(a *Account, prev, n int64) stepToken {
	t := stepToken{a: a, bits: uint32(min(n, tokenCountMax))}
	if prev == 0 {
		t.bits |= tokenFirst
	} else {
		// Floored: the time kept is never earlier than prev.
		d := s.anchor - prev
		us := d / 1000
		if d < 0 && d%1000 != 0 {
			us--
		}
		t.prevUs = int32(min(us, math.MaxInt32))
	}
	return t
}

type stepChunk struct {
	a *Account
	w float64
}

// Account is one session's share on a Steps engine; its zero value is a
// session not arrived. Its figures are final once Settle has reported it.
type Account struct {
	// Prefill and Decode are its engine time in seconds so far; Energy
	// and PrefillEnergy its energy in joules, meaningful when EnergyKnown.
	Prefill, Decode       float64
	Energy, PrefillEnergy float64

	arrival int64
	last    int64 // latest token's time
	// prompt and generated (tokens read, classified, so far) are token
	// counts, whole below 2^24 in a float32: the prompt is at most
	// MaxPromptTokens.
	prompt, generated float32
	pending           int32 // entries not settled yet
	state             accountState
}

// accountState packs an Account's flags and the power run it arrived in
// into 4 bytes: 64 B an account, a size class, allocated per session.
type accountState uint32

const (
	accountArrived accountState = 1 << iota
	accountEnded
	accountReported
	// accountEnergy: the power was known through the account's life so
	// far (its power run, above the flags, is the engine's).
	accountEnergy
	accountFlags = 4
	// powerRunMask keeps an engine's power run in the bits above the
	// flags.
	powerRunMask = 1<<(32-accountFlags) - 1
)

func (a *Account) is(f accountState) bool { return a.state&f != 0 }

// powerRun is the engine's power run the account arrived in (runs are
// numbered modulo 2^28 and compared for equality: a session would have to
// see 2^28 of them begin to be mistaken).
func (a *Account) powerRun() uint32 { return uint32(a.state >> accountFlags) }

// EnergyKnown reports whether Energy and PrefillEnergy are meaningful: the
// engine's power was known for all of the session's steps.
func (a *Account) EnergyKnown() bool { return a.is(accountEnergy) }

// EngineTime is Prefill + Decode.
func (a *Account) EngineTime() float64 { return a.Prefill + a.Decode }

// Final reports whether the account's figures are final.
func (a *Account) Final() bool { return a.is(accountReported) }

// MaxPromptTokens bounds a session's prompt as the steps take it: longer
// than any model's context, so that a sender's absurd prompt length (or
// size) cannot take a step's whole time from the others in it.
const MaxPromptTokens = 1 << 22

// NewSteps returns an engine account settled from its steps.
func NewSteps(c StepsConfig) *Steps {
	if c.StepTokens < 1 {
		c.StepTokens = DefaultBudget
	}
	return &Steps{cfg: c, budget: float64(c.StepTokens), join: c.Join}
}

// Arrive is a session's arrival at at, its prompt's tokens prompt (an
// estimate; < 0: unknown, the engine's mean so far).
func (e *Steps) Arrive(a *Account, at, prompt int64) {
	if a.is(accountArrived) {
		return
	}
	if !e.started {
		e.started, e.settledTo = true, at
	}
	e.latest = max(e.latest, at)
	*a = Account{arrival: at, state: accountArrived | accountState(e.powerRun)<<accountFlags}
	if e.hasPower {
		a.state |= accountEnergy
	}
	a.prompt = float32(e.meanPrompt())
	if prompt >= 0 {
		a.prompt = float32(min(max(prompt, 1), MaxPromptTokens))
	}
	e.open++
}

// SetPrompt corrects the session's prompt (the usage at its end): it
// counts for the prefills not spread yet, and for the engine's mean.
func (e *Steps) SetPrompt(a *Account, prompt int64) {
	if prompt < 0 || !a.is(accountArrived) {
		return
	}
	a.prompt = float32(min(max(prompt, 1), MaxPromptTokens))
	e.promptSum += float64(a.prompt)
	e.promptCount++
}

func (e *Steps) meanPrompt() float64 {
	if e.promptCount == 0 {
		return 1
	}
	return e.promptSum / e.promptCount
}

// Token is n of the session's tokens at at. It reports false for a token
// that came after its step was settled (its weight is lost to the others
// in it).
func (e *Steps) Token(a *Account, at, n int64) bool {
	if a.state&(accountArrived|accountEnded) != accountArrived || n < 1 {
		return true
	}
	if at > e.latest {
		e.latest = at
	}
	prev := a.last
	if at <= prev {
		// Out of order within a session: the same step as its previous.
		at = prev
	} else if prev != 0 {
		e.gap(at - prev)
	}
	a.last = at
	j, ok := e.stepAt(at)
	if !ok {
		e.late++
		return false
	}
	s := e.steps[j]
	s.tokens = append(s.tokens, s.newStepToken(a, prev, n))
	a.pending++
	if j < e.classified {
		e.classify(j, len(e.steps[j].tokens)-1)
	}
	return true
}

// stepAt finds or makes the step ending at at; false when its time is
// settled already.
func (e *Steps) stepAt(at int64) (int, bool) {
	if at <= e.settledTo+e.join && (len(e.steps) == 0 || at < e.steps[0].at-e.join) {
		return 0, false
	}
	// The step after which at's goes: the last, mostly (tokens come in
	// time order), else found by halving. The steps are in time order; a
	// sender whose tokens fit no engine's steps (each its own step, out of
	// order) must not cost a walk over them all a token.
	i := len(e.steps)
	if i > 0 && e.steps[i-1].at > at+e.join {
		i = sort.Search(i-1, func(k int) bool { return e.steps[k].at > at+e.join })
	}
	if i > 0 && at <= e.steps[i-1].last+e.join && at-e.steps[i-1].at <= 2*e.join {
		// Within Join of a token of the step: its tokens come spread by
		// the way to the collector, each a little later than the step
		// ended, so the step ends at its earliest. A step spans at most
		// twice Join: a stream of tokens closer than Join does not chain
		// into one step without end.
		s := e.steps[i-1]
		s.at, s.last = min(s.at, at), max(s.last, at)
		return i - 1, true
	}
	if len(e.steps) >= maxStepsHeld {
		// Settle the oldest early: a sender's tokens that fit no
		// engine's steps (each its own step) would otherwise hold as many
		// steps as tokens inside Lag, each new one moved in among them.
		e.settleOldest()
		i--
		if i < 0 {
			return 0, false // at was in the step settled
		}
	}
	var s *step
	if n := len(e.free); n > 0 {
		s, e.free = e.free[n-1], e.free[:n-1]
	} else {
		s = &step{}
	}
	s.at, s.last, s.anchor = at, at, at
	e.steps = slices.Insert(e.steps, i, s)
	if i < e.classified {
		e.classified++ // a new step among the read ones: nothing in it read yet
	}
	return i, true
}

// End is the session's end at at with its prompt and output tokens (the
// usage; < 0: unknown); its share is final once its steps are settled. A
// session that streamed no token (a whole response at once) computed its
// prompt and its output in the steps before its end: they are spread
// there as one prefill.
func (e *Steps) End(a *Account, at, prompt, output int64) {
	if a.state&(accountArrived|accountEnded) != accountArrived {
		return
	}
	e.SetPrompt(a, prompt)
	if a.last == 0 && output > 0 {
		a.prompt += float32(min(output, MaxPromptTokens))
		_ = e.Token(a, at, 1) // late, it is counted in Late
	}
	a.state |= accountEnded
	e.open--
	if at > e.latest {
		e.latest = at
	}
	if a.pending == 0 {
		e.finish(a, false)
	}
}

// finish makes a's share final; settled: by a step's settling, handed
// out by Settle (End's caller sees Final at once).
func (e *Steps) finish(a *Account, settled bool) {
	if a.is(accountReported) {
		return
	}
	a.state |= accountReported
	if !e.powerRunIs(a) {
		a.state &^= accountEnergy
	}
	e.totals.Charged += a.Prefill + a.Decode
	e.totals.ChargedPrefill += a.Prefill
	e.totals.ChargedDecode += a.Decode
	if a.EnergyKnown() {
		e.totals.ChargedEnergy += a.Energy
	}
	if settled {
		e.final = append(e.final, a)
	}
}

// prevEnd is the end of the step before steps[j].
func (e *Steps) prevEnd(j int) int64 {
	if j == 0 {
		return e.settledTo
	}
	return e.steps[j-1].at
}

// classify reads token i of step j.
func (e *Steps) classify(j, i int) {
	s := e.steps[j]
	t := &s.tokens[i]
	if t.is(tokenRead) {
		return
	}
	t.bits |= tokenRead
	a := t.a
	switch {
	case t.is(tokenFirst):
		e.spread(a, float64(a.prompt), j, a.arrival)
	case s.prevOf(t) >= e.prevEnd(j)-e.join || !e.preempted(s.prevOf(t), j):
		t.bits |= tokenDecode
		s.decoders += t.n()
	default:
		e.spread(a, float64(a.prompt+a.generated), j, s.prevOf(t))
	}
	a.generated += float32(t.n())
}

// preempted reports whether the steps after prev before steps[j] decoded
// without the session: every step decodes its running sequences, but
// prefill first a step that computes prompts decodes none.
//
// Steps missed that lasted less than twice Join in all are no evidence:
// a step's tokens can come spread a little wider than Join, and split it.
func (e *Steps) preempted(prev int64, j int) bool {
	missed, decoded := int64(0), !e.cfg.PrefillFirst
	for k := j - 1; k >= 0 && e.steps[k].at > prev+e.join; k-- {
		missed += e.steps[k].at - e.prevEnd(k)
		decoded = decoded || e.steps[k].decoders > 0
		if decoded && missed >= 2*e.join {
			return true // no need to walk further back
		}
	}
	return false
}

// spread charges tokens of prompt to a in steps[j] and the ones before
// it, after from (its arrival, or its last token before a pre-emption):
// prefill first all in steps[j]; otherwise each step, latest first, takes
// what its budget leaves after its decodes and the prompts spread in it
// already, and steps[j] the rest.
func (e *Steps) spread(a *Account, tokens float64, j int, from int64) {
	left := tokens
	k := j
	if !e.cfg.PrefillFirst {
		for ; k > 0 && left > 0 && j-k < maxSpreadSteps; k-- {
			room := e.budget - e.steps[k].decoders - e.steps[k].prefill
			if room >= left || e.prevEnd(k) <= from+e.join {
				break
			}
			if room >= 1 {
				e.chunk(a, k, room)
				left -= room
			}
		}
	}
	if left > 0 {
		e.chunk(a, k, left)
	}
}

// maxSpreadSteps bounds how many steps back a prompt is spread: what is
// left after them goes to the earliest. A real engine's queue and chunked
// prefill span far fewer (a 2 s wait at 10 ms steps is 200); a sender's
// tokens that fit no engine's steps could otherwise cost a walk over
// every step held, a token.
const maxSpreadSteps = 1024

func (e *Steps) chunk(a *Account, k int, w float64) {
	s := e.steps[k]
	s.prefill += w
	s.chunks = append(s.chunks, stepChunk{a: a, w: w})
	a.pending++
}

// SetPower records the engine's power draw (W), held until the next
// reading: a step is charged at the draw known when it settles. A
// negative, NaN or infinite reading ends the power run (energy is unknown
// for the sessions open across it).
func (e *Steps) SetPower(watts float64) {
	if watts < 0 || math.IsNaN(watts) || math.IsInf(watts, 0) {
		e.hasPower = false
		return
	}
	if !e.hasPower {
		e.hasPower = true
		e.powerRun = (e.powerRun + 1) & powerRunMask
	}
	e.watts = watts
}

// SettleAll settles every step, with idle time only up to the latest
// event (the collector's shutdown).
func (e *Steps) SettleAll() []*Account { return e.Settle(e.latest + e.cfg.Lag) }

// Latest is the latest event time the engine had (ns, its clock).
func (e *Steps) Latest() int64 { return e.latest }

// HasPower reports whether the engine has a power reading.
func (e *Steps) HasPower() bool { return e.hasPower }

// Settle reads the tokens of the steps that ended Lag/2 before now and
// settles those that ended Lag before it, then returns the accounts made
// final (valid until the next call). now is on the engine's clock.
func (e *Steps) Settle(now int64) []*Account {
	e.takeFinal()
	for e.classified < len(e.steps) && e.steps[e.classified].at <= now-e.cfg.Lag/2 {
		e.classifyNext()
	}
	for e.classified > 0 && e.steps[0].at <= now-e.cfg.Lag {
		e.settle()
	}
	if len(e.steps) == 0 && e.open == 0 && e.started && now-e.cfg.Lag > e.settledTo {
		// Nothing running: the time up to the horizon is idle.
		e.idle(now - e.cfg.Lag - e.settledTo)
		e.settledTo = now - e.cfg.Lag
	}
	e.finalTaken = true
	return e.final
}

// takeFinal empties final once Settle has handed it out: the accounts made
// final since (here, or by a step settled early) go out with the next.
func (e *Steps) takeFinal() {
	if e.finalTaken {
		e.final, e.finalTaken = e.final[:0], false
	}
}

// classifyNext reads the tokens of the first step not read yet.
func (e *Steps) classifyNext() {
	j := e.classified
	s := e.steps[j]
	// Decodes first, so that the prompts spread in this step see what
	// its decodes left of its budget.
	for i := range s.tokens {
		if t := &s.tokens[i]; !t.is(tokenFirst) && s.prevOf(t) >= e.prevEnd(j)-e.join {
			e.classify(j, i)
		}
	}
	for i := range s.tokens {
		e.classify(j, i)
	}
	e.classified++
}

// settleOldest settles the oldest step before its time, read first if it
// was not.
func (e *Steps) settleOldest() {
	e.takeFinal()
	if e.classified == 0 {
		e.classifyNext()
	}
	e.settle()
}

// maxStepsHeld bounds the steps an engine holds: a real engine's steps
// inside settle_after are far fewer (2 s of 10 ms steps is 200).
const maxStepsHeld = 2048

// gapEvery is how many times between a session's tokens there are for one
// kept in gaps: a sample is enough for a median, and sorting gapsKept of
// them once every gapEvery×gapsKept tokens costs next to nothing a token.
const gapEvery = 8

// gap notes the time between two tokens of a session, and sets join by a
// sample of the latest ones.
func (e *Steps) gap(d int64) {
	if e.gapsN++; e.gapsN%gapEvery != 0 {
		return
	}
	k := e.gapsN / gapEvery
	e.gaps[k%gapsKept] = d
	if k%gapsKept != 0 {
		return
	}
	sorted := e.gaps
	slices.Sort(sorted[:])
	e.join = min(e.cfg.Join, sorted[gapsKept/2]/3)
}

func (e *Steps) idle(d int64) {
	s := float64(d) / 1e9
	e.totals.Idle += s
	if e.hasPower {
		e.totals.IdleEnergy += s * e.watts
	}
}

// settle charges steps[0] and drops it.
func (e *Steps) settle() {
	s := e.steps[0]
	start := e.settledTo
	// The step began no earlier than the first arrival of a session in
	// it: before that the engine had nothing to run.
	first := s.at
	for _, t := range s.tokens {
		first = min(first, t.a.arrival)
	}
	for _, c := range s.chunks {
		first = min(first, c.a.arrival)
	}
	if first > start {
		e.idle(first - start)
		start = first
	}
	d := float64(s.at-start) / 1e9
	w := s.decoders + s.prefill
	if d > 0 && w > 0 {
		e.totals.Busy += d
		if e.hasPower {
			e.totals.BusyEnergy += d * e.watts
		}
	} else if d > 0 {
		e.idle(s.at - start)
	}
	per := 0.0
	if w > 0 {
		per = d / w
	}
	for _, t := range s.tokens {
		if t.is(tokenDecode) {
			e.charge(t.a, t.n()*per, false)
		}
		e.release(t.a)
	}
	for _, c := range s.chunks {
		e.charge(c.a, c.w*per, true)
		e.release(c.a)
	}
	e.settledTo = s.at
	clear(s.tokens)
	clear(s.chunks)
	*s = step{tokens: s.tokens[:0], chunks: s.chunks[:0]}
	e.free = append(e.free, s)
	// Off the front without moving the others (slices.Delete moved every
	// step held, a settled step); append gives the steps a new array as
	// the front's room runs out.
	e.steps[0] = nil
	e.steps = e.steps[1:]
	e.classified--
}

func (e *Steps) charge(a *Account, t float64, prefill bool) {
	if prefill {
		a.Prefill += t
	} else {
		a.Decode += t
	}
	if e.powerRunIs(a) {
		j := t * e.watts
		a.Energy += j
		if prefill {
			a.PrefillEnergy += j
		}
	}
}

func (e *Steps) release(a *Account) {
	if a.pending--; a.pending == 0 && a.is(accountEnded) {
		e.finish(a, true)
	}
}

// powerRunIs reports whether a's energy is known and the engine's power
// still is, in the run a arrived in.
func (e *Steps) powerRunIs(a *Account) bool {
	return a.EnergyKnown() && e.hasPower && a.powerRun() == e.powerRun
}

// Totals returns the engine's settled account: Wall is the time settled
// so far, Busy + Idle.
func (e *Steps) Totals() Totals {
	t := e.totals
	t.Wall = t.Busy + t.Idle
	return t
}

// Late is how many tokens came after their step was settled.
func (e *Steps) Late() int64 { return e.late }
