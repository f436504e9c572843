// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"encoding/binary"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// Phase spans (traces::phase_spans): a kept session's time as child spans of
// its session span, so that a trace UI draws the waterfall. vLLM's own
// proposal (vllm-project/vllm#44402) names its phases vllm_queue,
// vllm_prefill and vllm_decode under llm_request; these are the same three
// phases, derived by the collector for any engine, so they take the words
// and not the engine's prefix, in the namespace of the processor's other
// spans (llm.session.verdict).
const (
	spanNameQueue   = "llm.session.queue"
	spanNamePrefill = "llm.session.prefill"
	spanNameDecode  = "llm.session.decode"
	// spanNameFirstToken is the wait for the first token when the engine did
	// not split it: queue, prefill and the way to and from the engine,
	// which the collector cannot tell apart.
	spanNameFirstToken = "llm.session.time_to_first_token"
	// timingSourceCollector is llm.session.timing_source of a phase whose
	// bounds are the collector's own (the session's first and last token).
	timingSourceCollector = "collector"
)

// phase is one phase span: its name, bounds (on the session span's clock)
// and whose bounds they are.
type phase struct {
	name       string
	start, end int64
	source     string
}

// sessionPhases returns the phases of a session in order, at most three,
// on the session span's clock. The engine gives durations, not times: its
// queue and prefill are placed back from the first token (the end of
// prefill, as the collector saw it), its decode forward from it; what lies
// before the queue is the way to the engine. Every bound is kept within the
// session span (the engine's parts may exceed it by a little, see
// session.Timing.Plausible). Without the engine's queue and prefill, the
// collector's own wait for the first token stands for both; without its
// decode, the first to the last token.
func sessionPhases(s *session.Session, e *session.End) (out [3]phase, n int) {
	start, end, first := s.StartedAt(), s.EndedAt(e), s.FirstTokenTime
	clamp := func(t int64) int64 { return min(max(t, start), end) }
	add := func(name string, from, to int64, source string) {
		out[n] = phase{name: name, start: clamp(from), end: clamp(to), source: source}
		n++
	}
	t := e.Timing
	split := t.Known() && t.Queue >= 0 && t.Prefill >= 0
	if first == 0 {
		// No token: the engine's queue and prefill from the start, if it
		// said; the session span alone shows the wait otherwise.
		if t.Known() && t.Queue >= 0 {
			q := start + int64(t.Queue)
			add(spanNameQueue, start, q, t.Source)
			if t.Prefill >= 0 {
				add(spanNamePrefill, q, q+int64(t.Prefill), t.Source)
			}
		}
		return out, n
	}
	if split {
		prefillStart := first - int64(t.Prefill)
		add(spanNameQueue, prefillStart-int64(t.Queue), prefillStart, t.Source)
		add(spanNamePrefill, prefillStart, first, t.Source)
	} else {
		add(spanNameFirstToken, start, first, timingSourceCollector)
	}
	switch {
	case t.Known() && t.Decode >= 0:
		add(spanNameDecode, first, first+int64(t.Decode), t.Source)
	case end > first:
		add(spanNameDecode, first, end, timingSourceCollector)
	}
	return out, n
}

// appendPhaseSpans writes the phase spans of the kept session s into ss:
// children of its session span, with its trace and tracestate, kind
// INTERNAL. They carry llm.session.timing_source and nothing of the engine
// span's gen_ai.latency.* keys: a token_session further down the line would
// read a span with those as an engine span.
func appendPhaseSpans(ss ptrace.ScopeSpans, s *session.Session, e *session.End) {
	phases, n := sessionPhases(s, e)
	for _, ph := range phases[:n] {
		span := ss.Spans().AppendEmpty()
		span.SetTraceID(s.TraceID)
		span.SetSpanID(phaseSpanID(s.SpanID, ph.name))
		span.SetParentSpanID(s.SpanID)
		span.TraceState().FromRaw(s.TraceState())
		heldspans.StampThreshold(span.TraceState(), s.Threshold)
		span.SetName(ph.name)
		span.SetKind(ptrace.SpanKindInternal)
		span.SetStartTimestamp(pcommon.Timestamp(ph.start))
		span.SetEndTimestamp(pcommon.Timestamp(ph.end))
		span.Attributes().PutStr(attrTimingSource, ph.source)
	}
}

// phaseSpanID derives a phase span's ID from its session span's ID and its
// name (FNV-1a, 64 bits) rather than drawing it: a session's outputs are
// then a function of its events alone (the golden tests compare them
// whole), and the IDs still differ from each other and, but by chance,
// from every other span of the trace.
func phaseSpanID(parent pcommon.SpanID, name string) pcommon.SpanID {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, b := range parent {
		h = (h ^ uint64(b)) * prime
	}
	for i := range len(name) {
		h = (h ^ uint64(name[i])) * prime
	}
	if h == 0 {
		h = 1 // the zero span ID is invalid
	}
	var id pcommon.SpanID
	binary.BigEndian.PutUint64(id[:], h)
	return id
}
