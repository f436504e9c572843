// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)

func testJudge() *judge {
	return newJudge(judgeConfig{
		window: 10 * time.Second, minSessions: 5, stallRatio: 0.2, ttftP99: 2 * time.Second,
		errorRatio: 0.2, baseTime: 30 * time.Second, maxTime: 300 * time.Second, maxPercent: 50, keepLast: true,
	})
}

// healthyTraffic adds n sessions without a stall, an error or a slow TTFT.
func healthyTraffic(j *judge, engine string, at time.Time, n float64) {
	j.add(engine, sample{at: at, sessions: n, ttft: []bucket{{0.08, 0.1, uint64(n)}}})
}

func TestJudgeThresholds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      sample
		reason string
	}{
		{"stall ratio reached", sample{sessions: 10, stalls: 2}, reasonStallRatio},
		{"stall ratio below", sample{sessions: 10, stalls: 1}, ""},
		{"error ratio reached", sample{sessions: 10, errors: 2}, reasonErrorRatio},
		{"error ratio below", sample{sessions: 10, errors: 1}, ""},
		{"ttft p99 reached", sample{sessions: 10, ttft: []bucket{{0.25, 0.5, 9}, {1, 2.5, 1}}}, reasonTTFTP99},
		{"ttft p99 below", sample{sessions: 100, ttft: []bucket{{0.25, 0.5, 99}, {1, 2.5, 1}}}, ""},
		{"the worst reason", sample{sessions: 10, stalls: 2, errors: 8}, reasonErrorRatio},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := testJudge()
			healthyTraffic(j, "other", t0, 100) // two engines: one may go
			tc.s.at = t0
			j.add("e", tc.s)
			changes := j.evaluate(t0.Add(time.Second))
			if tc.reason == "" {
				assert.Empty(t, changes)
				return
			}
			require.Equal(t, []change{{engine: "e", state: stateEjected, reason: tc.reason}}, changes)
		})
	}
}

func TestJudgeMinSessions(t *testing.T) {
	j := testJudge()
	healthyTraffic(j, "other", t0, 100)
	j.add("e", sample{at: t0, sessions: 4, stalls: 4})
	assert.Empty(t, j.evaluate(t0.Add(time.Second)), "4 sessions, all stalled: too few to judge")
	j.add("e", sample{at: t0.Add(time.Second), sessions: 1})
	assert.Len(t, j.evaluate(t0.Add(2*time.Second)), 1, "the fifth session")
}

// Stall alerts (distinct sessions) count before any session ends: an engine
// that freezes ends few sessions.
func TestJudgeStallAlertsAlone(t *testing.T) {
	j := testJudge()
	healthyTraffic(j, "other", t0, 100)
	for i := range 5 {
		j.add("e", sample{at: t0, stalled: fmt.Sprint("s", i)})
		j.add("e", sample{at: t0, stalled: fmt.Sprint("s", i)}) // a second alert of the same session
	}
	require.Len(t, j.evaluate(t0.Add(time.Second)), 1)
	assert.Equal(t, 1.0, j.engines["e"].figures.StallRatio)
}

func TestJudgeEjectionTimeGrowsAndReadmits(t *testing.T) {
	j := testJudge()
	now := t0
	for round, want := range []time.Duration{30 * time.Second, 60 * time.Second, 90 * time.Second} {
		healthyTraffic(j, "other", now, 100)
		j.add("e", sample{at: now, sessions: 10, stalls: 5})
		changes := j.evaluate(now)
		require.Len(t, changes, 1, "round %d", round)
		st := j.status(j.engines["e"]).at(now)
		assert.Equal(t, stateEjected, st.State)
		assert.Equal(t, round+1, st.Ejections)
		assert.Equal(t, want.Seconds(), st.TimeLeftS)
		// Still out just before the time is over; back when it is.
		assert.Empty(t, j.evaluate(now.Add(want-time.Millisecond)))
		now = now.Add(want)
		assert.Equal(t, []change{{engine: "e", state: stateHealthy}}, j.evaluate(now), "round %d", round)
		assert.Empty(t, j.engines["e"].samples, "judged afresh")
	}
	// Capped at max_time.
	j.cfg.maxTime = 100 * time.Second
	healthyTraffic(j, "other", now, 100)
	j.add("e", sample{at: now, sessions: 10, stalls: 5})
	j.evaluate(now)
	assert.Equal(t, 100.0, j.status(j.engines["e"]).at(now).TimeLeftS)
}

