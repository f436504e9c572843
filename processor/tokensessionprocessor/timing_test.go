// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// llmRequestSpan is vLLM's llm_request span for a request of trace whose
// parent (the proxy's session span) is parent: queue, prefill and decode in
// seconds, as vLLM's SpanAttributes name them.
func llmRequestSpan(trace pcommon.TraceID, parent pcommon.SpanID, queue, prefill, decode float64) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "vllm")
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName("vllm.llm_engine")
	span := ss.Spans().AppendEmpty()
	span.SetName("llm_request")
	span.SetKind(ptrace.SpanKindServer)
	span.SetTraceID(trace)
	span.SetSpanID(pcommon.SpanID{0xe7, parent[1], 1})
	span.SetParentSpanID(parent)
	a := span.Attributes()
	a.PutDouble("gen_ai.latency.time_in_queue", queue)
	a.PutDouble("gen_ai.latency.time_in_model_prefill", prefill)
	a.PutDouble("gen_ai.latency.time_in_model_decode", decode)
	a.PutDouble("gen_ai.latency.time_to_first_token", queue+prefill)
	a.PutStr("gen_ai.response.model", "llama-fp8")
	a.PutStr("gen_ai.request.id", "chatcmpl-1")
	return td
}

// sessionSpanOf is the processor's span of the session with ID id.
func sessionSpanOf(p *pipelines, id string) (ptrace.Span, bool) {
	for _, s := range allSpans(p.trcSink.AllTraces()) {
		if v, ok := s.Attributes().Get("llm.session.id"); ok && v.Str() == id {
			return s, true
		}
	}
	return ptrace.Span{}, false
}

// warmUp sends one engine span of an unrelated trace: sessions wait for
// their engine span only once engine spans are seen to flow.
func warmUp(t *testing.T, p *pipelines) {
	t.Helper()
	require.NoError(t, p.traces.ConsumeTraces(context.Background(), llmRequestSpan(pcommon.TraceID{0xff}, pcommon.SpanID{0xff}, 0, 0, 0)))
}

// The engine span arrives 3 s after the session ended (vLLM's batch
// exporter): the kept session's span and summary wait for it and come out
// with the exact split.
func TestEngineSpanJoinedAfterTheEnd(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	ctx := context.Background()
	warmUp(t, p)
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(slowSession("late")...)))
	_, emitted := sessionSpanOf(p, "late")
	require.False(t, emitted, "held for the engine span")
	assert.Empty(t, recordsNamed(p.logSink.AllLogs(), eventNameSummary))

	time.Sleep(3 * time.Second)
	sessionSpanID := pcommon.SpanID(start("late", traceSlow, base).SpanID)
	require.NoError(t, p.traces.ConsumeTraces(ctx, llmRequestSpan(traceSlow, sessionSpanID, 0.412, 0.173, 0.05)))
	span, emitted := sessionSpanOf(p, "late")
	require.True(t, emitted, "released by its engine span")
	attrs := span.Attributes().AsRaw()
	assert.Equal(t, 0.412, attrs["llm.session.queue_time"])
	assert.Equal(t, 0.173, attrs["llm.session.prefill_time"])
	assert.Equal(t, 0.05, attrs["llm.session.decode_time"])
	assert.Equal(t, "engine_span", attrs["llm.session.timing_source"])
	assert.Equal(t, "llama-fp8", attrs["gen_ai.response.model"])
	summaries := recordsNamed(p.logSink.AllLogs(), eventNameSummary)
	require.Len(t, summaries, 1)
	assert.Equal(t, 0.412, summaries[0].Attributes().AsRaw()["llm.session.queue_time"])
}

// No engine span comes: the session goes out when the wait is over, without
// the split, and the miss is counted.
func TestEngineSpanNeverComes(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.EngineTiming.Wait = 300 * time.Millisecond })
	defer p.shutdown(t)
	warmUp(t, p)
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(slowSession("never")...)))
	require.Eventually(t, func() bool { _, ok := sessionSpanOf(p, "never"); return ok }, 5*time.Second, 10*time.Millisecond)
	span, _ := sessionSpanOf(p, "never")
	assert.NotContains(t, span.Attributes().AsRaw(), "llm.session.queue_time")
	assert.NotContains(t, span.Attributes().AsRaw(), "llm.session.timing_source")
}

// Two sessions in one trace (an agent's two calls, both slow): each engine
// span goes to the session that is its parent.
func TestEngineSpansMatchedByParent(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	ctx := context.Background()
	warmUp(t, p)
	one, two := start("one", traceSlow, base), start("two", traceSlow, base)
	one.SpanID, two.SpanID = tokenevent.SpanID{0x5e, 0x01}, tokenevent.SpanID{0x5e, 0x02}
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(one, two, tok("one", base+700*ms, 1), tok("two", base+800*ms, 1),
		end("one", base+710*ms), end("two", base+810*ms))))
	require.NoError(t, p.traces.ConsumeTraces(ctx, llmRequestSpan(traceSlow, pcommon.SpanID(two.SpanID), 0.6, 0.15, 0.01)))
	require.NoError(t, p.traces.ConsumeTraces(ctx, llmRequestSpan(traceSlow, pcommon.SpanID(one.SpanID), 0.5, 0.15, 0.01)))
	for id, queue := range map[string]float64{"one": 0.5, "two": 0.6} {
		span, ok := sessionSpanOf(p, id)
		require.True(t, ok, id)
		assert.Equal(t, queue, span.Attributes().AsRaw()["llm.session.queue_time"], id)
	}
}

