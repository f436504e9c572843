// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"sync"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"
)

// spanGate is the part of the core that tail-samples the other spans of a
// session's trace: it holds them until the session's verdict and remembers
// the verdicts of ended traces (internal/heldspans). mu guards buf. The
// sessions part calls in with its own lock held (a verdict releases a
// trace's spans; a span batch asks whether its trace has an active
// session); mu is a leaf: nothing is locked under it.
type spanGate struct {
	mu  sync.Mutex
	buf *heldspans.Buffer
}

// spanCounts is what became of a span batch's spans.
type spanCounts struct {
	held, dropped, overflow int
}

// traceSessions is what the span gate asks the sessions part while routing
// a batch, under the sessions' lock.
type traceSessions interface {
	// observeEngineSpan reads the engine timing of span, if it is an
	// engine span, for the session it belongs to.
	observeEngineSpan(span ptrace.Span)
	// traceActive reports whether the trace has an active session, and
	// whether it was kept already (with the threshold).
	traceActive(id pcommon.TraceID) (active, kept bool, th sampling.Threshold)
}

// route holds the spans of traces with an active session until the
// session's verdict, drops those of traces already dropped, stamps the
// threshold on those of kept traces, and leaves the others in td.
func (g *spanGate) route(td ptrace.Traces, now time.Time, fold traceSessions) (n spanCounts) {
	g.mu.Lock()
	defer g.mu.Unlock()
	td.ResourceSpans().RemoveIf(func(rs ptrace.ResourceSpans) bool {
		rs.ScopeSpans().RemoveIf(func(ss ptrace.ScopeSpans) bool {
			ss.Spans().RemoveIf(func(span ptrace.Span) bool {
				fold.observeEngineSpan(span)
				id := span.TraceID()
				// A trace kept once stays kept, when it calls the model
				// again too; every kept span carries its threshold.
				keep, th, known := g.buf.Verdict(id)
				if known && keep {
					heldspans.StampThreshold(span.TraceState(), th)
					return false
				}
				if active, kept, th := fold.traceActive(id); active {
					if kept {
						heldspans.StampThreshold(span.TraceState(), th)
						return false
					}
					if g.buf.HoldMove(id, rs.Resource(), rs.SchemaUrl(), ss.Scope(), ss.SchemaUrl(), span, now) {
						n.held++
						return true
					}
					n.overflow++
					return false
				}
				if known {
					n.dropped++
					return true
				}
				return false
			})
			return ss.Spans().Len() == 0
		})
		return rs.ScopeSpans().Len() == 0
	})
	return n
}

// release ends the wait of a trace's held spans on its verdict: kept ones
// go into into, with the threshold.
func (g *spanGate) release(trace pcommon.TraceID, keep bool, th sampling.Threshold, into ptrace.Traces) (kept, dropped int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Release(trace, keep, th, into)
}

// keptTrace is the session table's memory of ended traces' verdicts.
func (g *spanGate) keptTrace(id pcommon.TraceID) (sampling.Threshold, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.KeptTrace(id)
}

// expire sends on, into into, the traces whose spans waited too long.
func (g *spanGate) expire(now time.Time, into ptrace.Traces) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Expire(now, into)
}

// flush sends on every held span (shutdown).
func (g *spanGate) flush(into ptrace.Traces) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.buf.Flush(into)
}

func (g *spanGate) heldSpans() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.HeldSpans()
}
