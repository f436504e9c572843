// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadatatest"
)

const ms = int64(time.Millisecond)

// pipelines is one token_session in all three pipelines, with sinks.
type pipelines struct {
	logs    processor.Logs
	metrics processor.Metrics
	traces  processor.Traces
	logSink *consumertest.LogsSink
	metSink *consumertest.MetricsSink
	trcSink *consumertest.TracesSink
}

func newPipelines(t *testing.T, mutate func(*Config)) *pipelines {
	t.Helper()
	return newPipelinesWith(t, processortest.NewNopSettings(metadata.Type), mutate)
}

// newPipelinesWith is newPipelines with the settings set (its telemetry).
func newPipelinesWith(t *testing.T, set processor.Settings, mutate func(*Config)) *pipelines {
	t.Helper()
	cfg := createDefaultConfig()
	cfg.Sampling.NormalPercent = 0
	cfg.Metrics.FlushInterval = time.Hour // flushed at shutdown in these tests
	// These tests count and read session spans; phases_test.go turns the
	// phase spans on.
	cfg.Traces.PhaseSpans = false
	// The events of these tests come whole in each call: the engines'
	// steps settle at its end, and the outputs go out with it, as they do
	// without attribution (attribution_test.go tests the wait).
	cfg.Attribution.SettleAfter, cfg.Attribution.StepJoin = 0, 0
	if mutate != nil {
		mutate(cfg)
	}
	require.NoError(t, cfg.Validate())
	set.ID = component.NewIDWithName(metadata.Type, t.Name())
	p := &pipelines{logSink: new(consumertest.LogsSink), metSink: new(consumertest.MetricsSink), trcSink: new(consumertest.TracesSink)}
	f := NewFactory()
	var err error
	ctx := context.Background()
	p.logs, err = f.CreateLogs(ctx, set, cfg, p.logSink)
	require.NoError(t, err)
	p.metrics, err = f.CreateMetrics(ctx, set, cfg, p.metSink)
	require.NoError(t, err)
	p.traces, err = f.CreateTraces(ctx, set, cfg, p.trcSink)
	require.NoError(t, err)
	host := componenttest.NewNopHost()
	for _, c := range []component.Component{p.logs, p.metrics, p.traces} {
		require.NoError(t, c.Start(ctx, host))
	}
	return p
}

func (p *pipelines) shutdown(t *testing.T) {
	t.Helper()
	for _, c := range []component.Component{p.logs, p.metrics, p.traces} {
		require.NoError(t, c.Shutdown(context.Background()))
	}
}

// events builds a logs batch the way the token_stream receiver does.
func events(evs ...tokenevent.Event) plog.Logs {
	ld := plog.NewLogs()
	sl := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty()
	w := tokenrecord.NewRecordWriter()
	w.Reset(sl.LogRecords(), 1)
	for i := range evs {
		w.Append(&evs[i])
	}
	w.Flush()
	return ld
}

var (
	traceSlow = pcommon.TraceID{0xaa, 1}
	traceFast = pcommon.TraceID{0xbb, 2}
)

// base is an engine time close to the collector's clock, so that session
// times and the collector's idle checks agree.
var base = time.Now().UnixNano()

func start(id string, trace pcommon.TraceID, at int64) tokenevent.Event {
	return tokenevent.Event{
		Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: uint64(at), TraceID: tokenevent.TraceID(trace),
		SpanID: tokenevent.SpanID{0x5e, byte(len(id))}, Model: "llama", Operation: "chat", Engine: "vllm-0", PromptTokens: 100,
		Attributes: []tokenevent.Attribute{{Key: "quantization", Value: "fp8"}}, Count: 1, CompletionTokens: -1,
	}
}

func tok(id string, at, n int64) tokenevent.Event {
	return tokenevent.Event{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: uint64(at), Count: n, PromptTokens: -1, CompletionTokens: -1}
}

func end(id string, at int64) tokenevent.Event {
	return tokenevent.Event{Kind: tokenevent.KindEnd, SessionID: id, TimeUnixNano: uint64(at), CompletionTokens: -1, FinishReason: "stop", PromptTokens: -1, Count: 1}
}

// slowSession has a TTFT of 600 ms; fastSession is normal.
func slowSession(id string) []tokenevent.Event {
	return []tokenevent.Event{start(id, traceSlow, base), tok(id, base+600*ms, 1), tok(id, base+620*ms, 1), tok(id, base+640*ms, 2), end(id, base+650*ms)}
}

func fastSession(id string) []tokenevent.Event {
	return []tokenevent.Event{start(id, traceFast, base), tok(id, base+100*ms, 1), tok(id, base+120*ms, 1), end(id, base+130*ms)}
}

func allRecords(ld []plog.Logs) []plog.LogRecord {
	var out []plog.LogRecord
	for _, l := range ld {
		for _, rl := range l.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					out = append(out, lr)
				}
			}
		}
	}
	return out
}

func recordsNamed(ld []plog.Logs, name string) []plog.LogRecord {
	var out []plog.LogRecord
	for _, lr := range allRecords(ld) {
		if lr.EventName() == name {
			out = append(out, lr)
		}
	}
	return out
}

func allSpans(td []ptrace.Traces) []ptrace.Span {
	var out []ptrace.Span
	for _, t := range td {
		for _, rs := range t.ResourceSpans().All() {
			for _, ss := range rs.ScopeSpans().All() {
				for _, span := range ss.Spans().All() {
					out = append(out, span)
				}
			}
		}
	}
	return out
}

