// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package promconv

import (
	"flag"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/golden"
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/pdatatest/pmetrictest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// Golden-file tests of the vllm source: a /metrics exposition converted to
// pmetric. Regenerate the files with
//
//	go test ./internal/promconv/ -run TestVLLMGolden -update-vllm-golden
//
// (the run that writes them fails on purpose, as golden.WriteMetrics does),
// then read the diff: the figures TestVLLMGoldenFigures checks were worked
// out by hand from the fixture, not from the converter.
var updateVLLMGolden = flag.Bool("update-vllm-golden", false, "rewrite testdata/golden/vllm_*.yaml from the current conversion")

const vllmGoldenDir = "testdata/golden"

// goldenScrape is the fixed scrape time of the golden conversions, ten
// minutes after the fixture's _created times.
var goldenScrape = time.Unix(1754000600, 0)

// goldenTarget is the target the golden conversions are attributed to.
const goldenTarget = "http://vllm-0.example:8000/metrics"

// fixtureBytes reads testdata/fixtures/vllm/metrics-v1.prom at the
// repository root.
func fixtureBytes(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "fixtures", "vllm", "metrics-v1.prom"))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// goldenConverter is the converter of the golden target, with its resource.
func goldenConverter(t *testing.T) *Converter {
	t.Helper()
	u, err := url.Parse(goldenTarget)
	require.NoError(t, err)
	return NewConverter(testScope, TargetResource(u))
}

// checkGolden compares md with testdata/golden/name, or rewrites the file
// with -update-vllm-golden. Timestamps are written as they are: the start
// times taken from _created are part of what is checked.
func checkGolden(t *testing.T, name string, md pmetric.Metrics) {
	t.Helper()
	path := filepath.Join(vllmGoldenDir, name)
	if *updateVLLMGolden {
		require.NoError(t, os.MkdirAll(vllmGoldenDir, 0o755))
		require.NoError(t, golden.WriteMetrics(t, path, md, golden.SkipMetricTimestampNormalization()))
		return
	}
	want, err := golden.ReadMetrics(path)
	require.NoError(t, err, "missing golden file? run with -update-vllm-golden")
	require.NoError(t, pmetrictest.CompareMetrics(want, md,
		pmetrictest.IgnoreMetricsOrder(), pmetrictest.IgnoreMetricDataPointsOrder()))
}

// readGolden reads a golden file and indexes its metrics by name.
func readGolden(t *testing.T, name string) (pmetric.ResourceMetrics, map[string]pmetric.Metric) {
	t.Helper()
	md, err := golden.ReadMetrics(filepath.Join(vllmGoldenDir, name))
	require.NoError(t, err)
	return md.ResourceMetrics().At(0), metricsByName(t, md)
}

// sumPointWith, histPointWith and gaugePointWith return the data point of m
// whose attribute key is value.
func sumPointWith(t *testing.T, m pmetric.Metric, key, value string) pmetric.NumberDataPoint {
	t.Helper()
	for _, dp := range m.Sum().DataPoints().All() {
		if v, ok := dp.Attributes().Get(key); ok && v.Str() == value {
			return dp
		}
	}
	t.Fatalf("%s: no point with %s=%s", m.Name(), key, value)
	return pmetric.NumberDataPoint{}
}

func histPointOfEngine(t *testing.T, m pmetric.Metric, engine string) pmetric.HistogramDataPoint {
	t.Helper()
	for _, dp := range m.Histogram().DataPoints().All() {
		if v, ok := dp.Attributes().Get("engine"); ok && v.Str() == engine {
			return dp
		}
	}
	t.Fatalf("%s: no point with engine=%s", m.Name(), engine)
	return pmetric.HistogramDataPoint{}
}

func gaugePointWith(t *testing.T, m pmetric.Metric, key, value string) pmetric.NumberDataPoint {
	t.Helper()
	for _, dp := range m.Gauge().DataPoints().All() {
		if v, ok := dp.Attributes().Get(key); ok && v.Str() == value {
			return dp
		}
	}
	t.Fatalf("%s: no point with %s=%s", m.Name(), key, value)
	return pmetric.NumberDataPoint{}
}

func TestVLLMGoldenFixture(t *testing.T) {
	md := convertBody(t, goldenConverter(t), string(fixtureBytes(t)), textContentType, goldenScrape)
	checkGolden(t, "vllm_metrics_v1.yaml", md)
}