// A hook's end event brings the split itself: nothing waits, and the queue
// rule can keep the session.
func TestHookTimingAndQueueRule(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.QueueTime = 300 * time.Millisecond })
	ctx := context.Background()
	warmUp(t, p)
	e := end("queued", base+530*ms)
	e.QueueTimeNs, e.PrefillTimeNs, e.DecodeTimeNs, e.TimingSource = int64(400*time.Millisecond), int64(90*time.Millisecond), -1, tokenevent.TimingHook
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(start("queued", traceFast, base), tok("queued", base+500*ms-1, 1), e)))
	span, ok := sessionSpanOf(p, "queued")
	require.True(t, ok, "kept by the queue rule, at once")
	attrs := span.Attributes().AsRaw()
	assert.Equal(t, "queue", attrs[attrSamplingReason])
	assert.Equal(t, 0.4, attrs["llm.session.queue_time"])
	assert.Equal(t, 0.09, attrs["llm.session.prefill_time"])
	assert.NotContains(t, attrs, "llm.session.decode_time", "the hook did not give it")
	assert.Equal(t, "hook", attrs["llm.session.timing_source"])
	p.shutdown(t)
	points := metricPoints(t, p)
	assert.Equal(t, uint64(1), points["llm.session.queue_time"])
	assert.Equal(t, uint64(1), points["llm.session.prefill_time"])
}

// llama.cpp's timings, read by the proxy (its queue derived), come with the
// end as vLLM's per-request metrics do: the session carries them under
// their own source, and the timing is counted by it.
func TestLlamaCppTimingJoined(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	p := newPipelinesWith(t, set, func(c *Config) { c.Sampling.QueueTime = 300 * time.Millisecond })
	warmUp(t, p)
	e := end("llama", base+760*ms)
	e.QueueTimeNs, e.PrefillTimeNs, e.DecodeTimeNs, e.TimingSource = int64(643877*time.Microsecond), int64(106123*time.Microsecond), int64(9600*time.Microsecond), tokenevent.TimingLlamaCpp
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(start("llama", traceFast, base), tok("llama", base+750*ms, 1), e)))
	span, ok := sessionSpanOf(p, "llama")
	require.True(t, ok, "kept by the queue rule")
	attrs := span.Attributes().AsRaw()
	assert.Equal(t, "llamacpp_timings", attrs["llm.session.timing_source"])
	assert.InDelta(t, 0.643877, attrs["llm.session.queue_time"], 1e-9)
	assert.InDelta(t, 0.106123, attrs["llm.session.prefill_time"], 1e-9)
	p.shutdown(t)
	m, err := tel.GetMetric("otelcol_processor_token_session_engine_timings")
	require.NoError(t, err)
	counted := map[string]int64{}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		source, _ := dp.Attributes.Value("source")
		result, _ := dp.Attributes.Value("result")
		counted[source.AsString()+"/"+result.AsString()] += dp.Value
	}
	assert.Equal(t, map[string]int64{"llamacpp_timings/joined": 1}, counted)
}

// Timings that cannot be right are dropped, never attached: a negative or
// NaN part, or a queue longer than the session.
func TestImplausibleTimingsDropped(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.EngineTiming.Wait = 300 * time.Millisecond })
	defer p.shutdown(t)
	ctx := context.Background()
	warmUp(t, p)
	for i, queue := range []float64{-0.1, math.NaN(), 30} {
		id := []string{"negative", "nan", "absurd"}[i]
		st := start(id, pcommon.TraceID{0xab, byte(i)}, base)
		require.NoError(t, p.logs.ConsumeLogs(ctx, events(st, tok(id, base+700*ms, 1), end(id, base+710*ms))))
		require.NoError(t, p.traces.ConsumeTraces(ctx, llmRequestSpan(pcommon.TraceID(st.TraceID), pcommon.SpanID(st.SpanID), queue, 0.1, 0.01)))
	}
	require.Eventually(t, func() bool {
		for _, id := range []string{"negative", "nan", "absurd"} {
			if _, ok := sessionSpanOf(p, id); !ok {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "out once the wait is over")
	for _, id := range []string{"negative", "nan", "absurd"} {
		span, ok := sessionSpanOf(p, id)
		require.True(t, ok, id)
		assert.NotContains(t, span.Attributes().AsRaw(), "llm.session.queue_time", id)
	}
	// The invalid hook timing: dropped at the end, counted by the table.
	e := end("hook-bad", base+100*ms)
	e.QueueTimeNs, e.PrefillTimeNs, e.DecodeTimeNs, e.TimingSource = int64(time.Minute), -1, -1, tokenevent.TimingHook
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(start("hook-bad", traceFast, base), tok("hook-bad", base+900*ms, 1), e)))
	// Without a timing it waits for an engine span, like any session.
	require.Eventually(t, func() bool { _, ok := sessionSpanOf(p, "hook-bad"); return ok }, 5*time.Second, 10*time.Millisecond)
	span, _ := sessionSpanOf(p, "hook-bad")
	assert.NotContains(t, span.Attributes().AsRaw(), "llm.session.queue_time")
}