func TestLogsFoldsTokenEventsAndEmitsSummaries(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	ld := events(append(slowSession("slow"), fastSession("fast")...)...)
	other := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	other.Body().SetStr("an application log")
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), ld))

	records := allRecords(p.logSink.AllLogs())
	for _, lr := range records {
		assert.False(t, tokenrecord.IsTokenEvent(lr), "token events stop here by default")
	}
	require.Len(t, records, 2, "the other record and one summary")
	assert.Equal(t, "an application log", records[0].Body().Str())

	sum := records[1]
	assert.Equal(t, eventNameSummary, sum.EventName())
	assert.Equal(t, plog.SeverityNumberWarn, sum.SeverityNumber())
	assert.Equal(t, traceSlow, sum.TraceID())
	assert.Equal(t, pcommon.SpanID{0x5e, 4}, sum.SpanID())
	assert.Equal(t, pcommon.Timestamp(base+640*ms), sum.Timestamp(), "a session ends at its last token")
	attrs := sum.Attributes().AsRaw()
	assert.Equal(t, map[string]any{
		"gen_ai.operation.name":               "chat",
		"gen_ai.provider.name":                "vllm",
		"gen_ai.request.model":                "llama",
		"gen_ai.request.stream":               true,
		"gen_ai.usage.input_tokens":           int64(100),
		"gen_ai.usage.output_tokens":          int64(4),
		"gen_ai.response.finish_reasons":      []any{"stop"},
		"gen_ai.response.time_to_first_chunk": 0.6,
		"llm.session.id":                      "slow",
		"llm.engine":                          "vllm-0",
		"llm.session.outcome":                 "completed",
		"llm.session.ttft":                    0.6,
		"llm.session.tpot":                    (40 * time.Millisecond / 3).Seconds(),
		"llm.session.max_gap":                 0.02,
		"llm.session.duration":                0.65,
		"llm.session.freezes":                 int64(0),
		"llm.session.stalls":                  int64(0),
		// The engine's steps as its tokens show them: "fast" alone in those
		// to 120 ms, then this one's prefill (120-600 ms) and decodes (to
		// its last token, at 640 ms).
		"llm.session.attribution_source":  "collector",
		"llm.session.engine_time":         0.52,
		"llm.session.engine_time.prefill": 0.48,
		"llm.session.engine_time.decode":  0.04,
		"llm.session.chunks":              int64(3),
		"llm.session.sampling.reason":     "ttft",
		"llm.session.attributes":          map[string]any{"quantization": "fp8"},
	}, attrs)
}

// A start attribute gen_ai.conversation.id (the vLLM plugin sends vLLM's
// session_id there) is on the summary and the span themselves, as the GenAI
// conventions name it, and stays in llm.session.attributes.
func TestConversationIDOnSummaryAndSpan(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	evs := slowSession("conv")
	evs[0].Attributes = []tokenevent.Attribute{{Key: "gen_ai.conversation.id", Value: "c-42"}, {Key: "tenant", Value: "a"}}
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(evs...)))

	records := allRecords(p.logSink.AllLogs())
	require.Len(t, records, 1)
	attrs := records[0].Attributes().AsRaw()
	assert.Equal(t, "c-42", attrs["gen_ai.conversation.id"])
	assert.Equal(t, map[string]any{"gen_ai.conversation.id": "c-42", "tenant": "a"}, attrs["llm.session.attributes"])
	spans := p.trcSink.AllTraces()
	require.Len(t, spans, 1)
	span := spans[0].ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0)
	got, ok := span.Attributes().Get("gen_ai.conversation.id")
	require.True(t, ok, "on the session span")
	assert.Equal(t, "c-42", got.Str())
}

// The proxy learns the input tokens from the stream's usage chunk, so its
// end event carries them: the summary reports them as if the start had.
func TestInputTokensFromTheEnd(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	st := start("proxied", traceSlow, base)
	st.PromptTokens = -1
	e := end("proxied", base+650*ms)
	e.PromptTokens = 42
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(st, tok("proxied", base+600*ms, 1), tok("proxied", base+620*ms, 1), e)))
	sums := recordsNamed(p.logSink.AllLogs(), eventNameSummary)
	require.Len(t, sums, 1)
	v, ok := sums[0].Attributes().Get("gen_ai.usage.input_tokens")
	require.True(t, ok)
	assert.Equal(t, int64(42), v.Int())
}

// The proxy's end event says how often it moved the answer to another
// replica (proxy::migrate): the summary and the session span carry it; a
// session never moved has no such attribute (see
// TestLogsFoldsTokenEventsAndEmitsSummaries).
func TestMigrationsOnSummaryAndSpan(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	evs := slowSession("moved")
	evs[len(evs)-1].Migrations = 2
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(evs...)))
	sums := recordsNamed(p.logSink.AllLogs(), eventNameSummary)
	require.Len(t, sums, 1)
	assert.Equal(t, int64(2), sums[0].Attributes().AsRaw()["llm.session.migrations"])
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1)
	assert.Equal(t, int64(2), spans[0].Attributes().AsRaw()["llm.session.migrations"], "on the session span")
}

