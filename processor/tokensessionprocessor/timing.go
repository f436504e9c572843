// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"math"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// The engine's own timing of a request — how long it waited in the queue,
// in prefill, in decode — comes three ways: on the hook's end event, in the
// engine's response (the proxy reads vLLM's per-request metrics off the
// final chunk), or in the engine's span (vLLM's llm_request, which arrives
// seconds after the session ended: vLLM batches its spans). The first two
// come with the end; the span is joined here, to the session it is the
// child of (by parent span), or to the only session of its trace.
//
// Until the span comes (engine_timing::wait at most), an ended session waits
// in the join (awaited), and a kept one's span and summary are held with it
// (heldOutput). Verdicts, alerts and every other metric go out as before:
// only the kept session's outputs and the timing histograms wait.

// Attributes of vLLM's llm_request span (SpanAttributes in vllm/tracing),
// in seconds. The dotted spellings are read too, in case an engine wrote
// them that way.
var (
	spanAttrQueue   = []string{"gen_ai.latency.time_in_queue"}
	spanAttrPrefill = []string{"gen_ai.latency.time_in_model_prefill", "gen_ai.latency.time_in_model.prefill"}
	spanAttrDecode  = []string{"gen_ai.latency.time_in_model_decode", "gen_ai.latency.time_in_model.decode"}
)

const spanAttrResponseModel = "gen_ai.response.model"

// spanTiming reads the engine timing of span: ok is false when it has none
// (not an engine span); valid is false when a part is negative, NaN or not
// a number.
func spanTiming(span ptrace.Span) (t session.Timing, model string, ok, valid bool) {
	attrs := span.Attributes()
	t = session.Timing{Queue: -1, Prefill: -1, Decode: -1, Source: session.TimingEngineSpan}
	valid = true
	for _, part := range [...]struct {
		keys []string
		dst  *time.Duration
	}{{spanAttrQueue, &t.Queue}, {spanAttrPrefill, &t.Prefill}, {spanAttrDecode, &t.Decode}} {
		for _, k := range part.keys {
			v, found := attrs.Get(k)
			if !found {
				continue
			}
			ok = true
			var sec float64
			switch v.Type() {
			case pcommon.ValueTypeDouble:
				sec = v.Double()
			case pcommon.ValueTypeInt:
				sec = float64(v.Int())
			default:
				valid = false
				continue
			}
			// An hour of queue is absurd already; it also keeps the
			// conversion to ns far from overflowing.
			if math.IsNaN(sec) || sec < 0 || sec > 3600 {
				valid = false
				continue
			}
			*part.dst = time.Duration(sec * float64(time.Second))
			break
		}
	}
	if m, found := attrs.Get(spanAttrResponseModel); found && m.Type() == pcommon.ValueTypeStr {
		model = m.Str()
	}
	return t, model, ok, valid
}

// awaited is an ended session waiting for its engine's span.
type awaited struct {
	trace     pcommon.TraceID
	span      pcommon.SpanID
	live      *sessionmetrics.Live
	errorType string
	duration  time.Duration
	held      *heldOutput // its outputs, when kept and held
	wait                  // done: joined, or given up
}

// earlySpan is an engine span's timing that came before its session ended
// (a span exporter without batching), kept until the session ends.
type earlySpan struct {
	trace  pcommon.TraceID
	parent pcommon.SpanID
	timing session.Timing
	model  string
	wait
}

// timingJoin joins engine spans to sessions: the sessions that wait for
// theirs, and the spans that came before their session ended. The fold
// calls it under its lock; it records the timing it joins in the session
// metrics and counts what it joins, gives up on or drops.
type timingJoin struct {
	cfg       EngineTimingConfig
	metrics   *sessionmetrics.Aggregator
	telemetry *processorTelemetry

	// seen is set once an engine span with timing has passed: only then do
	// sessions wait for one, unless engine_timing::expect_spans says they
	// come from the start.
	seen bool
	// bySpan and byTrace index the awaited sessions; a trace matches by
	// itself only while it has one awaited session.
	bySpan  map[pcommon.SpanID]*awaited
	byTrace traceIndex[awaited]
	// queue is every awaited session in order of until (the wait is the
	// same for all), for expiry.
	queue []*awaited

	earlyByParent map[pcommon.SpanID]*earlySpan
	earlyByTrace  traceIndex[earlySpan]
	earlyQueue    []*earlySpan
}

// traceIndex finds the one item of a trace: while a trace has several, it
// finds none (they match by parent span only), until all are gone.
type traceIndex[T any] map[pcommon.TraceID]traceItems[T]

type traceItems[T any] struct {
	n   int
	one *T
}

func (ix traceIndex[T]) add(trace pcommon.TraceID, v *T) {
	it := ix[trace]
	it.n++
	it.one = nil
	if it.n == 1 {
		it.one = v
	}
	ix[trace] = it
}

func (ix traceIndex[T]) remove(trace pcommon.TraceID, v *T) {
	it := ix[trace]
	if it.n--; it.n <= 0 {
		delete(ix, trace)
		return
	}
	if it.one == v {
		it.one = nil
	}
	ix[trace] = it
}

// only returns the trace's item when it has one.
func (ix traceIndex[T]) only(trace pcommon.TraceID) *T { return ix[trace].one }

func newTimingJoin(cfg EngineTimingConfig, metrics *sessionmetrics.Aggregator, telemetry *processorTelemetry) timingJoin {
	return timingJoin{
		cfg: cfg, metrics: metrics, telemetry: telemetry,
		bySpan: make(map[pcommon.SpanID]*awaited), byTrace: make(traceIndex[awaited]),
		earlyByParent: make(map[pcommon.SpanID]*earlySpan), earlyByTrace: make(traceIndex[earlySpan]),
	}
}

