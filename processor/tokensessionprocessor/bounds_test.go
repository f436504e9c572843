// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/internal/keyset"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// distinctKeys is how many distinct models, engines or tenants the bounds
// tests send: the 100 000, 10 000 with -short.
func distinctKeys() int {
	if testing.Short() {
		return 10_000
	}
	return 100_000
}

// Engine shares the bounds tests' sessions bring on their ends: the
// counters take them as they are, so that what they must add up to is
// known to the nanosecond.
const (
	boundsPrefill = 1 * ms
	boundsDecode  = 2 * ms
)

// boundsSessions feeds n sessions through the logs pipeline, in batches of
// 1000: session i has a model, an engine and a tenant of its own, named
// after first+i.
func boundsSessions(t *testing.T, p *pipelines, first, n int) {
	t.Helper()
	const batch = 1000
	t0 := time.Now().UnixNano() - int64(n/batch+1)*10*ms
	for b := 0; b < n; b += batch {
		at := t0 + int64(b/batch)*10*ms
		evs := make([]tokenevent.Event, 0, 3*batch)
		for i := first + b; i < first+min(b+batch, n); i++ {
			id := fmt.Sprint("s-", i)
			st := tenantStart(id, fmt.Sprint("tenant-", i), at, 100)
			st.TraceID = tokenevent.TraceID{0xb0, byte(i >> 16), byte(i >> 8), byte(i)}
			st.Model = fmt.Sprint("invented-", i)
			st.Engine = fmt.Sprintf("10.%d.%d.%d:8000", i>>16, (i>>8)&0xff, i&0xff)
			e := end(id, at+3*ms)
			e.HasEngineTime, e.EngineTimePrefillNs, e.EngineTimeDecodeNs = true, boundsPrefill, boundsDecode
			evs = append(evs, st, tok(id, at+1*ms, 1), e)
		}
		require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(evs...)))
	}
}

// engineTimePoints sums llm.engine.time's points of md: busy is the
// sessions' prefill and decode, overflow the otel.metric.overflow point;
// values are the distinct values of each attribute on them.
type engineTimePoints struct {
	points, idle   int
	busy, overflow float64
	values         map[string]map[string]bool
}

func readEngineTime(md pmetric.Metrics) engineTimePoints {
	out := engineTimePoints{values: map[string]map[string]bool{}}
	for _, rm := range md.ResourceMetrics().All() {
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				if m.Name() != metricEngineTime {
					continue
				}
				for _, dp := range m.Sum().DataPoints().All() {
					out.points++
					if _, ok := dp.Attributes().Get(attrMetricOverflow); ok {
						out.overflow += dp.DoubleValue()
						continue
					}
					state, _ := dp.Attributes().Get(attrMetricState)
					if state.Str() == stateIdle {
						out.idle++
						continue
					}
					out.busy += dp.DoubleValue()
					for k, v := range dp.Attributes().All() {
						if out.values[k] == nil {
							out.values[k] = map[string]bool{}
						}
						out.values[k][v.Str()] = true
					}
				}
			}
		}
	}
	return out
}

// sessionsByKey sums llm.sessions by the value of key (model or engine).
func sessionsByKey(md pmetric.Metrics, key string) map[string]int64 {
	out := map[string]int64{}
	for _, rm := range md.ResourceMetrics().All() {
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				if m.Name() != sessionmetrics.MetricSessions {
					continue
				}
				for _, dp := range m.Sum().DataPoints().All() {
					v, _ := dp.Attributes().Get(key)
					out[v.AsString()] += dp.IntValue()
				}
			}
		}
	}
	return out
}

