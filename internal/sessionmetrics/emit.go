// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sessionmetrics

import (
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// AppendTo appends every metric that has points to sm, stamped now, in a fixed order with points
// in series creation order (overflow last).
//
// Cumulative: every series is emitted with the start timestamp of the interval in which it was
// created (New's start or the AppendTo before its creation), except that an inter-token latency
// series appears only after its first gap. Stall counters are emitted from 0 so that the first
// stall is visible to rate().
//
// Delta: points start at the previous AppendTo (or New's start); series without data in the
// interval are not emitted, except the active gauge, emitted for every live series (a series whose
// sessions all ended in the interval reports 0 once). Afterwards the data is reset, the
// end-of-session series are dropped and so are live series without an active session, which
// frees their cardinality for the next interval.
//
// Forgetting (Config.ForgetAfter), before the points are written: under either temporality, a
// model or an engine no open session holds and nothing recorded for ForgetAfter is forgotten and
// its place under MaxModels or MaxEngines is free; under Cumulative, so is a series with no
// recording (and, for a live series, no active session) for ForgetAfter: it is no longer
// emitted, and one made again later starts from zero at a new start timestamp. Delta drops
// series sooner, above.
//
// The active-sessions gauge has no start timestamp.
func (a *Aggregator) AppendTo(sm pmetric.ScopeMetrics, now time.Time) {
	ts := pcommon.NewTimestampFromTime(now)
	a.forget(now.UnixNano())
	ms := sm.Metrics()
	ms.EnsureCapacity(ms.Len() + 8)
	a.appendEnd(ms, &a.ttft, ts)
	a.appendEnd(ms, &a.tpot, ts)
	a.appendEnd(ms, &a.queue, ts)
	a.appendEnd(ms, &a.prefill, ts)
	a.appendEnd(ms, &a.duration, ts)
	a.appendInterTokenLatency(ms, ts)
	a.appendEnd(ms, &a.tokens, ts)
	a.appendSessions(ms, ts)
	a.appendStalls(ms, ts)
	a.appendActive(ms, ts)
	if a.cfg.Temporality == Delta {
		a.resetDelta()
	}
	a.lastFlush = ts
}

func (a *Aggregator) temporality() pmetric.AggregationTemporality {
	if a.cfg.Temporality == Delta {
		return pmetric.AggregationTemporalityDelta
	}
	return pmetric.AggregationTemporalityCumulative
}

// startOf returns the start timestamp of a point of a series created at created.
func (a *Aggregator) startOf(created pcommon.Timestamp) pcommon.Timestamp {
	if a.cfg.Temporality == Delta {
		return a.lastFlush
	}
	return created
}

func (a *Aggregator) newHistogramMetric(ms pmetric.MetricSlice, name, unit, desc string, points int) pmetric.Metric {
	m := ms.AppendEmpty()
	m.SetName(name)
	m.SetUnit(unit)
	m.SetDescription(desc)
	if a.cfg.Histogram == Exponential {
		e := m.SetEmptyExponentialHistogram()
		e.SetAggregationTemporality(a.temporality())
		e.DataPoints().EnsureCapacity(points)
	} else {
		h := m.SetEmptyHistogram()
		h.SetAggregationTemporality(a.temporality())
		h.DataPoints().EnsureCapacity(points)
	}
	return m
}

// appendHistogramPoint appends h as a point of m and returns its attribute map to fill.
func (a *Aggregator) appendHistogramPoint(m pmetric.Metric, h *histogram, start, ts pcommon.Timestamp) pcommon.Map {
	if a.cfg.Histogram == Exponential {
		dp := m.ExponentialHistogram().DataPoints().AppendEmpty()
		setHistogramPoint(dp, h, start, ts)
		dp.SetScale(h.scale)
		dp.SetZeroCount(h.zeroCount)
		if len(h.counts) > 0 {
			dp.Positive().SetOffset(h.offset)
			dp.Positive().BucketCounts().FromRaw(h.counts)
		}
		return dp.Attributes()
	}
	dp := m.Histogram().DataPoints().AppendEmpty()
	setHistogramPoint(dp, h, start, ts)
	dp.ExplicitBounds().FromRaw(h.bounds)
	dp.BucketCounts().FromRaw(h.counts)
	return dp.Attributes()
}

// histogramPoint is what explicit and exponential histogram points share.
type histogramPoint interface {
	SetStartTimestamp(pcommon.Timestamp)
	SetTimestamp(pcommon.Timestamp)
	SetCount(uint64)
	SetSum(float64)
	SetMin(float64)
	SetMax(float64)
}

// setHistogramPoint sets the fields every histogram point has: times,
// count, sum, and min and max when there is a value.
func setHistogramPoint[P histogramPoint](dp P, h *histogram, start, ts pcommon.Timestamp) {
	dp.SetStartTimestamp(start)
	dp.SetTimestamp(ts)
	dp.SetCount(h.count)
	dp.SetSum(h.sum)
	if h.count > 0 {
		dp.SetMin(h.min)
		dp.SetMax(h.max)
	}
}

// appendSeries is the skeleton every metric shares. It counts the series
// to emit (those of order, then the overflow series if there is one, that
// keep accepts) and, when there are any, makes the metric with room for
// them (begin) and appends a point per series (point), whose attributes
// are those of the series (attrs) or, for the overflow series, only
// otel.metric.overflow.
func appendSeries[S, M any](order []*S, overflow *S, keep func(*S) bool,
	begin func(points int) M, point func(M, *S) pcommon.Map, attrs func(pcommon.Map, *S),
) {
	points := 0
	for _, s := range order {
		if keep(s) {
			points++
		}
	}
	hasOverflow := overflow != nil && keep(overflow)
	if hasOverflow {
		points++
	}
	if points == 0 {
		return
	}
	m := begin(points)
	for _, s := range order {
		if keep(s) {
			attrs(point(m, s), s)
		}
	}
	if hasOverflow {
		putOverflow(point(m, overflow))
	}
}

func every[S any](*S) bool { return true }

// appendEnd writes an end-of-session histogram metric.
func (a *Aggregator) appendEnd(ms pmetric.MetricSlice, em *endMetric, ts pcommon.Timestamp) {
	appendSeries(em.order, em.overflow, every[endSeries],
		func(points int) pmetric.Metric { return a.newHistogramMetric(ms, em.name, em.unit, em.desc, points) },
		func(m pmetric.Metric, s *endSeries) pcommon.Map {
			return a.appendHistogramPoint(m, &s.h, a.startOf(s.start), ts)
		},
		func(attrs pcommon.Map, s *endSeries) { a.putEndAttrs(attrs, &s.attrs) })
}

// putLiveDims writes the attributes of a live series.
func (a *Aggregator) putLiveDims(attrs pcommon.Map, s *liveSeries) { a.putDims(attrs, s.live.dims, "") }

func (a *Aggregator) appendInterTokenLatency(ms pmetric.MetricSlice, ts pcommon.Timestamp) {
	appendSeries(a.liveOrder, a.liveOverflow, func(s *liveSeries) bool { return s.itl.count > 0 },
		func(points int) pmetric.Metric {
			return a.newHistogramMetric(ms, MetricInterTokenLatency, "s",
				"Per-token gap between successive tokens of a session; a chunk of n tokens counts n times.", points)
		},
		func(m pmetric.Metric, s *liveSeries) pcommon.Map {
			return a.appendHistogramPoint(m, &s.itl, a.startOf(s.start), ts)
		},
		a.putLiveDims)
}

func (a *Aggregator) newSumMetric(ms pmetric.MetricSlice, name, unit, desc string, points int) pmetric.NumberDataPointSlice {
	m := ms.AppendEmpty()
	m.SetName(name)
	m.SetUnit(unit)
	m.SetDescription(desc)
	sum := m.SetEmptySum()
	sum.SetIsMonotonic(true)
	sum.SetAggregationTemporality(a.temporality())
	dps := sum.DataPoints()
	dps.EnsureCapacity(points)
	return dps
}

func appendIntPoint(dps pmetric.NumberDataPointSlice, v int64, start, ts pcommon.Timestamp) pcommon.Map {
	dp := dps.AppendEmpty()
	dp.SetStartTimestamp(start)
	dp.SetTimestamp(ts)
	dp.SetIntValue(v)
	return dp.Attributes()
}

func (a *Aggregator) appendSessions(ms pmetric.MetricSlice, ts pcommon.Timestamp) {
	em := &a.sessions
	appendSeries(em.order, em.overflow, every[endSeries],
		func(points int) pmetric.NumberDataPointSlice {
			return a.newSumMetric(ms, em.name, em.unit, em.desc, points)
		},
		func(dps pmetric.NumberDataPointSlice, s *endSeries) pcommon.Map {
			return appendIntPoint(dps, int64(s.n), a.startOf(s.start), ts)
		},
		func(attrs pcommon.Map, s *endSeries) {
			a.putEndAttrs(attrs, &s.attrs)
			putStr(attrs, AttrOutcome, s.attrs.outcome)
			attrs.PutBool(attrSampled, s.attrs.sampled)
		})
}

func (a *Aggregator) appendStalls(ms pmetric.MetricSlice, ts pcommon.Timestamp) {
	// Under Cumulative every live series is emitted, at 0 until its first stall.
	appendSeries(a.liveOrder, a.liveOverflow, func(s *liveSeries) bool { return a.cfg.Temporality == Cumulative || s.stalls > 0 },
		func(points int) pmetric.NumberDataPointSlice {
			return a.newSumMetric(ms, MetricStalls, "{stall}",
				"Stall episodes: consecutive slow inter-token gaps, or a freeze with no token.", points)
		},
		func(dps pmetric.NumberDataPointSlice, s *liveSeries) pcommon.Map {
			return appendIntPoint(dps, int64(s.stalls), a.startOf(s.start), ts)
		},
		a.putLiveDims)
}

func (a *Aggregator) appendActive(ms pmetric.MetricSlice, ts pcommon.Timestamp) {
	appendSeries(a.liveOrder, a.liveOverflow, every[liveSeries],
		func(points int) pmetric.NumberDataPointSlice {
			m := ms.AppendEmpty()
			m.SetName(MetricActiveSessions)
			m.SetUnit("{session}")
			m.SetDescription("Sessions started and not yet ended.")
			dps := m.SetEmptyGauge().DataPoints()
			dps.EnsureCapacity(points)
			return dps
		},
		func(dps pmetric.NumberDataPointSlice, s *liveSeries) pcommon.Map {
			dp := dps.AppendEmpty()
			dp.SetTimestamp(ts)
			dp.SetIntValue(s.active)
			return dp.Attributes()
		},
		a.putLiveDims)
}

// forget forgets the series, models and engines idle for ForgetAfter at now (Unix ns): the
// series first, so that a model or an engine outlives none of its series (each recording on a
// series uses its model and engine too, and a live series with an active session holds them
// open).
func (a *Aggregator) forget(now int64) {
	after := int64(a.cfg.ForgetAfter)
	if a.cfg.Temporality == Cumulative {
		idleLive := func(s *liveSeries) bool { return s.activity.Idle(now, after) && s.active <= 0 }
		kept := a.liveOrder[:0]
		a.liveIdle.Reset()
		for _, s := range a.liveOrder {
			switch {
			case s.displaced:
				continue
			case idleLive(s):
				delete(a.live, s.live.key)
				a.forgotten += 3
				continue
			case s.activity.Unused() && s.active <= 0:
				a.liveIdle.Add(s)
			}
			kept = append(kept, s)
		}
		clear(a.liveOrder[len(kept):])
		a.liveOrder = kept
		a.liveIdle.Sort(func(s *liveSeries) int64 { return s.activity.UnusedSince() })
		if o := a.liveOverflow; o != nil && idleLive(o) {
			a.liveOverflow = nil
			a.forgotten += 3
		}
		ends := a.forgotten
		for _, em := range a.endMetrics() {
			kept := em.order[:0]
			em.idle.Reset()
			for _, s := range em.order {
				switch {
				case s.displaced:
					continue
				case s.activity.Idle(now, after):
					delete(em.series, s.key)
					a.forgotten++
					continue
				case s.activity.Unused():
					em.idle.Add(s)
				}
				kept = append(kept, s)
			}
			clear(em.order[len(kept):])
			em.order = kept
			em.idle.Sort(func(s *endSeries) int64 { return s.activity.UnusedSince() })
			if o := em.overflow; o != nil && o.activity.Idle(now, after) {
				em.overflow = nil
				a.forgotten++
			}
		}
		if a.forgotten != ends {
			a.epoch++ // the live series' endCaches may hold forgotten series
		}
	}
	a.models.Sweep(now)
	a.engines.Sweep(now)
}

func (a *Aggregator) endMetrics() [7]*endMetric {
	return [...]*endMetric{&a.ttft, &a.tpot, &a.queue, &a.prefill, &a.duration, &a.tokens, &a.sessions}
}

// resetDelta starts a new delta interval.
func (a *Aggregator) resetDelta() {
	a.epoch++ // the series the live series' endCaches hold are dropped
	for _, em := range a.endMetrics() {
		clear(em.series)
		clear(em.order)
		em.order = em.order[:0]
		em.overflow = nil
	}
	kept := a.liveOrder[:0]
	for _, s := range a.liveOrder {
		if s.active <= 0 {
			delete(a.live, s.live.key)
			continue
		}
		s.itl.reset()
		s.stalls = 0
		kept = append(kept, s)
	}
	clear(a.liveOrder[len(kept):])
	a.liveOrder = kept
	if o := a.liveOverflow; o != nil {
		if o.active <= 0 {
			a.liveOverflow = nil
		} else {
			o.itl.reset()
			o.stalls = 0
		}
	}
}

func (a *Aggregator) putDims(m pcommon.Map, d *Dims, errorType string) {
	m.EnsureCapacity(8 + len(a.cfg.Dimensions))
	putStr(m, attrOperation, d.Operation)
	putStr(m, attrProvider, d.Provider)
	putStr(m, attrModel, d.Model)
	putStr(m, attrErrorType, errorType)
	putStr(m, attrEngine, d.Engine)
	for i, key := range a.cfg.Dimensions {
		putStr(m, key, d.Extra[i])
	}
}

func (a *Aggregator) putEndAttrs(m pcommon.Map, e *endAttrs) {
	a.putDims(m, e.dims, e.errorType)
	putStr(m, attrTokenType, e.tokenType)
}

func putStr(m pcommon.Map, key, v string) {
	if v != "" {
		m.PutStr(key, v)
	}
}

func putOverflow(m pcommon.Map) { m.PutBool(attrOverflow, true) }
