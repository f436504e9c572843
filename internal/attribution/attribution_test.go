// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package attribution

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const ms = int64(1e6)

// Conservation holds by construction, whatever the events: random
// arrivals, first tokens, ends (some before their first token), power
// readings, out-of-order times; at every point the charged and accruing
// shares are the busy time, busy plus idle the wall time.
func TestConservationRandom(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		e := NewEngine(Limits{StepTokens: 256, PrefillFirst: seed%2 == 1})
		var open []*Share
		var ended []*Share
		now := int64(1e18)
		for range 3000 {
			now += rng.Int64N(20 * ms)
			at := now - rng.Int64N(3*ms) // a little disorder
			switch k := rng.IntN(10); {
			case k < 3:
				s := &Share{}
				p := int64(rng.IntN(3000)) - 100 // some unknown
				e.Arrive(s, at, p)
				open = append(open, s)
			case k < 6 && len(open) > 0:
				e.FirstToken(open[rng.IntN(len(open))], at)
			case k < 9 && len(open) > 0:
				i := rng.IntN(len(open))
				e.End(open[i], at, 10)
				ended = append(ended, open[i])
				open = append(open[:i], open[i+1:]...)
			default:
				e.SetPower(at, 100+rng.Float64()*500)
			}
		}
		for _, s := range open {
			e.End(s, now, 10)
			ended = append(ended, s)
		}
		tot := e.Totals(now + 5*ms)
		sum, energy := 0.0, 0.0
		for _, s := range ended {
			sum += s.EngineTime()
			if s.EnergyKnown {
				energy += s.Energy
			}
		}
		require.Positive(t, tot.Busy)
		assert.InDelta(t, tot.Busy, sum, 1e-9*tot.Busy, "seed %d: shares = busy", seed)
		assert.InDelta(t, tot.Busy, tot.Charged, 1e-9*tot.Busy)
		assert.InDelta(t, tot.Wall, tot.Busy+tot.Idle, 1e-9*tot.Wall, "seed %d: busy + idle = wall", seed)
		assert.LessOrEqual(t, energy, tot.BusyEnergy*(1+1e-9), "known energies within the busy energy")
	}
}

// A decoding session in a batch of 200 is charged a 200th of the steps, in
// a batch of 2 a half; the idle time before and after is nobody's.
func TestDecodeBatchSize(t *testing.T) {
	share := func(n int) (float64, Totals) {
		e := NewEngine(Limits{})
		ss := make([]Share, n)
		for i := range ss {
			e.Arrive(&ss[i], 0, 10)
		}
		// Prefill: 10 ms; decode: 1 s; then 1 s idle.
		for i := range ss {
			e.FirstToken(&ss[i], 10*ms)
		}
		for i := range ss {
			e.End(&ss[i], 1010*ms, 10)
		}
		return ss[0].Decode, e.Totals(2010 * ms)
	}
	two, tot2 := share(2)
	many, tot200 := share(200)
	assert.InDelta(t, 0.5, two, 1e-9)
	assert.InDelta(t, 1.0/200, many, 1e-9)
	for _, tot := range []Totals{tot2, tot200} {
		assert.InDelta(t, 1.0, tot.Idle, 1e-9)
		assert.InDelta(t, 1.01, tot.Busy, 1e-9)
		assert.InDelta(t, 2.01, tot.Wall, 1e-9)
	}
}

// A prefill-heavy session (3000-token prompt, few tokens out) beside a
// decode-heavy one (200 in, long answer): while both compute, the prefill
// weighs its tokens per step against the decode's one.
func TestPrefillHeavyVersusDecodeHeavy(t *testing.T) {
	e := NewEngine(Limits{StepTokens: 2048})
	var rag, chat Share
	e.Arrive(&chat, 0, 200)
	e.FirstToken(&chat, 20*ms) // chat decodes alone from 20 ms
	e.Arrive(&rag, 100*ms, 3000)
	// 3000 tokens with 1 decoding: 2 steps of 1500 (2047 available).
	assert.InDelta(t, 1500, rag.w, 1e-9)
	e.FirstToken(&rag, 300*ms)
	e.End(&rag, 400*ms, 10)
	e.End(&chat, 1000*ms, 10)

	// 0-20 ms chat's prefill alone; 20-100 chat decodes alone; 100-300
	// rag's prefill (1500) beside chat's decode (1); 300-400 both decode;
	// 400-1000 chat alone.
	assert.InDelta(t, 0.020, chat.Prefill, 1e-9)
	assert.InDelta(t, 0.080+0.2/1501+0.05+0.6, chat.Decode, 1e-9)
	assert.InDelta(t, 0.2*1500/1501, rag.Prefill, 1e-9)
	assert.InDelta(t, 0.05, rag.Decode, 1e-9)
	assert.InDelta(t, 1.0, e.Totals(1000*ms).Busy, 1e-9)
}

