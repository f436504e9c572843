// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package heldspans holds the spans of traces whose LLM session has no sampling
// verdict yet, for the traces pipeline of the token_session processor, and
// remembers verdicts so spans that arrive after the verdict are decided the same
// way.
//
// The processor decides, span by span: a span whose trace has a cached verdict
// (Verdict) is kept or dropped at once; a span whose trace belongs to an active
// session is held (Hold) until the session's verdict (Release) or until it has
// waited MaxHold (Expire, which sends it on: fail open); any other span passes
// through. Every bound is enforced here and reported to the caller, who counts.
//
// A Buffer is not safe for concurrent use: the processor serializes all calls
// under its own lock.
package heldspans // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"

import (
	"errors"
	"strings"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// Buffer holds spans per trace until a verdict, bounded in spans and in time,
// and caches verdicts in a fixed-size LRU. See the package comment for the
// locking rule.
type Buffer struct {
	maxHeldSpans int
	maxHold      time.Duration

	traces    map[pcommon.TraceID]*heldTrace
	heldSpans int
	// Held traces in arrival order of their first span, so Expire visits only
	// the expired ones at the front.
	oldest, newest *heldTrace

	verdicts *verdictCache
}

// heldTrace is the holding area of one trace. Its spans are grouped by
// resource and scope, so a resource is copied once per trace, not per span.
type heldTrace struct {
	id     pcommon.TraceID
	since  time.Time // when its first held span arrived
	spans  int
	groups ptrace.ResourceSpansSlice
	// Arrival-order list links.
	prev, next *heldTrace
}

// New returns an empty Buffer, or the validation error of cfg.
func New(cfg Config) (*Buffer, error) {
	if err := errors.Join(cfg.Validate()...); err != nil {
		return nil, err
	}
	return &Buffer{
		maxHeldSpans: cfg.MaxHeldSpans,
		maxHold:      cfg.MaxHold,
		traces:       make(map[pcommon.TraceID]*heldTrace),
		verdicts:     newVerdictCache(cfg.VerdictCacheSize),
	}, nil
}

// Hold copies span, with its resource and scope, into the holding area of
// traceID (normally span.TraceID()); nothing of the arguments is referenced
// after it returns. now is the arrival time that Expire measures MaxHold from;
// only a trace's first held span sets it.
//
// Hold returns false, and holds nothing, when MaxHeldSpans spans are already
// held: the caller then passes the span on (fail open) and counts it.
func (b *Buffer) Hold(traceID pcommon.TraceID, res pcommon.Resource, resSchemaURL string,
	scope pcommon.InstrumentationScope, scopeSchemaURL string, span ptrace.Span, now time.Time,
) bool {
	return b.hold(traceID, res, resSchemaURL, scope, scopeSchemaURL, span, now, false)
}

// HoldMove is Hold without the copy of the span: when it returns true it has
// moved the span's content out, leaving span empty, and the caller must
// remove span from its batch (SpanSlice.RemoveIf with HoldMove as the
// predicate does both). Resource and scope are still copied, once per trace.
// Use it only when the processor owns its input (MutatesData: true); it saves
// copying every attribute, event and link of the span.
func (b *Buffer) HoldMove(traceID pcommon.TraceID, res pcommon.Resource, resSchemaURL string,
	scope pcommon.InstrumentationScope, scopeSchemaURL string, span ptrace.Span, now time.Time,
) bool {
	return b.hold(traceID, res, resSchemaURL, scope, scopeSchemaURL, span, now, true)
}

func (b *Buffer) hold(traceID pcommon.TraceID, res pcommon.Resource, resSchemaURL string,
	scope pcommon.InstrumentationScope, scopeSchemaURL string, span ptrace.Span, now time.Time, move bool,
) bool {
	if b.heldSpans >= b.maxHeldSpans {
		return false
	}
	t := b.traces[traceID]
	if t == nil {
		t = &heldTrace{id: traceID, since: now, groups: ptrace.NewResourceSpansSlice()}
		b.traces[traceID] = t
		b.pushNewest(t)
	}
	into := t.scopeSpans(res, resSchemaURL, scope, scopeSchemaURL).Spans().AppendEmpty()
	if move {
		span.MoveTo(into)
	} else {
		span.CopyTo(into)
	}
	t.spans++
	b.heldSpans++
	return true
}

// Release ends holding for traceID with its verdict: keep, with threshold th
// (the OTEP 235 sampling threshold of the trace), or drop. A trace kept before
// stays kept, at the lower of the two thresholds. Kept spans get the
// threshold in their tracestate (StampThreshold) and are moved into dst,
// merged into a ResourceSpans and ScopeSpans of dst with an equal resource and
// scope when there is one, else appended with their own; dropped spans are
// discarded (dst is not touched and may be the zero Traces). The verdict is
// cached either way, also for a trace with no held spans, so later spans of
// the trace are decided by Verdict. It returns how many spans were kept and
// dropped.
//
// Merging compares each released resource with those already in dst, so pass
// a dst that collects one flush, not an ever-growing one.
func (b *Buffer) Release(traceID pcommon.TraceID, keep bool, th sampling.Threshold, dst ptrace.Traces) (kept, dropped int) {
	keep, th = b.verdicts.put(traceID, keep, th)
	t := b.traces[traceID]
	if t == nil {
		return 0, 0
	}
	b.remove(t)
	if !keep {
		return 0, t.spans
	}
	for _, rs := range t.groups.All() {
		for _, ss := range rs.ScopeSpans().All() {
			for _, span := range ss.Spans().All() {
				StampThreshold(span.TraceState(), th)
			}
		}
	}
	moveGroups(t.groups, dst)
	return t.spans, 0
}

// Verdict returns the cached verdict for traceID (with the threshold of a
// keep) and whether there is one, and marks it most recently used. It does
// not allocate.
func (b *Buffer) Verdict(traceID pcommon.TraceID) (keep bool, th sampling.Threshold, known bool) {
	return b.verdicts.get(traceID)
}

// KeptTrace reports whether traceID was kept, with its threshold: the
// session table's TraceMemory.
func (b *Buffer) KeptTrace(traceID pcommon.TraceID) (sampling.Threshold, bool) {
	keep, th, _ := b.verdicts.get(traceID)
	return th, keep
}

// StampThreshold writes th, the sampling threshold of a kept span, into its
// W3C tracestate's OTel entry (ot=th:…), keeping the other entries and rv, so
// that span metrics and samplers downstream weigh it right (OTEP 235). A
// span already sampled at a higher threshold keeps it; a tracestate that does
// not parse is left as it is.
func StampThreshold(ts pcommon.TraceState, th sampling.Threshold) {
	w3c, err := sampling.NewW3CTraceState(ts.AsRaw())
	if err != nil {
		return
	}
	if w3c.OTelValue().UpdateTValueWithSampling(th) != nil {
		return
	}
	var b strings.Builder
	if w3c.Serialize(&b) == nil {
		ts.FromRaw(b.String())
	}
}

// Expire moves into dst, as kept, every held trace whose first held span
// arrived more than MaxHold before now: better to send spans unsampled than to
// lose them. No verdict is cached for them. Traces are visited in arrival
// order and the walk stops at the first one still within MaxHold, so the cost
// is O(expired traces). It returns the number of spans moved.
func (b *Buffer) Expire(now time.Time, dst ptrace.Traces) int {
	n := 0
	for t := b.oldest; t != nil && now.Sub(t.since) > b.maxHold; t = b.oldest {
		b.remove(t)
		moveGroups(t.groups, dst)
		n += t.spans
	}
	return n
}

// Flush moves every held trace into dst as kept, oldest first, without caching
// verdicts (for Shutdown: fail open). It returns the number of spans moved.
func (b *Buffer) Flush(dst ptrace.Traces) int {
	n := 0
	for t := b.oldest; t != nil; t = b.oldest {
		b.remove(t)
		moveGroups(t.groups, dst)
		n += t.spans
	}
	return n
}

// HeldSpans returns the number of spans held across all traces.
func (b *Buffer) HeldSpans() int { return b.heldSpans }

// HeldTraces returns the number of traces with held spans.
func (b *Buffer) HeldTraces() int { return len(b.traces) }

// CachedVerdicts returns the number of trace IDs in the verdict cache.
func (b *Buffer) CachedVerdicts() int { return b.verdicts.len() }

func (b *Buffer) pushNewest(t *heldTrace) {
	t.prev = b.newest
	if b.newest != nil {
		b.newest.next = t
	} else {
		b.oldest = t
	}
	b.newest = t
}

// remove forgets t; its groups stay with t for the caller to move or discard.
func (b *Buffer) remove(t *heldTrace) {
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		b.oldest = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		b.newest = t.prev
	}
	t.prev, t.next = nil, nil
	delete(b.traces, t.id)
	b.heldSpans -= t.spans
}

