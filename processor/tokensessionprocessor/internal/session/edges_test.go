// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// The edges of session semantics: each test names the defect
// it guards.

func inTrace(ev *tokenevent.Event, id pcommon.TraceID) *tokenevent.Event {
	ev.TraceID = tokenevent.TraceID(id)
	return ev
}

// seqTok is a token event of session "s" with a sequence number.
func seqTok(at int64, seq uint64) *tokenevent.Event {
	ev := tok("s", at, 1)
	ev.Seq, ev.HasSeq = seq, true
	return ev
}

// 1. A keep is permanent for the trace: an agent calls the model three
// times in one trace, the first call is slow; the later calls, normal on
// their own, are kept with it, and their verdict says why.
func TestKeepHoldsForTheWholeTrace(t *testing.T) {
	tbl, rec := newTable(t, nil)
	trace := pcommon.TraceID{7}
	memory := map[pcommon.TraceID]sampling.Threshold{}
	tbl.SetTraceMemory(func(id pcommon.TraceID) (sampling.Threshold, bool) {
		th, ok := memory[id]
		return th, ok
	})
	call := func(id string, at int64, ttft int64) {
		apply(tbl, inTrace(start(id, at), trace), tok(id, at+ttft, 1), tok(id, at+ttft+10*ms, 1), end(id, at+ttft+10*ms, 2))
		e := rec.ended[len(rec.ended)-1]
		require.True(t, e.Trace.Done)
		if e.Trace.Kept { // what the processor does with a released trace
			memory[trace] = e.Trace.Threshold
		}
	}
	call("1", t0, 900*ms) // slow
	call("2", t0+2*int64(time.Second), 20*ms)
	call("3", t0+4*int64(time.Second), 20*ms)
	require.Len(t, rec.ended, 3)
	assert.Equal(t, ReasonTTFT, rec.ended[0].Reasons)
	for _, e := range rec.ended[1:] {
		assert.True(t, e.Keep, e.ID)
		assert.Equal(t, ReasonTrace, e.Reasons, e.ID)
		assert.True(t, e.Trace.Kept, e.ID)
		assert.Equal(t, sampling.AlwaysSampleThreshold, e.Threshold, e.ID)
	}
}

// 2. A request that was not streamed has no first token, TPOT or gaps:
// its one token event (every token, at the end) counts its tokens and
// its duration only.
func TestNotStreamed(t *testing.T) {
	tbl, rec := newTable(t, nil)
	st := start("n", t0)
	st.NoStream = true
	apply(tbl, st, tok("n", t0+2*int64(time.Second), 300), end("n", t0+2*int64(time.Second), 300))
	require.Len(t, rec.ended, 1)
	e := rec.ended[0]
	assert.False(t, e.HasTTFT)
	assert.False(t, e.HasTPOT)
	assert.Empty(t, rec.gaps)
	assert.Zero(t, e.MaxGap)
	assert.Equal(t, int64(300), e.Tokens)
	assert.Equal(t, 2*time.Second, e.Duration)
	assert.False(t, e.Keep, "2 s for a whole response is no slow first token")
	tbl.Tick(t0 + 10*int64(time.Second))
	assert.Empty(t, rec.stalls)
}