// 100 000 sessions, each with a model, an engine and a tenant of its own
// (a client inventing model names, pods restarting under new addresses, a
// header turned into a tenant): the values on llm.engine.time and in the
// session metrics stay at metrics::max_models, metrics::max_engines and
// attribution::max_tenants plus _OTHER, the state held at those bounds,
// and no second of engine time is lost: the counters' busy time is every
// session's. With no session for metrics::forget_after, all of it is
// forgotten: nothing held, nothing sent, and the places are free again.
func TestKeysBoundedAndForgotten(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	p := newPipelinesWith(t, set, func(c *Config) { c.Metrics.ForgetAfter = time.Minute })
	defer p.shutdown(t)
	c := coreOf(t)
	n := distinctKeys()
	boundsSessions(t, p, 0, n)

	const bound = 100 // the defaults of max_models, max_engines and max_tenants
	flushed := time.Now()
	md := c.sessions.sessionMetrics(flushed)
	got := readEngineTime(md)
	for _, key := range []string{attrMetricModel, attrMetricEngine, attrMetricTenant} {
		assert.Len(t, got.values[key], bound+1, "%s: %d and _OTHER", key, bound)
		assert.True(t, got.values[key][keyset.Overflow], key)
	}
	assert.Equal(t, 2*(bound+1), got.points-got.idle, "a series per session of the first 100, and _OTHER's")
	assert.Equal(t, bound, got.idle, "an idle point per engine held")
	assert.Zero(t, got.overflow, "the cardinality limit not reached")
	assert.InDelta(t, float64(n)*float64(boundsPrefill+boundsDecode)/1e9, got.busy, 1e-6, "every session's engine time")
	assert.Equal(t, map[string]int64{"model": int64(n - bound), "engine": int64(n - bound), "tenant": int64(n - bound)},
		keysOverflowed(t, tel))
	for _, key := range []string{attrMetricModel, attrMetricEngine} {
		bySession := sessionsByKey(md, key)
		assert.Len(t, bySession, bound+1, key)
		assert.Equal(t, int64(n-bound), bySession[keyset.Overflow], key)
	}

	a := c.sessions.attr
	models, engines := c.sessions.metrics.KeyCounts()
	assert.Equal(t, bound, models)
	assert.Equal(t, bound, engines)
	assert.Len(t, a.series, bound+1)
	assert.Len(t, a.prompts, bound+1)
	assert.Len(t, a.engines, bound, "an engine beyond the bound is forgotten with its last session")
	assert.Equal(t, bound, a.tenants.Len())
	assert.LessOrEqual(t, c.sessions.metrics.SeriesCount(), 10*c.cfg.Metrics.CardinalityLimit)

	// Forgotten at the first flush a minute after the one that followed
	// the last session.
	md = c.sessions.sessionMetrics(flushed.Add(59 * time.Second))
	assert.Equal(t, got.points, readEngineTime(md).points, "59 s: still sent")
	md = c.sessions.sessionMetrics(flushed.Add(time.Minute))
	assert.Zero(t, md.DataPointCount(), "nothing is sent")
	models, engines = c.sessions.metrics.KeyCounts()
	assert.Zero(t, models)
	assert.Zero(t, engines)
	assert.Zero(t, c.sessions.metrics.SeriesCount())
	assert.Empty(t, a.series)
	assert.Empty(t, a.prompts)
	assert.Empty(t, a.engines)
	assert.Zero(t, a.tenants.Len())
	assert.Zero(t, a.points)
	m, err := tel.GetMetric("otelcol_processor_token_session_series_forgotten")
	require.NoError(t, err)
	assert.Equal(t, int64(got.points)+int64(c.sessions.metrics.ForgottenCount()), m.Data.(metricdata.Sum[int64]).DataPoints[0].Value,
		"every point of llm.engine.time (no energy without power readings) and of the session metrics")

	// The places are free: new values have series of their own.
	boundsSessions(t, p, n, 1)
	md = c.sessions.sessionMetrics(flushed.Add(time.Minute + 15*time.Second))
	got = readEngineTime(md)
	assert.Equal(t, map[string]bool{fmt.Sprint("invented-", n): true}, got.values[attrMetricModel])
	assert.Equal(t, map[string]bool{fmt.Sprint("tenant-", n): true}, got.values[attrMetricTenant])
}

// Beyond metrics::cardinality_limit the counters' series fold into one
// point with only otel.metric.overflow=true, which keeps their time: the
// points still add up to every session's share and every engine's idle.
func TestEngineTimeCardinalityLimit(t *testing.T) {
	// Five regular points: the engine's idle and two series of two.
	p := newPipelines(t, func(c *Config) { c.Metrics.CardinalityLimit = 6 })
	defer p.shutdown(t)
	var evs []tokenevent.Event
	at := time.Now().UnixNano() - 100*ms
	for i, model := range []string{"llama", "qwen", "mistral", "gemma"} {
		id := fmt.Sprint("s-", i)
		st := tenantStart(id, "acme", at, -1) // the prompt learnt at the end, as through the proxy
		st.Model = model
		e := end(id, at+3*ms)
		e.HasEngineTime, e.EngineTimePrefillNs, e.EngineTimeDecodeNs = true, boundsPrefill, boundsDecode
		evs = append(evs, st, tok(id, at+1*ms, 1), e)
	}
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(evs...)))
	md := coreOf(t).sessions.sessionMetrics(time.Now())
	got := readEngineTime(md)
	assert.Equal(t, 6, got.points)
	assert.Equal(t, map[string]bool{"llama": true, "qwen": true}, got.values[attrMetricModel])
	assert.InDelta(t, 2*3e-3, got.busy, 1e-12)
	assert.InDelta(t, 2*3e-3, got.overflow, 1e-12, "mistral's and gemma's")

	// After that flush, a new model takes the place of a series idle since
	// (its totals were sent), not the overflow's.
	at = time.Now().UnixNano() - 100*ms
	st := tenantStart("s-new", "acme", at, -1)
	st.Model = "phi"
	e := end("s-new", at+3*ms)
	e.HasEngineTime, e.EngineTimePrefillNs, e.EngineTimeDecodeNs = true, boundsPrefill, boundsDecode
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(st, tok("s-new", at+1*ms, 1), e)))
	got = readEngineTime(coreOf(t).sessions.sessionMetrics(time.Now()))
	assert.Equal(t, 6, got.points)
	assert.True(t, got.values[attrMetricModel]["phi"], "phi has a series of its own")
	assert.Len(t, got.values[attrMetricModel], 2, "in the place of llama or qwen")
	assert.InDelta(t, 2*3e-3, got.overflow, 1e-12, "the overflow point unchanged")
}

