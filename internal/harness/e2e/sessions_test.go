// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// postLines posts a batch of hook lines and requires it taken.
func postLines(t *testing.T, url string, lines ...string) {
	t.Helper()
	require.NoError(t, postBatch(url, lines...))
}

// postBatch posts a batch of hook lines; from a goroutine, where require
// may not be used.
func postBatch(url string, lines ...string) error {
	resp, err := http.Post(url, "application/x-ndjson", strings.NewReader(strings.Join(lines, "\n"))) //nolint:gosec // the test's own collector on loopback
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("hook answered %s", resp.Status)
	}
	return nil
}

// sendEngineSpans sends one "llm_request" span per trace to the collector's
// otlp receiver, as vLLM's own tracing would.
func sendEngineSpans(t *testing.T, addr string, traces ...pcommon.TraceID) {
	t.Helper()
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "vllm-engine")
	ss := rs.ScopeSpans().AppendEmpty()
	for _, id := range traces {
		span := ss.Spans().AppendEmpty()
		span.SetName("llm_request")
		span.SetTraceID(id)
		span.SetSpanID(pcommon.SpanID{id[0], 0xee})
		span.SetStartTimestamp(pcommon.NewTimestampFromTime(time.Now()))
		span.SetEndTimestamp(pcommon.NewTimestampFromTime(time.Now()))
	}
	exportTraces(t, addr, td)
}

// exportTraces sends td to the collector's otlp receiver (gRPC) at addr.
func exportTraces(t *testing.T, addr string, td ptrace.Traces) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = ptraceotlp.NewGRPCClient(conn).Export(ctx, ptraceotlp.NewExportRequestFromTraces(td))
	require.NoError(t, err)
}

func recordNamed(s *sink, name string) []plog.LogRecord {
	var out []plog.LogRecord
	for _, lr := range s.LogRecords() {
		if lr.EventName() == name {
			out = append(out, lr)
		}
	}
	return out
}

func histogramTotals(m pmetric.Metric) (count uint64, sum float64) {
	for _, dp := range m.Histogram().DataPoints().All() {
		count += dp.Count()
		sum += dp.Sum()
	}
	return count, sum
}

