// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package promconv // import "github.com/otelcol-llm/otelcol-llm/internal/promconv"

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// seriesState is what a converter remembers of one cumulative series between
// scrapes.
type seriesState struct {
	start pcommon.Timestamp
	last  float64 // counter value or histogram count
	gen   uint64  // the scrape it was last seen in
}

// Converter turns the metric families of one target's scrapes into pmetric,
// keeping the start times of its cumulative series. It is used by one
// goroutine at a time.
type Converter struct {
	scope    string
	resource func(pcommon.Resource)
	series   map[string]*seriesState
	gen      uint64
	// dropped counts the data points of the last conversion that were left
	// out as invalid (a histogram whose cumulative buckets decrease).
	dropped int
	// skipped counts the families of the last conversion that were left
	// out, by reason.
	skipped Skipped
}

// NewConverter returns the converter of one target: its metrics go under
// the instrumentation scope named scope, on a resource that resource (when
// not nil) fills.
func NewConverter(scope string, resource func(pcommon.Resource)) *Converter {
	return &Converter{scope: scope, resource: resource, series: make(map[string]*seriesState)}
}

// Dropped is the number of data points the last Convert left out as
// invalid.
func (c *Converter) Dropped() int { return c.dropped }

// Skipped is the number of families the last Convert left out, by reason
// (summaries and gauge histograms); nil when none.
func (c *Converter) Skipped() Skipped { return c.skipped }

