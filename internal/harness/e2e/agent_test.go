// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// sendSpans sends spans of one service, in trace, to the collector's otlp
// receiver; each name gets a span parented on parent.
func sendSpans(t *testing.T, addr, service string, trace pcommon.TraceID, parent pcommon.SpanID, names ...string) {
	t.Helper()
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", service)
	ss := rs.ScopeSpans().AppendEmpty()
	for i, name := range names {
		span := ss.Spans().AppendEmpty()
		span.SetName(name)
		span.SetTraceID(trace)
		span.SetSpanID(pcommon.SpanID{byte(len(service)), byte(i + 1), 0xa9})
		span.SetParentSpanID(parent)
		span.SetStartTimestamp(pcommon.NewTimestampFromTime(time.Now()))
		span.SetEndTimestamp(pcommon.NewTimestampFromTime(time.Now()))
	}
	exportTraces(t, addr, td)
}

// TestAgentTraceEndToEnd: an agent calls the model three times in one
// trace, one call after the other; the first call is slow. vLLM's spans of
// the calls, the gateway's span and the root span arrive 5 s after the
// last call ended (batch exporters): every one of them is kept, with the
// sessions of the two normal calls, and every kept span carries the same
// ot=th.
func TestAgentTraceEndToEnd(t *testing.T) {
	s, sinkAddr := startSink(t)
	col := startCollector(t, "sessions.yaml", sinkAddr)
	url := "http://" + col.httpAddr + "/v1/token-events"
	trace := pcommon.TraceID{0xa9, 0xe7, 0x17, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}
	root, gateway := pcommon.SpanID{0x70, 0x07}, pcommon.SpanID{0x9a, 0x7e}
	ms := int64(time.Millisecond)
	base := time.Now().UnixNano()
	call := func(n int, at, ttft int64) {
		id := fmt.Sprintf("call-%d", n)
		postLines(t, url,
			fmt.Sprintf(`{"event":"start","session_id":%q,"time_unix_nano":%d,"trace_id":"%s","span_id":"5e5510000000000%d","parent_span_id":"%s","model":"llama","operation":"chat","engine":"vllm-0"}`, id, at, trace, n, gateway),
			fmt.Sprintf(`{"event":"token","session_id":%q,"time_unix_nano":%d}`, id, at+ttft),
			fmt.Sprintf(`{"event":"token","session_id":%q,"time_unix_nano":%d}`, id, at+ttft+20*ms),
			fmt.Sprintf(`{"event":"end","session_id":%q,"time_unix_nano":%d,"completion_tokens":2,"finish_reason":"stop"}`, id, at+ttft+20*ms),
		)
	}
	call(1, base, 900*ms)
	call(2, base+1000*ms, 40*ms)
	call(3, base+2000*ms, 40*ms)
	require.Eventually(t, func() bool { return len(s.Spans()) >= 3 }, 30*time.Second, 10*time.Millisecond)

	time.Sleep(5 * time.Second)
	sendSpans(t, col.otlpAddr, "vllm-engine", trace, pcommon.SpanID{0x5e, 0x55, 0x10}, "llm_request 1", "llm_request 2", "llm_request 3")
	sendSpans(t, col.otlpAddr, "gateway", trace, root, "POST /v1/chat/completions")
	sendSpans(t, col.otlpAddr, "agent", trace, pcommon.SpanID{}, "agent run")

	require.Eventually(t, func() bool { return len(s.Spans()) >= 8 }, 30*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // nothing more must come
	spans := s.Spans()
	names := make([]string, len(spans))
	reasons := map[string]any{}
	for i, span := range spans {
		names[i] = span.Name()
		assert.Equal(t, trace, span.TraceID())
		assert.Equal(t, "ot=th:0", span.TraceState().AsRaw(), "%s: every kept span carries the trace's threshold", span.Name())
		if id, ok := span.Attributes().Get("llm.session.id"); ok {
			reasons[id.Str()] = span.Attributes().AsRaw()["llm.session.sampling.reason"]
		}
	}
	assert.ElementsMatch(t, []string{
		"chat llama", "chat llama", "chat llama", "llm_request 1", "llm_request 2", "llm_request 3",
		"POST /v1/chat/completions", "agent run",
	}, names)
	assert.Equal(t, map[string]any{"call-1": "ttft", "call-2": "trace", "call-3": "trace"}, reasons)
}