// Each move of the answer (the proxy's move events) is a span event on the
// session span, at the move's time: where it left (the session's engine,
// then where the move before went), where it went, why and the tokens
// carried.
func TestMovesAreSpanEvents(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	moved := func(at int64, to, reason string, carried int64) tokenevent.Event {
		return tokenevent.Event{
			Kind: tokenevent.KindMove, SessionID: "moved", TimeUnixNano: uint64(at), Engine: to, Error: reason, Count: carried,
			PromptTokens: -1, CompletionTokens: -1,
		}
	}
	e := end("moved", base+650*ms)
	e.Migrations, e.Error = 2, "engine_stalled"
	evs := []tokenevent.Event{
		start("moved", traceSlow, base), tok("moved", base+600*ms, 1), moved(base+610*ms, "svc:8000", "engine_stalled", 1),
		tok("moved", base+620*ms, 1), moved(base+630*ms, "svc-b:8000", "upstream_stream_broken", 2), tok("moved", base+640*ms, 2), e,
	}
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(evs...)))
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1)
	var got []map[string]any
	var at []pcommon.Timestamp
	for _, ev := range spans[0].Events().All() {
		if ev.Name() == "llm.session.migration" {
			got = append(got, ev.Attributes().AsRaw())
			at = append(at, ev.Timestamp())
		}
	}
	assert.Equal(t, []map[string]any{
		{"llm.migration.from": "vllm-0", "llm.migration.to": "svc:8000", "llm.migration.reason": "engine_stalled", "llm.migration.tokens_carried": int64(1)},
		{"llm.migration.from": "svc:8000", "llm.migration.to": "svc-b:8000", "llm.migration.reason": "upstream_stream_broken", "llm.migration.tokens_carried": int64(2)},
	}, got)
	assert.Equal(t, []pcommon.Timestamp{pcommon.Timestamp(base + 610*ms), pcommon.Timestamp(base + 630*ms)}, at)
	assert.Equal(t, int64(2), spans[0].Attributes().AsRaw()["llm.session.migrations"], "the end's count, as before")
	assert.Equal(t, int64(4), spans[0].Attributes().AsRaw()["gen_ai.usage.output_tokens"], "a move is no token")
}

func TestLogsPassAll(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.PassTokenEvents = PassAll })
	defer p.shutdown(t)
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(fastSession("fast")...)))
	assert.Len(t, recordsNamed(p.logSink.AllLogs(), tokenrecord.EventNameStart), 1)
	assert.Len(t, recordsNamed(p.logSink.AllLogs(), tokenrecord.EventNameToken), 1, "two token events packed in one record")
	assert.Len(t, recordsNamed(p.logSink.AllLogs(), tokenrecord.EventNameEnd), 1)
}

func TestLogsPassSampled(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.PassTokenEvents = PassSampled })
	defer p.shutdown(t)
	ctx := context.Background()
	slow, fast := slowSession("slow"), fastSession("fast")
	// Spread over batches: the records are held until the verdict.
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(slow[0], fast[0], slow[1], fast[1])))
	assert.Empty(t, allRecords(p.logSink.AllLogs()), "nothing before the verdicts")
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(append(slow[2:], fast[2:]...)...)))
	var names []string
	var ev tokenevent.Event
	var got []string
	for _, lr := range allRecords(p.logSink.AllLogs()) {
		names = append(names, lr.EventName())
		if tokenrecord.IsTokenEvent(lr) {
			require.NoError(t, tokenrecord.ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) { got = append(got, e.SessionID+" "+e.Kind.String()) }))
		}
	}
	assert.Equal(t, []string{tokenrecord.EventNameStart, tokenrecord.EventNameToken, tokenrecord.EventNameToken, tokenrecord.EventNameEnd, eventNameSummary}, names)
	assert.Equal(t, []string{"slow start", "slow token", "slow token", "slow token", "slow end"}, got, "only the sampled session's events, in order")
	c, _ := cores.LoadOrStore(component.NewIDWithName(metadata.Type, t.Name()), nil)
	assert.Empty(t, c.Unwrap().sessions.sampledRecords, "nothing held after the sessions ended")
}

func TestStallAlertTheMomentItIsDetected(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	id := "stally"
	batch1 := []tokenevent.Event{start(id, traceSlow, base), tok(id, base+50*ms, 1), tok(id, base+250*ms, 1), tok(id, base+450*ms, 1)}
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(batch1...)))
	assert.Empty(t, recordsNamed(p.logSink.AllLogs(), eventNameStall), "two slow gaps are not a stall")
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(tok(id, base+650*ms, 1))))
	alerts := recordsNamed(p.logSink.AllLogs(), eventNameStall)
	require.Len(t, alerts, 1)
	a := alerts[0]
	assert.Equal(t, plog.SeverityNumberWarn, a.SeverityNumber())
	assert.Equal(t, traceSlow, a.TraceID())
	assert.Equal(t, pcommon.Timestamp(base+650*ms), a.Timestamp())
	assert.Equal(t, []any{0.2, 0.2, 0.2}, a.Attributes().AsRaw()[attrStallGaps])
	assert.Equal(t, false, a.Attributes().AsRaw()[attrStallFreeze])
	assert.Empty(t, recordsNamed(p.logSink.AllLogs(), eventNameSummary), "the session is still running")
}

func TestFreezeAlertedWithoutTokens(t *testing.T) {
	p := newPipelines(t, func(c *Config) {
		c.Stall.Gap = 10 * time.Millisecond
		c.Stall.CheckInterval = 5 * time.Millisecond
	})
	defer p.shutdown(t)
	now := time.Now().UnixNano()
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(start("frozen", traceSlow, now), tok("frozen", now+ms, 1))))
	require.Eventually(t, func() bool { return len(recordsNamed(p.logSink.AllLogs(), eventNameStall)) == 1 }, 10*time.Second, 5*time.Millisecond)
	a := recordsNamed(p.logSink.AllLogs(), eventNameStall)[0]
	assert.Equal(t, true, a.Attributes().AsRaw()[attrStallFreeze])
}

