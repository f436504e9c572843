// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// engineExposition is a vLLM /metrics page (V1 names) with the figures the
// session should carry.
const engineExposition = `# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 31
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 3
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama"} 7
`

// TestEngineContextEndToEnd: the collector scrapes the engine's /metrics
// and a slow session's span carries the engine's state.
func TestEngineContextEndToEnd(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, engineExposition)
	}))
	defer engine.Close()
	s, sinkAddr := startSink(t)
	col := startCollector(t, "engine.yaml", sinkAddr, "METRICS_URL="+engine.URL+"/metrics")

	// The engine metrics reach the sink, so token_session has read them.
	require.Eventually(t, func() bool { _, ok := s.Metric("vllm:kv_cache_usage_perc"); return ok }, 30*time.Second, 20*time.Millisecond)

	base := time.Now().UnixNano()
	ms := int64(time.Millisecond)
	postLines(t, "http://"+col.httpAddr+"/v1/token-events",
		fmt.Sprintf(`{"event":"start","session_id":"e","time_unix_nano":%d,"model":"llama","operation":"chat","engine":"vllm-0"}`, base),
		fmt.Sprintf(`{"event":"token","session_id":"e","time_unix_nano":%d}`, base+700*ms),
		fmt.Sprintf(`{"event":"token","session_id":"e","time_unix_nano":%d}`, base+720*ms),
		fmt.Sprintf(`{"event":"end","session_id":"e","time_unix_nano":%d,"completion_tokens":2}`, base+730*ms),
	)
	require.Eventually(t, func() bool { return len(s.Spans()) == 1 }, 30*time.Second, 10*time.Millisecond)
	attrs := s.Spans()[0].Attributes().AsRaw()
	assert.Equal(t, 0.42, attrs["vllm.kv_cache_usage.start"])
	assert.Equal(t, 0.42, attrs["vllm.kv_cache_usage.max"])
	assert.Equal(t, 3.0, attrs["vllm.num_requests_waiting.start"])
	assert.Equal(t, int64(0), attrs["vllm.num_preemptions"])
}
