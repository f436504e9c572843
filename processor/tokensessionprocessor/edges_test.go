// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"testing"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// Session semantics at the edges, through the processor's
// pipelines: what a user sees in spans, summaries and metrics.

// spansOf builds a traces batch of one service with a span per name, all in
// trace, parented on parent.
func spansOf(service string, trace pcommon.TraceID, parent pcommon.SpanID, names ...string) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", service)
	ss := rs.ScopeSpans().AppendEmpty()
	for i, name := range names {
		span := ss.Spans().AppendEmpty()
		span.SetTraceID(trace)
		span.SetSpanID(pcommon.SpanID{byte(len(service)), byte(i + 1), byte(len(name))})
		span.SetParentSpanID(parent)
		span.SetName(name)
	}
	return td
}

// An agent calls the model three times in one trace; the first call is
// slow. The engine's span of each call arrives seconds later (vLLM's batch
// exporter), the gateway's and the root span after the last call: every one
// of them is kept, each with the trace's one threshold, and so are the
// session spans of the later, normal calls.
func TestAgentTraceKeptWhole(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 1 })
	defer p.shutdown(t)
	ctx := context.Background()
	trace := pcommon.TraceID{0xa9, 0xe7, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 1} // below the 1% draw
	call := func(id string, at, ttft int64) {
		evs := []tokenevent.Event{start(id, trace, at), tok(id, at+ttft, 1), tok(id, at+ttft+20*ms, 1), end(id, at+ttft+20*ms)}
		require.NoError(t, p.logs.ConsumeLogs(ctx, events(evs...)))
	}
	call("call-1", base, 900*ms)
	call("call-2", base+2000*ms, 50*ms)
	require.NoError(t, p.traces.ConsumeTraces(ctx, spansOf("vllm", trace, pcommon.SpanID{0x5e, 6}, "llm_request call-1")))
	call("call-3", base+4000*ms, 50*ms)
	require.NoError(t, p.traces.ConsumeTraces(ctx, spansOf("vllm", trace, pcommon.SpanID{0x5e, 6}, "llm_request call-2", "llm_request call-3")))
	require.NoError(t, p.traces.ConsumeTraces(ctx, spansOf("gateway", trace, pcommon.SpanID{0x01}, "POST /v1/chat/completions", "agent run")))

	spans := allSpans(p.trcSink.AllTraces())
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.Name()
	}
	require.Len(t, spans, 8, "3 session spans, 3 engine spans, 2 gateway spans: %v", names)
	for _, s := range spans {
		assert.Equal(t, "ot=th:0", s.TraceState().AsRaw(), s.Name())
	}
	reasons := map[string]any{}
	for _, s := range spans {
		if id, ok := s.Attributes().Get("llm.session.id"); ok {
			reasons[id.Str()] = s.Attributes().AsRaw()[attrSamplingReason]
		}
	}
	assert.Equal(t, map[string]any{"call-1": "ttft", "call-2": "trace", "call-3": "trace"}, reasons)
}

// A request not streamed is one response: no TTFT, TPOT or gaps, but its
// duration and tokens count, and its span says stream=false.
func TestNotStreamedSession(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	ctx := context.Background()
	st := start("whole", traceFast, base)
	st.NoStream = true
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(st, tok("whole", base+2000*ms, 300), end("whole", base+2000*ms))))
	p.shutdown(t)

	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1)
	attrs := spans[0].Attributes().AsRaw()
	assert.Equal(t, false, attrs[attrRequestStream])
	assert.Equal(t, "probabilistic", attrs[attrSamplingReason], "no slow TTFT for a whole response")
	assert.NotContains(t, attrs, attrSessionTTFT)
	assert.NotContains(t, attrs, attrSessionTPOT)
	assert.Equal(t, 2.0, attrs[attrSessionDuration])
	assert.Equal(t, 0, spans[0].Events().Len(), "no first token event")

	points := metricPoints(t, p)
	assert.Zero(t, points["gen_ai.server.time_to_first_token"])
	assert.Zero(t, points["gen_ai.server.time_per_output_token"])
	assert.Zero(t, points["llm.session.inter_token_latency"])
	assert.Equal(t, uint64(1), points["gen_ai.server.request.duration"])
	assert.Equal(t, uint64(2), points["llm.session.token.usage"], "input and output")
}

