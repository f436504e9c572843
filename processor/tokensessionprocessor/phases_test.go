// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// goldenSplit is the golden slow session again, in a trace of its own,
// ended by an end event that brings the engine's split (a hook's): 500 ms
// of queue, 250 ms of prefill, 860 ms of decode.
var goldenSplit = goldenStartEvent{
	id: "sess-split", model: "llama-3.1-8b", operation: tokenevent.OperationChat, engine: "vllm-0",
	trace:        pcommon.TraceID{0x7a, 0x51, 0x0c, 0x21, 0x9e, 0x44, 0x4f, 0x0b, 0x8d, 0x12, 0x63, 0xa0, 0x55, 0x3e, 0x19, 0xc4},
	span:         pcommon.SpanID{0x3c, 0x8e, 0x71, 0x02, 0xd4, 0x5a, 0x99, 0x10},
	parent:       pcommon.SpanID{0x53, 0x99, 0x5c, 0x3f, 0x42, 0xcd, 0x8a, 0xd8},
	promptTokens: 512,
}

func goldenPhasesConfig(c *Config) { c.Traces.PhaseSpans = true }

// The waterfall of a kept session, both ways: with the engine's split, the
// queue and prefill end at the first token (queue t0+50 ms to t0+550 ms,
// prefill to t0+800 ms) and the decode runs 860 ms from it; without it, the
// wait for the first token (t0 to t0+800 ms) and the decode to the last
// token (t0+1670 ms), both the collector's own.
func TestGoldenPhaseSpans(t *testing.T) {
	p := newGoldenPipesWith(t, "golden_phase_spans", goldenPhasesConfig)
	t0 := goldenT0
	b := goldenSlowBatches()
	evs := append(append(append([]tokenevent.Event(nil), b[0]...), b[1]...), b[2]...)
	split := make([]tokenevent.Event, len(evs))
	copy(split, evs)
	split[0] = goldenSplit.at(t0)
	for i := range split[1:] {
		split[i+1].SessionID = goldenSplit.id
	}
	last := &split[len(split)-1]
	last.QueueTimeNs, last.PrefillTimeNs, last.DecodeTimeNs = 500*goldenMS, 250*goldenMS, 860*goldenMS
	last.TimingSource = tokenevent.TimingHook

	p.feed(t, split...)
	require.Len(t, p.trcSink.AllTraces(), 1)
	compareGoldenTraces(t, goldenPath("phase_spans_engine_split.yaml"), p.trcSink.AllTraces()[0])

	// A pipeline of its own: the engine's clock of the attribution has
	// passed these events' times in the first.
	p = newGoldenPipesWith(t, "golden_phase_spans_collector", goldenPhasesConfig)
	p.feed(t, evs...)
	require.Len(t, p.trcSink.AllTraces(), 1)
	compareGoldenTraces(t, goldenPath("phase_spans_collector.yaml"), p.trcSink.AllTraces()[0])
}

// phaseTimes is a phase as the tests write it: name, start and end in ms
// from the session's start, and source.
type phaseTimes struct {
	name       string
	start, end int64
	source     string
}