// The budget admits prompts first come, first served: one waits (weight
// 0) until the one before it leaves prefill.
func TestAdmissionWaitsForBudget(t *testing.T) {
	e := NewEngine(Limits{StepTokens: 1000})
	var a, b Share
	e.Arrive(&a, 0, 1000)
	e.Arrive(&b, 0, 500)
	assert.Equal(t, PhasePrefill, a.Phase())
	assert.Equal(t, PhaseWaiting, b.Phase())
	e.FirstToken(&a, 100*ms)
	assert.Equal(t, PhasePrefill, b.Phase())
	e.FirstToken(&b, 150*ms)
	e.End(&a, 150*ms, 10)
	e.End(&b, 150*ms, 10)
	assert.InDelta(t, 0.1, a.Prefill, 1e-9)
	assert.InDelta(t, 0.05*500/501, b.Prefill, 1e-9)
	assert.InDelta(t, 0.05/501, a.Decode, 1e-9)
	assert.Zero(t, b.Decode)
	assert.Zero(t, e.Totals(150*ms).Unadmitted)
}

// Energy is the power integral split like the time; without a reading it
// is unknown, and a session across a break in the readings has none.
func TestEnergy(t *testing.T) {
	e := NewEngine(Limits{StepTokens: 2048})
	var dark, a, b Share
	e.Arrive(&dark, 0, 10)
	e.SetPower(0, 100)
	e.Arrive(&a, 0, 10)
	e.Arrive(&b, 0, 10)
	e.FirstToken(&a, 10*ms)
	e.FirstToken(&b, 10*ms)
	e.FirstToken(&dark, 10*ms)
	e.SetPower(510*ms, 300)
	e.End(&a, 1010*ms, 10)
	e.End(&b, 1010*ms, 10)
	e.End(&dark, 1010*ms, 10)
	assert.False(t, dark.EnergyKnown)
	require.True(t, a.EnergyKnown)
	// 0-10 ms: 3 prefills of 10 at 100 W; 10-510: 3 decodes at 100 W;
	// 510-1010: at 300 W.
	assert.InDelta(t, 0.01*100/3+0.5*100/3+0.5*300/3, a.Energy, 1e-9)
	tot := e.Totals(2010 * ms)
	assert.InDelta(t, 300, tot.IdleEnergy, 1e-9)
	assert.InDelta(t, 0.01*100+0.5*100+0.5*300, tot.BusyEnergy, 1e-9)

	e.SetPower(2010*ms, math.NaN())
	var c Share
	e.Arrive(&c, 2010*ms, 10)
	e.SetPower(2020*ms, 100)
	e.End(&c, 2030*ms, 10)
	assert.False(t, c.EnergyKnown, "arrived without power")
}

// Prefill first (vLLM V0 without chunked prefill): while a prompt is
// computed the decodes wait, so the prompt's step time is all its own.
func TestPrefillFirst(t *testing.T) {
	e := NewEngine(Limits{StepTokens: 4096, PrefillFirst: true})
	var chat, rag Share
	e.Arrive(&chat, 0, 200)
	e.FirstToken(&chat, 10*ms)
	e.Arrive(&rag, 100*ms, 3000)
	e.FirstToken(&rag, 300*ms) // 100-300: rag's prefill alone
	e.End(&rag, 400*ms, 10)
	e.End(&chat, 500*ms, 10)
	assert.InDelta(t, 0.2, rag.Prefill, 1e-9)
	assert.InDelta(t, 0.05, rag.Decode, 1e-9)
	assert.InDelta(t, 0.09+0.05+0.1, chat.Decode, 1e-9)
	assert.InDelta(t, 0.5, e.Totals(500*ms).Busy, 1e-9)
}