// A freeze its alert reported is the session's reason, freeze, and counted
// in llm.session.freezes on the summary and the span, once decoding
// resumed (the fast gap after the freeze does not withdraw it).
func TestFreezeKeptForItsAlert(t *testing.T) {
	p := newPipelines(t, func(c *Config) {
		c.Stall.Gap = 10 * time.Millisecond
		c.Stall.CheckInterval = 5 * time.Millisecond
		c.Sampling.TPOT = 0
	})
	defer p.shutdown(t)
	ctx := context.Background()
	now := time.Now().UnixNano()
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(start("frozen", traceSlow, now), tok("frozen", now+ms, 1))))
	require.Eventually(t, func() bool { return len(recordsNamed(p.logSink.AllLogs(), eventNameStall)) == 1 }, 10*time.Second, 5*time.Millisecond)
	// Decoding resumes 200 ms after the first token, then fast; the end
	// comes in the same batch, before the ticker could see another freeze.
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tok("frozen", now+200*ms, 1), tok("frozen", now+201*ms, 1),
		tok("frozen", now+202*ms, 1), end("frozen", now+202*ms))))
	sums := recordsNamed(p.logSink.AllLogs(), eventNameSummary)
	require.Len(t, sums, 1)
	attrs := sums[0].Attributes().AsRaw()
	assert.Equal(t, "freeze", attrs[attrSamplingReason])
	assert.Equal(t, int64(1), attrs[attrSessionFreezes])
	assert.Equal(t, int64(1), attrs[attrSessionStalls])
	assert.Equal(t, plog.SeverityNumberWarn, sums[0].SeverityNumber())
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1)
	assert.Equal(t, "freeze", spans[0].Attributes().AsRaw()[attrSamplingReason])
	assert.Equal(t, int64(1), spans[0].Attributes().AsRaw()[attrSessionFreezes])
}

func TestTracesHeldUntilVerdict(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	ctx := context.Background()
	// Both sessions start; engine spans of both traces arrive while they run.
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(start("slow", traceSlow, base), start("fast", traceFast, base))))
	require.NoError(t, p.traces.ConsumeTraces(ctx, engineSpans(traceSlow, traceFast, pcommon.TraceID{0xcc})))
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1, "only the span of a trace without a session passes")
	assert.Equal(t, pcommon.TraceID{0xcc}, spans[0].TraceID())

	// The slow session is kept at its first token: its held span is released.
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tok("slow", base+600*ms, 1))))
	spans = allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 2)
	assert.Equal(t, traceSlow, spans[1].TraceID())
	assert.Equal(t, "llm_request", spans[1].Name())
	// Later spans of a kept trace pass at once.
	require.NoError(t, p.traces.ConsumeTraces(ctx, engineSpans(traceSlow)))
	assert.Len(t, allSpans(p.trcSink.AllTraces()), 3)

	// The rest of both sessions: the slow one's span is emitted, the fast
	// one (not sampled) drops its held span, and its late spans too.
	rest := slices.Concat(slowSession("slow")[2:], fastSession("fast")[1:])
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(rest...)))
	spans = allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 4)
	session := spans[3]
	assert.Equal(t, "chat llama", session.Name())
	assert.Equal(t, traceSlow, session.TraceID())
	assert.Equal(t, "ot=th:0", session.TraceState().AsRaw())
	// The threshold is what any OTEP 235 sampler reads back.
	w3c, err := sampling.NewW3CTraceState(session.TraceState().AsRaw())
	require.NoError(t, err)
	th, ok := w3c.OTelValue().TValueThreshold()
	require.True(t, ok)
	assert.Equal(t, sampling.AlwaysSampleThreshold, th)
	assert.Equal(t, 1.0, w3c.OTelValue().AdjustedCount())
	assert.Equal(t, ptrace.SpanKindServer, session.Kind())
	assert.Equal(t, pcommon.Timestamp(base), session.StartTimestamp())
	assert.Equal(t, pcommon.Timestamp(base+640*ms), session.EndTimestamp())
	require.Equal(t, 1, session.Events().Len())
	assert.Equal(t, spanEventFirstToken, session.Events().At(0).Name())
	require.NoError(t, p.traces.ConsumeTraces(ctx, engineSpans(traceFast)))
	assert.Len(t, allSpans(p.trcSink.AllTraces()), 4, "late span of a dropped trace is dropped")
}

func engineSpans(traces ...pcommon.TraceID) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "vllm-engine")
	ss := rs.ScopeSpans().AppendEmpty()
	for _, id := range traces {
		span := ss.Spans().AppendEmpty()
		span.SetTraceID(id)
		span.SetSpanID(pcommon.SpanID{id[0], 9})
		span.SetName("llm_request")
	}
	return td
}

func TestMetricsFlushedAtShutdownOverAllSessions(t *testing.T) {
	p := newPipelines(t, nil)
	ctx := context.Background()
	// Engine metrics pass through.
	md := pmetric.NewMetrics()
	md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty().SetName("vllm:num_requests_running")
	require.NoError(t, p.metrics.ConsumeMetrics(ctx, md))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(append(slowSession("slow"), fastSession("fast")...)...)))
	p.shutdown(t)

	all := p.metSink.AllMetrics()
	require.Len(t, all, 2)
	assert.Equal(t, "vllm:num_requests_running", all[0].ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Name())
	byName := map[string]pmetric.Metric{}
	for _, m := range all[1].ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().All() {
		byName[m.Name()] = m
	}
	ttft := byName["gen_ai.server.time_to_first_token"]
	require.Equal(t, pmetric.MetricTypeHistogram, ttft.Type())
	var count uint64
	var sum float64
	for _, dp := range ttft.Histogram().DataPoints().All() {
		count += dp.Count()
		sum += dp.Sum()
	}
	assert.Equal(t, uint64(2), count, "both sessions, sampled or not")
	assert.InDelta(t, 0.7, sum, 1e-9)
	sessions := byName["llm.sessions"]
	require.Equal(t, pmetric.MetricTypeSum, sessions.Type())
	var total int64
	for _, dp := range sessions.Sum().DataPoints().All() {
		total += dp.IntValue()
	}
	assert.Equal(t, int64(2), total)
	itl := byName["llm.session.inter_token_latency"]
	count = 0
	for _, dp := range itl.Histogram().DataPoints().All() {
		count += dp.Count()
	}
	assert.Equal(t, uint64(4), count, "slow: 20 ms, then 2×10 ms; fast: 20 ms")
}

