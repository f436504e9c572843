// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sessionmetrics

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

var (
	t0 = time.Unix(1_700_000_000, 0)
	t1 = t0.Add(15 * time.Second)
	t2 = t0.Add(30 * time.Second)
)

func newAggregator(tb testing.TB, mutate func(*Config)) *Aggregator {
	tb.Helper()
	cfg := DefaultConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := New(cfg, t0)
	require.NoError(tb, err)
	return a
}

func flush(a *Aggregator, now time.Time) pmetric.ScopeMetrics {
	sm := pmetric.NewScopeMetrics()
	a.AppendTo(sm, now)
	return sm
}

func metricNames(sm pmetric.ScopeMetrics) []string {
	var names []string
	for _, m := range sm.Metrics().All() {
		names = append(names, m.Name())
	}
	return names
}

func findMetric(t *testing.T, sm pmetric.ScopeMetrics, name string) pmetric.Metric {
	t.Helper()
	for _, m := range sm.Metrics().All() {
		if m.Name() == name {
			return m
		}
	}
	require.Failf(t, "metric missing", "%s not in %v", name, metricNames(sm))
	return pmetric.Metric{}
}

func hasMetric(sm pmetric.ScopeMetrics, name string) bool {
	for _, m := range sm.Metrics().All() {
		if m.Name() == name {
			return true
		}
	}
	return false
}

// pointAttrs returns the attributes of every point of m, in order.
func pointAttrs(m pmetric.Metric) []map[string]any {
	var out []map[string]any
	add := func(attrs pcommon.Map) { out = append(out, attrs.AsRaw()) }
	switch m.Type() {
	case pmetric.MetricTypeHistogram:
		for _, dp := range m.Histogram().DataPoints().All() {
			add(dp.Attributes())
		}
	case pmetric.MetricTypeExponentialHistogram:
		for _, dp := range m.ExponentialHistogram().DataPoints().All() {
			add(dp.Attributes())
		}
	case pmetric.MetricTypeSum:
		for _, dp := range m.Sum().DataPoints().All() {
			add(dp.Attributes())
		}
	case pmetric.MetricTypeGauge:
		for _, dp := range m.Gauge().DataPoints().All() {
			add(dp.Attributes())
		}
	}
	return out
}

// intValues maps a key built from one attribute of each point to the point's value.
func intValues(t *testing.T, m pmetric.Metric, key string) map[string]int64 {
	t.Helper()
	dps := pmetric.NewNumberDataPointSlice()
	switch m.Type() {
	case pmetric.MetricTypeSum:
		dps = m.Sum().DataPoints()
	case pmetric.MetricTypeGauge:
		dps = m.Gauge().DataPoints()
	default:
		require.Failf(t, "not a number metric", "%s is %s", m.Name(), m.Type())
	}
	out := map[string]int64{}
	for _, dp := range dps.All() {
		k := ""
		if v, ok := dp.Attributes().Get(key); ok {
			k = v.AsString()
		}
		out[k] = dp.IntValue()
	}
	return out
}