func TestSessionPhases(t *testing.T) {
	const t0 = int64(1_000_000 * time.Millisecond)
	none := session.Timing{Queue: -1, Prefill: -1, Decode: -1}
	timing := func(q, p, d int64) session.Timing {
		return session.Timing{
			Queue: time.Duration(q) * time.Millisecond, Prefill: time.Duration(p) * time.Millisecond,
			Decode: time.Duration(d) * time.Millisecond, Source: session.TimingResponse,
		}
	}
	for _, tc := range []struct {
		name               string
		first, last, endAt int64 // ms from t0; 0: none
		timing             session.Timing
		want               []phaseTimes
	}{
		{
			name: "engine split, the way to the engine before the queue", first: 300, last: 900, endAt: 910,
			timing: timing(200, 80, 590),
			want: []phaseTimes{
				{spanNameQueue, 20, 220, "response"}, {spanNamePrefill, 220, 300, "response"}, {spanNameDecode, 300, 890, "response"},
			},
		},
		{
			name: "engine parts longer than the session's: kept within it", first: 300, last: 900, endAt: 910,
			timing: timing(400, 100, 700),
			want: []phaseTimes{
				{spanNameQueue, 0, 200, "response"}, {spanNamePrefill, 200, 300, "response"}, {spanNameDecode, 300, 900, "response"},
			},
		},
		{
			name: "no timing: the collector's wait for the first token, then decode", first: 300, last: 900, endAt: 910,
			timing: none,
			want:   []phaseTimes{{spanNameFirstToken, 0, 300, "collector"}, {spanNameDecode, 300, 900, "collector"}},
		},
		{
			name: "queue without prefill: the collector's wait; the engine's decode", first: 300, last: 900, endAt: 910,
			timing: session.Timing{Queue: 100 * time.Millisecond, Prefill: -1, Decode: 500 * time.Millisecond, Source: session.TimingHook},
			want:   []phaseTimes{{spanNameFirstToken, 0, 300, "collector"}, {spanNameDecode, 300, 800, "hook"}},
		},
		{
			name: "one chunk, no timing: nothing to decode", first: 300, last: 300, endAt: 310,
			timing: none,
			want:   []phaseTimes{{spanNameFirstToken, 0, 300, "collector"}},
		},
		{
			name: "no token, the engine's queue and prefill from the start", endAt: 500,
			timing: timing(300, 100, -1),
			want:   []phaseTimes{{spanNameQueue, 0, 300, "response"}, {spanNamePrefill, 300, 400, "response"}},
		},
		{
			name: "no token, no timing: the session span alone", endAt: 500, timing: none,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := func(v int64) int64 {
				if v == 0 {
					return 0
				}
				return t0 + v*int64(time.Millisecond)
			}
			s := &session.Session{StartTime: t0, FirstTokenTime: at(tc.first), LastTokenTime: at(tc.last)}
			e := &session.End{Time: at(tc.endAt), Timing: tc.timing}
			phases, n := sessionPhases(s, e)
			var got []phaseTimes
			for _, ph := range phases[:n] {
				got = append(got, phaseTimes{ph.name, (ph.start - t0) / int64(time.Millisecond), (ph.end - t0) / int64(time.Millisecond), ph.source})
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// phaseSpansOf returns the phase spans under the session span of the
// session with ID id (not the engine's span, its child too).
func phaseSpansOf(p *pipelines, id string) []ptrace.Span {
	parent, ok := sessionSpanOf(p, id)
	if !ok {
		return nil
	}
	var out []ptrace.Span
	for _, s := range allSpans(p.trcSink.AllTraces()) {
		switch s.Name() {
		case spanNameQueue, spanNamePrefill, spanNameDecode, spanNameFirstToken:
		default:
			continue
		}
		if s.ParentSpanID() == parent.SpanID() {
			out = append(out, s)
		}
	}
	return out
}

// By default a kept session comes with its phases: children of its span,
// in its trace and with its tracestate; a session not kept has none.
func TestPhaseSpansByDefault(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Traces = createDefaultConfig().Traces })
	ctx := context.Background()
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(slowSession("slow")...)))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(fastSession("fast")...)))
	p.shutdown(t)
	sessionSpan, ok := sessionSpanOf(p, "slow")
	require.True(t, ok)
	phases := phaseSpansOf(p, "slow")
	require.Len(t, phases, 2)
	for i, want := range []struct {
		name       string
		start, end int64
	}{{spanNameFirstToken, base, base + 600*ms}, {spanNameDecode, base + 600*ms, base + 640*ms}} {
		ph := phases[i]
		assert.Equal(t, want.name, ph.Name())
		assert.Equal(t, sessionSpan.TraceID(), ph.TraceID())
		assert.Equal(t, sessionSpan.TraceState().AsRaw(), ph.TraceState().AsRaw())
		assert.Equal(t, ptrace.SpanKindInternal, ph.Kind())
		assert.Equal(t, pcommon.Timestamp(want.start), ph.StartTimestamp(), want.name)
		assert.Equal(t, pcommon.Timestamp(want.end), ph.EndTimestamp(), want.name)
		assert.Equal(t, "collector", ph.Attributes().AsRaw()[attrTimingSource])
		assert.NotEqual(t, sessionSpan.SpanID(), ph.SpanID())
	}
	assert.NotEqual(t, phases[0].SpanID(), phases[1].SpanID())
	assert.Equal(t, 3, p.trcSink.SpanCount(), "the fast session was not kept: no span of it")
}