// 3. The caller's tracestate takes part in the verdict (OTEP 235): its
// explicit randomness decides the draw, and its head-sampling threshold
// stays on the spans.
func TestCallerTraceState(t *testing.T) {
	withState := func(id, ts string) *tokenevent.Event {
		ev := start(id, t0)
		ev.TraceState = ts
		return ev
	}
	finish := func(tbl *testTable, id string, ttft int64) {
		apply(tbl, tok(id, t0+ttft, 1), end(id, t0+ttft, 1))
	}
	th := func(s string) sampling.Threshold {
		v, err := sampling.TValueToThreshold(s)
		require.NoError(t, err)
		return v
	}

	tbl, rec := newTable(t, func(c *Config) { c.Sampling.NormalPercent = 50 })
	// The trace ID's own randomness would pass 50%; the explicit rv does not.
	lucky := pcommon.TraceID{0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	apply(tbl, inTrace(withState("rv-low", "ot=rv:00000000000001"), lucky))
	finish(tbl, "rv-low", 10*ms)
	assert.False(t, rec.ended[0].Keep, "the explicit rv decides, not the trace ID")

	// A rule keeps it; the caller sampled at 50%: the span says so.
	apply(tbl, withState("slow", "ot=th:8;rv:ffffffffffffff"))
	finish(tbl, "slow", 900*ms)
	assert.True(t, rec.ended[1].Keep)
	assert.Equal(t, th("8"), rec.ended[1].Threshold)

	// The caller sampled at ~0.4%, less than normal_percent: a normal
	// session kept by the draw carries the caller's threshold.
	apply(tbl, withState("strict", "ot=th:ff;rv:ffffffffffffff"))
	finish(tbl, "strict", 10*ms)
	assert.Equal(t, ReasonProbabilistic, rec.ended[2].Reasons)
	assert.Equal(t, th("ff"), rec.ended[2].Threshold)

	apply(tbl, withState("bad", "ot=th:zz"))
	assert.Equal(t, uint64(1), tbl.Counters.InvalidTraceStates)
}

// 4. Freezes are judged on the engine's clock: delivery lagging by more
// than the freeze time raises nothing while the source is busy, a real
// freeze is raised once the source's clock moves past it, and a freeze
// raised on silence is withdrawn when a token made before it arrives.
func TestFreezeOnEngineTime(t *testing.T) {
	tbl, rec := newTable(t, nil)
	const lag = 600 * ms // every event arrives 600 ms after it was made
	at := func(ev *tokenevent.Event) { tbl.Apply(ev, int64(ev.TimeUnixNano)+lag) }
	at(start("a", t0))
	at(start("b", t0))
	for i := int64(1); i <= 20; i++ {
		at(tok("a", t0+i*20*ms, 1))
		if i <= 5 {
			at(tok("b", t0+i*20*ms, 1)) // b's last token: t0+100 ms
		}
		tbl.Tick(t0 + i*20*ms + lag)
		if t0+i*20*ms-(t0+100*ms) <= 450*ms {
			assert.Empty(t, rec.stalls, "at %d ms: late delivery alone", i*20)
		}
	}
	// a's clock reached t0+400 ms: b not frozen yet. Let a go on to t0+600.
	for i := int64(21); i <= 30; i++ {
		at(tok("a", t0+i*20*ms, 1))
		tbl.Tick(t0 + i*20*ms + lag)
	}
	require.Len(t, rec.stalls, 1, "b froze on the engine's clock")
	assert.Equal(t, Stall{DetectedAt: t0 + 550*ms, Since: t0 + 100*ms, Freeze: true}, rec.stalls[0])

	// A lone session, no slack: silence raises a freeze, then a token
	// made 40 ms after the last arrives late and withdraws it.
	tbl2, rec2 := newTable(t, func(c *Config) { c.Stall.DeliverySlack = 0 })
	apply(tbl2, start("c", t0), tok("c", t0+10*ms, 1), tok("c", t0+20*ms, 1))
	tbl2.Tick(t0 + 500*ms)
	require.Len(t, rec2.stalls, 1)
	tbl2.Apply(tok("c", t0+60*ms, 1), t0+600*ms)
	tbl2.Apply(tok("c", t0+70*ms, 1), t0+610*ms)
	tbl2.Apply(end("c", t0+70*ms, 4), t0+610*ms)
	assert.Equal(t, uint64(1), tbl2.Counters.WithdrawnFreezes)
	e := rec2.ended[0]
	assert.Zero(t, e.Stalls)
	assert.Empty(t, e.StallRecords)
	assert.True(t, e.Keep, "its trace was released as kept: a keep is not undone")
	assert.Equal(t, ReasonCorrected, e.Reasons)
}

// 5. A session that never had a token lasts until the collector ended it,
// on the engine's clock; not 0.
func TestNoFirstTokenDuration(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Table.IdleTimeout = 10 * time.Second; c.Table.MaxActive = 2 })
	const skew = 3 * int64(time.Second) // the engine's clock runs 3 s behind the collector's
	tbl.Apply(start("queued", t0), t0+skew)
	tbl.Tick(t0 + skew + 11*int64(time.Second))
	require.Len(t, rec.ended, 1)
	assert.Equal(t, OutcomeTimeout, rec.ended[0].Outcome)
	assert.Equal(t, 11*time.Second, rec.ended[0].Duration)
	assert.Equal(t, t0+11*int64(time.Second), rec.ended[0].End.Time)

	tbl.Apply(start("x", t0), t0+skew)
	tbl.Apply(start("y", t0), t0+skew+int64(time.Second))
	tbl.Apply(start("z", t0), t0+skew+2*int64(time.Second)) // evicts x
	require.Len(t, rec.ended, 2)
	assert.Equal(t, OutcomeEvicted, rec.ended[1].Outcome)
	assert.Equal(t, 2*time.Second, rec.ended[1].Duration)
	tbl.Shutdown(t0 + skew + 5*int64(time.Second))
	for _, e := range rec.ended[2:] {
		assert.Equal(t, OutcomeShutdown, e.Outcome)
		assert.Positive(t, e.Duration, e.ID)
	}
}