func TestShutdownEndsActiveSessions(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(start("left", traceFast, base), tok("left", base+10*ms, 1))))
	p.shutdown(t)
	sums := recordsNamed(p.logSink.AllLogs(), eventNameSummary)
	require.Len(t, sums, 1)
	assert.Equal(t, "shutdown", sums[0].Attributes().AsRaw()[attrSessionOutcome])
	require.Len(t, allSpans(p.trcSink.AllTraces()), 1)
}

func TestLifecycle(t *testing.T) {
	f := NewFactory()
	cfg := createDefaultConfig()
	set := processortest.NewNopSettings(metadata.Type)
	ctx := context.Background()
	// Shutdown without Start.
	lp, err := f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.NoError(t, lp.Shutdown(ctx))
	// Start and shutdown, twice.
	for range 2 {
		lp, err := f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
		require.NoError(t, err)
		tp, err := f.CreateTraces(ctx, set, cfg, consumertest.NewNop())
		require.NoError(t, err)
		assert.Same(t, lp.(*logsProcessor).Unwrap(), tp.(*tracesProcessor).Unwrap(), "one core per component ID")
		require.NoError(t, lp.Start(ctx, componenttest.NewNopHost()))
		require.NoError(t, tp.Start(ctx, componenttest.NewNopHost()))
		require.NoError(t, lp.Shutdown(ctx))
		require.NoError(t, tp.Shutdown(ctx))
	}
	// The same ID in two logs pipelines is refused.
	_, err = f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	_, err = f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
	require.ErrorContains(t, err, "one pipeline per signal")
	c, _ := cores.LoadOrStore(set.ID, nil)
	require.NoError(t, c.Shutdown(ctx))
	assert.True(t, lp.Capabilities().MutatesData)
}

// Logs, traces and ticks from several goroutines at once: run under -race.
func TestConcurrentPipelines(t *testing.T) {
	p := newPipelines(t, func(c *Config) {
		c.Stall.CheckInterval = time.Millisecond
		c.Sampling.NormalPercent = 50
	})
	ctx := context.Background()
	const workers, sessionsPerWorker = 4, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range sessionsPerWorker {
				id := fmt.Sprintf("w%d-s%d", w, i)
				trace := pcommon.TraceID{byte(w), byte(i), 7}
				evs := []tokenevent.Event{start(id, trace, base), tok(id, base+10*ms, 1), tok(id, base+30*ms, 2), end(id, base+40*ms)}
				assert.NoError(t, p.logs.ConsumeLogs(ctx, events(evs[:2]...)))
				assert.NoError(t, p.logs.ConsumeLogs(ctx, events(evs[2:]...)))
			}
		}()
		go func() {
			defer wg.Done()
			for i := range sessionsPerWorker {
				assert.NoError(t, p.traces.ConsumeTraces(ctx, engineSpans(pcommon.TraceID{byte(w), byte(i), 7})))
			}
		}()
	}
	wg.Wait()
	p.shutdown(t)
	var ended int64
	for _, md := range p.metSink.AllMetrics() {
		for _, m := range md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().All() {
			if m.Name() == "llm.sessions" {
				for _, dp := range m.Sum().DataPoints().All() {
					ended += dp.IntValue()
				}
			}
		}
	}
	assert.Equal(t, int64(workers*sessionsPerWorker), ended, "every session ended once")
}

func TestSelfTelemetry(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	cfg := createDefaultConfig()
	cfg.Sampling.NormalPercent = 0
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	sink := new(consumertest.LogsSink)
	lp, err := NewFactory().CreateLogs(context.Background(), set, cfg, sink)
	require.NoError(t, err)
	require.NoError(t, lp.Start(context.Background(), componenttest.NewNopHost()))
	evs := append(slowSession("slow"), fastSession("fast")...)
	ghostMove := tokenevent.Event{Kind: tokenevent.KindMove, SessionID: "ghost-move", TimeUnixNano: uint64(base), PromptTokens: -1, CompletionTokens: -1}
	evs = append(evs, tok("fast", base+200*ms, 1), end("ghost", base), tok("orphan", base, 1), ghostMove)
	require.NoError(t, lp.ConsumeLogs(context.Background(), events(evs...)))
	require.NoError(t, lp.Shutdown(context.Background()))

	sum := func(name string, match func(attribute.Set) bool) int64 {
		m, err := tel.GetMetric(name)
		require.NoError(t, err, name)
		var total int64
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			if match(dp.Attributes) {
				total += dp.Value
			}
		}
		return total
	}
	attr := func(k, v string) func(attribute.Set) bool {
		return func(s attribute.Set) bool { got, ok := s.Value(attribute.Key(k)); return ok && got.String() == v }
	}
	assert.Equal(t, int64(2), sum("otelcol_processor_token_session_sessions_ended", attr("outcome", "completed")))
	assert.Equal(t, int64(1), sum("otelcol_processor_token_session_sessions_ended", attr("outcome", "shutdown")), "the orphan's session")
	assert.Equal(t, int64(1), sum("otelcol_processor_token_session_sessions_ended", attr("sampled", "true")))
	assert.Equal(t, int64(1), sum("otelcol_processor_token_session_disorder_events", attr("kind", "late")))
	assert.Equal(t, int64(1), sum("otelcol_processor_token_session_disorder_events", attr("kind", "orphan_end")))
	assert.Equal(t, int64(1), sum("otelcol_processor_token_session_disorder_events", attr("kind", "orphan_token")))
	assert.Equal(t, int64(1), sum("otelcol_processor_token_session_disorder_events", attr("kind", "orphan_move")))
}

