// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package attribution

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestSteps(prefillFirst bool) *Steps {
	return NewSteps(StepsConfig{StepTokens: 100, PrefillFirst: prefillFirst, Join: ms, Lag: 200 * ms})
}

// Two sessions decode in the same 10 ms steps: each has half of every
// step. A third arrives, and its first token 20 ms later ends its prefill
// of 150 tokens: with chunked prefill the two steps before take 98 and 52
// (each step's budget of 100 less the two decodes), and the step's time
// goes by tokens. Every step's time is charged: the shares plus the idle
// time are the wall time.
func TestStepsSplitByTokens(t *testing.T) {
	e := newTestSteps(false)
	var a, b, c Account
	e.Arrive(&a, 0, 10)
	e.Arrive(&b, 0, 10)
	for i := int64(1); i <= 5; i++ {
		e.Token(&a, i*10*ms, 1)
		e.Token(&b, i*10*ms, 1)
	}
	e.Arrive(&c, 30*ms, 150)
	e.Token(&c, 50*ms, 1)
	e.End(&a, 50*ms, 10, 1)
	e.End(&b, 50*ms, 10, 1)
	e.End(&c, 50*ms, 150, 1)
	fin := e.Settle(300 * ms)
	require.Len(t, fin, 3)
	assert.True(t, a.Final() && b.Final() && c.Final())
	// Steps 10..30: a and b alone, 5 ms each a step (the first step's
	// prefill of both: 10 tokens each, the step to themselves).
	// Step 40: a, b decode (1 each) and c's 98 → 10 ms × 1/100 each.
	// Step 50: a, b decode and c's last 52 → 10 ms × 1/54 each.
	assert.InDelta(t, 0.010*(98.0/100+52.0/54), c.Prefill, 1e-9)
	assert.InDelta(t, a.EngineTime(), b.EngineTime(), 1e-12)
	assert.InDelta(t, 0.005*3+0.010/100+0.010/54, a.EngineTime(), 1e-9)
	tot := e.Totals()
	assert.InDelta(t, 0.050, tot.Busy, 1e-9)
	assert.InDelta(t, tot.Busy, a.EngineTime()+b.EngineTime()+c.EngineTime(), 1e-12)
	assert.InDelta(t, tot.Busy, tot.Charged, 1e-12)
}

// Prefill first, a step that computes a prompt decodes nothing: the
// decoding session skips it, is charged none of it, and is not taken for
// pre-empted (no recomputation charged).
func TestStepsPrefillFirstSkipIsNotPreemption(t *testing.T) {
	e := newTestSteps(true)
	var a, b Account
	e.Arrive(&a, 0, 1)
	e.Token(&a, 10*ms, 1) // a's prefill step
	e.Token(&a, 20*ms, 1)
	e.Arrive(&b, 20*ms, 50)
	e.Token(&b, 60*ms, 1) // b's prefill step, 20..60: a waits
	e.Token(&a, 70*ms, 1)
	e.Token(&b, 70*ms, 1)
	e.End(&a, 70*ms, 1, 1)
	e.End(&b, 70*ms, 50, 1)
	e.Settle(time1s)
	assert.InDelta(t, 0.010+0.010+0.005, a.EngineTime(), 1e-9)
	assert.Zero(t, a.Prefill-0.010, "a's only prefill is its own")
	assert.InDelta(t, 0.040, b.Prefill, 1e-9, "the whole prefill step is b's")
	assert.InDelta(t, 0.005, b.Decode, 1e-9)
}

const (
	ms     = int64(1e6)
	time1s = int64(1e9)
)

// With chunked prefill every step decodes every running sequence: a
// session that misses steps others decode in was pre-empted, and its
// prompt and output so far are computed again before it resumes; the
// steps it missed are not its.
func TestStepsPreemptionRecomputes(t *testing.T) {
	e := newTestSteps(false)
	var a, b Account
	e.Arrive(&a, 0, 1)
	e.Arrive(&b, 0, 1)
	for i := int64(1); i <= 6; i++ {
		e.Token(&a, i*10*ms, 1)
		if i <= 2 || i == 6 {
			e.Token(&b, i*10*ms, 1) // b misses 30, 40, 50
		}
	}
	e.End(&a, 60*ms, 1, 1)
	e.End(&b, 60*ms, 1, 1)
	e.Settle(time1s)
	// b resumes at 60 with 1 + 2 tokens to compute again: in step 60 with
	// a's decode, 3/4 of it.
	assert.InDelta(t, 0.010*3.0/4, b.Prefill-0.005, 1e-9, "recomputation")
	assert.InDelta(t, 0.005, b.Decode, 1e-9, "step 20 only: 10 is its prefill")
	assert.InDelta(t, 0.005+0.005+0.010*3+0.010/4, a.EngineTime(), 1e-9)
	assert.InDelta(t, e.Totals().Busy, a.EngineTime()+b.EngineTime(), 1e-12)
}

// A token that comes after its step was settled is counted late, and its
// weight is lost to the others in the step; its session still ends and is
// reported.
func TestStepsLateToken(t *testing.T) {
	e := newTestSteps(false)
	var a, b Account
	e.Arrive(&a, 0, 1)
	e.Arrive(&b, 0, 1)
	e.Token(&a, 10*ms, 1)
	e.Settle(time1s)
	e.Token(&b, 10*ms, 1)
	assert.Equal(t, int64(1), e.Late())
	e.End(&a, 10*ms, 1, 1)
	e.End(&b, 10*ms, 1, 1)
	assert.True(t, a.Final() && b.Final(), "nothing of them left to settle")
	assert.InDelta(t, 0.010, a.EngineTime(), 1e-9)
	assert.Zero(t, b.EngineTime())
}