// metricPoints sums the counts of the session metrics flushed at shutdown,
// by metric name.
func metricPoints(t *testing.T, p *pipelines) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, md := range p.metSink.AllMetrics() {
		for _, rm := range md.ResourceMetrics().All() {
			for _, sm := range rm.ScopeMetrics().All() {
				for _, m := range sm.Metrics().All() {
					if m.Type() == pmetric.MetricTypeHistogram {
						for _, dp := range m.Histogram().DataPoints().All() {
							out[m.Name()] += dp.Count()
						}
					}
				}
			}
		}
	}
	return out
}

// TTFT and TPOT are for sessions that completed; a session cut short
// carries error.type on its duration and on llm.sessions.
func TestCutSessionsCarryErrorType(t *testing.T) {
	p := newPipelines(t, nil)
	ctx := context.Background()
	abort := end("a", base+60*ms)
	abort.FinishReason = "abort"
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(start("a", traceFast, base), tok("a", base+20*ms, 1), tok("a", base+40*ms, 1), abort)))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(start("s", traceSlow, base), tok("s", base+20*ms, 1), tok("s", base+40*ms, 1))))
	p.shutdown(t) // s ends as shutdown

	points := metricPoints(t, p)
	assert.Zero(t, points["gen_ai.server.time_to_first_token"])
	assert.Zero(t, points["gen_ai.server.time_per_output_token"])
	byErrorType := map[string]int64{}
	for _, md := range p.metSink.AllMetrics() {
		for _, m := range md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().All() {
			switch m.Name() {
			case "llm.sessions":
				for _, dp := range m.Sum().DataPoints().All() {
					et, _ := dp.Attributes().Get("error.type")
					byErrorType["sessions "+et.Str()] += dp.IntValue()
				}
			case "gen_ai.server.request.duration":
				for _, dp := range m.Histogram().DataPoints().All() {
					et, _ := dp.Attributes().Get("error.type")
					byErrorType["duration "+et.Str()] += int64(dp.Count())
				}
			}
		}
	}
	assert.Equal(t, map[string]int64{"sessions aborted": 1, "sessions shutdown": 1, "duration aborted": 1, "duration shutdown": 1}, byErrorType)
}

// GenAI semconv names the span "{operation} {model}", the operation alone
// without a model, and gen_ai without an operation.
func TestSpanName(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	ctx := context.Background()
	noOp := start("no-op", pcommon.TraceID{1}, base)
	noOp.Operation = ""
	noModel := start("no-model", pcommon.TraceID{2}, base)
	noModel.Model = ""
	for _, st := range []tokenevent.Event{noOp, noModel} {
		require.NoError(t, p.logs.ConsumeLogs(ctx, events(st, tok(st.SessionID, base+900*ms, 1), end(st.SessionID, base+900*ms))))
	}
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 2)
	assert.Equal(t, "gen_ai", spans[0].Name())
	assert.Equal(t, "chat", spans[1].Name())
}

// The metrics face only reads what passes: the pipeline need not clone for it.
func TestMetricsFaceDoesNotMutate(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	assert.False(t, p.metrics.Capabilities().MutatesData)
	assert.True(t, p.logs.Capabilities().MutatesData)
	assert.True(t, p.traces.Capabilities().MutatesData)
}

// The caller's tracestate reaches the session span: its other entries and
// its rv stay, with the threshold the session was kept at.
func TestSessionSpanOnTheCallersTraceState(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	st := start("ts", traceSlow, base)
	st.TraceState = "vendor=abc,ot=rv:fedcba98765432"
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(st, tok("ts", base+900*ms, 1), end("ts", base+900*ms))))
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1)
	w3c, err := sampling.NewW3CTraceState(spans[0].TraceState().AsRaw())
	require.NoError(t, err)
	assert.Equal(t, "fedcba98765432", w3c.OTelValue().RValue())
	th, ok := w3c.OTelValue().TValueThreshold()
	require.True(t, ok)
	assert.Equal(t, sampling.AlwaysSampleThreshold, th)
	assert.Contains(t, spans[0].TraceState().AsRaw(), "vendor=abc")
}