// A retry never double-counts: once a batch's token events are folded, a
// refusal downstream is counted as lost output and not returned, so the
// sender (the hook endpoint answers 503 to an error) does not send the same
// tokens again. A batch without token events passes the refusal back.
func TestRefusalAfterFoldingIsNotReturned(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	cfg := createDefaultConfig()
	cfg.Sampling.NormalPercent = 100 // every session's summary goes on
	cfg.Attribution.SettleAfter = 0  // and at once, in this call
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	refused := errors.New("exporter queue full")
	lp, err := NewFactory().CreateLogs(context.Background(), set, cfg, consumertest.NewErr(refused))
	require.NoError(t, err)
	require.NoError(t, lp.Start(context.Background(), componenttest.NewNopHost()))
	defer func() { require.NoError(t, lp.Shutdown(context.Background())) }()

	require.NoError(t, lp.ConsumeLogs(context.Background(), events(fastSession("once")...)))
	m, err := tel.GetMetric("otelcol_processor_token_session_output_failures")
	require.NoError(t, err)
	var lost int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		lost += dp.Value
	}
	assert.Equal(t, int64(1), lost, "the session summary the next consumer refused is counted")

	plain := plog.NewLogs()
	plain.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords().AppendEmpty().Body().SetStr("app log")
	assert.ErrorIs(t, lp.ConsumeLogs(context.Background(), plain), refused, "no token events: the refusal is the sender's to handle")
}

// metrics::max_models: a client inventing model names gets one _OTHER
// series, in the session metrics and on llm.engine.time alike, and the
// sessions recorded under it are counted.
func TestMaxModelsGuard(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	cfg := createDefaultConfig()
	cfg.Metrics.MaxModels = 1
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	f := NewFactory()
	metSink := new(consumertest.MetricsSink)
	lp, err := f.CreateLogs(context.Background(), set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	mp, err := f.CreateMetrics(context.Background(), set, cfg, metSink)
	require.NoError(t, err)
	for _, c := range []component.Component{lp, mp} {
		require.NoError(t, c.Start(context.Background(), componenttest.NewNopHost()))
	}
	var evs []tokenevent.Event
	for i, model := range []string{"llama", "invented-1", "invented-2"} {
		id := fmt.Sprint("s", i)
		session := fastSession(id)
		session[0].Model = model
		evs = append(evs, session...)
	}
	require.NoError(t, lp.ConsumeLogs(context.Background(), events(evs...)))
	for _, c := range []component.Component{lp, mp} {
		require.NoError(t, c.Shutdown(context.Background()))
	}
	models := map[string]int64{}
	engineTimeModels := map[string]bool{}
	for _, md := range metSink.AllMetrics() {
		for _, rm := range md.ResourceMetrics().All() {
			for _, sm := range rm.ScopeMetrics().All() {
				for _, m := range sm.Metrics().All() {
					switch m.Name() {
					case "llm.sessions":
						for _, dp := range m.Sum().DataPoints().All() {
							v, _ := dp.Attributes().Get("gen_ai.request.model")
							models[v.AsString()] += dp.IntValue()
						}
					case "llm.engine.time":
						for _, dp := range m.Sum().DataPoints().All() {
							if v, ok := dp.Attributes().Get("gen_ai.request.model"); ok {
								engineTimeModels[v.AsString()] = true
							}
						}
					}
				}
			}
		}
	}
	assert.Equal(t, map[string]int64{"llama": 1, "_OTHER": 2}, models)
	assert.Equal(t, map[string]bool{"llama": true, "_OTHER": true}, engineTimeModels)
	assert.Equal(t, map[string]int64{"model": 2}, keysOverflowed(t, tel))
}

// keysOverflowed returns otelcol_processor_token_session_keys_overflowed
// by key.
func keysOverflowed(t *testing.T, tel *componenttest.Telemetry) map[string]int64 {
	t.Helper()
	m, err := tel.GetMetric("otelcol_processor_token_session_keys_overflowed")
	require.NoError(t, err)
	out := map[string]int64{}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		key, _ := dp.Attributes.Value("key")
		out[key.AsString()] = dp.Value
	}
	return out
}

