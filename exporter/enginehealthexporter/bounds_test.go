// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadatatest"
	"github.com/otelcol-llm/otelcol-llm/internal/keyset"
)

// sessionCounts is llm.sessions as token_session flushes it: one point per
// engine and outcome, cumulative (every series re-sent at each flush, its
// start the counter's) or delta. completed and failed are by engine.
func sessionCounts(temporality pmetric.AggregationTemporality, start time.Time, completed, failed map[string]int) pmetric.Metrics {
	md := pmetric.NewMetrics()
	m := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName(metricSessions)
	sum := m.SetEmptySum()
	sum.SetAggregationTemporality(temporality)
	sum.SetIsMonotonic(true)
	add := func(engine, outcome, errorType string, n int) {
		dp := sum.DataPoints().AppendEmpty()
		dp.SetStartTimestamp(pcommon.NewTimestampFromTime(start))
		dp.SetIntValue(int64(n))
		dp.Attributes().PutStr(attrEngine, engine)
		dp.Attributes().PutStr(attrOutcome, outcome)
		if errorType != "" {
			dp.Attributes().PutStr(attrErrorType, errorType)
		}
	}
	for engine, n := range completed {
		add(engine, "completed", "", n)
	}
	for engine, n := range failed {
		add(engine, "error", "500", n)
	}
	return md
}

// An engine is forgotten when nothing new came of it for max(10 × window,
// max_time), whatever the temporality: under the default cumulative one
// token_session re-sends every series at each flush, and an unchanged point
// is no evidence. Issue 38: 2 100 engine names, then a real engine failing
// every request was answered 404 and never ejected, because no engine was
// ever forgotten and the judge was full.
func TestEnginesWithoutNewEvidenceAreForgotten(t *testing.T) {
	for _, temporality := range []pmetric.AggregationTemporality{
		pmetric.AggregationTemporalityCumulative, pmetric.AggregationTemporalityDelta,
	} {
		t.Run(temporality.String(), func(t *testing.T) {
			th := startHealth(t, nil)
			forget := th.judge.forgetAfter()
			start := th.clock.Now()
			junk := map[string]int{}
			for i := range 2100 {
				junk[fmt.Sprintf("junk-%d", i)] = 1
			}
			th.clock.Advance(time.Second)
			th.consumeMetrics(sessionCounts(temporality, start, junk, nil))
			assert.Equal(t, maxEngines, count(th.verdicts.Load().list), "the judge keeps 1024 engines")

			// Flushes every 10 s for longer than forgetAfter: cumulative
			// re-sends the same counts, delta sends nothing.
			for elapsed := time.Duration(0); elapsed <= forget; elapsed += 10 * time.Second {
				th.clock.Advance(10 * time.Second)
				if temporality == pmetric.AggregationTemporalityCumulative {
					th.consumeMetrics(sessionCounts(temporality, start, junk, nil))
				}
				th.evaluate()
			}
			assert.Zero(t, count(th.verdicts.Load().list), "nothing new of any engine for %s: all forgotten", forget)

			// A real engine failing every request, then two healthy ones
			// beside it: it is judged and ejected.
			healthy := map[string]int{"a": 0, "b": 0}
			failed := map[string]int{"real": 0}
			for range 3 {
				for e := range healthy {
					healthy[e] += 10
				}
				failed["real"] += 10
				for e, n := range junk {
					healthy[e] = n
				}
				th.clock.Advance(time.Second)
				md := sessionCounts(temporality, start, healthy, failed)
				if temporality == pmetric.AggregationTemporalityDelta {
					md = sessionCounts(temporality, th.clock.Now().Add(-time.Second), map[string]int{"a": 10, "b": 10},
						map[string]int{"real": 10})
				}
				th.consumeMetrics(md)
			}
			st := th.status(t, "real")
			assert.Equal(t, stateEjected, st.State)
			assert.Equal(t, reasonErrorRatio, st.Reason)
			if temporality == pmetric.AggregationTemporalityCumulative {
				assert.LessOrEqual(t, len(th.verdicts.Load().list), maxEngines)
			}
		})
	}
}

// With the judge full of engines that said something new a moment ago
// (2 100 names, each with a session this flush), a new engine failing every
// request takes the place of the one silent longest and is ejected: the
// judge never refuses an engine while one it knows is not ejected.
func TestNewEngineTakesThePlaceOfTheOneSilentLongest(t *testing.T) {
	th := startHealth(t, nil)
	start := th.clock.Now()
	junk := map[string]int{}
	for i := range 2100 {
		junk[fmt.Sprintf("junk-%d", i)] = 1
	}
	th.clock.Advance(time.Second)
	th.consumeMetrics(sessionCounts(pmetric.AggregationTemporalityCumulative, start, junk, nil))
	require.Equal(t, maxEngines, count(th.verdicts.Load().list))

	failed := map[string]int{}
	healthy := map[string]int{}
	for i := range 3 {
		failed["real"] = 10 * (i + 1)
		healthy["a"] = 10 * (i + 1)
		th.clock.Advance(time.Second)
		th.consumeMetrics(sessionCounts(pmetric.AggregationTemporalityCumulative, start, healthy, failed))
	}
	assert.Equal(t, stateEjected, th.status(t, "real").State)
	assert.Equal(t, maxEngines, count(th.verdicts.Load().list))
	metadatatest.AssertEqualExporterEngineHealthForgotten(t, th.tel, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(attribute.String("kind", "engine"), attribute.String("why", "overflow")), Value: 2100 - maxEngines + 2},
	}, metricdatatest.IgnoreTimestamp())
}