// TestSessionsEndToEnd: token events through the hooks, token_session in
// all three pipelines, OTLP out. A slow session (TTFT 600 ms, then a stall)
// is sampled: its span, summary and stall alert arrive, with vLLM's span of
// the same trace released after being held. A normal session is not
// sampled: nothing of it arrives but its share of the metrics, and its
// engine span is dropped.
func TestSessionsEndToEnd(t *testing.T) {
	s, sinkAddr := startSink(t)
	col := startCollector(t, "sessions.yaml", sinkAddr)
	url := "http://" + col.httpAddr + "/v1/token-events"
	slowTrace := pcommon.TraceID{0x51, 0x0e, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	fastTrace := pcommon.TraceID{0xfa, 0x57, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	base := time.Now().UnixNano()
	ms := int64(time.Millisecond)
	line := fmt.Sprintf

	postLines(t, url,
		line(`{"event":"start","session_id":"slow","time_unix_nano":%d,"trace_id":"%s","span_id":"5105000000000001","model":"llama","operation":"chat","prompt_tokens":4000,"engine":"vllm-0"}`, base, slowTrace),
		line(`{"event":"start","session_id":"fast","time_unix_nano":%d,"trace_id":"%s","model":"llama","operation":"chat","prompt_tokens":20,"engine":"vllm-0"}`, base, fastTrace),
	)
	// The engine's spans arrive while the sessions run: both are held.
	sendEngineSpans(t, col.otlpAddr, slowTrace, fastTrace)

	// slow: TTFT 600 ms; gaps 20, 200, 200, 200 ms (a stall at the third
	// slow gap, at 1220 ms); 5 tokens; TPOT (1220-600)/4 = 155 ms.
	// fast: TTFT 50 ms; gaps 20, 20 ms; 3 tokens; TPOT 20 ms.
	postLines(t, url,
		line(`{"event":"token","session_id":"slow","time_unix_nano":%d}`, base+600*ms),
		line(`{"event":"token","session_id":"fast","time_unix_nano":%d}`, base+50*ms),
		line(`{"event":"token","session_id":"fast","time_unix_nano":%d}`, base+70*ms),
		line(`{"event":"token","session_id":"slow","time_unix_nano":%d}`, base+620*ms),
		line(`{"event":"token","session_id":"fast","time_unix_nano":%d}`, base+90*ms),
		line(`{"event":"end","session_id":"fast","time_unix_nano":%d,"completion_tokens":3,"finish_reason":"stop"}`, base+95*ms),
		line(`{"event":"token","session_id":"slow","time_unix_nano":%d}`, base+820*ms),
		line(`{"event":"token","session_id":"slow","time_unix_nano":%d}`, base+1020*ms),
		line(`{"event":"token","session_id":"slow","time_unix_nano":%d}`, base+1220*ms),
		line(`{"event":"end","session_id":"slow","time_unix_nano":%d,"completion_tokens":5,"finish_reason":"length"}`, base+1230*ms),
	)

	// Spans: the session span and the released engine span of the slow trace.
	require.Eventually(t, func() bool { return len(s.Spans()) >= 2 }, 30*time.Second, 10*time.Millisecond)
	var sessionSpan ptrace.Span
	for _, span := range s.Spans() {
		assert.Equal(t, slowTrace, span.TraceID(), "nothing of the unsampled trace, %s", span.Name())
		if span.Name() == "chat llama" {
			sessionSpan = span
		}
	}
	require.Equal(t, "chat llama", sessionSpan.Name())
	assert.Equal(t, pcommon.SpanID{0x51, 0x05, 0, 0, 0, 0, 0, 1}, sessionSpan.SpanID())
	assert.Equal(t, "ot=th:0", sessionSpan.TraceState().AsRaw())
	assert.Equal(t, pcommon.Timestamp(base), sessionSpan.StartTimestamp())
	assert.Equal(t, pcommon.Timestamp(base+1220*ms), sessionSpan.EndTimestamp())
	attrs := sessionSpan.Attributes().AsRaw()
	assert.InDelta(t, 0.6, attrs["llm.session.ttft"], 1e-9)
	assert.InDelta(t, 0.155, attrs["llm.session.tpot"], 1e-9)
	assert.Equal(t, int64(1), attrs["llm.session.stalls"])
	assert.Equal(t, int64(5), attrs["gen_ai.usage.output_tokens"])
	assert.Equal(t, int64(4000), attrs["gen_ai.usage.input_tokens"])
	assert.Equal(t, "ttft,tpot,stall", attrs["llm.session.sampling.reason"])
	require.Equal(t, 2, sessionSpan.Events().Len())
	assert.Equal(t, "llm.first_token", sessionSpan.Events().At(0).Name())
	assert.Equal(t, "llm.stall", sessionSpan.Events().At(1).Name())
	assert.Equal(t, pcommon.Timestamp(base+1220*ms), sessionSpan.Events().At(1).Timestamp())
	assert.Len(t, s.Spans(), 2)

	// Logs: one summary (slow) and one stall alert; no token events.
	require.Eventually(t, func() bool { return len(recordNamed(s, "llm.session.summary")) == 1 }, 30*time.Second, 10*time.Millisecond)
	sum := recordNamed(s, "llm.session.summary")[0]
	assert.Equal(t, plog.SeverityNumberWarn, sum.SeverityNumber())
	assert.Equal(t, "slow", sum.Attributes().AsRaw()["llm.session.id"])
	alerts := recordNamed(s, "llm.session.stall")
	require.Len(t, alerts, 1)
	assert.Equal(t, pcommon.Timestamp(base+1220*ms), alerts[0].Timestamp())
	assert.Equal(t, []any{0.2, 0.2, 0.2}, alerts[0].Attributes().AsRaw()["llm.stall.gaps"])
	assert.Len(t, s.LogRecords(), 2)

	// Metrics over both sessions: TTFT 0.6 + 0.05; ITL 2 + 4 gaps.
	require.Eventually(t, func() bool {
		m, ok := s.Metric("gen_ai.server.time_to_first_token")
		if !ok {
			return false
		}
		n, _ := histogramTotals(m)
		return n == 2
	}, 30*time.Second, 20*time.Millisecond)
	m, _ := s.Metric("gen_ai.server.time_to_first_token")
	_, ttftSum := histogramTotals(m)
	assert.InDelta(t, 0.65, ttftSum, 1e-9)
	m, ok := s.Metric("llm.session.inter_token_latency")
	require.True(t, ok)
	itlCount, itlSum := histogramTotals(m)
	assert.Equal(t, uint64(6), itlCount)
	assert.InDelta(t, 0.02+0.02+0.02+0.2+0.2+0.2, itlSum, 1e-9)
	m, ok = s.Metric("llm.sessions")
	require.True(t, ok)
	sampled := map[bool]int64{}
	for _, dp := range m.Sum().DataPoints().All() {
		v, _ := dp.Attributes().Get("llm.session.sampled")
		sampled[v.Bool()] += dp.IntValue()
	}
	assert.Equal(t, map[bool]int64{true: 1, false: 1}, sampled)
}
