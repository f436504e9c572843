// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package promconv

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// testScope is the scope the token_stream receiver converts under, which the
// golden files record.
const testScope = "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

const (
	textContentType        = "text/plain; version=0.0.4; charset=utf-8"
	openMetricsContentType = "application/openmetrics-text; version=1.0.0; charset=utf-8"
	fixtureModel           = "meta-llama/Llama-3.1-8B-Instruct"
)

func readFixture(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "fixtures", "vllm", "metrics-v1.prom"))
	require.NoError(t, err)
	return b
}

// convertBody parses body and converts it with c at now.
func convertBody(t *testing.T, c *Converter, body, contentType string, now time.Time) pmetric.Metrics {
	t.Helper()
	fams, _, err := ParseExposition([]byte(body), contentType)
	require.NoError(t, err)
	return c.Convert(fams, now)
}

// metricsByName indexes the metrics of a single-resource, single-scope batch.
func metricsByName(t *testing.T, md pmetric.Metrics) map[string]pmetric.Metric {
	t.Helper()
	require.Equal(t, 1, md.ResourceMetrics().Len())
	sms := md.ResourceMetrics().At(0).ScopeMetrics()
	require.Equal(t, 1, sms.Len())
	assert.Equal(t, testScope, sms.At(0).Scope().Name())
	out := map[string]pmetric.Metric{}
	for _, m := range sms.At(0).Metrics().All() {
		_, dup := out[m.Name()]
		require.False(t, dup, "metric %s emitted twice", m.Name())
		out[m.Name()] = m
	}
	return out
}

func ts(sec int64, nsec int64) pcommon.Timestamp {
	return pcommon.NewTimestampFromTime(time.Unix(sec, nsec))
}

func attrsOf(m pcommon.Map) map[string]any { return m.AsRaw() }

func TestConvertFixtureTypes(t *testing.T) {
	body := readFixture(t)
	now := time.Unix(1754000600, 0)
	md := convertBody(t, NewConverter(testScope, nil), string(body), textContentType, now)
	got := metricsByName(t, md)

	// Every family the fixture declares is emitted with the matching type,
	// under the name it declares, except the _created gauges that give the
	// start times.
	want := map[string]pmetric.MetricType{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[1] != "TYPE" {
			continue
		}
		switch {
		case strings.HasSuffix(f[2], "_created"):
			continue
		case f[3] == "gauge":
			want[f[2]] = pmetric.MetricTypeGauge
		case f[3] == "counter":
			want[f[2]] = pmetric.MetricTypeSum
		case f[3] == "histogram":
			want[f[2]] = pmetric.MetricTypeHistogram
		default:
			t.Fatalf("unexpected type in fixture: %s", sc.Text())
		}
	}
	require.NotEmpty(t, want)
	gotTypes := map[string]pmetric.MetricType{}
	for name, m := range got {
		gotTypes[name] = m.Type()
	}
	assert.Equal(t, want, gotTypes)

	// A gauge.
	kv := got["vllm:kv_cache_usage_perc"].Gauge().DataPoints()
	require.Equal(t, 1, kv.Len())
	assert.InDelta(t, 0.4178, kv.At(0).DoubleValue(), 1e-12)
	assert.Equal(t, map[string]any{"engine": "0", "model_name": fixtureModel}, attrsOf(kv.At(0).Attributes()))
	assert.Equal(t, pcommon.NewTimestampFromTime(now), kv.At(0).Timestamp())

	// A counter keeps its _total name; its start time is its _created value.
	pre := got["vllm:num_preemptions_total"].Sum()
	assert.True(t, pre.IsMonotonic())
	assert.Equal(t, pmetric.AggregationTemporalityCumulative, pre.AggregationTemporality())
	require.Equal(t, 1, pre.DataPoints().Len())
	assert.Equal(t, 4.0, pre.DataPoints().At(0).DoubleValue())
	assert.Equal(t, ts(1754000000, 12_300_000), pre.DataPoints().At(0).StartTimestamp())
	assert.Equal(t, pcommon.NewTimestampFromTime(now), pre.DataPoints().At(0).Timestamp())

	// A labeled counter: one point per finished_reason.
	succ := got["vllm:request_success_total"].Sum().DataPoints()
	require.Equal(t, 4, succ.Len())
	byReason := map[string]float64{}
	for _, dp := range succ.All() {
		r, _ := dp.Attributes().Get("finished_reason")
		byReason[r.Str()] = dp.DoubleValue()
		assert.Equal(t, ts(1754000000, 12_300_000), dp.StartTimestamp())
	}
	assert.Equal(t, map[string]float64{"stop": 161, "length": 39, "abort": 0, "error": 0}, byReason)

	// The info gauge keeps all its labels.
	info := got["vllm:cache_config_info"].Gauge().DataPoints()
	require.Equal(t, 1, info.Len())
	assert.Equal(t, 15, info.At(0).Attributes().Len())
	v, _ := info.At(0).Attributes().Get("num_gpu_blocks")
	assert.Equal(t, "29127", v.Str())
}