func histPoint(t *testing.T, m pmetric.Metric, i int) pmetric.HistogramDataPoint {
	t.Helper()
	require.Equal(t, pmetric.MetricTypeHistogram, m.Type(), m.Name())
	require.Greater(t, m.Histogram().DataPoints().Len(), i, m.Name())
	return m.Histogram().DataPoints().At(i)
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr []string
	}{
		{name: "defaults", mutate: func(*Config) {}},
		{name: "exponential defaults", mutate: func(c *Config) { c.Histogram = Exponential }},
		{name: "explicit ignores max size", mutate: func(c *Config) { c.ExponentialMaxSize = 0 }},
		{
			name:    "zero config",
			mutate:  func(c *Config) { *c = Config{} },
			wantErr: []string{"cardinality_limit: want at least 2 (one regular series plus the overflow series), got 0"},
		},
		{
			name: "every problem at once",
			mutate: func(c *Config) {
				c.CardinalityLimit = 1
				c.Temporality = "weekly"
				c.Histogram = Exponential
				c.ExponentialMaxSize = 1
				c.Dimensions = []string{"tenant", "", "error.type", "tenant", "otel.metric.overflow"}
			},
			wantErr: []string{
				"cardinality_limit: want at least 2 (one regular series plus the overflow series), got 1",
				`temporality: want cumulative or delta, got "weekly"`,
				"exponential_max_size: want at least 2, got 1",
				"dimensions::1: empty key",
				`dimensions::2: "error.type" is set by the aggregator itself`,
				`dimensions::3: "tenant" repeats dimensions::0`,
				`dimensions::4: "otel.metric.overflow" is set by the aggregator itself`,
			},
		},
		{
			name:    "unknown histogram kind",
			mutate:  func(c *Config) { c.Histogram = "linear" },
			wantErr: []string{`histogram: want explicit or exponential, got "linear"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mutate(&cfg)
			a, err := New(cfg, t0)
			if len(tt.wantErr) == 0 {
				require.NoError(t, err)
				require.NotNil(t, a)
				return
			}
			require.Error(t, err)
			assert.Nil(t, a)
			for _, want := range tt.wantErr {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}

// Temporality and Histogram are spelt in any case, as the configuration
// gives them.
func TestConfigAnyCase(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Temporality, cfg.Histogram = "Delta", "EXPONENTIAL"
	a, err := New(cfg, t0)
	require.NoError(t, err)
	assert.Equal(t, Delta, a.cfg.Temporality)
	assert.Equal(t, Exponential, a.cfg.Histogram)
}

var chatDims = Dims{Operation: "chat", Provider: "vllm", Model: "llama-3-8b", Engine: "vllm-0"}

func TestAllMetricsNamesUnitsTypes(t *testing.T) {
	a := newAggregator(t, nil)
	l := a.SessionStarted(chatDims)
	a.ObserveGap(l, 20*time.Millisecond, 1)
	a.Stall(l)
	a.SessionEnded(l, Result{
		Outcome: "completed", TTFT: time.Second, HasTTFT: true, TPOT: 20 * time.Millisecond, HasTPOT: true,
		Duration: 2 * time.Second, InputTokens: 10, OutputTokens: 50, HasInputTokens: true, HasOutputTokens: true,
	})
	sm := flush(a, t1)
	want := []struct {
		name, unit string
		typ        pmetric.MetricType
		bounds     []float64
	}{
		{MetricTimeToFirstToken, "s", pmetric.MetricTypeHistogram, ttftBounds},
		{MetricTimePerOutputTok, "s", pmetric.MetricTypeHistogram, tpotBounds},
		{MetricRequestDuration, "s", pmetric.MetricTypeHistogram, durationBounds},
		{MetricInterTokenLatency, "s", pmetric.MetricTypeHistogram, tpotBounds},
		{MetricTokenUsage, "{token}", pmetric.MetricTypeHistogram, tokenBounds},
		{MetricSessions, "{session}", pmetric.MetricTypeSum, nil},
		{MetricStalls, "{stall}", pmetric.MetricTypeSum, nil},
		{MetricActiveSessions, "{session}", pmetric.MetricTypeGauge, nil},
	}
	require.Equal(t, len(want), sm.Metrics().Len(), metricNames(sm))
	for i, w := range want {
		m := sm.Metrics().At(i)
		assert.Equal(t, w.name, m.Name())
		assert.Equal(t, w.unit, m.Unit(), w.name)
		assert.Equal(t, w.typ, m.Type(), w.name)
		assert.NotEmpty(t, m.Description(), w.name)
		switch w.typ {
		case pmetric.MetricTypeHistogram:
			assert.Equal(t, pmetric.AggregationTemporalityCumulative, m.Histogram().AggregationTemporality())
			assert.Equal(t, w.bounds, m.Histogram().DataPoints().At(0).ExplicitBounds().AsRaw(), w.name)
		case pmetric.MetricTypeSum:
			assert.True(t, m.Sum().IsMonotonic(), w.name)
			assert.Equal(t, pmetric.AggregationTemporalityCumulative, m.Sum().AggregationTemporality())
		}
	}
}

func TestObserveGapWeightsMinMaxSum(t *testing.T) {
	a := newAggregator(t, nil)
	l := a.SessionStarted(chatDims)
	// tpot bounds: 0.01, 0.025, 0.05, 0.075, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5
	a.ObserveGap(l, 20*time.Millisecond, 3)  // bucket 1 (0.01, 0.025] ×3
	a.ObserveGap(l, 80*time.Millisecond, 1)  // bucket 4 (0.075, 0.08], the edge
	a.ObserveGap(l, 81*time.Millisecond, 2)  // bucket 5 (0.08, 0.1] ×2
	a.ObserveGap(l, 3*time.Second, 1)        // bucket 14 (2.5, +Inf)
	a.ObserveGap(l, -5*time.Millisecond, 1)  // negative: recorded as 0, bucket 0
	a.ObserveGap(l, 10*time.Millisecond, 0)  // no tokens: nothing
	a.ObserveGap(l, 10*time.Millisecond, -4) // negative tokens: nothing

	dp := histPoint(t, findMetric(t, flush(a, t1), MetricInterTokenLatency), 0)
	assert.Equal(t, []uint64{1, 3, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1}, dp.BucketCounts().AsRaw())
	assert.Equal(t, uint64(8), dp.Count())
	assert.InDelta(t, 0.06+0.08+0.162+3, dp.Sum(), 1e-12)
	assert.True(t, dp.HasMin())
	assert.Equal(t, 0.0, dp.Min())
	assert.Equal(t, 3.0, dp.Max())
}

func TestEndOfSessionHistograms(t *testing.T) {
	a := newAggregator(t, nil)
	for _, r := range []Result{
		{Outcome: "completed", TTFT: 100 * time.Millisecond, HasTTFT: true, TPOT: 80 * time.Millisecond, HasTPOT: true, Duration: 1280 * time.Millisecond},
		{Outcome: "completed", TTFT: 300 * time.Millisecond, HasTTFT: true, TPOT: 30 * time.Millisecond, HasTPOT: true, Duration: 5 * time.Second},
		{Outcome: "completed", Duration: 10 * time.Millisecond}, // no token at all: neither TTFT nor TPOT
	} {
		a.SessionEnded(a.SessionStarted(chatDims), r)
	}
	sm := flush(a, t1)

	ttft := histPoint(t, findMetric(t, sm, MetricTimeToFirstToken), 0)
	// ttft bounds: 0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 ...: 0.1 → 7, 0.3 → 9.
	assert.Equal(t, []uint64{0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0}, ttft.BucketCounts().AsRaw())
	assert.Equal(t, uint64(2), ttft.Count())
	assert.InDelta(t, 0.4, ttft.Sum(), 1e-12)
	assert.Equal(t, 0.1, ttft.Min())
	assert.Equal(t, 0.3, ttft.Max())

	tpot := histPoint(t, findMetric(t, sm, MetricTimePerOutputTok), 0)
	// 0.03 → (0.025, 0.05] = 2; 0.08 → (0.075, 0.08] = 4.
	assert.Equal(t, []uint64{0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, tpot.BucketCounts().AsRaw())

	dur := histPoint(t, findMetric(t, sm, MetricRequestDuration), 0)
	// duration bounds 0.01 0.02 0.04 0.08 0.16 0.32 0.64 1.28 2.56 5.12: 0.01 → 0, 1.28 → 7, 5 → 9.
	assert.Equal(t, []uint64{1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0}, dur.BucketCounts().AsRaw())
	assert.Equal(t, uint64(3), dur.Count())
	assert.Equal(t, 0.01, dur.Min())
	assert.Equal(t, 5.0, dur.Max())
}

func TestTokenUsage(t *testing.T) {
	a := newAggregator(t, nil)
	a.SessionEnded(a.SessionStarted(chatDims), Result{Outcome: "completed", InputTokens: 4, OutputTokens: 1000, HasInputTokens: true, HasOutputTokens: true})
	a.SessionEnded(a.SessionStarted(chatDims), Result{Outcome: "completed", InputTokens: 5, HasInputTokens: true})
	m := findMetric(t, flush(a, t1), MetricTokenUsage)
	require.Equal(t, 2, m.Histogram().DataPoints().Len())
	in, out := m.Histogram().DataPoints().At(0), m.Histogram().DataPoints().At(1)
	assert.Equal(t, "input", in.Attributes().AsRaw()["gen_ai.token.type"])
	assert.Equal(t, "output", out.Attributes().AsRaw()["gen_ai.token.type"])
	// token bounds 1 4 16 64 256 1024: 4 → 1, 5 → 2, 1000 → 5.
	assert.Equal(t, []uint64{0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, in.BucketCounts().AsRaw())
	assert.Equal(t, 9.0, in.Sum())
	assert.Equal(t, []uint64{0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, out.BucketCounts().AsRaw())
	assert.Equal(t, uint64(1), out.Count())
}

func TestDimsToAttributes(t *testing.T) {
	a := newAggregator(t, func(c *Config) { c.Dimensions = []string{"tenant", "region", "tier"} })
	extra := []string{"acme", "", "gold", "ignored"} // "" is absent; a value beyond the keys is ignored
	d := Dims{Operation: "chat", Model: "m1", Engine: "e1", ErrorType: "ignored at start", Extra: extra}
	l := a.SessionStarted(d)
	extra[0] = "mutated" // the aggregator keeps its own copy
	a.ObserveGap(l, time.Millisecond, 1)
	a.Stall(l)
	a.SessionEnded(l, Result{
		ErrorType: "timeout", Outcome: "timeout", Sampled: true, TTFT: time.Second, HasTTFT: true,
		TPOT: time.Millisecond, HasTPOT: true, OutputTokens: 3, HasOutputTokens: true,
	})
	// Shorter Extra: missing values are absent; the same live dims as a zero value.
	l2 := a.SessionStarted(Dims{Operation: "chat", Model: "m1", Engine: "e1", Extra: []string{"acme"}})

	sm := flush(a, t1)
	live := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "llm.engine": "e1", "tenant": "acme", "tier": "gold"}
	live2 := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "llm.engine": "e1", "tenant": "acme"}
	end := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "llm.engine": "e1", "tenant": "acme", "tier": "gold", "error.type": "timeout"}
	with := func(base map[string]any, kv ...any) map[string]any {
		out := map[string]any{}
		for k, v := range base {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	for _, tt := range []struct {
		metric string
		want   []map[string]any
	}{
		// error.type only on end-of-session metrics.
		{MetricTimeToFirstToken, []map[string]any{end}},
		{MetricTimePerOutputTok, []map[string]any{end}},
		{MetricRequestDuration, []map[string]any{end}},
		{MetricTokenUsage, []map[string]any{with(end, "gen_ai.token.type", "output")}},
		{MetricSessions, []map[string]any{with(end, "llm.session.outcome", "timeout", "llm.session.sampled", true)}},
		{MetricInterTokenLatency, []map[string]any{live}},
		{MetricStalls, []map[string]any{live, live2}},
		{MetricActiveSessions, []map[string]any{live, live2}},
	} {
		assert.Equal(t, tt.want, pointAttrs(findMetric(t, sm, tt.metric)), tt.metric)
	}
	_ = l2
}

func TestSessionsByOutcomeAndSampled(t *testing.T) {
	a := newAggregator(t, nil)
	for _, r := range []Result{
		{Outcome: "completed"},
		{Outcome: "completed"},
		{Outcome: "completed", Sampled: true},
		{Outcome: "error", ErrorType: "500", Sampled: true},
		{Outcome: "aborted"},
	} {
		a.SessionEnded(a.SessionStarted(chatDims), r)
	}
	m := findMetric(t, flush(a, t1), MetricSessions)
	got := map[string]int64{}
	for _, dp := range m.Sum().DataPoints().All() {
		attrs := dp.Attributes().AsRaw()
		key := attrs["llm.session.outcome"].(string)
		if attrs["llm.session.sampled"].(bool) {
			key += "/sampled"
		}
		if e, ok := attrs["error.type"]; ok {
			key += "/" + e.(string)
		}
		got[key] = dp.IntValue()
	}
	assert.Equal(t, map[string]int64{"completed": 2, "completed/sampled": 1, "error/sampled/500": 1, "aborted": 1}, got)
}

// Models beyond max_models, as a client inventing names would send them,
// share one series under ModelOverflow; the models seen first keep theirs,
// and sessions without a model are not counted against the bound.
func TestMaxModels(t *testing.T) {
	a := newAggregator(t, func(c *Config) { c.MaxModels = 2 })
	for _, model := range []string{"llama", "qwen", "", "invented-1", "invented-2", "llama", "invented-3"} {
		d := chatDims
		d.Model = model
		a.SessionEnded(a.SessionStarted(d), Result{Outcome: "completed"})
	}
	got := intValues(t, findMetric(t, flush(a, t1), MetricSessions), "gen_ai.request.model")
	assert.Equal(t, map[string]int64{"llama": 2, "qwen": 1, "": 1, ModelOverflow: 3}, got)
	assert.Equal(t, uint64(3), a.ModelOverflowCount())

	unbounded := newAggregator(t, func(c *Config) { c.MaxModels = 0 })
	for i := range 300 {
		d := chatDims
		d.Model = fmt.Sprint("m", i)
		unbounded.SessionEnded(unbounded.SessionStarted(d), Result{Outcome: "completed"})
	}
	assert.Zero(t, unbounded.ModelOverflowCount())

	_, err := New(Config{FlushInterval: time.Second, CardinalityLimit: 10, Temporality: Cumulative, Histogram: Explicit, MaxModels: -1}, t0)
	assert.EqualError(t, err, "max_models: must not be negative (0: no bound), got -1")
}

// Engines beyond max_engines share llm.engine=_OTHER, as models do: pods
// that restart under new addresses, or a hook that names engines by
// request, do not take the cardinality limit from real series.
func TestMaxEngines(t *testing.T) {
	a := newAggregator(t, func(c *Config) { c.MaxEngines = 2 })
	for _, engine := range []string{"vllm-0", "vllm-1", "", "10.0.0.7:8000", "vllm-0", "10.0.0.8:8000"} {
		d := chatDims
		d.Engine = engine
		l := a.SessionStarted(d)
		if engine == "10.0.0.7:8000" {
			assert.Equal(t, ModelOverflow, l.Engine())
		}
		a.SessionEnded(l, Result{Outcome: "completed"})
	}
	got := intValues(t, findMetric(t, flush(a, t1), MetricSessions), "llm.engine")
	assert.Equal(t, map[string]int64{"vllm-0": 2, "vllm-1": 1, "": 1, ModelOverflow: 2}, got)
	assert.Equal(t, uint64(2), a.EngineOverflowCount())
	_, engines := a.KeyCounts()
	assert.Equal(t, 2, engines)
}

// 100 000 distinct models and engines, one session each: the values held
// stay at max_models and max_engines, the series at the cardinality
// limit, and every session is counted (under _OTHER, or the overflow
// series). After forget_after without a session, every one is forgotten:
// nothing is held and nothing is sent.
func TestKeysBoundedAndForgotten(t *testing.T) {
	for _, temporality := range []Temporality{Cumulative, Delta} {
		t.Run(string(temporality), func(t *testing.T) {
			a := newAggregator(t, func(c *Config) {
				c.Temporality = temporality
				c.ForgetAfter = time.Minute
			})
			const n = 100_000
			for i := range n {
				d := chatDims
				d.Model, d.Engine = fmt.Sprint("model-", i), fmt.Sprint("10.0.", i/256, ".", i%256, ":8000")
				a.SessionEnded(a.SessionStarted(d), Result{Outcome: "completed", Duration: time.Second})
			}
			models, engines := a.KeyCounts()
			assert.Equal(t, DefaultMaxModels, models)
			assert.Equal(t, DefaultMaxEngines, engines)
			assert.Equal(t, uint64(n-DefaultMaxModels), a.ModelOverflowCount())
			assert.Equal(t, uint64(n-DefaultMaxEngines), a.EngineOverflowCount())
			sm := flush(a, t1)
			sessions := findMetric(t, sm, MetricSessions).Sum().DataPoints()
			assert.LessOrEqual(t, sessions.Len(), DefaultCardinalityLimit)
			total := int64(0)
			for _, dp := range sessions.All() {
				total += dp.IntValue()
			}
			assert.Equal(t, int64(n), total, "every session counted")
			// No session since: forgotten at the first flush a minute
			// after the one that followed the last.
			flush(a, t1.Add(59*time.Second))
			models, _ = a.KeyCounts()
			assert.Equal(t, DefaultMaxModels, models, "59 s: held")
			sm = flush(a, t1.Add(time.Minute))
			assert.Zero(t, sm.Metrics().Len(), "nothing is sent")
			models, engines = a.KeyCounts()
			assert.Zero(t, models)
			assert.Zero(t, engines)
			assert.Zero(t, a.SeriesCount())
			assert.Empty(t, a.live)
			assert.Nil(t, a.liveOverflow)
			// The places are free: a new model has its own series.
			d := chatDims
			d.Model = "new-model"
			assert.Equal(t, "new-model", a.SessionStarted(d).Model())
		})
	}
}

// Under cumulative temporality a series with no session for forget_after
// is no longer sent; one whose session is still open is, however long it
// runs; a series made again after it was forgotten starts from zero, at a
// new start timestamp.
func TestForgetAfterCumulative(t *testing.T) {
	a := newAggregator(t, func(c *Config) { c.ForgetAfter = time.Minute })
	gone, open := chatDims, chatDims
	gone.Model, open.Model = "gone", "long"
	a.SessionEnded(a.SessionStarted(gone), Result{Outcome: "completed", Duration: time.Second})
	long := a.SessionStarted(open)
	models := func(sm pmetric.ScopeMetrics, name string) map[string]int64 {
		if !hasMetric(sm, name) {
			return nil
		}
		return intValues(t, findMetric(t, sm, name), "gen_ai.request.model")
	}
	assert.Equal(t, map[string]int64{"gone": 1}, models(flush(a, t1), MetricSessions))
	sm := flush(a, t1.Add(time.Minute))
	assert.Nil(t, models(sm, MetricSessions), "gone's llm.sessions is forgotten")
	assert.Equal(t, map[string]int64{"long": 1}, models(sm, MetricActiveSessions), "long's session is open")
	assert.Equal(t, uint64(3+1+1), a.ForgottenCount(), "gone's live series (3 metrics), its llm.sessions and duration")

	restart := t1.Add(time.Minute)
	a.SessionEnded(a.SessionStarted(gone), Result{Outcome: "completed", Duration: time.Second})
	a.SessionEnded(long, Result{Outcome: "completed", Duration: time.Second})
	sm = flush(a, restart.Add(15*time.Second))
	assert.Equal(t, map[string]int64{"gone": 1, "long": 1}, models(sm, MetricSessions), "from zero")
	for _, dp := range findMetric(t, sm, MetricSessions).Sum().DataPoints().All() {
		if v, _ := dp.Attributes().Get("gen_ai.request.model"); v.Str() == "gone" {
			assert.Equal(t, pcommon.NewTimestampFromTime(restart), dp.StartTimestamp(), "a new start")
		}
	}

	_, err := New(Config{FlushInterval: time.Minute, CardinalityLimit: 10, Temporality: Cumulative, Histogram: Explicit, ForgetAfter: -time.Second}, t0)
	assert.EqualError(t, err, "forget_after: must not be negative (0: never), got -1s")
}

func TestActiveGauge(t *testing.T) {
	for _, tt := range []struct {
		temporality Temporality
		// values after each flush: two sessions start; flush; one ends; flush; the other ends; flush; flush
		want []map[string]int64
	}{
		{Cumulative, []map[string]int64{{"m1": 2}, {"m1": 1}, {"m1": 0}, {"m1": 0}}},
		// Under Delta a series at 0 is reported once, then dropped.
		{Delta, []map[string]int64{{"m1": 2}, {"m1": 1}, {"m1": 0}, nil}},
	} {
		t.Run(string(tt.temporality), func(t *testing.T) {
			a := newAggregator(t, func(c *Config) { c.Temporality = tt.temporality })
			d := Dims{Model: "m1"}
			l1, l2 := a.SessionStarted(d), a.SessionStarted(d)
			assert.Same(t, l1, l2, "sessions with the same dims share a handle")
			var got []map[string]int64
			now := t0
			step := func() {
				now = now.Add(15 * time.Second)
				sm := flush(a, now)
				if !hasMetric(sm, MetricActiveSessions) {
					got = append(got, nil)
					return
				}
				m := findMetric(t, sm, MetricActiveSessions)
				assert.Equal(t, pcommon.Timestamp(0), m.Gauge().DataPoints().At(0).StartTimestamp())
				assert.Equal(t, pcommon.NewTimestampFromTime(now), m.Gauge().DataPoints().At(0).Timestamp())
				got = append(got, intValues(t, m, "gen_ai.request.model"))
			}
			step()
			a.SessionEnded(l1, Result{Outcome: "completed"})
			step()
			a.SessionEnded(l2, Result{Outcome: "completed"})
			step()
			step()
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestCumulativeVsDelta(t *testing.T) {
	type flushWant struct {
		itlCount      uint64
		itlStart      time.Time
		stalls        int64 // -1: not emitted
		durationCount uint64
		durationStart time.Time
		sessionsTotal int64
	}
	tests := []struct {
		temporality Temporality
		histTemp    pmetric.AggregationTemporality
		first       flushWant
		second      flushWant
	}{
		{
			temporality: Cumulative, histTemp: pmetric.AggregationTemporalityCumulative,
			first:  flushWant{itlCount: 3, itlStart: t0, stalls: 1, durationCount: 1, sessionsTotal: 1, durationStart: t0},
			second: flushWant{itlCount: 5, itlStart: t0, stalls: 1, durationCount: 2, sessionsTotal: 2, durationStart: t0},
		},
		{
			temporality: Delta, histTemp: pmetric.AggregationTemporalityDelta,
			first:  flushWant{itlCount: 3, itlStart: t0, stalls: 1, durationCount: 1, sessionsTotal: 1, durationStart: t0},
			second: flushWant{itlCount: 2, itlStart: t1, stalls: -1, durationCount: 1, sessionsTotal: 1, durationStart: t1},
		},
	}
	for _, tt := range tests {
		t.Run(string(tt.temporality), func(t *testing.T) {
			a := newAggregator(t, func(c *Config) { c.Temporality = tt.temporality })
			// A long session spanning both flushes, and one short session in each interval.
			long := a.SessionStarted(chatDims)
			a.ObserveGap(long, 10*time.Millisecond, 2)
			a.Stall(long)
			short := a.SessionStarted(chatDims)
			a.ObserveGap(short, 30*time.Millisecond, 1)
			a.SessionEnded(short, Result{Outcome: "completed", Duration: time.Second})
			check := func(sm pmetric.ScopeMetrics, now time.Time, w flushWant) {
				t.Helper()
				itl := findMetric(t, sm, MetricInterTokenLatency)
				assert.Equal(t, tt.histTemp, itl.Histogram().AggregationTemporality())
				dp := histPoint(t, itl, 0)
				assert.Equal(t, w.itlCount, dp.Count())
				assert.Equal(t, pcommon.NewTimestampFromTime(w.itlStart), dp.StartTimestamp())
				assert.Equal(t, pcommon.NewTimestampFromTime(now), dp.Timestamp())
				if w.stalls < 0 {
					assert.False(t, hasMetric(sm, MetricStalls))
				} else {
					assert.Equal(t, map[string]int64{"chat": w.stalls}, intValues(t, findMetric(t, sm, MetricStalls), "gen_ai.operation.name"))
				}
				dur := histPoint(t, findMetric(t, sm, MetricRequestDuration), 0)
				assert.Equal(t, w.durationCount, dur.Count())
				assert.Equal(t, pcommon.NewTimestampFromTime(w.durationStart), dur.StartTimestamp())
				sessions := findMetric(t, sm, MetricSessions)
				assert.Equal(t, tt.histTemp, sessions.Sum().AggregationTemporality())
				assert.Equal(t, w.sessionsTotal, sessions.Sum().DataPoints().At(0).IntValue())
				assert.Equal(t, map[string]int64{"chat": 1}, intValues(t, findMetric(t, sm, MetricActiveSessions), "gen_ai.operation.name"))
			}
			check(flush(a, t1), t1, tt.first)

			a.ObserveGap(long, 20*time.Millisecond, 2)
			short = a.SessionStarted(chatDims)
			a.SessionEnded(short, Result{Outcome: "completed", Duration: 2 * time.Second})
			check(flush(a, t2), t2, tt.second)
		})
	}
}

func TestDeltaOmitsSeriesWithoutData(t *testing.T) {
	a := newAggregator(t, func(c *Config) { c.Temporality = Delta })
	l := a.SessionStarted(chatDims)
	a.SessionEnded(a.SessionStarted(Dims{Model: "other"}), Result{Outcome: "completed", HasTTFT: true})
	_ = flush(a, t1)
	// Nothing happened in the second interval but one session is still running.
	sm := flush(a, t2)
	assert.Equal(t, []string{MetricActiveSessions}, metricNames(sm))
	assert.Equal(t, map[string]int64{"llama-3-8b": 1}, intValues(t, findMetric(t, sm, MetricActiveSessions), "gen_ai.request.model"))
	assert.Equal(t, 3, a.SeriesCount(), "the ended series was dropped")
	a.SessionEnded(l, Result{Outcome: "completed"})
}

func TestCumulativeStartOfLaterSeries(t *testing.T) {
	a := newAggregator(t, nil)
	a.SessionEnded(a.SessionStarted(Dims{Model: "early"}), Result{Outcome: "completed"})
	_ = flush(a, t1)
	a.SessionEnded(a.SessionStarted(Dims{Model: "late"}), Result{Outcome: "completed"})
	m := findMetric(t, flush(a, t2), MetricRequestDuration)
	assert.Equal(t, pcommon.NewTimestampFromTime(t0), histPoint(t, m, 0).StartTimestamp())
	assert.Equal(t, pcommon.NewTimestampFromTime(t1), histPoint(t, m, 1).StartTimestamp(), "created after the first flush")
}

func TestCardinalityOverflow(t *testing.T) {
	// Limit 3: two regular sets per metric, the third point is the overflow set.
	a := newAggregator(t, func(c *Config) { c.CardinalityLimit = 3 })
	var lives []*Live
	for _, model := range []string{"m1", "m2", "m3", "m4"} {
		lives = append(lives, a.SessionStarted(Dims{Model: model})) // m3, m4: +1 overflow each
	}
	assert.Equal(t, uint64(2), a.OverflowCount())
	for _, l := range lives {
		a.ObserveGap(l, 20*time.Millisecond, 5) // +1 each for m3, m4
	}
	a.Stall(lives[3]) // +1
	assert.Equal(t, uint64(5), a.OverflowCount())
	// End m1, m3, m4 (m3, m4: +1 each for the active gauge). Their end series have their own
	// count: m1 and m3 get regular duration series, m4 overflows (+1 duration, +1 sessions).
	// error.type makes m1's a different set from m1 without it.
	for _, i := range []int{0, 2, 3} {
		a.SessionEnded(lives[i], Result{Outcome: "completed", Duration: time.Second})
	}
	assert.Equal(t, uint64(9), a.OverflowCount())
	// m2 ends with an error: a new end set, over the limit (+1 duration, +1 sessions).
	a.SessionEnded(lives[1], Result{Outcome: "error", ErrorType: "500", Duration: time.Second})
	assert.Equal(t, uint64(11), a.OverflowCount())

	sm := flush(a, t1)
	overflow := map[string]any{"otel.metric.overflow": true}
	for _, tt := range []struct {
		metric string
		want   []map[string]any
	}{
		{MetricInterTokenLatency, []map[string]any{{"gen_ai.request.model": "m1"}, {"gen_ai.request.model": "m2"}, overflow}},
		{MetricStalls, []map[string]any{{"gen_ai.request.model": "m1"}, {"gen_ai.request.model": "m2"}, overflow}},
		{MetricActiveSessions, []map[string]any{{"gen_ai.request.model": "m1"}, {"gen_ai.request.model": "m2"}, overflow}},
		{MetricRequestDuration, []map[string]any{{"gen_ai.request.model": "m1"}, {"gen_ai.request.model": "m3"}, overflow}},
	} {
		assert.Equal(t, tt.want, pointAttrs(findMetric(t, sm, tt.metric)), tt.metric)
	}
	itlOverflow := histPoint(t, findMetric(t, sm, MetricInterTokenLatency), 2)
	assert.Equal(t, uint64(10), itlOverflow.Count())
	assert.Equal(t, map[string]int64{"m1": 0, "m2": 0, "": 1}, intValues(t, findMetric(t, sm, MetricStalls), "gen_ai.request.model"))
	assert.Equal(t, map[string]int64{"m1": 0, "m2": 0, "": 0}, intValues(t, findMetric(t, sm, MetricActiveSessions), "gen_ai.request.model"))
	dur := findMetric(t, sm, MetricRequestDuration)
	assert.Equal(t, uint64(2), histPoint(t, dur, 2).Count())
	assert.False(t, hasMetric(sm, MetricTimeToFirstToken))
}

func TestDeltaFreesCardinality(t *testing.T) {
	a := newAggregator(t, func(c *Config) { c.CardinalityLimit = 2; c.Temporality = Delta })
	a.SessionEnded(a.SessionStarted(Dims{Model: "m1"}), Result{Outcome: "completed"})
	_ = flush(a, t1)
	a.SessionEnded(a.SessionStarted(Dims{Model: "m2"}), Result{Outcome: "completed"})
	sm := flush(a, t2)
	assert.Equal(t, uint64(0), a.OverflowCount())
	assert.Equal(t, []map[string]any{{"gen_ai.request.model": "m2"}}, pointAttrs(findMetric(t, sm, MetricRequestDuration)))
}

func TestExponentialOutput(t *testing.T) {
	for _, temporality := range []Temporality{Cumulative, Delta} {
		t.Run(string(temporality), func(t *testing.T) {
			a := newAggregator(t, func(c *Config) {
				c.Histogram = Exponential
				c.ExponentialMaxSize = 4
				c.Temporality = temporality
			})
			l := a.SessionStarted(chatDims)
			// In seconds: 1, 3, 0.3, 7, and a zero gap; see TestExponentialDownscale.
			a.ObserveGap(l, time.Second, 1)
			a.ObserveGap(l, 3*time.Second, 2)
			a.ObserveGap(l, 300*time.Millisecond, 1)
			a.ObserveGap(l, 7*time.Second, 1)
			a.ObserveGap(l, 0, 3)
			sm := flush(a, t1)
			m := findMetric(t, sm, MetricInterTokenLatency)
			require.Equal(t, pmetric.MetricTypeExponentialHistogram, m.Type())
			dp := m.ExponentialHistogram().DataPoints().At(0)
			assert.Equal(t, int32(-1), dp.Scale())
			assert.Equal(t, int32(-1), dp.Positive().Offset())
			assert.Equal(t, []uint64{2, 2, 1}, dp.Positive().BucketCounts().AsRaw())
			assert.Equal(t, 0, dp.Negative().BucketCounts().Len())
			assert.Equal(t, uint64(3), dp.ZeroCount())
			assert.Equal(t, 0.0, dp.ZeroThreshold())
			assert.Equal(t, uint64(8), dp.Count())
			assert.InDelta(t, 1+6+0.3+7, dp.Sum(), 1e-12)
			assert.Equal(t, 0.0, dp.Min())
			assert.Equal(t, 7.0, dp.Max())
			assert.Equal(t, pcommon.NewTimestampFromTime(t0), dp.StartTimestamp())

			a.ObserveGap(l, 1500*time.Millisecond, 1)
			dp = findMetric(t, flush(a, t2), MetricInterTokenLatency).ExponentialHistogram().DataPoints().At(0)
			if temporality == Delta {
				// A fresh point: back at scale 20 with one bucket.
				assert.Equal(t, int32(20), dp.Scale())
				assert.Equal(t, int32(613377), dp.Positive().Offset())
				assert.Equal(t, []uint64{1}, dp.Positive().BucketCounts().AsRaw())
				assert.Equal(t, uint64(0), dp.ZeroCount())
				assert.Equal(t, pcommon.NewTimestampFromTime(t1), dp.StartTimestamp())
			} else {
				// 1.5 ∈ (1, 4] = bucket 0 at scale -1.
				assert.Equal(t, int32(-1), dp.Scale())
				assert.Equal(t, []uint64{2, 3, 1}, dp.Positive().BucketCounts().AsRaw())
				assert.Equal(t, uint64(9), dp.Count())
			}
		})
	}
}

func TestNegativeValuesRecordedAsZero(t *testing.T) {
	a := newAggregator(t, nil)
	a.SessionEnded(a.SessionStarted(chatDims), Result{Outcome: "completed", TTFT: -time.Second, HasTTFT: true, Duration: -1, InputTokens: -3, HasInputTokens: true})
	sm := flush(a, t1)
	for _, name := range []string{MetricTimeToFirstToken, MetricRequestDuration, MetricTokenUsage} {
		dp := histPoint(t, findMetric(t, sm, name), 0)
		assert.Equal(t, uint64(1), dp.BucketCounts().At(0), name)
		assert.Equal(t, 0.0, dp.Max(), name)
	}
}

func TestSessionStartedDoesNotAllocateForKnownSeries(t *testing.T) {
	a := newAggregator(t, func(c *Config) { c.Dimensions = []string{"tenant"} })
	d := Dims{Operation: "chat", Provider: "vllm", Model: "m", Engine: "e", Extra: []string{"acme"}}
	r := Result{
		Outcome: "completed", ErrorType: "x", TTFT: time.Millisecond, HasTTFT: true, TPOT: time.Millisecond, HasTPOT: true,
		Duration: time.Second, InputTokens: 1, OutputTokens: 2, HasInputTokens: true, HasOutputTokens: true,
	}
	a.SessionEnded(a.SessionStarted(d), r)
	allocs := testing.AllocsPerRun(100, func() {
		l := a.SessionStarted(d)
		a.ObserveGap(l, time.Millisecond, 1)
		a.Stall(l)
		a.SessionEnded(l, r)
	})
	assert.Equal(t, 0.0, allocs)
}

// A live series remembers the end series its sessions ended on; one that
// overflowed still counts every recording, and a delta flush forgets them.
func TestEndSeriesRemembered(t *testing.T) {
	a := newAggregator(t, func(c *Config) { c.CardinalityLimit = 2; c.Temporality = Delta })
	end := func(outcome string) {
		a.SessionEnded(a.SessionStarted(chatDims), Result{Outcome: outcome, Duration: time.Second})
	}
	end("completed")
	end("completed")
	assert.Equal(t, uint64(0), a.OverflowCount())
	end("aborted") // llm.sessions' second set: over the limit
	end("aborted")
	assert.Equal(t, uint64(2), a.OverflowCount())
	sm := flush(a, t1)
	assert.Equal(t, uint64(4), histPoint(t, findMetric(t, sm, MetricRequestDuration), 0).Count())
	assert.Equal(t, map[string]int64{"completed": 2, "": 2}, intValues(t, findMetric(t, sm, MetricSessions), AttrOutcome))

	end("aborted") // a new interval: aborted's series is a regular one now
	assert.Equal(t, uint64(2), a.OverflowCount())
	sm = flush(a, t2)
	assert.Equal(t, uint64(1), histPoint(t, findMetric(t, sm, MetricRequestDuration), 0).Count())
	assert.Equal(t, map[string]int64{"aborted": 1}, intValues(t, findMetric(t, sm, MetricSessions), AttrOutcome))
}

// Under cumulative temporality, at the cardinality limit a new series takes
// the place of one idle since the last flush, the one idle longest, not the
// overflow series (which has no engine: engine_health could not judge a new
// engine until every name before it was forgotten); one used in the last
// interval keeps its place.
func TestCardinalityLimitDisplacesIdleSeries(t *testing.T) {
	a := newAggregator(t, func(c *Config) { c.CardinalityLimit = 3; c.ForgetAfter = time.Hour })
	end := func(engine string) {
		a.SessionEnded(a.SessionStarted(Dims{Operation: "chat", Model: "m", Engine: engine}),
			Result{Outcome: "completed", Duration: time.Second})
	}
	engines := func(sm pmetric.ScopeMetrics) map[string]int64 {
		return intValues(t, findMetric(t, sm, MetricSessions), "llm.engine")
	}
	end("old")
	flush(a, t1)
	end("busy")
	sm := flush(a, t1.Add(time.Second))
	assert.Equal(t, map[string]int64{"old": 1, "busy": 1}, engines(sm))

	end("new")
	end("busy")
	sm = flush(a, t1.Add(2*time.Second))
	assert.Equal(t, map[string]int64{"busy": 2, "new": 1}, engines(sm), "new took old's place")
	assert.Zero(t, a.OverflowCount())
	assert.Equal(t, uint64(2+3), a.DisplacedCount(), "old's llm.sessions and duration, and its live series (3 metrics)")

	// Every place taken by a series used in the interval: the overflow.
	end("busy")
	end("new")
	end("third")
	sm = flush(a, t1.Add(3*time.Second))
	assert.Equal(t, map[string]int64{"busy": 3, "new": 2, "": 1}, engines(sm), "third on the overflow series")
}