func TestJudgeMaxPercent(t *testing.T) {
	for _, tc := range []struct {
		engines, bad, ejected int
	}{
		{2, 2, 1}, // 50% of 2
		{5, 5, 2}, // 50% of 5, rounded down
		{5, 1, 1},
		{1, 1, 0}, // never the only engine
	} {
		t.Run(fmt.Sprintf("%d engines, %d bad", tc.engines, tc.bad), func(t *testing.T) {
			j := testJudge()
			for i := range tc.engines {
				name := fmt.Sprint("e", i)
				if i < tc.bad {
					// e0 is the worst: it goes first.
					j.add(name, sample{at: t0, sessions: 10, stalls: float64(10 - i)})
				} else {
					healthyTraffic(j, name, t0, 10)
				}
			}
			changes := j.evaluate(t0.Add(time.Second))
			require.Len(t, changes, tc.ejected)
			if tc.ejected > 0 {
				assert.Equal(t, "e0", changes[0].engine, "the worst first")
			}
			assert.Equal(t, tc.ejected, j.ejectedCount())
			// The others stay in while it lasts.
			assert.Empty(t, j.evaluate(t0.Add(2*time.Second)))
		})
	}
}

func TestJudgeWindowAndIdleEngine(t *testing.T) {
	j := testJudge()
	healthyTraffic(j, "other", t0, 100)
	j.add("e", sample{at: t0, sessions: 10, stalls: 5})
	// Out of the window by the time it is judged.
	assert.Empty(t, j.evaluate(t0.Add(11*time.Second)))
	// An engine with no sessions in the window keeps its state.
	st := j.status(j.engines["e"]).at(t0.Add(11 * time.Second))
	assert.Equal(t, stateHealthy, st.State)
	assert.Zero(t, st.Window.Sessions)
	assert.Nil(t, st.TTFTP99S)
}

func TestP99(t *testing.T) {
	hist := func(bs ...bucket) map[float64]bucket {
		m := map[float64]bucket{}
		for _, b := range bs {
			m[b.upper] = b
		}
		return m
	}
	assert.True(t, math.IsNaN(p99(hist())))
	// Rank 99 of 100: the first of the two in (0.1, 0.5], half way.
	assert.InDelta(t, 0.3, p99(hist(bucket{0, 0.1, 98}, bucket{0.1, 0.5, 2})), 1e-9)
	assert.InDelta(t, 0.1, p99(hist(bucket{0, 0.1, 99}, bucket{0.1, 0.5, 1})), 1e-9)
	// Empty buckets below do not move the lower bound.
	assert.InDelta(t, 2.485, p99(hist(bucket{0.5, 1, 0}, bucket{1, 2.5, 100})), 1e-9)
	// In the +Inf bucket: its lower bound, the last finite one.
	assert.Equal(t, 10.0, p99(hist(bucket{0, 0.1, 1}, bucket{10, math.Inf(1), 1})))
	// The GenAI TTFT buckets: 99 under 1 s and one at 1.1 s is a p99 near
	// 1 s, not the 2.5 s bound of its bucket.
	assert.Less(t, p99(hist(bucket{0.5, 0.75, 50}, bucket{0.75, 1, 49}, bucket{1, 2.5, 1})), 1.01)
}