// The span counters follow the held spans of TestTracesHeldUntilVerdict:
// two held, one released with its kept session, one dropped with its
// unsampled session and one dropped late.
func TestSpanTelemetry(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	cfg := createDefaultConfig()
	cfg.Sampling.NormalPercent = 0
	set := metadatatest.NewSettings(tel)
	ctx := context.Background()
	lp, err := NewFactory().CreateLogs(ctx, set, cfg, new(consumertest.LogsSink))
	require.NoError(t, err)
	tp, err := NewFactory().CreateTraces(ctx, set, cfg, new(consumertest.TracesSink))
	require.NoError(t, err)
	require.NoError(t, lp.Start(ctx, componenttest.NewNopHost()))
	require.NoError(t, tp.Start(ctx, componenttest.NewNopHost()))

	require.NoError(t, lp.ConsumeLogs(ctx, events(start("slow", traceSlow, base), start("fast", traceFast, base))))
	require.NoError(t, tp.ConsumeTraces(ctx, engineSpans(traceSlow, traceFast, pcommon.TraceID{0xcc})))
	metadatatest.AssertEqualProcessorTokenSessionSpansHeld(t, tel, []metricdata.DataPoint[int64]{{Value: 2}}, metricdatatest.IgnoreTimestamp())
	require.NoError(t, lp.ConsumeLogs(ctx, events(append(slowSession("slow")[1:], fastSession("fast")[1:]...)...)))
	require.NoError(t, tp.ConsumeTraces(ctx, engineSpans(traceFast)))
	metadatatest.AssertEqualProcessorTokenSessionSpansHeld(t, tel, []metricdata.DataPoint[int64]{{Value: 0}}, metricdatatest.IgnoreTimestamp())
	require.NoError(t, lp.Shutdown(ctx))
	require.NoError(t, tp.Shutdown(ctx))

	one := []metricdata.DataPoint[int64]{{Value: 1}}
	metadatatest.AssertEqualProcessorTokenSessionSpansDelayed(t, tel, []metricdata.DataPoint[int64]{{Value: 2}}, metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualProcessorTokenSessionSpansReleased(t, tel, one, metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualProcessorTokenSessionSpansDropped(t, tel, []metricdata.DataPoint[int64]{{Value: 2}}, metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualProcessorTokenSessionSessionsEnded(t, tel, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(attribute.String("outcome", "completed"), attribute.Bool("sampled", false)), Value: 1},
		{Attributes: attribute.NewSet(attribute.String("outcome", "completed"), attribute.Bool("sampled", true)), Value: 1},
	}, metricdatatest.IgnoreTimestamp())
}

// A session kept by the 1% draw carries its threshold in the tracestate,
// and span metrics downstream re-weight it by 100.
func TestProbabilisticThresholdInTraceState(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 1 })
	defer p.shutdown(t)
	ctx := context.Background()
	th, err := sampling.ProbabilityToThresholdWithPrecision(0.01, 4)
	require.NoError(t, err)
	// The draw compares the trace ID's last 56 bits with the threshold:
	// these are above it, so the 1% draw keeps this trace.
	trace := pcommon.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 0xff, 0xfe, 0, 0, 0, 0, 1}
	require.True(t, th.ShouldSample(sampling.TraceIDToRandomness(trace)))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(start("lucky", trace, base), tok("lucky", base+10*ms, 1), tok("lucky", base+20*ms, 1), end("lucky", base+20*ms))))
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1)
	w3c, err := sampling.NewW3CTraceState(spans[0].TraceState().AsRaw())
	require.NoError(t, err)
	got, ok := w3c.OTelValue().TValueThreshold()
	require.True(t, ok)
	assert.Equal(t, th, got)
	assert.InDelta(t, 100, w3c.OTelValue().AdjustedCount(), 0.01)
	assert.Equal(t, "probabilistic", spans[0].Attributes().AsRaw()[attrSamplingReason])
}

// engineMetricsAt is what the vllm scraper emits for one engine at one time.
func engineMetricsAt(at int64, kv float64, running, waiting, preemptions int64) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.instance.id", "localhost:8000")
	ms := rm.ScopeMetrics().AppendEmpty().Metrics()
	gauge := func(name string, v float64) {
		m := ms.AppendEmpty()
		m.SetName(name)
		dp := m.SetEmptyGauge().DataPoints().AppendEmpty()
		dp.SetTimestamp(pcommon.Timestamp(at))
		dp.SetDoubleValue(v)
	}
	gauge("vllm:kv_cache_usage_perc", kv)
	gauge("vllm:num_requests_running", float64(running))
	gauge("vllm:num_requests_waiting", float64(waiting))
	m := ms.AppendEmpty()
	m.SetName("vllm:num_preemptions_total")
	sum := m.SetEmptySum()
	sum.SetIsMonotonic(true)
	sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	dp := sum.DataPoints().AppendEmpty()
	dp.SetTimestamp(pcommon.Timestamp(at))
	dp.SetIntValue(preemptions)
	return md
}

func TestEngineContextOnSessionAndStall(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	ctx := context.Background()
	for _, md := range []pmetric.Metrics{
		engineMetricsAt(base-1000*ms, 0.5, 8, 2, 10),
		engineMetricsAt(base+300*ms, 0.9, 12, 5, 12),
		engineMetricsAt(base+2000*ms, 0.2, 3, 0, 15),
	} {
		require.NoError(t, p.metrics.ConsumeMetrics(ctx, md))
	}
	id := "ctx"
	evs := []tokenevent.Event{
		start(id, traceSlow, base), tok(id, base+50*ms, 1),
		tok(id, base+250*ms, 1), tok(id, base+450*ms, 1), tok(id, base+650*ms, 1), end(id, base+660*ms),
	}
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(evs...)))

	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1)
	attrs := spans[0].Attributes().AsRaw()
	assert.Equal(t, 0.5, attrs["vllm.kv_cache_usage.start"])
	assert.Equal(t, 0.9, attrs["vllm.kv_cache_usage.max"], "the maximum while the session ran")
	assert.Equal(t, 2.0, attrs["vllm.num_requests_waiting.start"])
	assert.Equal(t, int64(5), attrs["vllm.num_preemptions"], "between the scrapes that bracket the session: -1000 ms and +2000 ms")
	// The stall at +650 ms is explained by the state then.
	require.Equal(t, 2, spans[0].Events().Len())
	stallEvent := spans[0].Events().At(1).Attributes().AsRaw()
	assert.Equal(t, 0.9, stallEvent["vllm.kv_cache_usage"])
	assert.Equal(t, 5.0, stallEvent["vllm.num_requests_waiting"])
	assert.Equal(t, 12.0, stallEvent["vllm.num_preemptions_total"])
	alerts := recordsNamed(p.logSink.AllLogs(), eventNameStall)
	require.Len(t, alerts, 1)
	assert.Equal(t, 12.0, alerts[0].Attributes().AsRaw()["vllm.num_requests_running"])
	// Engine metrics pass through unchanged.
	assert.Len(t, p.metSink.AllMetrics(), 3)
}

