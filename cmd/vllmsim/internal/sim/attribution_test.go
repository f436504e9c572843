// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// conserved checks that the requests' shares plus the orphaned time are the
// engine's busy time, and busy plus idle its wall time (each share is
// truncated to the nanosecond: at most one per entry of a step is lost).
func conserved(t *testing.T, e *Engine, reqs []*Request, now time.Time) Totals {
	t.Helper()
	tot := e.Totals(now)
	var sum time.Duration
	var energy float64
	for _, r := range reqs {
		sum += r.Share().EngineTime()
		energy += r.Share().EnergyJ
	}
	slack := time.Duration(tot.PrefillTokens + tot.DecodeTokens) // 1 ns per token at most
	assert.InDelta(t, float64(tot.Busy), float64(sum+tot.Orphaned), float64(slack), "shares + orphaned = busy")
	assert.Equal(t, tot.Wall, tot.Busy+tot.Idle, "busy + idle = wall")
	assert.InDelta(t, tot.BusyEnergyJ, energy+tot.OrphanedEnergyJ, 1e-6*tot.BusyEnergyJ, "energies add up")
	return tot
}

func TestShareConservedWithChunkingAndPreemption(t *testing.T) {
	c := testConfig()
	c.KVBlocks = 64 // small: pre-emptions happen
	c.MaxNumBatchedTokens = 256
	e := newEngine(t, c)
	var reqs []*Request
	now := t0
	for i := range 12 {
		r, err := e.Submit(fmt.Sprint(i), Params{PromptTokens: 100 + 37*i, MaxTokens: 20 + 5*i}, now)
		require.NoError(t, err)
		reqs = append(reqs, r)
	}
	end := now
	drive(t, e, now, 10000, func(b *Batch) { end = b.Start.Add(b.Duration) })
	// An idle second after the last step.
	tot := conserved(t, e, reqs, end.Add(time.Second))
	assert.Positive(t, e.Snapshot().Preemptions, "the test wants pre-emptions")
	assert.Equal(t, time.Second, tot.Idle)
	assert.InDelta(t, c.Power.IdleWatts, tot.IdleEnergyJ, 1e-9)
	for _, r := range reqs {
		s := r.Share()
		assert.Positive(t, s.Prefill, r.ID)
		assert.Positive(t, s.Decode, r.ID)
	}
}

// A decode in a batch of 200 costs a fraction of one in a batch of 2: the
// step is hardly longer and its time is split 100 times more ways.
func TestDecodeShareFallsWithBatchSize(t *testing.T) {
	perToken := func(n int) time.Duration {
		c := testConfig()
		c.MaxNumSeqs = 256
		c.KVBlocks = 8192
		e := newEngine(t, c)
		var reqs []*Request
		for i := range n {
			r, err := e.Submit(fmt.Sprint(i), Params{PromptTokens: 10, MaxTokens: 50}, t0)
			require.NoError(t, err)
			reqs = append(reqs, r)
		}
		drive(t, e, t0, 1000, nil)
		return reqs[0].Share().Decode / 49
	}
	two, many := perToken(2), perToken(200)
	assert.Greater(t, float64(two)/float64(many), 20.0, "batch 2: %s a token; batch 200: %s", two, many)
}

// A prefill-heavy request's time is its prefill, a decode-heavy one's its
// decode: the two tenants of the demo.
func TestPrefillHeavyVersusDecodeHeavy(t *testing.T) {
	c := testConfig()
	e := newEngine(t, c)
	rag, err := e.Submit("rag", Params{PromptTokens: 3000, MaxTokens: 10}, t0)
	require.NoError(t, err)
	chat, err := e.Submit("chat", Params{PromptTokens: 200, MaxTokens: 200}, t0)
	require.NoError(t, err)
	drive(t, e, t0, 1000, nil)
	conserved(t, e, []*Request{rag, chat}, t0)
	assert.Greater(t, rag.Share().Prefill, 10*chat.Share().Prefill)
	assert.Greater(t, rag.Share().Prefill, rag.Share().Decode, "rag %+v", rag.Share())
	assert.Greater(t, chat.Share().Decode, 10*chat.Share().Prefill, "chat %+v", chat.Share())
}

func TestPowerModel(t *testing.T) {
	p := DefaultPower()
	assert.InDelta(t, 80, p.Watts(0), 1e-9)
	assert.InDelta(t, 80+620*0.5, p.Watts(128), 1e-9)
	assert.InDelta(t, 700, p.Watts(5000), 1e-9)
	c := testConfig()
	c.Power.MaxWatts = 10
	_, err := New(c)
	require.Error(t, err)
}