// Convert converts one scrape taken at now. Rules:
//   - gauge and untyped → gauge;
//   - counter → cumulative monotonic sum, named as the family is (`x_total`);
//   - histogram → cumulative explicit-bucket histogram: bounds are the finite
//     `le` values, counts de-cumulated, the last bucket is count minus the
//     last finite cumulative count; sum and count kept;
//   - summary and gauge histogram → skipped;
//   - `x_created` series (x_total's or a histogram's) give the start time of
//     their series and are not emitted themselves; without them the start is
//     the time the series was first seen, renewed when its value (a
//     histogram's count) goes down;
//   - labels → data point attributes; the data point time is the sample's
//     timestamp when exposed, else now.
func (c *Converter) Convert(fams map[string]*dto.MetricFamily, now time.Time) pmetric.Metrics {
	c.gen++
	c.dropped = 0
	c.skipped = nil
	ts := pcommon.NewTimestampFromTime(now)
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	if c.resource != nil {
		c.resource(rm.Resource())
	}
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName(c.scope)

	consumed := make(map[string]bool)
	names := make([]string, 0, len(fams))
	for name, mf := range fams {
		names = append(names, name)
		if cf := fams[createdName(mf)]; cf != nil && (cf.GetType() == dto.MetricType_GAUGE || cf.GetType() == dto.MetricType_UNTYPED) {
			consumed[cf.GetName()] = true
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if consumed[name] {
			continue
		}
		mf := fams[name]
		var created map[string]pcommon.Timestamp
		if cn := createdName(mf); consumed[cn] {
			created = createdValues(fams[cn])
		}
		switch mf.GetType() {
		case dto.MetricType_GAUGE, dto.MetricType_UNTYPED:
			c.gauge(sm, mf, ts)
		case dto.MetricType_COUNTER:
			c.counter(sm, mf, created, ts)
		case dto.MetricType_HISTOGRAM:
			c.histogram(sm, mf, created, ts)
		case dto.MetricType_SUMMARY:
			c.skip(SkipSummary)
		case dto.MetricType_GAUGE_HISTOGRAM:
			c.skip(SkipGaugeHistogram)
		default:
			c.skip(SkipUnknownType)
		}
	}
	for k, s := range c.series {
		if s.gen != c.gen {
			delete(c.series, k)
		}
	}
	return md
}

func (c *Converter) skip(reason string) {
	if c.skipped == nil {
		c.skipped = make(Skipped)
	}
	c.skipped[reason]++
}

// createdName is the name of the family holding the creation times of mf's
// series, or "" for families that have none.
func createdName(mf *dto.MetricFamily) string {
	switch mf.GetType() {
	case dto.MetricType_COUNTER:
		return strings.TrimSuffix(mf.GetName(), "_total") + "_created"
	case dto.MetricType_HISTOGRAM, dto.MetricType_SUMMARY:
		return mf.GetName() + "_created"
	}
	return ""
}

// createdValues maps label keys to the creation times of a `_created` family.
func createdValues(mf *dto.MetricFamily) map[string]pcommon.Timestamp {
	if mf == nil {
		return nil
	}
	out := make(map[string]pcommon.Timestamp, len(mf.GetMetric()))
	for _, m := range mf.GetMetric() {
		var v float64
		switch {
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		case m.Untyped != nil:
			v = m.Untyped.GetValue()
		default:
			continue
		}
		if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		// Unix seconds as a float; prometheus_client has microseconds.
		sec := math.Floor(v)
		usec := math.Round((v - sec) * 1e6)
		out[labelKey(m)] = pcommon.NewTimestampFromTime(time.Unix(int64(sec), int64(usec)*1e3))
	}
	return out
}

// labelKey identifies a series within its family.
func labelKey(m *dto.Metric) string {
	pairs := make([]string, 0, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		pairs = append(pairs, l.GetName()+"\xfe"+l.GetValue())
	}
	slices.Sort(pairs)
	return strings.Join(pairs, "\xff")
}

func newMetric(sm pmetric.ScopeMetrics, mf *dto.MetricFamily) pmetric.Metric {
	m := sm.Metrics().AppendEmpty()
	m.SetName(mf.GetName())
	m.SetDescription(mf.GetHelp())
	return m
}

func setPoint(attrs pcommon.Map, m *dto.Metric) {
	attrs.EnsureCapacity(len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		attrs.PutStr(l.GetName(), l.GetValue())
	}
}

func pointTime(m *dto.Metric, now pcommon.Timestamp) pcommon.Timestamp {
	if m.TimestampMs != nil {
		return pcommon.NewTimestampFromTime(time.UnixMilli(m.GetTimestampMs()))
	}
	return now
}

func (c *Converter) gauge(sm pmetric.ScopeMetrics, mf *dto.MetricFamily, now pcommon.Timestamp) {
	dps := newMetric(sm, mf).SetEmptyGauge().DataPoints()
	for _, m := range mf.GetMetric() {
		dp := dps.AppendEmpty()
		setPoint(dp.Attributes(), m)
		dp.SetTimestamp(pointTime(m, now))
		if m.Gauge != nil {
			dp.SetDoubleValue(m.Gauge.GetValue())
		} else {
			dp.SetDoubleValue(m.Untyped.GetValue())
		}
	}
}

func (c *Converter) counter(sm pmetric.ScopeMetrics, mf *dto.MetricFamily, created map[string]pcommon.Timestamp, now pcommon.Timestamp) {
	sum := newMetric(sm, mf).SetEmptySum()
	sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	sum.SetIsMonotonic(true)
	for _, m := range mf.GetMetric() {
		v := m.GetCounter().GetValue()
		key := labelKey(m)
		t := pointTime(m, now)
		dp := sum.DataPoints().AppendEmpty()
		setPoint(dp.Attributes(), m)
		dp.SetTimestamp(t)
		dp.SetStartTimestamp(c.startTime(mf.GetName(), key, v, created, t))
		dp.SetDoubleValue(v)
	}
}

func (c *Converter) histogram(sm pmetric.ScopeMetrics, mf *dto.MetricFamily, created map[string]pcommon.Timestamp, now pcommon.Timestamp) {
	hist := newMetric(sm, mf).SetEmptyHistogram()
	hist.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		bounds, counts, count, err := deCumulate(h)
		if err != nil {
			c.dropped++
			continue
		}
		key := labelKey(m)
		t := pointTime(m, now)
		dp := hist.DataPoints().AppendEmpty()
		setPoint(dp.Attributes(), m)
		dp.SetTimestamp(t)
		dp.SetStartTimestamp(c.startTime(mf.GetName(), key, float64(count), created, t))
		dp.SetCount(count)
		if h.SampleSum != nil {
			dp.SetSum(h.GetSampleSum())
		}
		dp.ExplicitBounds().FromRaw(bounds)
		dp.BucketCounts().FromRaw(counts)
	}
}