// 100 000 distinct engine names in one batch, twice (cumulative: the second
// re-sends the first): the judge keeps 1024 engines and the series table
// its bound, and both forget them once nothing new comes.
func TestHundredThousandEnginesStayBounded(t *testing.T) {
	th := startHealth(t, nil)
	start := th.clock.Now()
	names := map[string]int{}
	for i := range 100_000 {
		names[fmt.Sprintf("engine-%06d", i)] = 1
	}
	for range 2 {
		th.clock.Advance(time.Second)
		th.consumeMetrics(sessionCounts(pmetric.AggregationTemporalityCumulative, start, names, nil))
		th.mu.Lock()
		assert.Equal(t, maxEngines, countKeys(th.judge.engines))
		assert.Equal(t, maxEngines, th.judge.byEvidence.Len())
		assert.LessOrEqual(t, len(th.series.points), maxSeries)
		assert.Equal(t, len(th.series.points), th.series.changed.Len()+th.series.unchanged.Len())
		th.mu.Unlock()
	}
	th.clock.Advance(th.judge.forgetAfter() + time.Second)
	th.evaluate()
	th.mu.Lock()
	defer th.mu.Unlock()
	assert.Zero(t, countKeys(th.judge.engines))
	assert.Zero(t, countKeys(th.series.points))
}

// The series table keeps the last point of at most maxSeries series; when
// full, a new series takes the place of one that never changed before one
// that did, and of the one silent longest among those.
func TestSeriesTableBoundAndOrder(t *testing.T) {
	st := newSeriesTable()
	start := pcommon.NewTimestampFromTime(t0)
	now := t0.Add(time.Second)
	history := now.Add(-10 * time.Second) // what started before is history
	v, reset := st.delta("changes", start, 1, nil, now, history)
	assert.Equal(t, 1.0, v)
	assert.False(t, reset)
	for i := range maxSeries - 1 {
		st.delta(fmt.Sprint("still-", i), start, 1, nil, now, history)
	}
	require.Equal(t, maxSeries, countKeys(st.points))
	now = now.Add(time.Second)
	v, _ = st.delta("changes", start, 3, nil, now, history)
	assert.Equal(t, 2.0, v, "what it added since its last point")
	v, _ = st.delta("still-0", start, 1, nil, now, history)
	assert.Zero(t, v, "unchanged: adds nothing")

	st.delta("new", start, 1, nil, now, history)
	assert.Equal(t, maxSeries, countKeys(st.points))
	assert.NotContains(t, st.points, "still-0", "never changed, first seen first: forgotten first")
	assert.Contains(t, st.points, "changes")
	assert.Equal(t, 1, st.forgotten.overflow)

	// A histogram's counts turn into deltas in place, the raw ones kept.
	counts := []uint64{1, 2}
	st.delta("h", start, 0, &counts, now, history)
	counts = []uint64{3, 2}
	st.delta("h", start, 0, &counts, now, history)
	assert.Equal(t, []uint64{2, 0}, counts)
	counts = []uint64{4, 5}
	st.delta("h", start, 0, &counts, now, history)
	assert.Equal(t, []uint64{1, 3}, counts)
	counts = []uint64{4, 5}
	st.delta("h", start, 0, &counts, now, history)
	assert.Equal(t, []uint64{0, 0}, counts, "unchanged")

	// Idle: nothing new for a minute. "changes" and "h" changed, and "new"
	// was first seen, a second after the others.
	st.forgetIdle(now.Add(time.Minute), time.Minute)
	assert.ElementsMatch(t, []string{"changes", "h", "new"}, mapKeys(st.points))
	assert.Equal(t, maxSeries-3, st.forgotten.idle, "still-2 … still-(maxSeries-2)")
}

func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// token_session records the sessions of engines beyond metrics::max_engines
// under llm.engine=_OTHER: no one engine, never judged, counted.
func TestOverflowEngineIsNotJudged(t *testing.T) {
	th := startHealth(t, nil)
	th.clock.Advance(time.Second)
	th.consumeMetrics(sessionCounts(pmetric.AggregationTemporalityDelta, th.clock.Now().Add(-time.Second),
		map[string]int{"a": 10, keyset.Overflow: 10}, map[string]int{keyset.Overflow: 10}))
	assert.Equal(t, 1, count(th.verdicts.Load().list))
	metadatatest.AssertEqualExporterEngineHealthIgnored(t, th.tel, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(attribute.String("why", "engine_overflow")), Value: 2},
	}, metricdatatest.IgnoreTimestamp())
}

// count and countKeys are len, for assertions on large collections:
// assert.Len and assert.Empty would print every element when they fail.
func count[E any](s []E) int { return len(s) }

func countKeys[K comparable, V any](m map[K]V) int { return len(m) }