// 6. Event times are bounded: ahead of the collector's clock by more than
// max_future_skew, or before the session's start by more than a second.
func TestEventTimeBounds(t *testing.T) {
	tbl, rec := newTable(t, nil)
	year := int64(365 * 24 * time.Hour)
	apply(tbl, start("s", t0), tok("s", t0+10*ms, 1))
	tbl.Apply(tok("s", t0+year, 1), t0+20*ms)
	tbl.Apply(tok("s", t0-2*int64(time.Second), 1), t0+30*ms)
	tbl.Apply(tok("s", t0+40*ms, 1), t0+40*ms)
	tbl.Apply(start("f", t0+2*int64(time.Minute)), t0+50*ms)
	tbl.Apply(move("s", t0+year), t0+45*ms)
	tbl.Apply(move("s", t0-2*int64(time.Second)), t0+45*ms)
	tbl.Apply(end("s", t0+50*ms, -1), t0+50*ms)
	assert.Equal(t, [4]uint64{1, 1, 0, 1}, tbl.Counters.FutureEvents, "start, token, end, move")
	assert.Equal(t, [4]uint64{0, 1, 0, 1}, tbl.Counters.EventsBeforeStart)
	require.Len(t, rec.ended, 1)
	assert.Equal(t, int64(2), rec.ended[0].Tokens)
	assert.Equal(t, 30*time.Millisecond, rec.ended[0].TPOT)
	assert.False(t, tbl.Contains("f"), "a start from the future opens nothing")
}

// 9. Token events carrying seq are folded once: a retried batch adds
// nothing; reordering within 64 is no duplicate.
func TestSeqDedupe(t *testing.T) {
	tbl, rec := newTable(t, nil)
	apply(tbl, start("s", t0), seqTok(t0+10*ms, 0), seqTok(t0+30*ms, 1))
	apply(tbl, seqTok(t0+10*ms, 0), seqTok(t0+30*ms, 1)) // the retry
	apply(tbl, seqTok(t0+70*ms, 3), seqTok(t0+50*ms, 2), seqTok(t0+200*ms, 100), seqTok(t0+190*ms, 20))
	apply(tbl, end("s", t0+200*ms, -1))
	assert.Equal(t, uint64(3), tbl.Counters.DuplicateTokens, "the retried 0 and 1, and 20, too old to tell")
	assert.Equal(t, int64(5), rec.ended[0].Tokens)
	assert.Equal(t, 47500*time.Microsecond, rec.ended[0].TPOT, "(200-10)/(5-1): the retry added no token")
}

// 11. finish_reason "error" without an error is an engine error.
func TestFinishReasonError(t *testing.T) {
	tbl, rec := newTable(t, nil)
	e := end("x", t0+20*ms, 1)
	e.FinishReason = "error"
	apply(tbl, start("x", t0), tok("x", t0+10*ms, 1), e)
	assert.Equal(t, OutcomeError, rec.ended[0].Outcome)
	assert.Equal(t, ErrorTypeEngine, rec.ended[0].End.ErrorType)
	assert.Equal(t, ReasonError, rec.ended[0].Reasons)
}

// 12. A reordered earlier first token corrects TTFT below the threshold:
// the ttft reason goes; the early keep stays, as corrected.
func TestReasonsRecomputed(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Sampling.TPOT = 0 })
	apply(tbl, start("x", t0), tok("x", t0+600*ms, 1))
	require.Equal(t, []string{"x"}, rec.early)
	apply(tbl, tok("x", t0+100*ms, 1), tok("x", t0+610*ms, 1), end("x", t0+610*ms, 3))
	e := rec.ended[0]
	assert.Equal(t, 100*time.Millisecond, e.TTFT)
	assert.Equal(t, ReasonCorrected, e.Reasons)
	assert.True(t, e.Keep)
	assert.Equal(t, "corrected", e.Reasons.String())
}

// 13. A session opened by a token before its start takes the start's trace
// (with its keep) and dimensions when the start arrives. Its early keep is
// held until then: reported under the random trace, it would tell a tail
// sampler of a trace no other span has, and the real trace would hear of it
// a second time.
func TestOrphanRekeyed(t *testing.T) {
	tbl, rec := newTable(t, nil)
	realTrace := pcommon.TraceID{9}
	// Stalled before the start arrived: kept early under a random trace.
	apply(tbl, tok("o", t0+100*ms, 1), tok("o", t0+300*ms, 1), tok("o", t0+500*ms, 1), tok("o", t0+700*ms, 1))
	require.Len(t, rec.stalls, 1)
	assert.Empty(t, rec.early, "held for the start's trace")
	apply(tbl, inTrace(start("o", t0), realTrace))
	assert.Equal(t, []string{"o m e"}, rec.restarted)
	active, kept, th := tbl.TraceActive(realTrace)
	assert.True(t, active)
	assert.True(t, kept, "the keep moved to the real trace")
	assert.Equal(t, sampling.AlwaysSampleThreshold, th)
	assert.Equal(t, []string{"o"}, rec.early, "reported once, in the real trace, so that its spans are released")
	assert.Equal(t, []int64{t0 + 700*ms}, rec.earlyAt, "when the stall was detected")
	assert.Equal(t, 1, tbl.traces.used, "the random trace is gone")
	assert.Zero(t, tbl.Counters.UnreportedKeeps)
}