// deCumulate turns the cumulative `le` buckets of h into explicit bounds
// (finite ones, ascending) and per-bucket counts, the last one being the
// overflow bucket (count minus the last finite cumulative count).
func deCumulate(h *dto.Histogram) (bounds []float64, counts []uint64, count uint64, err error) {
	if h == nil {
		return nil, nil, 0, errors.New("histogram family without histogram values")
	}
	floats := h.SampleCountFloat != nil
	for _, b := range h.GetBucket() {
		floats = floats || b.CumulativeCountFloat != nil
	}
	var badCount error
	// toCount rounds a float count; out of range, it fails the histogram
	// (a uint64 conversion of such a float is undefined).
	toCount := func(x float64) uint64 {
		if !(x >= 0 && x < 1<<63) {
			badCount = fmt.Errorf("count %g out of range", x)
			return 0
		}
		return uint64(math.Round(x))
	}
	cum := func(b *dto.Bucket) uint64 {
		if floats {
			return toCount(max(b.GetCumulativeCountFloat(), float64(b.GetCumulativeCount())))
		}
		return b.GetCumulativeCount()
	}
	buckets := slices.Clone(h.GetBucket())
	slices.SortFunc(buckets, func(a, b *dto.Bucket) int { return cmpFloat(a.GetUpperBound(), b.GetUpperBound()) })
	var prev uint64
	infSeen := false
	var infCount uint64
	for _, b := range buckets {
		ub := b.GetUpperBound()
		cc := cum(b)
		if cc < prev {
			return nil, nil, 0, fmt.Errorf("bucket le=%g: cumulative count %d below the previous %d", ub, cc, prev)
		}
		if math.IsInf(ub, 1) {
			infSeen, infCount = true, cc
			continue
		}
		if math.IsNaN(ub) || math.IsInf(ub, -1) {
			return nil, nil, 0, fmt.Errorf("bucket with bound le=%g", ub)
		}
		if n := len(bounds); n > 0 && bounds[n-1] == ub {
			return nil, nil, 0, fmt.Errorf("bucket le=%g repeated", ub)
		}
		bounds = append(bounds, ub)
		counts = append(counts, cc-prev)
		prev = cc
	}
	switch {
	case h.SampleCount != nil || h.SampleCountFloat != nil:
		if floats {
			count = toCount(max(h.GetSampleCountFloat(), float64(h.GetSampleCount())))
		} else {
			count = h.GetSampleCount()
		}
	case infSeen:
		count = infCount
	default:
		count = prev
	}
	if badCount != nil {
		return nil, nil, 0, badCount
	}
	if count < prev {
		return nil, nil, 0, fmt.Errorf("count %d below the last bucket's cumulative count %d", count, prev)
	}
	counts = append(counts, count-prev)
	return bounds, counts, count, nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// startTime returns the start time of a cumulative series: its `_created`
// time when exposed, else the time it was first seen, renewed when its value
// went down since the previous scrape (a reset).
func (c *Converter) startTime(name, key string, value float64, created map[string]pcommon.Timestamp, now pcommon.Timestamp) pcommon.Timestamp {
	id := name + "\x00" + key
	s := c.series[id]
	switch {
	case s == nil:
		s = &seriesState{start: now}
		c.series[id] = s
	case value < s.last:
		s.start = now
	}
	s.last, s.gen = value, c.gen
	if t, ok := created[key]; ok {
		return t
	}
	return s.start
}
