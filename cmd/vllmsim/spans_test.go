// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/otelcol-llm/otelcol-llm/cmd/vllmsim/internal/sim"
)

// otlpSink is an OTLP/HTTP traces endpoint that keeps the spans it gets.
type otlpSink struct {
	*httptest.Server
	mu    sync.Mutex
	spans []ptrace.Span
}

func newOTLPSink(t *testing.T) *otlpSink {
	s := &otlpSink{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want protobuf on /v1/traces", http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(r.Body)
		req := ptraceotlp.NewExportRequest()
		if err := req.UnmarshalProto(body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		for _, rs := range req.Traces().ResourceSpans().All() {
			for _, ss := range rs.ScopeSpans().All() {
				for _, sp := range ss.Spans().All() {
					s.spans = append(s.spans, sp)
				}
			}
		}
		s.mu.Unlock()
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *otlpSink) got() []ptrace.Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ptrace.Span(nil), s.spans...)
}

// With -otlp-traces-endpoint the simulator sends vLLM's llm_request span of
// each request, parented on its traceparent, with the engine's true split;
// with -enable-per-request-metrics the final usage chunk carries the same
// split in vLLM's per-request metrics object.
func TestSpansAndPerRequestMetrics(t *testing.T) {
	sink := newOTLPSink(t)
	base := startSim(t, "-otlp-traces-endpoint", sink.URL, "-otlp-traces-delay", "50ms", "-enable-per-request-metrics")
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(
		`{"model":"`+model+`","messages":[{"role":"user","content":"hello there"}],"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}`))
	require.NoError(t, err)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	data := sseData(t, resp.Body)
	resp.Body.Close()

	var final struct {
		Metrics map[string]*float64 `json:"metrics"`
	}
	require.NoError(t, json.Unmarshal([]byte(data[len(data)-2]), &final), "the usage chunk, before [DONE]")
	for _, k := range []string{"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second"} {
		require.NotNil(t, final.Metrics[k], k)
		assert.GreaterOrEqual(t, *final.Metrics[k], 0.0, k)
	}

	require.Eventually(t, func() bool { return len(sink.got()) == 1 }, 5*time.Second, 10*time.Millisecond)
	span := sink.got()[0]
	assert.Equal(t, "llm_request", span.Name())
	assert.Equal(t, ptrace.SpanKindServer, span.Kind())
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", span.TraceID().String())
	assert.Equal(t, pcommon.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, span.ParentSpanID())
	a := span.Attributes().AsRaw()
	assert.Equal(t, int64(6), a["gen_ai.usage.completion_tokens"])
	assert.Equal(t, model, a["gen_ai.response.model"])
	sec := func(k string) float64 { return a[k].(float64) }
	ms := func(k string) float64 { return *final.Metrics[k] / 1000 }
	assert.InDelta(t, ms("queue_time_ms"), sec("gen_ai.latency.time_in_queue"), 1e-9, "one truth, two reports")
	assert.InDelta(t, ms("time_to_first_token_ms"), sec("gen_ai.latency.time_in_model_prefill"), 1e-9)
	assert.InDelta(t, ms("generation_time_ms"), sec("gen_ai.latency.time_in_model_decode"), 1e-9)
	assert.InDelta(t, sec("gen_ai.latency.time_in_queue")+sec("gen_ai.latency.time_in_model_prefill"),
		sec("gen_ai.latency.time_to_first_token"), 1e-9)
	assert.LessOrEqual(t, sec("gen_ai.latency.time_to_first_token"), sec("gen_ai.latency.e2e"))
}

// The truth file names each request's trace (from its traceparent), the key
// a demo joins it on with the client's and the collector's records; a
// request without a traceparent has none.
func TestTimingLogNamesTheTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timings.ndjson")
	l := &timingLog{path: path}
	l.Finished(&sim.Request{ID: "traced", Params: sim.Params{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}, "stop", time.Now())
	l.Finished(&sim.Request{ID: "untraced"}, "abort", time.Now())
	require.NoError(t, l.close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var got []timingRecord
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		var r timingRecord
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		got = append(got, r)
	}
	require.Len(t, got, 2)
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", got[0].TraceID)
	assert.Equal(t, "stop", got[0].Finish)
	assert.Empty(t, got[1].TraceID)
	assert.Equal(t, -1.0, got[1].QueueS, "never scheduled")
}