func TestPhaseSpansOff(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Traces.PhaseSpans = false })
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(slowSession("slow")...)))
	p.shutdown(t)
	assert.Equal(t, 1, p.trcSink.SpanCount(), "the session span alone")
}

// engine_timing::expect_spans: the very first session waits for its engine
// span, which nothing has announced yet, and comes out with the engine's
// split and its phases.
func TestExpectSpansFromTheFirstSession(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.EngineTiming.ExpectSpans, c.Traces.PhaseSpans = true, true })
	defer p.shutdown(t)
	ctx := context.Background()
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(slowSession("first")...)))
	_, emitted := sessionSpanOf(p, "first")
	require.False(t, emitted, "held for its engine span, though none was seen yet")

	sessionSpanID := pcommon.SpanID(start("first", traceSlow, base).SpanID)
	require.NoError(t, p.traces.ConsumeTraces(ctx, llmRequestSpan(traceSlow, sessionSpanID, 0.4, 0.15, 0.04)))
	span, emitted := sessionSpanOf(p, "first")
	require.True(t, emitted, "released by its engine span")
	assert.Equal(t, "engine_span", span.Attributes().AsRaw()[attrTimingSource])
	phases := phaseSpansOf(p, "first")
	require.Len(t, phases, 3)
	for i, name := range []string{spanNameQueue, spanNamePrefill, spanNameDecode} {
		assert.Equal(t, name, phases[i].Name())
		assert.Equal(t, "engine_span", phases[i].Attributes().AsRaw()[attrTimingSource], name)
	}
	// The first token came 600 ms after the start; 150 ms of prefill before
	// it, and the 400 ms of queue before that.
	assert.Equal(t, pcommon.Timestamp(base+50*ms), phases[0].StartTimestamp())
	assert.Equal(t, pcommon.Timestamp(base+450*ms), phases[1].StartTimestamp())
	assert.Equal(t, pcommon.Timestamp(base+600*ms), phases[1].EndTimestamp())
}

// Without it (the default) the first session goes out at once, without the
// split: no engine span has been seen.
func TestWithoutExpectSpansTheFirstSessionDoesNotWait(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(slowSession("first")...)))
	span, emitted := sessionSpanOf(p, "first")
	require.True(t, emitted)
	assert.NotContains(t, span.Attributes().AsRaw(), attrTimingSource)
}

func TestPhaseSpanIDs(t *testing.T) {
	a, b := pcommon.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, pcommon.SpanID{1, 2, 3, 4, 5, 6, 7, 9}
	ids := map[pcommon.SpanID]bool{}
	for _, parent := range []pcommon.SpanID{a, b} {
		for _, name := range []string{spanNameQueue, spanNamePrefill, spanNameDecode, spanNameFirstToken} {
			id := phaseSpanID(parent, name)
			assert.False(t, id.IsEmpty())
			assert.NotEqual(t, parent, id)
			assert.Equal(t, id, phaseSpanID(parent, name), "a function of the parent and the name")
			ids[id] = true
		}
	}
	assert.Len(t, ids, 8, "all distinct")
}