// Time with no session in the engine is idle, before a session's arrival
// and after the last end; busy + idle is the wall time settled.
func TestStepsIdle(t *testing.T) {
	e := newTestSteps(false)
	var a, b Account
	e.Arrive(&a, 0, 1)
	e.Token(&a, 10*ms, 1)
	e.End(&a, 10*ms, 1, 1)
	e.Settle(500 * ms) // idle from 10 to 300
	e.Arrive(&b, 400*ms, 1)
	e.Token(&b, 420*ms, 1)
	e.End(&b, 420*ms, 1, 1)
	e.Settle(time1s)
	tot := e.Totals()
	assert.InDelta(t, 0.030, tot.Busy, 1e-9)
	assert.InDelta(t, 0.800-0.030, tot.Idle, 1e-9)
	assert.InDelta(t, 0.800, tot.Wall, 1e-9)
	assert.InDelta(t, 0.020, b.EngineTime(), 1e-9)
}

// Every session allocates its Account (the steps point at it until it is
// final): 64 bytes, a size class; a field more takes it to 80. The steps
// hold a stepToken for every token until it settles: 16 bytes.
func TestAccountSize(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(Account{}), uintptr(64))
	assert.LessOrEqual(t, unsafe.Sizeof(stepToken{}), uintptr(16))
}

// An absurd prompt length is taken as the longest any model has: it
// cannot take a step's whole time from the decodes in it.
func TestStepsPromptBounded(t *testing.T) {
	e := newTestSteps(true)
	var a, b Account
	e.Arrive(&a, 0, 1)
	e.Token(&a, 10*ms, 1)
	e.Arrive(&b, 10*ms, 1<<50)
	e.Token(&a, 20*ms, 1)
	e.Token(&b, 20*ms, 1)
	e.End(&a, 20*ms, 1, 2)
	e.End(&b, 20*ms, -1, 1)
	e.Settle(time1s)
	assert.InDelta(t, 0.010/float64(MaxPromptTokens+1), a.Decode, 1e-15)
	assert.Positive(t, a.Decode)
}

// A step keeps its tokens' previous times in 4 bytes, as µs before its
// first token: within a µs of the truth (never earlier, so a token right
// after its previous step stays a decode), before or after that token, and
// an hour back is still long before any step held; an event's count is
// bounded, not wrapped.
func TestStepTokenPrevTime(t *testing.T) {
	s := step{anchor: 1_700_000_000_123_456_789}
	for _, prev := range []int64{s.anchor - 5_000_000, s.anchor - 5_000_999, s.anchor + 1_500_000, s.anchor + 1_500_001, s.anchor} {
		tok := s.newStepToken(&Account{}, prev, 1)
		got := s.prevOf(&tok)
		assert.GreaterOrEqual(t, got, prev)
		assert.Less(t, got, prev+1000)
		assert.False(t, tok.is(tokenFirst))
		assert.Equal(t, 1.0, tok.n())
	}
	far := s.newStepToken(&Account{}, s.anchor-int64(time.Hour), 3)
	assert.LessOrEqual(t, s.prevOf(&far), s.anchor-int64(35*time.Minute))
	first := s.newStepToken(&Account{}, 0, 1<<40)
	assert.True(t, first.is(tokenFirst))
	assert.Equal(t, float64(tokenCountMax), first.n())
}

// A sender whose tokens fit no engine's steps (each its own step, in no
// order across sessions: sessions of several engines under one name, or
// a sender's own clock) holds at most maxStepsHeld steps: the oldest is
// settled early, and the sessions it made final are handed out by the next
// Settle, each once, with every settled step's time charged.
func TestStepsHeldBounded(t *testing.T) {
	e := NewSteps(StepsConfig{StepTokens: 100, Join: time.Microsecond.Nanoseconds(), Lag: time.Hour.Nanoseconds()})
	accts := make([]Account, 10)
	for i := range accts {
		e.Arrive(&accts[i], 0, 10)
	}
	const perSession = 3 * maxStepsHeld / 10
	us := time.Microsecond.Nanoseconds()
	late := 0
	for i := range accts {
		// Session by session (as a batch groups them), each token 100 µs
		// after its previous and 10 µs from any other session's: each its
		// own step, every session's among the others'.
		for k := range int64(perSession) {
			if !e.Token(&accts[i], ms+k*100*us+int64(i)*10*us, 1) {
				late++
			}
			require.LessOrEqual(t, len(e.steps), maxStepsHeld)
		}
	}
	assert.Positive(t, late, "tokens older than the steps settled early are late")
	assert.Equal(t, int64(late), e.Late())
	final := map[*Account]int{}
	for _, a := range e.Settle(ms) { // nothing due yet: what settled early
		final[a]++
	}
	end := ms + perSession*100*us
	for i := range accts {
		e.End(&accts[i], end, 10, -1)
	}
	for _, a := range e.SettleAll() {
		final[a]++
	}
	for i := range accts {
		assert.True(t, accts[i].Final(), i)
		assert.LessOrEqual(t, final[&accts[i]], 1, "handed out once")
	}
	tot := e.Totals()
	assert.InDelta(t, tot.Busy, tot.Charged, 1e-9)
}