// scopeSpans returns the group of t for res and scope, adding it (with copies
// of res and scope) if t has none yet. Traces rarely span more than a few
// resources and scopes, so a linear search is the cheap way.
func (t *heldTrace) scopeSpans(res pcommon.Resource, resSchemaURL string,
	scope pcommon.InstrumentationScope, scopeSchemaURL string,
) ptrace.ScopeSpans {
	rs, ok := findResource(t.groups, t.groups.Len(), res, resSchemaURL)
	if !ok {
		rs = t.groups.AppendEmpty()
		res.CopyTo(rs.Resource())
		rs.SetSchemaUrl(resSchemaURL)
	}
	sss := rs.ScopeSpans()
	ss, ok := findScope(sss, sss.Len(), scope, scopeSchemaURL)
	if !ok {
		ss = sss.AppendEmpty()
		scope.CopyTo(ss.Scope())
		ss.SetSchemaUrl(scopeSchemaURL)
	}
	return ss
}

// moveGroups moves the held groups into dst, merging each into an equal
// resource and scope that dst already had.
func moveGroups(groups ptrace.ResourceSpansSlice, dst ptrace.Traces) {
	out := dst.ResourceSpans()
	if out.Len() == 0 {
		groups.MoveAndAppendTo(out) // nothing to merge with: move the whole slice
		return
	}
	// Held groups are distinct from each other, so only the groups dst had
	// before are candidates for a merge.
	before := out.Len()
	for i := 0; i < groups.Len(); i++ {
		rs := groups.At(i)
		into, ok := findResource(out, before, rs.Resource(), rs.SchemaUrl())
		if !ok {
			rs.MoveTo(out.AppendEmpty())
			continue
		}
		intoScopes := into.ScopeSpans()
		scopesBefore := intoScopes.Len()
		for j := 0; j < rs.ScopeSpans().Len(); j++ {
			ss := rs.ScopeSpans().At(j)
			if intoSS, ok := findScope(intoScopes, scopesBefore, ss.Scope(), ss.SchemaUrl()); ok {
				ss.Spans().MoveAndAppendTo(intoSS.Spans())
			} else {
				ss.MoveTo(intoScopes.AppendEmpty())
			}
		}
	}
}