func TestConvertFixtureHistograms(t *testing.T) {
	md := convertBody(t, NewConverter(testScope, nil), string(readFixture(t)), textContentType, time.Unix(1754000600, 0))
	got := metricsByName(t, md)

	// vllm:request_prompt_tokens, by hand from the fixture: cumulative
	// 0,0,0,0,0,0,0,14,47,113,200 for le 1..2000, +Inf 200, count 200.
	h := got["vllm:request_prompt_tokens"].Histogram()
	assert.Equal(t, pmetric.AggregationTemporalityCumulative, h.AggregationTemporality())
	require.Equal(t, 1, h.DataPoints().Len())
	dp := h.DataPoints().At(0)
	assert.Equal(t, []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}, dp.ExplicitBounds().AsRaw())
	assert.Equal(t, []uint64{0, 0, 0, 0, 0, 0, 0, 14, 33, 66, 87, 0}, dp.BucketCounts().AsRaw())
	assert.Equal(t, uint64(200), dp.Count())
	assert.True(t, dp.HasSum())
	assert.Equal(t, 186556.0, dp.Sum())
	assert.Equal(t, ts(1754000000, 45_600_000), dp.StartTimestamp())
	assert.Equal(t, map[string]any{"engine": "0", "model_name": fixtureModel}, attrsOf(dp.Attributes()))

	// vllm:time_to_first_token_seconds: cumulative 0,0,0,0,7,35,63,98,172,
	// 187,195,197,200 (le 0.001..2.5), then 200 up to 2560 and +Inf.
	dp = got["vllm:time_to_first_token_seconds"].Histogram().DataPoints().At(0)
	assert.Equal(t, []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560},
		dp.ExplicitBounds().AsRaw())
	assert.Equal(t, []uint64{0, 0, 0, 0, 7, 28, 28, 35, 74, 15, 8, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, dp.BucketCounts().AsRaw())
	assert.Equal(t, uint64(200), dp.Count())
	assert.InDelta(t, 33.208241, dp.Sum(), 1e-9)

	// Every histogram: one more bucket than bounds, counts adding up to count.
	for name, m := range got {
		if m.Type() != pmetric.MetricTypeHistogram {
			continue
		}
		for _, dp := range m.Histogram().DataPoints().All() {
			assert.Equal(t, dp.ExplicitBounds().Len()+1, dp.BucketCounts().Len(), name)
			var total uint64
			for _, c := range dp.BucketCounts().All() {
				total += c
			}
			assert.Equal(t, dp.Count(), total, name)
		}
	}
}