// 13b. The start of a session kept before it (a stall) can show a TTFT
// breach too: the verdict, reported when the start comes, was reached at
// the first token. A start without a trace keeps the session's random
// trace: the held keep is reported in it then.
func TestOrphanKeepReportedAtItsStart(t *testing.T) {
	tbl, rec := newTable(t, nil)
	apply(tbl, tok("o", t0+600*ms, 1), tok("o", t0+800*ms, 1), tok("o", t0+1000*ms, 1), tok("o", t0+1200*ms, 1))
	require.Len(t, rec.stalls, 1)
	require.Empty(t, rec.early)
	apply(tbl, start("o", t0))
	assert.Equal(t, []string{"o"}, rec.early)
	assert.Equal(t, []int64{t0 + 600*ms}, rec.earlyAt, "the TTFT breach, at the first token")
	apply(tbl, end("o", t0+1200*ms, 4))
	require.Len(t, rec.ended, 1)
	assert.Equal(t, ReasonTTFT|ReasonTPOT|ReasonStall, rec.ended[0].Reasons)
}

// 13c. A session kept before its start that ends without it reports no
// early keep at all, and counts it.
func TestOrphanKeepWithoutStart(t *testing.T) {
	tbl, rec := newTable(t, nil)
	apply(tbl, tok("o", t0+100*ms, 1), tok("o", t0+300*ms, 1), tok("o", t0+500*ms, 1), tok("o", t0+700*ms, 1),
		end("o", t0+700*ms, 4))
	require.Len(t, rec.ended, 1)
	assert.True(t, rec.ended[0].Keep, "the session itself is kept, under its own trace")
	assert.Empty(t, rec.early)
	assert.Equal(t, uint64(1), tbl.Counters.UnreportedKeeps)
	// The next session in the same memory starts clean.
	apply(tbl, start("p", t0+2000*ms), tok("p", t0+2600*ms, 1))
	assert.Equal(t, []string{"p"}, rec.early)
	assert.Equal(t, []int64{t0 + 2600*ms}, rec.earlyAt)
	assert.Equal(t, uint64(1), tbl.Counters.UnreportedKeeps)
}

// 15. The maximum window TPOT is over full windows only.
func TestWindowTPOTMaxFullWindows(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Window = 3; c.Stall.Gap = time.Second })
	apply(tbl, start("w", t0), tok("w", t0+10*ms, 1), tok("w", t0+210*ms, 1), tok("w", t0+220*ms, 1), tok("w", t0+230*ms, 1), tok("w", t0+240*ms, 1), end("w", t0+240*ms, -1))
	assert.Equal(t, 73333*time.Microsecond, rec.ended[0].WMax, "(200+10+10)/3, not the lone 200 ms")
}

// WindowTPOTMax is the highest mean, in whole µs, of any full window of
// per-token gaps: checked against that definition over random gaps (chunks
// of several tokens included, whose gap is the time over the count), as
// the fold finds a new maximum without dividing on every token.
func TestWindowTPOTMaxIsHighestFullWindowMean(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 50 {
		window := 1 + rng.IntN(8)
		tbl, rec := newTable(t, func(c *Config) { c.Window = window; c.Stall.Gap = time.Hour })
		id := fmt.Sprintf("w%d", round)
		at := t0
		apply(tbl, start(id, at))
		at += 10 * ms
		apply(tbl, tok(id, at, 1))
		var gaps []int64 // per token, µs
		var want time.Duration
		for range 5 + rng.IntN(60) {
			count := int64(1)
			if rng.IntN(4) == 0 {
				count = 1 + rng.Int64N(4)
			}
			d := 1 + rng.Int64N(int64(50*time.Millisecond))
			at += d
			apply(tbl, tok(id, at, count))
			for range min(count, int64(window)) {
				gaps = append(gaps, int64(time.Duration(d/count)/time.Microsecond))
			}
			if len(gaps) >= window {
				var sum int64
				for _, g := range gaps[len(gaps)-window:] {
					sum += g
				}
				want = max(want, time.Duration(sum/int64(window))*time.Microsecond)
			}
		}
		apply(tbl, end(id, at, -1))
		require.Len(t, rec.ended, 1)
		require.Equal(t, want, rec.ended[0].WMax, "round %d, window %d, gaps %v", round, window, gaps)
	}
}