// The engine readings of the metrics pipeline are bounded too: snapshots of
// at most metrics::max_engines engine instances, and the power readings of
// at most 4096 pods, forgotten after metrics::forget_after without one.
func TestEngineReadingsBounded(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	p := newPipelinesWith(t, set, func(c *Config) { c.Metrics.ForgetAfter = time.Minute })
	defer p.shutdown(t)
	c := coreOf(t)
	n := distinctKeys()
	now := time.Now().UnixNano()

	scrapes := pmetric.NewMetrics()
	power := pmetric.NewMetrics()
	gauge := power.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	gauge.SetName("DCGM_FI_DEV_POWER_USAGE")
	readings := gauge.SetEmptyGauge().DataPoints()
	for i := range n {
		rm := scrapes.ResourceMetrics().AppendEmpty()
		rm.Resource().Attributes().PutStr("service.instance.id", fmt.Sprint("vllm-", i))
		m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
		m.SetName("vllm:num_requests_running")
		m.SetEmptyGauge().DataPoints().AppendEmpty().SetTimestamp(pcommon.Timestamp(now))
		dp := readings.AppendEmpty()
		dp.SetTimestamp(pcommon.Timestamp(now))
		dp.SetDoubleValue(300)
		dp.Attributes().PutStr("pod", fmt.Sprint("pod-", i))
	}
	require.NoError(t, p.metrics.ConsumeMetrics(context.Background(), scrapes))
	require.NoError(t, p.metrics.ConsumeMetrics(context.Background(), power))
	assert.Len(t, c.engines.states.byInstance, sessionmetrics.DefaultMaxEngines)
	assert.Len(t, c.sessions.attr.pods, maxPods)

	flushed := time.Now()
	c.sessions.sessionMetrics(flushed)
	assert.Equal(t, map[string]int64{"engine_instance": int64(n - sessionmetrics.DefaultMaxEngines), "pod": int64(n - maxPods)},
		keysOverflowed(t, tel))
	c.sessions.sessionMetrics(flushed.Add(time.Minute))
	assert.Empty(t, c.sessions.attr.pods, "no reading for a minute")
}

// Engines that come one flush after another (pods replaced, names made up)
// each take the place of one idle since the last flush, in the session
// metrics and on the GPU time counters alike: the engines' accounts stay
// within metrics::max_engines, and every session's time is counted, none on
// the overflow point.
func TestEngineChurnAcrossFlushesStaysBounded(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Metrics.MaxEngines = 3 })
	defer p.shutdown(t)
	c := coreOf(t)
	for i := range 50 {
		boundsSessions(t, p, 2*i, 2) // two new engines, models and tenants
		got := readEngineTime(c.sessions.sessionMetrics(time.Now()))
		assert.Zero(t, got.overflow, "flush %d: nothing on the overflow point", i)
		c.sessions.attr.mu.Lock()
		engines := len(c.sessions.attr.engines)
		c.sessions.attr.mu.Unlock()
		assert.LessOrEqual(t, engines, 3, "flush %d: engine accounts", i)
	}
}

// Token event records an OTel SDK wrote reach the processor through OTLP,
// past every receiver's cut: a value over its bound (a model name of a
// kilobyte, which would be a metric dimension) is cut to it, the session
// kept, and each cut counted.
func TestRecordValuesCutToBound(t *testing.T) {
	p, tel := newPipelinesWithTelemetry(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	ctx := context.Background()
	s := start("a", pcommon.TraceID{1}, base)
	s.Model = strings.Repeat("m", 1000)
	s.Attributes = []tokenevent.Attribute{{Key: "tenant", Value: strings.Repeat("t", 300)}}
	e := end("a", base+20*ms)
	e.FinishReason = strings.Repeat("f", 500)
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(s, tok("a", base+10*ms, 1), e)))
	p.shutdown(t)
	a := summariesByID(recordsNamed(p.logSink.AllLogs(), eventNameSummary))["a"]
	require.NotNil(t, a)
	assert.Equal(t, strings.Repeat("m", tokenevent.MaxValueBytes), a["gen_ai.request.model"])
	assert.Equal(t, int64(3), counterSum(t, tel, "otelcol_processor_token_session_truncated_values"))
}
