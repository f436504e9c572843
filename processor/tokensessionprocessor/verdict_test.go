// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadatatest"
)

// Verdict spans (traces::verdict_spans) at the session's edges: each is
// stamped when the verdict was reached on the engine's clock, and goes to
// the session's real trace only.

func withVerdictSpans(c *Config) { c.Traces.VerdictSpans = true }

func spansNamed(td []ptrace.Traces, name string) []ptrace.Span {
	var out []ptrace.Span
	for _, s := range allSpans(td) {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// Tokens that arrive before their start (UDP reordering) open the session
// under a random trace. A stall among them keeps it, but its verdict span
// waits for the start: in the random trace it would be a span whose parent
// never exists, and the start would bring a second one. It goes out once,
// in the start's trace, under the session span, at the stall's detection.
func TestVerdictSpanOfAnOrphanWaitsForItsStart(t *testing.T) {
	p := newPipelines(t, withVerdictSpans)
	defer p.shutdown(t)
	ctx := context.Background()
	id := "orphan"
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(
		tok(id, base+100*ms, 1), tok(id, base+300*ms, 1), tok(id, base+500*ms, 1), tok(id, base+700*ms, 1))))
	require.Len(t, recordsNamed(p.logSink.AllLogs(), eventNameStall), 1, "the stall is alerted at once")
	assert.Empty(t, allSpans(p.trcSink.AllTraces()), "no verdict before the start")

	require.NoError(t, p.logs.ConsumeLogs(ctx, events(start(id, traceSlow, base))))
	verdicts := spansNamed(p.trcSink.AllTraces(), spanNameVerdict)
	require.Len(t, verdicts, 1)
	v := verdicts[0]
	assert.Equal(t, traceSlow, v.TraceID())
	assert.Equal(t, pcommon.SpanID{0x5e, byte(len(id))}, v.ParentSpanID(), "the session span the start names")
	assert.Equal(t, pcommon.Timestamp(base+700*ms), v.StartTimestamp(), "at the stall's detection")
	assert.Equal(t, "ot=th:0", v.TraceState().AsRaw())
	reason, _ := v.Attributes().Get(attrSamplingReason)
	assert.Equal(t, "stall", reason.Str())

	require.NoError(t, p.logs.ConsumeLogs(ctx, events(end(id, base+710*ms))))
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 2, "the verdict and the session span")
	assert.Equal(t, traceSlow, spans[1].TraceID())
	assert.Equal(t, v.ParentSpanID(), spans[1].SpanID())
}

// An orphan kept early whose start never comes ends with its session span,
// in the only trace it had; its verdict span is dropped, and counted.
func TestVerdictSpanOfAnOrphanWithoutStartDropped(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	p := newPipelinesWith(t, set, withVerdictSpans)
	ctx := context.Background()
	id := "orphan"
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(
		tok(id, base+100*ms, 1), tok(id, base+300*ms, 1), tok(id, base+500*ms, 1), tok(id, base+700*ms, 1), end(id, base+710*ms))))
	p.shutdown(t)
	spans := allSpans(p.trcSink.AllTraces())
	require.Len(t, spans, 1, "the session span alone")
	assert.NotEqual(t, spanNameVerdict, spans[0].Name())
	metadatatest.AssertEqualProcessorTokenSessionVerdictSpansDropped(t, tel,
		[]metricdata.DataPoint[int64]{{Value: 1}}, metricdatatest.IgnoreTimestamp())
}

// A TTFT breach and a stall folded in one batch make one verdict
// ("ttft,stall"), reached at the first token; a stall alone is stamped at
// its detection. Both on the engine's clock, inside the session span, not
// at the collector's clock when the batch came.
func TestVerdictSpanStampedWhenReached(t *testing.T) {
	p := newPipelines(t, withVerdictSpans)
	defer p.shutdown(t)
	ctx := context.Background()
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(
		start("both", traceSlow, base), tok("both", base+600*ms, 1), tok("both", base+800*ms, 1),
		tok("both", base+1000*ms, 1), tok("both", base+1200*ms, 1), end("both", base+1210*ms),
		start("stall", traceFast, base), tok("stall", base+50*ms, 1), tok("stall", base+250*ms, 1),
		tok("stall", base+450*ms, 1), tok("stall", base+650*ms, 1), end("stall", base+660*ms))))
	verdicts := map[pcommon.TraceID]ptrace.Span{}
	sessions := map[pcommon.TraceID]ptrace.Span{}
	for _, s := range allSpans(p.trcSink.AllTraces()) {
		if s.Name() == spanNameVerdict {
			verdicts[s.TraceID()] = s
		} else {
			sessions[s.TraceID()] = s
		}
	}
	require.Len(t, verdicts, 2)
	for trace, want := range map[pcommon.TraceID]struct {
		reason string
		at     int64
	}{traceSlow: {"ttft,stall", base + 600*ms}, traceFast: {"stall", base + 650*ms}} {
		v, s := verdicts[trace], sessions[trace]
		reason, _ := v.Attributes().Get(attrSamplingReason)
		assert.Equal(t, want.reason, reason.Str())
		assert.Equal(t, pcommon.Timestamp(want.at), v.StartTimestamp(), want.reason)
		assert.Equal(t, v.StartTimestamp(), v.EndTimestamp())
		assert.GreaterOrEqual(t, v.StartTimestamp(), s.StartTimestamp(), "within the session span")
		assert.LessOrEqual(t, v.EndTimestamp(), s.EndTimestamp(), "within the session span")
	}
}