// pending counts the sessions and spans waiting in the join.
func (j *timingJoin) pending() int { return len(j.bySpan) + len(j.earlyByParent) }

// join gives the session s, ended by e, its engine timing: the one its
// end brought, or an engine span that came before the end. Without either,
// once engine spans are seen to flow (or from the start, with
// engine_timing::expect_spans), the session waits in the join for its
// span, when a traces pipeline takes the outputs (toTraces); the returned
// awaited is its place, nil when it does not wait. (A deployment without
// engine spans keeps nothing here, and delays nothing.) live is the
// session's metric series; now the collector's time.
func (j *timingJoin) join(s *session.Session, e *session.End, live *sessionmetrics.Live, toTraces bool, now int64) *awaited {
	if !e.Timing.Known() {
		if sp := j.takeEarly(s.SpanID, s.TraceID); sp != nil {
			if sp.timing.Plausible(s.Duration(e)) {
				e.Timing = sp.timing
				if e.ResponseModel == "" {
					e.ResponseModel = sp.model
				}
			} else {
				j.telemetry.timing(sp.timing.Source, timingInvalid)
			}
		}
	}
	if e.Timing.Known() {
		j.metrics.EngineTiming(live, s.ErrorType(e), metricsTiming(e.Timing))
		j.telemetry.timing(e.Timing.Source, timingJoined)
		return nil
	}
	if (!j.seen && !j.cfg.ExpectSpans) || !toTraces {
		return nil
	}
	if j.pending() >= j.cfg.MaxSessions {
		j.telemetry.timing(session.TimingEngineSpan, timingOverflow)
		return nil
	}
	a := &awaited{
		trace: s.TraceID, span: s.SpanID, live: live, errorType: s.ErrorType(e), duration: s.Duration(e),
		wait: wait{until: now + int64(j.cfg.Wait)},
	}
	j.bySpan[a.span] = a
	j.byTrace.add(a.trace, a)
	j.queue = append(j.queue, a)
	return a
}

func metricsTiming(t session.Timing) sessionmetrics.Timing {
	return sessionmetrics.Timing{Queue: t.Queue, Prefill: t.Prefill, HasQueue: t.Queue >= 0, HasPrefill: t.Prefill >= 0}
}

// takeEarly returns the early span of the session with span ID span in
// trace, and forgets it: the span that named the session as its parent, else
// the only early span of its trace.
func (j *timingJoin) takeEarly(span pcommon.SpanID, trace pcommon.TraceID) *earlySpan {
	sp := j.earlyByParent[span]
	if sp == nil {
		sp = j.earlyByTrace.only(trace)
	}
	if sp == nil || sp.done {
		return nil
	}
	sp.done = true
	j.forgetEarly(sp)
	return sp
}

func (j *timingJoin) forgetEarly(sp *earlySpan) {
	if j.earlyByParent[sp.parent] == sp {
		delete(j.earlyByParent, sp.parent)
	}
	j.earlyByTrace.remove(sp.trace, sp)
}

// forget takes a out of the join. A trace that had several awaited
// sessions matches by parent only until all of them are gone.
func (j *timingJoin) forget(a *awaited) {
	a.done = true
	if j.bySpan[a.span] == a {
		delete(j.bySpan, a.span)
	}
	j.byTrace.remove(a.trace, a)
}

// observe reads the timing of an engine span passing through, at collector
// time now, and joins it to the session it belongs to (its parent, or the
// only session of its trace that waits); one that comes before its session
// ended waits for it.
func (j *timingJoin) observe(span ptrace.Span, now int64) {
	t, model, ok, valid := spanTiming(span)
	if !ok {
		return
	}
	j.seen = true
	if !valid {
		j.telemetry.timing(session.TimingEngineSpan, timingInvalid)
		return
	}
	a := j.bySpan[span.ParentSpanID()]
	if a == nil {
		a = j.byTrace.only(span.TraceID())
	}
	if a == nil || a.done {
		if j.pending() >= j.cfg.MaxSessions {
			j.telemetry.timing(session.TimingEngineSpan, timingOverflow)
			return
		}
		sp := &earlySpan{
			trace: span.TraceID(), parent: span.ParentSpanID(), timing: t, model: model,
			wait: wait{until: now + int64(j.cfg.Wait)},
		}
		if old := j.earlyByParent[sp.parent]; old != nil {
			old.done = true // a second span of one parent: the later wins
			j.forgetEarly(old)
		}
		j.earlyByParent[sp.parent] = sp
		j.earlyByTrace.add(sp.trace, sp)
		j.earlyQueue = append(j.earlyQueue, sp)
		return
	}
	j.forget(a)
	if !t.Plausible(a.duration) {
		j.telemetry.timing(session.TimingEngineSpan, timingInvalid)
		return
	}
	j.metrics.EngineTiming(a.live, a.errorType, metricsTiming(t))
	j.telemetry.timing(session.TimingEngineSpan, timingJoined)
	if h := a.held; h != nil {
		h.end.Timing = t
		if h.end.ResponseModel == "" {
			h.end.ResponseModel = model
		}
		h.timingUntil = 0
	}
}

// expire gives up, at collector time now, on the sessions whose span did
// not come within the wait, and on early spans whose session did not end.
func (j *timingJoin) expire(now int64) {
	j.queue = expireWaits(j.queue, now, func(a *awaited) {
		j.forget(a)
		j.telemetry.timing(session.TimingEngineSpan, timingMissing)
	})
	j.earlyQueue = expireWaits(j.earlyQueue, now, func(sp *earlySpan) {
		sp.done = true
		j.forgetEarly(sp)
		j.telemetry.timing(session.TimingEngineSpan, timingUnmatched)
	})
}
