// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"math"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/otelcol-llm/otelcol-llm/internal/promconv"
)

// Data-parallel ranks of one engine (vLLM's engine label) add up: KV usage
// is the fullest rank's, counts are summed. Older metric names and other
// engines are read the same way.
func TestEngineStatesObserve(t *testing.T) {
	md := pmetric.NewMetrics()
	// Build explicitly: one vLLM engine with two ranks (older KV name), one SGLang engine.
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("server.address", "10.0.0.1")
	rm.Resource().Attributes().PutInt("server.port", 8000)
	ms := rm.ScopeMetrics().AppendEmpty().Metrics()
	kv := ms.AppendEmpty()
	kv.SetName("vllm:gpu_cache_usage_perc")
	for i, v := range []float64{0.4, 0.7} {
		dp := kv.SetEmptyGauge().DataPoints().AppendEmpty()
		if i > 0 {
			dp = kv.Gauge().DataPoints().AppendEmpty()
		}
		dp.Attributes().PutStr("engine", string(rune('0'+i)))
		dp.SetTimestamp(1000)
		dp.SetDoubleValue(v)
	}
	wait := ms.AppendEmpty()
	wait.SetName("vllm:num_requests_waiting")
	wg := wait.SetEmptyGauge()
	for _, v := range []float64{3, 4} {
		dp := wg.DataPoints().AppendEmpty()
		dp.SetTimestamp(1000)
		dp.SetDoubleValue(v)
	}
	rm2 := md.ResourceMetrics().AppendEmpty()
	rm2.Resource().Attributes().PutStr("service.instance.id", "sglang-0:30000")
	m := rm2.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("sglang:token_usage")
	dp := m.SetEmptyGauge().DataPoints().AppendEmpty()
	dp.SetTimestamp(2000)
	dp.SetDoubleValue(0.25)
	other := rm2.ScopeMetrics().At(0).Metrics().AppendEmpty()
	other.SetName("process_cpu_seconds_total")
	other.SetEmptyGauge().DataPoints().AppendEmpty().SetDoubleValue(1)

	var e engineStates
	e.observe(md, 5000)
	require.Len(t, e.byInstance, 2)
	v := e.byInstance["10.0.0.1:8000"]
	require.NotNil(t, v)
	assert.Equal(t, "vllm", v.prefix)
	sn, ok := v.at(1000)
	require.True(t, ok)
	assert.Equal(t, 0.7, sn.values[roleKVUsage])
	assert.Equal(t, 7.0, sn.values[roleWaiting])
	assert.True(t, math.IsNaN(sn.values[roleRunning]))
	s := e.byInstance["sglang-0:30000"]
	require.NotNil(t, s)
	assert.Equal(t, "sglang", s.prefix)

	// A session names its engine; with two engines, an unknown name matches none.
	assert.Same(t, v, e.match("10.0.0.1:8000"))
	assert.Same(t, s, e.match("sglang-0:30000"))
	assert.Nil(t, e.match("vllm-7"))
}

func TestEngineHistoryBounded(t *testing.T) {
	var h engineHistory
	for i := range engineHistoryLen + 10 {
		h.add(engineSnapshot{at: int64(i)})
	}
	assert.Len(t, h.ring, engineHistoryLen)
	first, _ := h.at(0)
	assert.Equal(t, int64(10), first.at, "the oldest kept, when asked for a time before it")
	last, _ := h.at(math.MaxInt64)
	assert.Equal(t, int64(engineHistoryLen+9), last.at)
}

// SGLang's num_retractions is a histogram of retractions per request: its
// sum is the engine's retraction count, read like vLLM's pre-emptions.
func TestEngineStatesSGLangRetractions(t *testing.T) {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.instance.id", "sglang-0:30000")
	m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("sglang:num_retractions")
	dp := m.SetEmptyHistogram().DataPoints().AppendEmpty()
	dp.SetTimestamp(1000)
	dp.SetCount(40) // finished requests
	dp.SetSum(7)    // retractions among them
	var e engineStates
	e.observe(md, 5000)
	sn, ok := e.byInstance["sglang-0:30000"].at(1000)
	require.True(t, ok)
	assert.Equal(t, 7.0, sn.values[rolePreemptions])
}

// llama.cpp's /metrics as its source writes it (testdata/fixtures/llamacpp),
// scraped as the vllm source scrapes it: running and waiting from every
// version, KV usage only from a server that still exposes it (b5440 and
// before); a current one (v0.5.0) has none, and none is made up.
func TestEngineStatesLlamaCpp(t *testing.T) {
	for _, tt := range []struct {
		fixture string
		kv      float64
	}{
		{"metrics-v0.5.0.prom", math.NaN()},
		{"metrics-b5440.prom", 0.304688},
	} {
		t.Run(tt.fixture, func(t *testing.T) {
			body, err := os.ReadFile(filepath.Join("..", "..", "testdata", "fixtures", "llamacpp", tt.fixture))
			require.NoError(t, err)
			fams, _, err := promconv.ParseExposition(body, "text/plain; version=0.0.4")
			require.NoError(t, err)
			u, err := url.Parse("http://llama-0:8080/metrics")
			require.NoError(t, err)
			md := promconv.NewConverter("test", promconv.TargetResource(u)).Convert(fams, time.Unix(1790000000, 0))
			var e engineStates
			e.observe(md, int64(1790000000*time.Second))
			h := e.match("llama-0:8080")
			require.NotNil(t, h)
			assert.Equal(t, "llamacpp", h.prefix)
			sn, ok := h.at(math.MaxInt64)
			require.True(t, ok)
			assert.Equal(t, 4.0, sn.values[roleRunning], "requests_processing")
			assert.Equal(t, 3.0, sn.values[roleWaiting], "requests_deferred")
			if math.IsNaN(tt.kv) {
				assert.True(t, math.IsNaN(sn.values[roleKVUsage]), "no KV figure")
			} else {
				assert.Equal(t, tt.kv, sn.values[roleKVUsage], "kv_cache_usage_ratio")
			}
			assert.True(t, math.IsNaN(sn.values[rolePreemptions]))
		})
	}
}

// An engine no longer scraped (its pod went away) is forgotten after ten
// of its scrape intervals.
func TestEngineStatesPruned(t *testing.T) {
	scrape := func(id string, at int64) pmetric.Metrics {
		md := pmetric.NewMetrics()
		rm := md.ResourceMetrics().AppendEmpty()
		rm.Resource().Attributes().PutStr("service.instance.id", id)
		m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
		m.SetName("vllm:num_requests_running")
		m.SetEmptyGauge().DataPoints().AppendEmpty().SetTimestamp(pcommon.Timestamp(at))
		return md
	}
	const s = int64(time.Second)
	var e engineStates
	e.observe(scrape("gone", 1*s), 1*s)
	e.observe(scrape("gone", 2*s), 2*s) // scraped every second, then no more
	for at := int64(3); at <= 12; at++ {
		e.observe(scrape("live", at*s), at*s)
	}
	assert.Contains(t, e.byInstance, "gone", "10 s after its last scrape: not yet")
	e.observe(scrape("live", 13*s), 13*s)
	assert.NotContains(t, e.byInstance, "gone")
	assert.Contains(t, e.byInstance, "live")
}