// A kept session that ends before its engine's next scrape waits for it:
// its pre-emptions are counted between the scrapes that bracket it, never
// guessed. Without a scrape in time, it goes out without the count.
func TestPreemptionsWaitForTheNextScrape(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	ctx := context.Background()
	require.NoError(t, p.metrics.ConsumeMetrics(ctx, engineMetricsAt(base-1000*ms, 0.5, 8, 2, 10)))
	evs := []tokenevent.Event{start("w", traceSlow, base), tok("w", base+600*ms, 1), end("w", base+610*ms)}
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(evs...)))
	assert.Empty(t, allSpans(p.trcSink.AllTraces()), "held until the engine's next scrape")
	assert.Empty(t, recordsNamed(p.logSink.AllLogs(), eventNameSummary))

	require.NoError(t, p.metrics.ConsumeMetrics(ctx, engineMetricsAt(base+1000*ms, 0.6, 8, 2, 13)))
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1, "released by the scrape")
	assert.Equal(t, int64(3), spans[0].Attributes().AsRaw()["vllm.num_preemptions"])
	summaries := recordsNamed(p.logSink.AllLogs(), eventNameSummary)
	require.Len(t, summaries, 1)
	assert.Equal(t, int64(3), summaries[0].Attributes().AsRaw()["vllm.num_preemptions"])
}

func TestPreemptionsUnknownWithoutAScrape(t *testing.T) {
	p := newPipelines(t, nil)
	ctx := context.Background()
	require.NoError(t, p.metrics.ConsumeMetrics(ctx, engineMetricsAt(base-1000*ms, 0.5, 8, 2, 10)))
	evs := []tokenevent.Event{start("u", traceSlow, base), tok("u", base+600*ms, 1), end("u", base+610*ms)}
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(evs...)))
	p.shutdown(t) // no scrape came: the outputs go, the count left out
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1)
	attrs := spans[0].Attributes().AsRaw()
	assert.NotContains(t, attrs, "vllm.num_preemptions", "no 0 that was not measured")
	assert.Equal(t, 0.5, attrs["vllm.kv_cache_usage.start"])
}

// With traces::verdict_spans, a session kept before its end (here a TTFT
// breach, known at the first token) emits a verdict span at once: a child of
// the session span, with the reason and the trace's threshold, long before
// the session span itself. A session kept only at its end emits none, and
// without the option nothing changes.
func TestVerdictSpanAtTheMomentOfAnEarlyKeep(t *testing.T) {
	p := newPipelines(t, func(cfg *Config) { cfg.Traces.VerdictSpans = true })
	defer p.shutdown(t)
	ctx := context.Background()
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(start("slow", traceSlow, base), start("fast", traceFast, base))))
	assert.Empty(t, allSpans(p.trcSink.AllTraces()), "no verdict yet")

	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tok("slow", base+600*ms, 1))))
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1, "the verdict span, at the first token")
	verdict := spans[0]
	assert.Equal(t, spanNameVerdict, verdict.Name())
	assert.Equal(t, traceSlow, verdict.TraceID())
	assert.Equal(t, pcommon.SpanID{0x5e, 4}, verdict.ParentSpanID(), "a child of the session span")
	assert.NotEqual(t, verdict.ParentSpanID(), verdict.SpanID())
	assert.False(t, verdict.SpanID().IsEmpty())
	assert.Equal(t, pcommon.Timestamp(base+600*ms), verdict.StartTimestamp(), "at the first token")
	assert.Equal(t, verdict.StartTimestamp(), verdict.EndTimestamp())
	assert.Equal(t, "ot=th:0", verdict.TraceState().AsRaw())
	reason, _ := verdict.Attributes().Get(attrSamplingReason)
	assert.Equal(t, "ttft", reason.Str())
	id, _ := verdict.Attributes().Get(tokenrecord.AttrSessionID)
	assert.Equal(t, "slow", id.Str())

	// The rest: the slow session's span comes at its end; the fast one,
	// kept by nothing, emits nothing.
	rest := slices.Concat(slowSession("slow")[2:], fastSession("fast")[1:])
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(rest...)))
	spans = allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 2)
	assert.Equal(t, "chat llama", spans[1].Name())
	assert.Equal(t, verdict.ParentSpanID(), spans[1].SpanID())

	t.Run("off by default", func(t *testing.T) {
		q := newPipelines(t, nil)
		defer q.shutdown(t)
		require.NoError(t, q.logs.ConsumeLogs(ctx, events(slowSession("slow")[:2]...)))
		assert.Empty(t, allSpans(q.trcSink.AllTraces()))
	})
}