// TestVLLMGoldenFigures checks figures of the golden file itself against
// values worked out by hand from metrics-v1.prom, so that a golden file
// regenerated from a wrong conversion does not go unnoticed.
func TestVLLMGoldenFigures(t *testing.T) {
	if *updateVLLMGolden {
		t.Skip("golden files being rewritten")
	}
	rm, got := readGolden(t, "vllm_metrics_v1.yaml")
	scrape := pcommon.NewTimestampFromTime(goldenScrape)
	counterStart := pcommon.Timestamp(1754000000_012300000) // ..._created 1754000000.0123
	histStart := pcommon.Timestamp(1754000000_045600000)    // ..._created 1754000000.0456
	attrs := map[string]any{"engine": "0", "model_name": fixtureModel}

	assert.Equal(t, map[string]any{
		"server.address": "vllm-0.example", "server.port": int64(8000), "service.instance.id": "vllm-0.example:8000",
	}, rm.Resource().Attributes().AsRaw())
	assert.Equal(t, testScope, rm.ScopeMetrics().At(0).Scope().Name())

	// 36 families in the fixture, 16 of them _created gauges: 20 metrics,
	// 4 gauges, 6 counters, 10 histograms; 23 points (request_success has 4).
	require.Len(t, got, 20)
	types := map[pmetric.MetricType]int{}
	points := 0
	for _, m := range got {
		types[m.Type()]++
		switch m.Type() {
		case pmetric.MetricTypeGauge:
			points += m.Gauge().DataPoints().Len()
		case pmetric.MetricTypeSum:
			points += m.Sum().DataPoints().Len()
		case pmetric.MetricTypeHistogram:
			points += m.Histogram().DataPoints().Len()
		}
		assert.False(t, strings.HasSuffix(m.Name(), "_created"), m.Name())
		assert.NotEmpty(t, m.Description(), m.Name())
	}
	assert.Equal(t, map[pmetric.MetricType]int{pmetric.MetricTypeGauge: 4, pmetric.MetricTypeSum: 6, pmetric.MetricTypeHistogram: 10}, types)
	assert.Equal(t, 23, points)

	// Gauge: vllm:kv_cache_usage_perc 0.4178, at the scrape time, no start.
	kv := got["vllm:kv_cache_usage_perc"]
	assert.Equal(t, "KV-cache usage. 1 means 100 percent usage.", kv.Description())
	dp := kv.Gauge().DataPoints().At(0)
	assert.Equal(t, 0.4178, dp.DoubleValue())
	assert.Equal(t, attrs, dp.Attributes().AsRaw())
	assert.Equal(t, scrape, dp.Timestamp())
	assert.Zero(t, dp.StartTimestamp())

	// Info gauge: 15 labels, value 1.
	info := got["vllm:cache_config_info"].Gauge().DataPoints().At(0)
	assert.Equal(t, 1.0, info.DoubleValue())
	assert.Equal(t, 15, info.Attributes().Len())
	for k, v := range map[string]string{"block_size": "16", "num_gpu_blocks": "29127", "swap_space_bytes": "4294967296", "num_cpu_blocks": "None"} {
		got, _ := info.Attributes().Get(k)
		assert.Equal(t, v, got.Str(), k)
	}

	// Counters: cumulative, monotonic, named x_total, start from x_created.
	for name, want := range map[string]float64{
		"vllm:prefix_cache_queries_total": 186556, "vllm:prefix_cache_hits_total": 57824,
		"vllm:num_preemptions_total": 4, "vllm:prompt_tokens_total": 186556, "vllm:generation_tokens_total": 46272,
	} {
		s := got[name].Sum()
		assert.True(t, s.IsMonotonic(), name)
		assert.Equal(t, pmetric.AggregationTemporalityCumulative, s.AggregationTemporality(), name)
		require.Equal(t, 1, s.DataPoints().Len(), name)
		assert.Equal(t, want, s.DataPoints().At(0).DoubleValue(), name)
		assert.Equal(t, counterStart, s.DataPoints().At(0).StartTimestamp(), name)
		assert.Equal(t, scrape, s.DataPoints().At(0).Timestamp(), name)
		assert.Equal(t, attrs, s.DataPoints().At(0).Attributes().AsRaw(), name)
	}
	succ := got["vllm:request_success_total"]
	for reason, want := range map[string]float64{"stop": 161, "length": 39, "abort": 0, "error": 0} {
		dp := sumPointWith(t, succ, "finished_reason", reason)
		assert.Equal(t, want, dp.DoubleValue(), reason)
		assert.Equal(t, counterStart, dp.StartTimestamp(), reason)
		assert.Equal(t, 3, dp.Attributes().Len(), reason)
	}

	// Histograms, de-cumulated by hand from the fixture's _bucket lines.
	type hist struct {
		bounds []float64
		counts []uint64
		count  uint64
		sum    float64
	}
	phase := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	for name, want := range map[string]hist{
		// cumulative 0,0,0,0,0,0,55,89,161,200,200 | +Inf 200
		"vllm:request_generation_tokens": {
			bounds: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000},
			counts: []uint64{0, 0, 0, 0, 0, 0, 55, 34, 72, 39, 0, 0},
			count:  200, sum: 46272,
		},
		// cumulative 399,41397,45871,45871,45871,45871,45898,45949,45984,
		// 46019,46072 and 46072 up to 80 | +Inf 46072
		"vllm:inter_token_latency_seconds": {
			bounds: []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80},
			counts: []uint64{399, 40998, 4474, 0, 0, 0, 27, 51, 35, 35, 53, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			count:  46072, sum: 928.80172,
		},
		// cumulative 0,192,200,... | +Inf 200
		"vllm:request_time_per_output_token_seconds": {
			bounds: []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80},
			counts: []uint64{0, 192, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			count:  200, sum: 4.015071,
		},
		// cumulative 0,0,0,0,41,54,66,109,169,200,... | +Inf 200
		"vllm:e2e_request_latency_seconds": {
			bounds: phase,
			counts: []uint64{0, 0, 0, 0, 41, 13, 12, 43, 60, 31, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			count:  200, sum: 962.209961,
		},
		// cumulative 184,189,197,198,198,199,200,... | +Inf 200
		"vllm:request_queue_time_seconds": {
			bounds: phase,
			counts: []uint64{184, 5, 8, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			count:  200, sum: 18.991535,
		},
		// all 200 in the first bucket
		"vllm:request_prefill_time_seconds": {
			bounds: phase,
			counts: []uint64{200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			count:  200, sum: 13.416706,
		},
		// cumulative 0,0,0,0,48,55,78,117,175,200,... | +Inf 200
		"vllm:request_decode_time_seconds": {
			bounds: phase,
			counts: []uint64{0, 0, 0, 0, 48, 7, 23, 39, 58, 25, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			count:  200, sum: 928.80172,
		},
	} {
		m := got[name]
		require.Equal(t, pmetric.MetricTypeHistogram, m.Type(), name)
		h := m.Histogram()
		assert.Equal(t, pmetric.AggregationTemporalityCumulative, h.AggregationTemporality(), name)
		require.Equal(t, 1, h.DataPoints().Len(), name)
		dp := h.DataPoints().At(0)
		assert.Equal(t, want.bounds, dp.ExplicitBounds().AsRaw(), name)
		assert.Equal(t, want.counts, dp.BucketCounts().AsRaw(), name)
		assert.Equal(t, want.count, dp.Count(), name)
		assert.True(t, dp.HasSum(), name)
		assert.Equal(t, want.sum, dp.Sum(), name)
		assert.False(t, dp.HasMin(), name)
		assert.False(t, dp.HasMax(), name)
		assert.Equal(t, histStart, dp.StartTimestamp(), name)
		assert.Equal(t, scrape, dp.Timestamp(), name)
		assert.Equal(t, attrs, dp.Attributes().AsRaw(), name)
	}
}

// olderNamesBody is an exposition of the deprecated names of vLLM 0.7-0.10
// (and one V0 gauge), next to their replacement where there is one.
const olderNamesBody = `# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.0532
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0532
# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 7168.0
# HELP vllm:gpu_prefix_cache_queries_created GPU prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:gpu_prefix_cache_queries_created gauge
vllm:gpu_prefix_cache_queries_created{engine="0",model_name="m"} 1753990000.25
# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 2048.0
# HELP vllm:gpu_prefix_cache_hits_created GPU prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:gpu_prefix_cache_hits_created gauge
vllm:gpu_prefix_cache_hits_created{engine="0",model_name="m"} 1753990000.25
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.2857
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 0.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.025",model_name="m"} 310.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.05",model_name="m"} 1190.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.075",model_name="m"} 1190.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1195.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.15",model_name="m"} 1196.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.2",model_name="m"} 1196.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.3",model_name="m"} 1198.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.4",model_name="m"} 1198.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 1198.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.75",model_name="m"} 1199.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 1199.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="2.5",model_name="m"} 1199.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1199.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 1199.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 37.5125
# HELP vllm:time_per_output_token_seconds_created Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds_created gauge
vllm:time_per_output_token_seconds_created{engine="0",model_name="m"} 1753990000.5
`

func TestVLLMGoldenOlderNames(t *testing.T) {
	md := convertBody(t, goldenConverter(t), olderNamesBody, textContentType, goldenScrape)
	checkGolden(t, "vllm_older_names.yaml", md)
	if *updateVLLMGolden {
		return
	}

	// Each name passes through under its own name, old next to new.
	_, got := readGolden(t, "vllm_older_names.yaml")
	names := make([]string, 0, len(got))
	for name := range got {
		names = append(names, name)
	}
	assert.ElementsMatch(t, []string{
		"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
		"vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total",
		"vllm:gpu_prefix_cache_hit_rate", "vllm:time_per_output_token_seconds",
	}, names)

	assert.Equal(t, 0.0532, got["vllm:gpu_cache_usage_perc"].Gauge().DataPoints().At(0).DoubleValue())
	assert.Equal(t, "GPU KV-cache usage. 1 means 100 percent usage.", got["vllm:gpu_cache_usage_perc"].Description())
	assert.Equal(t, 0.2857, got["vllm:gpu_prefix_cache_hit_rate"].Gauge().DataPoints().At(0).DoubleValue())
	assert.Equal(t, map[string]any{"model_name": "m"}, got["vllm:gpu_prefix_cache_hit_rate"].Gauge().DataPoints().At(0).Attributes().AsRaw())

	start := pcommon.Timestamp(1753990000_250000000)
	for name, want := range map[string]float64{"vllm:gpu_prefix_cache_queries_total": 7168, "vllm:gpu_prefix_cache_hits_total": 2048} {
		require.Equal(t, pmetric.MetricTypeSum, got[name].Type(), name)
		dp := got[name].Sum().DataPoints().At(0)
		assert.Equal(t, want, dp.DoubleValue(), name)
		assert.Equal(t, start, dp.StartTimestamp(), name)
	}

	// cumulative 0,310,1190,1190,1195,1196,1196,1198,1198,1198,1199,1199,
	// 1199 | +Inf 1199
	tpot := got["vllm:time_per_output_token_seconds"]
	require.Equal(t, pmetric.MetricTypeHistogram, tpot.Type())
	dp := tpot.Histogram().DataPoints().At(0)
	assert.Equal(t, []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}, dp.ExplicitBounds().AsRaw())
	assert.Equal(t, []uint64{0, 310, 880, 0, 5, 1, 0, 2, 0, 0, 1, 0, 0, 0}, dp.BucketCounts().AsRaw())
	assert.Equal(t, uint64(1199), dp.Count())
	assert.Equal(t, 37.5125, dp.Sum())
	assert.Equal(t, pcommon.Timestamp(1753990000_500000000), dp.StartTimestamp())
}

// dataParallelBody is the exposition of a data-parallel deployment of two
// engines (--data-parallel-size 2): every series once per engine label.
const dataParallelBody = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 12.0
vllm:num_requests_running{engine="1",model_name="m"} 9.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 46272.0
vllm:generation_tokens_total{engine="1",model_name="m"} 39001.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="m"} 1754000000.0123
vllm:generation_tokens_created{engine="1",model_name="m"} 1754000003.5
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 98.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 187.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 200.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 200.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 33.208241
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 40.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="m"} 150.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 170.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 170.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 41.5
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="m"} 1754000000.0456
vllm:time_to_first_token_seconds_created{engine="1",model_name="m"} 1754000003.75
`

func TestVLLMGoldenDataParallel(t *testing.T) {
	md := convertBody(t, goldenConverter(t), dataParallelBody, textContentType, goldenScrape)
	checkGolden(t, "vllm_data_parallel.yaml", md)
	if *updateVLLMGolden {
		return
	}

	_, got := readGolden(t, "vllm_data_parallel.yaml")
	require.Len(t, got, 3)
	run := got["vllm:num_requests_running"]
	require.Equal(t, 2, run.Gauge().DataPoints().Len())
	assert.Equal(t, 12.0, gaugePointWith(t, run, "engine", "0").DoubleValue())
	assert.Equal(t, 9.0, gaugePointWith(t, run, "engine", "1").DoubleValue())

	gen := got["vllm:generation_tokens_total"]
	require.Equal(t, 2, gen.Sum().DataPoints().Len())
	dp0, dp1 := sumPointWith(t, gen, "engine", "0"), sumPointWith(t, gen, "engine", "1")
	assert.Equal(t, 46272.0, dp0.DoubleValue())
	assert.Equal(t, 39001.0, dp1.DoubleValue())
	assert.Equal(t, pcommon.Timestamp(1754000000_012300000), dp0.StartTimestamp())
	assert.Equal(t, pcommon.Timestamp(1754000003_500000000), dp1.StartTimestamp())

	ttft := got["vllm:time_to_first_token_seconds"]
	require.Equal(t, 2, ttft.Histogram().DataPoints().Len())
	h0, h1 := histPointOfEngine(t, ttft, "0"), histPointOfEngine(t, ttft, "1")
	assert.Equal(t, []float64{0.1, 0.5}, h0.ExplicitBounds().AsRaw())
	assert.Equal(t, []uint64{98, 89, 13}, h0.BucketCounts().AsRaw())
	assert.Equal(t, uint64(200), h0.Count())
	assert.Equal(t, 33.208241, h0.Sum())
	assert.Equal(t, pcommon.Timestamp(1754000000_045600000), h0.StartTimestamp())
	assert.Equal(t, []float64{0.1, 0.5}, h1.ExplicitBounds().AsRaw())
	assert.Equal(t, []uint64{40, 110, 20}, h1.BucketCounts().AsRaw())
	assert.Equal(t, uint64(170), h1.Count())
	assert.Equal(t, 41.5, h1.Sum())
	assert.Equal(t, pcommon.Timestamp(1754000003_750000000), h1.StartTimestamp())
}

// multiprocessBody rewrites a single-process exposition as prometheus_client
// writes it in multiprocess mode (vLLM with --api-server-count > 1): no
// _created series, and the _count and _sum lines of a histogram before its
// _bucket lines (the bucket lines of all the series of a family come last).
func multiprocessBody(body string) string {
	var out, buckets []string
	for line := range strings.SplitSeq(body, "\n") {
		f := strings.Fields(line)
		name := ""
		switch {
		case len(f) >= 3 && f[0] == "#" && (f[1] == "HELP" || f[1] == "TYPE"):
			name = f[2]
		case len(f) > 0 && f[0] != "#":
			name, _, _ = strings.Cut(f[0], "{")
		}
		switch {
		case strings.HasSuffix(name, "_created"):
		case strings.HasSuffix(name, "_bucket"):
			buckets = append(buckets, line)
		case strings.HasPrefix(line, "#") || line == "":
			out = append(out, buckets...)
			buckets = nil
			out = append(out, line)
		default:
			out = append(out, line)
		}
	}
	out = append(out, buckets...)
	return strings.Join(out, "\n")
}

// hasCreatedSeries tells whether an exposition declares or exposes a
// _created series (the fixture's header comment mentions them).
func hasCreatedSeries(body string) bool {
	for line := range strings.SplitSeq(body, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "#" && (f[1] == "HELP" || f[1] == "TYPE") && strings.HasSuffix(f[2], "_created") {
			return true
		}
		if len(f) > 0 && f[0] != "#" && strings.Contains(f[0], "_created") {
			return true
		}
	}
	return false
}

// withStart sets the start time of every sum and histogram point of md.
func withStart(md pmetric.Metrics, start pcommon.Timestamp) {
	for _, m := range md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().All() {
		switch m.Type() {
		case pmetric.MetricTypeSum:
			for _, dp := range m.Sum().DataPoints().All() {
				dp.SetStartTimestamp(start)
			}
		case pmetric.MetricTypeHistogram:
			for _, dp := range m.Histogram().DataPoints().All() {
				dp.SetStartTimestamp(start)
			}
		}
	}
}

func TestVLLMMultiprocessMatchesGolden(t *testing.T) {
	if *updateVLLMGolden {
		t.Skip("golden files being rewritten")
	}
	mp := multiprocessBody(string(fixtureBytes(t)))
	// The rewrite did what it says.
	require.False(t, hasCreatedSeries(mp))
	sumAt := strings.Index(mp, "vllm:request_prompt_tokens_sum{")
	countAt := strings.Index(mp, "vllm:request_prompt_tokens_count{")
	bucketAt := strings.Index(mp, "vllm:request_prompt_tokens_bucket{")
	require.Positive(t, sumAt)
	require.Positive(t, countAt)
	require.Less(t, sumAt, bucketAt)
	require.Less(t, countAt, bucketAt)

	c := goldenConverter(t)
	md := convertBody(t, c, mp, textContentType, goldenScrape)

	// The same metrics as the golden file, start times aside: without
	// _created they are the first scrape.
	want, err := golden.ReadMetrics(filepath.Join(vllmGoldenDir, "vllm_metrics_v1.yaml"))
	require.NoError(t, err)
	withStart(want, pcommon.NewTimestampFromTime(goldenScrape))
	require.NoError(t, pmetrictest.CompareMetrics(want, md,
		pmetrictest.IgnoreMetricsOrder(), pmetrictest.IgnoreMetricDataPointsOrder()))

	// A later scrape keeps the first scrape as the start.
	later := goldenScrape.Add(15 * time.Second)
	md = convertBody(t, c, mp, textContentType, later)
	want, err = golden.ReadMetrics(filepath.Join(vllmGoldenDir, "vllm_metrics_v1.yaml"))
	require.NoError(t, err)
	withStart(want, pcommon.NewTimestampFromTime(goldenScrape))
	require.NoError(t, pmetrictest.CompareMetrics(want, md,
		pmetrictest.IgnoreMetricsOrder(), pmetrictest.IgnoreMetricDataPointsOrder(), pmetrictest.IgnoreTimestamp()))
	got := metricsByName(t, md)
	dp := got["vllm:e2e_request_latency_seconds"].Histogram().DataPoints().At(0)
	assert.Equal(t, pcommon.NewTimestampFromTime(later), dp.Timestamp())
	assert.Equal(t, pcommon.NewTimestampFromTime(goldenScrape), dp.StartTimestamp())
}

func TestVLLMMultiprocessDataParallel(t *testing.T) {
	mp := multiprocessBody(dataParallelBody)
	require.False(t, hasCreatedSeries(mp))
	c := NewConverter(testScope, nil)
	t1, t2 := time.Unix(1754000600, 0), time.Unix(1754000615, 0)

	got := metricsByName(t, convertBody(t, c, mp, textContentType, t1))
	ttft := got["vllm:time_to_first_token_seconds"]
	require.Equal(t, 2, ttft.Histogram().DataPoints().Len())
	h0, h1 := histPointOfEngine(t, ttft, "0"), histPointOfEngine(t, ttft, "1")
	assert.Equal(t, []uint64{98, 89, 13}, h0.BucketCounts().AsRaw())
	assert.Equal(t, []uint64{40, 110, 20}, h1.BucketCounts().AsRaw())
	assert.Equal(t, 41.5, h1.Sum())
	for _, dp := range []pmetric.HistogramDataPoint{h0, h1} {
		assert.Equal(t, pcommon.NewTimestampFromTime(t1), dp.StartTimestamp())
	}

	// Engine 1 restarts (its series go down), engine 0 goes on: only
	// engine 1's series start again.
	restarted := strings.NewReplacer(
		`vllm:generation_tokens_total{engine="1",model_name="m"} 39001.0`, `vllm:generation_tokens_total{engine="1",model_name="m"} 12.0`,
		`vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 40.0`, `vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 1.0`,
		`vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="m"} 150.0`, `vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="m"} 1.0`,
		`vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 170.0`, `vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 1.0`,
		`vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 170.0`, `vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 1.0`,
		`vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 41.5`, `vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0.05`,
	).Replace(mp)
	require.NotEqual(t, mp, restarted)
	got = metricsByName(t, convertBody(t, c, restarted, textContentType, t2))
	gen := got["vllm:generation_tokens_total"]
	assert.Equal(t, pcommon.NewTimestampFromTime(t1), sumPointWith(t, gen, "engine", "0").StartTimestamp())
	assert.Equal(t, pcommon.NewTimestampFromTime(t2), sumPointWith(t, gen, "engine", "1").StartTimestamp())
	ttft = got["vllm:time_to_first_token_seconds"]
	assert.Equal(t, pcommon.NewTimestampFromTime(t1), histPointOfEngine(t, ttft, "0").StartTimestamp())
	h1 = histPointOfEngine(t, ttft, "1")
	assert.Equal(t, pcommon.NewTimestampFromTime(t2), h1.StartTimestamp())
	assert.Equal(t, []uint64{1, 0, 0}, h1.BucketCounts().AsRaw())
}