// Engines come and go: one without a sample for max(10 × window, max_time)
// is forgotten (and its ejection count with it), so that replaced pods do
// not fill the judge's 1024 places.
func TestJudgeForgetsGoneEngines(t *testing.T) {
	j := testJudge()
	require.Equal(t, 300*time.Second, j.forgetAfter())
	healthyTraffic(j, "gone", t0, 10)
	j.add("out", sample{at: t0, sessions: 10, stalls: 10})
	healthyTraffic(j, "stays", t0, 10)
	require.Len(t, j.evaluate(t0.Add(time.Second)), 1)
	for at := 30 * time.Second; at <= 300*time.Second; at += 30 * time.Second {
		healthyTraffic(j, "stays", t0.Add(at), 10)
		j.evaluate(t0.Add(at))
	}
	assert.Contains(t, j.engines, "gone", "not yet: 300 s after its last sample")
	j.evaluate(t0.Add(302 * time.Second))
	assert.NotContains(t, j.engines, "gone")
	assert.NotContains(t, j.engines, "out", "re-admitted long ago, then silent")
	assert.Contains(t, j.engines, "stays")
}

// max_percent is a share of the engines in play: those with sessions in the
// window, and those ejected now. Engines gone silent (replaced pods stay
// known for minutes) make no room, and the last engine with traffic is
// never ejected.
func TestJudgeMaxPercentOfEnginesWithTraffic(t *testing.T) {
	silent := func(j *judge) {
		for i := range 6 {
			healthyTraffic(j, fmt.Sprint("gone", i), t0, 10)
		}
	}
	now := t0.Add(11 * time.Second) // the silent engines' sessions are out of the window
	failing := func(j *judge, engines ...string) {
		for _, e := range engines {
			j.add(e, sample{at: now, sessions: 10, stalls: 10})
		}
	}

	t.Run("two live engines failing, six silent", func(t *testing.T) {
		j := testJudge()
		silent(j)
		failing(j, "a", "b")
		assert.Len(t, j.evaluate(now), 1, "50% of the 2 with traffic")
		assert.Equal(t, 1, j.ejectedCount())
	})
	t.Run("the only live engine, six silent", func(t *testing.T) {
		j := testJudge()
		silent(j)
		failing(j, "a")
		assert.Empty(t, j.evaluate(now))
	})
	t.Run("max_percent 100: the last engine with traffic stays", func(t *testing.T) {
		j := testJudge()
		j.cfg.maxPercent = 100
		failing(j, "a", "b")
		assert.Len(t, j.evaluate(now), 1)
		j = testJudge()
		j.cfg.maxPercent = 100
		failing(j, "a")
		assert.Empty(t, j.evaluate(now), "the only engine")
	})
	t.Run("keep_last false: the only engine may go, within max_percent", func(t *testing.T) {
		j := testJudge()
		j.cfg.maxPercent, j.cfg.keepLast = 100, false
		failing(j, "a")
		assert.Len(t, j.evaluate(now), 1, "the balancer keeps one in itself")
		j = testJudge()
		j.cfg.keepLast = false
		failing(j, "a")
		assert.Empty(t, j.evaluate(now), "50% of one engine is none")
	})
	t.Run("the ejected count among the engines in play", func(t *testing.T) {
		// Of four live engines, a is ejected and gets no traffic after; b
		// and c fail next: 2 of the 4 may be out, so one of them goes.
		j := testJudge()
		failing(j, "a")
		for _, e := range []string{"b", "c", "d"} {
			healthyTraffic(j, e, now, 10)
		}
		require.Len(t, j.evaluate(now), 1)
		later := now.Add(11 * time.Second)
		j.add("b", sample{at: later, sessions: 10, stalls: 10})
		j.add("c", sample{at: later, sessions: 10, stalls: 9})
		healthyTraffic(j, "d", later, 10)
		assert.Equal(t, []change{{engine: "b", state: stateEjected, reason: reasonStallRatio}}, j.evaluate(later))
	})
}
