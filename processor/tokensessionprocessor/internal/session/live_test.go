// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Scan sees each session in its phase, with the engine's clock as its
// source shows it: frozen by Tick's freeze rule, stalled by the stall rule,
// back to decoding at the first fast gap.
func TestScanPhases(t *testing.T) {
	tbl, _ := newTable(t, nil)
	apply(tbl,
		start("wait", t0),
		start("dec", t0), tok("dec", t0+100*ms, 1),
		start("stall", t0), tok("stall", t0+100*ms, 1), tok("stall", t0+300*ms, 1), tok("stall", t0+500*ms, 1), tok("stall", t0+700*ms, 1),
		start("froze", t0), tok("froze", t0+100*ms, 1),
	)
	// The engine's clock moves on past "froze" (a token of "dec" at t0+1 s).
	apply(tbl, tok("dec", t0+1000*ms, 1))
	tbl.Tick(t0 + 1000*ms)

	scan := func(now int64) (map[string]Phase, map[string]int64) {
		phases, clocks := map[string]Phase{}, map[string]int64{}
		tbl.Scan(now, func(s *Session, p Phase, engineNow int64) {
			phases[s.ID], clocks[s.ID] = p, engineNow
		})
		return phases, clocks
	}
	phases, clocks := scan(t0 + 1000*ms)
	assert.Equal(t, map[string]Phase{"wait": PhaseWaiting, "dec": PhaseDecoding, "stall": PhaseStalled, "froze": PhaseFrozen}, phases)
	assert.Equal(t, t0+1000*ms, clocks["froze"], "the engine's latest time, seen just now")
	// Silent for longer than the delivery slack: the clock runs on.
	_, clocks = scan(t0 + 2000*ms)
	assert.Equal(t, t0+1500*ms, clocks["dec"], "1 s of silence less the 500 ms slack")

	// A fast gap ends the stall; the frozen stream's next token confirms the
	// freeze (still slow: stalled), a fast one after it ends the episode.
	apply(tbl, tok("stall", t0+2010*ms, 1), tok("stall", t0+2020*ms, 1), tok("froze", t0+2030*ms, 1))
	phases, _ = scan(t0 + 2030*ms)
	assert.Equal(t, PhaseDecoding, phases["stall"])
	assert.Equal(t, PhaseStalled, phases["froze"])
	apply(tbl, tok("froze", t0+2040*ms, 1))
	phases, _ = scan(t0 + 2040*ms)
	assert.Equal(t, PhaseDecoding, phases["froze"])
	assert.Equal(t, "waiting decoding stalled frozen", PhaseWaiting.String()+" "+PhaseDecoding.String()+" "+PhaseStalled.String()+" "+PhaseFrozen.String())
}