func TestConvertCounterStartAndReset(t *testing.T) {
	c := NewConverter(testScope, nil)
	t1, t2, t3 := time.Unix(100, 0), time.Unix(105, 0), time.Unix(110, 0)
	point := func(md pmetric.Metrics, name string) pmetric.NumberDataPoint {
		m, ok := metricsByName(t, md)[name]
		require.True(t, ok, name)
		return m.Sum().DataPoints().At(0)
	}
	const counter = "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{engine=\"0\"} %s\n"
	body := func(v string) string { return strings.Replace(counter, "%s", v, 1) }

	// No _created: the first scrape's time is the start.
	dp := point(convertBody(t, c, body("10"), textContentType, t1), "vllm:num_preemptions_total")
	assert.Equal(t, pcommon.NewTimestampFromTime(t1), dp.StartTimestamp())
	assert.Equal(t, pcommon.NewTimestampFromTime(t1), dp.Timestamp())
	dp = point(convertBody(t, c, body("12"), textContentType, t2), "vllm:num_preemptions_total")
	assert.Equal(t, pcommon.NewTimestampFromTime(t1), dp.StartTimestamp())
	assert.Equal(t, 12.0, dp.DoubleValue())
	// The value went down: the engine restarted, a new start.
	dp = point(convertBody(t, c, body("3"), textContentType, t3), "vllm:num_preemptions_total")
	assert.Equal(t, pcommon.NewTimestampFromTime(t3), dp.StartTimestamp())
	assert.Equal(t, 3.0, dp.DoubleValue())

	// With _created the start is the creation time, and a restart brings a
	// new one.
	c = NewConverter(testScope, nil)
	withCreated := func(v, created string) string {
		return body(v) + "# TYPE vllm:num_preemptions_created gauge\nvllm:num_preemptions_created{engine=\"0\"} " + created + "\n"
	}
	md := convertBody(t, c, withCreated("10", "1754000000.5"), textContentType, t1)
	_, emitted := metricsByName(t, md)["vllm:num_preemptions_created"]
	assert.False(t, emitted, "_created is consumed, not emitted")
	dp = point(md, "vllm:num_preemptions_total")
	assert.Equal(t, ts(1754000000, 500_000_000), dp.StartTimestamp())
	dp = point(convertBody(t, c, withCreated("2", "1754000100"), textContentType, t2), "vllm:num_preemptions_total")
	assert.Equal(t, ts(1754000100, 0), dp.StartTimestamp())
}

func TestConvertHistogramReset(t *testing.T) {
	c := NewConverter(testScope, nil)
	hist := func(b1, inf, sum string) string {
		return "# TYPE x_seconds histogram\n" +
			"x_seconds_bucket{le=\"0.1\"} " + b1 + "\n" +
			"x_seconds_bucket{le=\"+Inf\"} " + inf + "\n" +
			"x_seconds_sum " + sum + "\n" +
			"x_seconds_count " + inf + "\n"
	}
	t1, t2, t3 := time.Unix(100, 0), time.Unix(105, 0), time.Unix(110, 0)
	get := func(md pmetric.Metrics) pmetric.HistogramDataPoint {
		return metricsByName(t, md)["x_seconds"].Histogram().DataPoints().At(0)
	}
	dp := get(convertBody(t, c, hist("1", "3", "0.9"), textContentType, t1))
	assert.Equal(t, []uint64{1, 2}, dp.BucketCounts().AsRaw())
	assert.Equal(t, pcommon.NewTimestampFromTime(t1), dp.StartTimestamp())
	dp = get(convertBody(t, c, hist("2", "5", "1.5"), textContentType, t2))
	assert.Equal(t, pcommon.NewTimestampFromTime(t1), dp.StartTimestamp())
	dp = get(convertBody(t, c, hist("0", "1", "0.2"), textContentType, t3))
	assert.Equal(t, pcommon.NewTimestampFromTime(t3), dp.StartTimestamp(), "count went down: reset")
	assert.Equal(t, []uint64{0, 1}, dp.BucketCounts().AsRaw())
}

func TestConvertOlderNamesPassThrough(t *testing.T) {
	body := "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n" +
		"# TYPE vllm:gpu_cache_usage_perc gauge\n" +
		"vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n" +
		"# TYPE vllm:num_preemptions_total counter\n" +
		"vllm:num_preemptions_total{model_name=\"m\"} 7\n"
	got := metricsByName(t, convertBody(t, NewConverter(testScope, nil), body, textContentType, time.Unix(1, 0)))
	require.Contains(t, got, "vllm:gpu_cache_usage_perc")
	g := got["vllm:gpu_cache_usage_perc"]
	assert.Equal(t, "GPU KV-cache usage. 1 means 100 percent usage.", g.Description())
	assert.Equal(t, 0.25, g.Gauge().DataPoints().At(0).DoubleValue())
	assert.Len(t, got, 2)
}

