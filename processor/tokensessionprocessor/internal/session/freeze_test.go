// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The freezes a session's alerts reported are its own reason, freeze; a
// withdrawn freeze is corrected only when the session's tokens show no
// freeze at the alert's moment. Lone sessions without delivery slack: the
// source is judged at once on the arrival clock; TPOT is off, so that the
// reasons are the stall rules' alone.
func newFreezeTable(t *testing.T) (*testTable, *recorder) {
	t.Helper()
	return newTable(t, func(c *Config) {
		c.Stall.DeliverySlack = 0
		c.Sampling.TPOT = 0
	})
}

// One freeze, one gap over the freeze time, fewer slow gaps than
// stall::consecutive: kept for the freeze.
func TestFreezeIsItsOwnReason(t *testing.T) {
	tbl, rec := newFreezeTable(t)
	apply(tbl, start("f", t0), tok("f", t0+10*ms, 1), tok("f", t0+20*ms, 1))
	tbl.Tick(t0 + 500*ms)
	require.Len(t, rec.stalls, 1)
	require.Equal(t, []string{"f"}, rec.early, "kept while the freeze lasts")
	apply(tbl, tok("f", t0+832*ms, 1), tok("f", t0+850*ms, 1), tok("f", t0+870*ms, 1), end("f", t0+870*ms, 5))
	e := rec.ended[0]
	assert.Equal(t, 1, e.Stalls)
	assert.Equal(t, 1, e.Freezes)
	assert.True(t, e.Keep)
	assert.Equal(t, ReasonFreeze, e.Reasons)
	assert.Equal(t, "freeze", e.Reasons.String())
}

// The demo's case: the freeze is reported on the last token folded, a
// token made a little later arrives late and withdraws it, then the real
// freeze shows in the tokens (a gap over the freeze time across the
// alert's moment). The alert was right: freeze, not corrected.
func TestWithdrawnFreezeReinstated(t *testing.T) {
	tbl, rec := newFreezeTable(t)
	apply(tbl, start("f", t0), tok("f", t0+10*ms, 1), tok("f", t0+20*ms, 1))
	tbl.Tick(t0 + 500*ms)
	require.Len(t, rec.stalls, 1)
	assert.Equal(t, Stall{DetectedAt: t0 + 470*ms, Since: t0 + 20*ms, Freeze: true}, rec.stalls[0])
	tbl.Apply(tok("f", t0+40*ms, 1), t0+600*ms) // made before the freeze, late
	require.Equal(t, uint64(1), tbl.Counters.WithdrawnFreezes)
	apply(tbl, tok("f", t0+852*ms, 1), tok("f", t0+870*ms, 1), tok("f", t0+890*ms, 1), end("f", t0+890*ms, 6))
	assert.Len(t, rec.stalls, 1, "no second alert: the first was right")
	assert.Equal(t, uint64(1), tbl.Counters.ReinstatedFreezes)
	e := rec.ended[0]
	assert.Equal(t, 1, e.Stalls)
	assert.Equal(t, 1, e.Freezes)
	assert.Equal(t, ReasonFreeze, e.Reasons)
	assert.Equal(t, []Stall{{DetectedAt: t0 + 470*ms, Since: t0 + 40*ms, Freeze: true}}, e.StallRecords,
		"since the last token before the freeze, as the late token showed it")
}

// A withdrawn freeze whose alert's moment falls in a short gap was wrong:
// the early keep stays, as corrected; a long gap later, with no alert of
// its own, does not bring it back.
func TestWithdrawnFreezeCorrected(t *testing.T) {
	tbl, rec := newFreezeTable(t)
	apply(tbl, start("c", t0), tok("c", t0+10*ms, 1), tok("c", t0+20*ms, 1))
	tbl.Tick(t0 + 500*ms)
	require.Len(t, rec.stalls, 1)
	tbl.Apply(tok("c", t0+300*ms, 1), t0+600*ms) // made before the freeze, late
	tbl.Apply(tok("c", t0+440*ms, 1), t0+610*ms)
	tbl.Apply(tok("c", t0+480*ms, 1), t0+620*ms) // the gap across t0+470 ms: 40 ms
	tbl.Apply(tok("c", t0+1000*ms, 1), t0+1000*ms)
	tbl.Apply(end("c", t0+1000*ms, 6), t0+1000*ms)
	assert.Zero(t, tbl.Counters.ReinstatedFreezes)
	e := rec.ended[0]
	assert.Zero(t, e.Stalls)
	assert.Zero(t, e.Freezes)
	assert.Empty(t, e.StallRecords)
	assert.True(t, e.Keep, "its trace was released as kept: a keep is not undone")
	assert.Equal(t, ReasonCorrected, e.Reasons)
}

// A freeze right after the first token is a freeze like any other; before
// it, the session waits for prefill, and only TTFT judges it.
func TestFreezeAtFirstToken(t *testing.T) {
	tbl, rec := newFreezeTable(t)
	apply(tbl, start("f", t0))
	tbl.Tick(t0 + 400*ms)
	assert.Empty(t, rec.stalls, "no freeze before the first token")
	apply(tbl, tok("f", t0+420*ms, 1))
	tbl.Tick(t0 + 900*ms)
	require.Len(t, rec.stalls, 1)
	assert.Equal(t, Stall{DetectedAt: t0 + 870*ms, Since: t0 + 420*ms, Freeze: true}, rec.stalls[0])
	apply(tbl, tok("f", t0+1300*ms, 1), tok("f", t0+1320*ms, 1), end("f", t0+1320*ms, 3))
	e := rec.ended[0]
	assert.Equal(t, 1, e.Freezes)
	assert.Equal(t, ReasonFreeze, e.Reasons)
}

// A freeze, then a run of slow gaps: two episodes, both reasons, in the
// reasons' order.
func TestFreezeThenStall(t *testing.T) {
	tbl, rec := newFreezeTable(t)
	apply(tbl, start("b", t0), tok("b", t0+10*ms, 1), tok("b", t0+20*ms, 1))
	tbl.Tick(t0 + 500*ms)
	apply(tbl, tok("b", t0+800*ms, 1), tok("b", t0+810*ms, 1),
		tok("b", t0+1010*ms, 1), tok("b", t0+1210*ms, 1), tok("b", t0+1410*ms, 1), end("b", t0+1410*ms, 7))
	require.Len(t, rec.stalls, 2)
	assert.True(t, rec.stalls[0].Freeze)
	assert.False(t, rec.stalls[1].Freeze)
	e := rec.ended[0]
	assert.Equal(t, 2, e.Stalls)
	assert.Equal(t, 1, e.Freezes)
	assert.Equal(t, ReasonStall|ReasonFreeze, e.Reasons)
	assert.Equal(t, "stall,freeze", e.Reasons.String())
}

// Sessions are reused: a withdrawn freeze waiting for its gap does not
// follow the Session into the next.
func TestWithdrawnFreezeNotReused(t *testing.T) {
	tbl, rec := newFreezeTable(t)
	apply(tbl, start("a", t0), tok("a", t0+10*ms, 1))
	tbl.Tick(t0 + 500*ms)
	tbl.Apply(tok("a", t0+20*ms, 1), t0+600*ms)
	tbl.Apply(end("a", t0+20*ms, 2), t0+600*ms)
	require.Equal(t, ReasonCorrected, rec.ended[0].Reasons)
	apply(tbl, start("b", t0+700*ms), tok("b", t0+710*ms, 1), tok("b", t0+1500*ms, 1), end("b", t0+1500*ms, 2))
	assert.Zero(t, rec.ended[1].Freezes)
	assert.Zero(t, rec.ended[1].Reasons)
}