// findResource searches rss[:n] for a resource equal to res with the same
// schema URL. Entity refs are not compared (pcommon does not expose them).
func findResource(rss ptrace.ResourceSpansSlice, n int, res pcommon.Resource, schemaURL string) (ptrace.ResourceSpans, bool) {
	return findFirst(n, rss.At, func(rs ptrace.ResourceSpans) bool {
		r := rs.Resource()
		return rs.SchemaUrl() == schemaURL &&
			r.DroppedAttributesCount() == res.DroppedAttributesCount() &&
			r.Attributes().Equal(res.Attributes())
	})
}

// findScope searches sss[:n] for a scope equal to scope with the same schema URL.
func findScope(sss ptrace.ScopeSpansSlice, n int, scope pcommon.InstrumentationScope, schemaURL string) (ptrace.ScopeSpans, bool) {
	return findFirst(n, sss.At, func(ss ptrace.ScopeSpans) bool {
		s := ss.Scope()
		return ss.SchemaUrl() == schemaURL &&
			s.Name() == scope.Name() &&
			s.Version() == scope.Version() &&
			s.DroppedAttributesCount() == scope.DroppedAttributesCount() &&
			s.Attributes().Equal(scope.Attributes())
	})
}

// findFirst returns the first of elements at(0) … at(n-1) that match.
func findFirst[E any](n int, at func(int) E, match func(E) bool) (E, bool) {
	for i := range n {
		if e := at(i); match(e) {
			return e, true
		}
	}
	var none E
	return none, false
}