func TestConvertOpenMetrics(t *testing.T) {
	body := "# TYPE vllm:num_preemptions counter\n" +
		"# HELP vllm:num_preemptions Cumulative number of preemption from the engine.\n" +
		"vllm:num_preemptions_total{engine=\"0\"} 4.0\n" +
		"vllm:num_preemptions_created{engine=\"0\"} 1.754e+09\n" +
		"# TYPE vllm:kv_cache_usage_perc gauge\n" +
		"vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n" +
		"# TYPE vllm:e2e_request_latency_seconds histogram\n" +
		"vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"1.0\"} 2.0\n" +
		"vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"+Inf\"} 3.0\n" +
		"vllm:e2e_request_latency_seconds_count{engine=\"0\"} 3.0\n" +
		"vllm:e2e_request_latency_seconds_sum{engine=\"0\"} 4.5\n" +
		"vllm:e2e_request_latency_seconds_created{engine=\"0\"} 1.754e+09\n" +
		"# EOF\n"
	got := metricsByName(t, convertBody(t, NewConverter(testScope, nil), body, openMetricsContentType, time.Unix(1754000600, 0)))
	require.Len(t, got, 3)
	sum := got["vllm:num_preemptions_total"]
	require.Equal(t, pmetric.MetricTypeSum, sum.Type())
	assert.True(t, sum.Sum().IsMonotonic())
	assert.Equal(t, 4.0, sum.Sum().DataPoints().At(0).DoubleValue())
	assert.Equal(t, ts(1754000000, 0), sum.Sum().DataPoints().At(0).StartTimestamp())
	assert.Equal(t, pmetric.MetricTypeGauge, got["vllm:kv_cache_usage_perc"].Type())
	h := got["vllm:e2e_request_latency_seconds"].Histogram().DataPoints().At(0)
	assert.Equal(t, []uint64{2, 1}, h.BucketCounts().AsRaw())
	assert.Equal(t, ts(1754000000, 0), h.StartTimestamp())
}

func TestParseExpositionGarbage(t *testing.T) {
	for name, body := range map[string]string{
		"html":         "<html><body>not found</body></html>\n",
		"json":         `{"error": "nope"}`,
		"bad value":    "vllm:num_requests_running{engine=\"0\"} twelve\n",
		"bad type":     "# TYPE x wibble\nx 1\n",
		"truncated":    "vllm:num_requests_running{engine=\"0\"",
		"openmetrics2": "x 1\n",
	} {
		t.Run(name, func(t *testing.T) {
			ct := textContentType
			if name == "openmetrics2" {
				ct = "application/openmetrics-text; version=2.0.0; charset=utf-8"
			}
			_, _, err := ParseExposition([]byte(body), ct)
			assert.Error(t, err)
		})
	}
}

func TestConvertDropsInvalidHistogram(t *testing.T) {
	body := "# TYPE h histogram\n" +
		"h_bucket{le=\"1\"} 5\n" +
		"h_bucket{le=\"2\"} 3\n" +
		"h_bucket{le=\"+Inf\"} 5\n" +
		"h_count 5\n" +
		"h_sum 1\n"
	c := NewConverter(testScope, nil)
	got := metricsByName(t, convertBody(t, c, body, textContentType, time.Unix(1, 0)))
	assert.Equal(t, 0, got["h"].Histogram().DataPoints().Len())
	assert.Equal(t, 1, c.Dropped())
}

func TestConvertForgetsVanishedSeries(t *testing.T) {
	c := NewConverter(testScope, nil)
	convertBody(t, c, "# TYPE a_total counter\na_total 1\n", textContentType, time.Unix(1, 0))
	assert.Len(t, c.series, 1)
	convertBody(t, c, "# TYPE b_total counter\nb_total 1\n", textContentType, time.Unix(2, 0))
	assert.Len(t, c.series, 1)
	// a_total comes back: a new series, a new start.
	md := convertBody(t, c, "# TYPE a_total counter\na_total 5\n", textContentType, time.Unix(3, 0))
	assert.Equal(t, ts(3, 0), metricsByName(t, md)["a_total"].Sum().DataPoints().At(0).StartTimestamp())
}

// TestConvertOpenMetricsAllTypes: info, stateset and unknown families,
// exemplars and second timestamps are read; a gauge histogram is skipped
// alone, counted, and the rest of the exposition converted.
func TestConvertOpenMetricsAllTypes(t *testing.T) {
	body := "# HELP vllm:cache_config Information of the LLMEngine CacheConfig.\n" +
		"# TYPE vllm:cache_config info\n" +
		"vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\"} 1.0\n" +
		"# TYPE engine_state stateset\n" +
		"engine_state{engine_state=\"running\"} 1\n" +
		"engine_state{engine_state=\"sleeping\"} 0\n" +
		"# TYPE vllm:request_success counter\n" +
		"vllm:request_success_total{engine=\"0\",finished_reason=\"stop\"} 7.0 # {trace_id=\"0123456789abcdef\"} 1.0 1754000000.5\n" +
		"# TYPE vllm:e2e_request_latency_seconds histogram\n" +
		"# UNIT vllm:e2e_request_latency_seconds seconds\n" +
		"vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"1.0\"} 2.0 # {trace_id=\"ab\"} 0.5\n" +
		"vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"+Inf\"} 3.0\n" +
		"vllm:e2e_request_latency_seconds_count{engine=\"0\"} 3.0\n" +
		"vllm:e2e_request_latency_seconds_sum{engine=\"0\"} 4.5\n" +
		"# TYPE queue_depth gaugehistogram\n" +
		"queue_depth_bucket{le=\"1.0\"} 1\n" +
		"queue_depth_bucket{le=\"+Inf\"} 2\n" +
		"queue_depth_gcount 2\n" +
		"queue_depth_gsum 3\n" +
		"# TYPE mystery unknown\n" +
		"mystery{label=\"a # {not an exemplar}\"} 3 1754000001.25\n" +
		"# EOF\n"
	fams, skipped, err := ParseExposition([]byte(body), openMetricsContentType)
	require.NoError(t, err)
	assert.Equal(t, Skipped{SkipGaugeHistogram: 1}, skipped)
	c := NewConverter(testScope, nil)
	got := metricsByName(t, c.Convert(fams, time.Unix(1754000600, 0)))
	assert.Nil(t, c.Skipped())

	info := got["vllm:cache_config_info"]
	require.Equal(t, pmetric.MetricTypeGauge, info.Type())
	assert.Equal(t, "Information of the LLMEngine CacheConfig.", info.Description())
	require.Equal(t, 1, info.Gauge().DataPoints().Len())
	assert.Equal(t, 1.0, info.Gauge().DataPoints().At(0).DoubleValue())
	assert.Equal(t, map[string]any{"block_size": "16", "cache_dtype": "auto"}, attrsOf(info.Gauge().DataPoints().At(0).Attributes()))

	st := got["engine_state"]
	require.Equal(t, pmetric.MetricTypeGauge, st.Type())
	states := map[string]float64{}
	for _, dp := range st.Gauge().DataPoints().All() {
		v, _ := dp.Attributes().Get("engine_state")
		states[v.Str()] = dp.DoubleValue()
	}
	assert.Equal(t, map[string]float64{"running": 1, "sleeping": 0}, states)

	sum := got["vllm:request_success_total"]
	require.Equal(t, pmetric.MetricTypeSum, sum.Type())
	assert.Equal(t, 7.0, sum.Sum().DataPoints().At(0).DoubleValue())
	h := got["vllm:e2e_request_latency_seconds"].Histogram().DataPoints().At(0)
	assert.Equal(t, []uint64{2, 1}, h.BucketCounts().AsRaw())

	my := got["mystery"]
	require.Equal(t, pmetric.MetricTypeGauge, my.Type())
	dp := my.Gauge().DataPoints().At(0)
	assert.Equal(t, 3.0, dp.DoubleValue())
	assert.Equal(t, map[string]any{"label": "a # {not an exemplar}"}, attrsOf(dp.Attributes()))
	assert.Equal(t, ts(1754000001, 250e6), dp.Timestamp(), "OpenMetrics timestamps are seconds")

	for _, name := range []string{"queue_depth", "queue_depth_bucket", "queue_depth_gcount", "queue_depth_gsum"} {
		assert.NotContains(t, got, name)
	}
}

func TestConvertCountsSkippedSummaries(t *testing.T) {
	body := "# TYPE rpc_seconds summary\nrpc_seconds{quantile=\"0.5\"} 1\nrpc_seconds_sum 2\nrpc_seconds_count 3\nup 1\n"
	fams, skipped, err := ParseExposition([]byte(body), textContentType)
	require.NoError(t, err)
	assert.Nil(t, skipped)
	c := NewConverter(testScope, nil)
	got := metricsByName(t, c.Convert(fams, time.Unix(1754000600, 0)))
	assert.Contains(t, got, "up")
	assert.Equal(t, Skipped{SkipSummary: 1}, c.Skipped())
}

// BenchmarkParseExposition is the cost of parsing the vLLM fixture, served
// as the text format and as OpenMetrics (rewritten by normalizeOpenMetrics
// first).
func BenchmarkParseExposition(b *testing.B) {
	body := fixtureBytes(b)
	for name, ct := range map[string]string{"text": textContentType, "openmetrics": openMetricsContentType} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for range b.N {
				if _, _, err := ParseExposition(body, ct); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
