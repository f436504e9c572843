// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package heldspans

import (
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func tid(n byte) pcommon.TraceID { return pcommon.TraceID{0x11, 15: n} }

// source is one resource+scope of an input batch, as the processor sees it.
type source struct {
	rs ptrace.ResourceSpans
	ss ptrace.ScopeSpans
}

// newSource builds a fresh input batch every time, so equal resources are
// equal by value, never by identity.
func newSource(service, scopeName string) source {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.SetSchemaUrl("https://opentelemetry.io/schemas/1.26.0")
	rs.Resource().Attributes().PutStr("service.name", service)
	rs.Resource().Attributes().PutStr("host.name", "gpu-node-7")
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName(scopeName)
	ss.Scope().SetVersion("1.0")
	ss.Scope().Attributes().PutStr("scope.attr", scopeName)
	return source{rs: rs, ss: ss}
}

func (s source) span(trace pcommon.TraceID, name string) ptrace.Span {
	sp := s.ss.Spans().AppendEmpty()
	sp.SetTraceID(trace)
	sp.SetSpanID(pcommon.SpanID{byte(len(name)), name[len(name)-1]})
	sp.SetName(name)
	sp.Attributes().PutStr("gen_ai.request.model", "llama-3-8b")
	return sp
}

func (s source) hold(b *Buffer, trace pcommon.TraceID, name string, now time.Time) bool {
	return b.Hold(trace, s.rs.Resource(), s.rs.SchemaUrl(), s.ss.Scope(), s.ss.SchemaUrl(), s.span(trace, name), now)
}

func newBuffer(tb testing.TB, cfg Config) *Buffer {
	tb.Helper()
	b, err := New(cfg)
	require.NoError(tb, err)
	return b
}

// layout renders dst as service/scope: span names, in order, to compare grouping.
func layout(td ptrace.Traces) []string {
	var out []string
	for _, rs := range td.ResourceSpans().All() {
		svc, _ := rs.Resource().Attributes().Get("service.name")
		for _, ss := range rs.ScopeSpans().All() {
			line := svc.Str() + "/" + ss.Scope().Name() + ":"
			for _, sp := range ss.Spans().All() {
				line += " " + sp.Name()
			}
			out = append(out, line)
		}
	}
	return out
}

// arrivalOrder walks the held traces oldest first, checking the list links,
// the index and the span count; it returns the tid numbers.
func arrivalOrder(t *testing.T, b *Buffer) []byte {
	t.Helper()
	var out []byte
	var prev *heldTrace
	spans := 0
	for h := b.oldest; h != nil; h = h.next {
		require.Same(t, prev, h.prev)
		require.Same(t, h, b.traces[h.id])
		out = append(out, h.id[15])
		spans += h.spans
		prev = h
	}
	require.Same(t, prev, b.newest)
	require.Len(t, b.traces, len(out))
	require.Equal(t, b.heldSpans, spans)
	return out
}

func TestReleaseKeepGroupsByResourceAndScope(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	trace := tid(1)
	// Four input batches; "vllm" appears in three of them with equal attributes.
	vllm1, gw, vllm2, vllmOther := newSource("vllm", "vllm.tracing"), newSource("gateway", "otelhttp"),
		newSource("vllm", "vllm.tracing"), newSource("vllm", "vllm.other")
	require.True(t, vllm1.hold(b, trace, "llm_request-a", t0))
	require.True(t, gw.hold(b, trace, "POST /v1/chat-b", t0))
	require.True(t, vllm2.hold(b, trace, "llm_request-c", t0))
	require.True(t, vllmOther.hold(b, trace, "engine_step-d", t0))
	require.True(t, vllm1.hold(b, trace, "llm_request-e", t0))
	assert.Equal(t, 5, b.HeldSpans())
	assert.Equal(t, 1, b.HeldTraces())

	dst := ptrace.NewTraces()
	kept, dropped := b.Release(trace, true, th0, dst)
	assert.Equal(t, 5, kept)
	assert.Equal(t, 0, dropped)
	assert.Equal(t, []string{
		"vllm/vllm.tracing: llm_request-a llm_request-c llm_request-e",
		"vllm/vllm.other: engine_step-d",
		"gateway/otelhttp: POST /v1/chat-b",
	}, layout(dst))
	assert.Equal(t, 5, dst.SpanCount())
	assert.Equal(t, 0, b.HeldSpans())
	assert.Equal(t, 0, b.HeldTraces())

	// Resource, scope and span arrive intact.
	rs := dst.ResourceSpans().At(0)
	assert.Equal(t, map[string]any{"service.name": "vllm", "host.name": "gpu-node-7"}, rs.Resource().Attributes().AsRaw())
	assert.Equal(t, "https://opentelemetry.io/schemas/1.26.0", rs.SchemaUrl())
	ss := rs.ScopeSpans().At(0)
	assert.Equal(t, "1.0", ss.Scope().Version())
	assert.Equal(t, map[string]any{"scope.attr": "vllm.tracing"}, ss.Scope().Attributes().AsRaw())
	sp := ss.Spans().At(0)
	assert.Equal(t, trace, sp.TraceID())
	assert.Equal(t, map[string]any{"gen_ai.request.model": "llama-3-8b"}, sp.Attributes().AsRaw())

	keep, _, known := b.Verdict(trace)
	assert.True(t, keep)
	assert.True(t, known)
}

func TestResourceSchemaURLAndDroppedCountSeparateGroups(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	a, other, dropped := newSource("vllm", "s"), newSource("vllm", "s"), newSource("vllm", "s")
	other.rs.SetSchemaUrl("https://opentelemetry.io/schemas/1.30.0")
	dropped.rs.Resource().SetDroppedAttributesCount(2)
	a.hold(b, tid(1), "a", t0)
	other.hold(b, tid(1), "b", t0)
	dropped.hold(b, tid(1), "c", t0)
	dst := ptrace.NewTraces()
	b.Release(tid(1), true, th0, dst)
	assert.Equal(t, []string{"vllm/s: a", "vllm/s: b", "vllm/s: c"}, layout(dst))
}

func TestReleaseMergesIntoEqualGroupsOfDst(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	newSource("vllm", "vllm.tracing").hold(b, tid(1), "one", t0)
	newSource("vllm", "vllm.tracing").hold(b, tid(2), "two", t0)
	newSource("vllm", "vllm.other").hold(b, tid(2), "two-b", t0)
	newSource("gateway", "otelhttp").hold(b, tid(3), "three", t0)

	dst := ptrace.NewTraces()
	b.Release(tid(1), true, th0, dst)
	b.Release(tid(2), true, th0, dst)
	b.Release(tid(3), true, th0, dst)
	assert.Equal(t, []string{
		"vllm/vllm.tracing: one two",
		"vllm/vllm.other: two-b",
		"gateway/otelhttp: three",
	}, layout(dst))
}

func TestReleaseDropDiscardsAndCounts(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	src := newSource("vllm", "s")
	src.hold(b, tid(1), "a", t0)
	src.hold(b, tid(1), "b", t0)
	src.hold(b, tid(2), "other", t0)

	dst := ptrace.NewTraces()
	kept, dropped := b.Release(tid(1), false, th0, dst)
	assert.Equal(t, 0, kept)
	assert.Equal(t, 2, dropped)
	assert.Equal(t, 0, dst.ResourceSpans().Len())
	assert.Equal(t, 1, b.HeldSpans())
	assert.Equal(t, []byte{2}, arrivalOrder(t, b))

	// A drop never touches dst, so the zero Traces is fine there.
	kept, dropped = b.Release(tid(2), false, th0, ptrace.Traces{})
	assert.Equal(t, 0, kept)
	assert.Equal(t, 1, dropped)
}

func TestVerdictDecidesLateSpans(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	src := newSource("vllm", "s")
	src.hold(b, tid(1), "a", t0)
	src.hold(b, tid(2), "b", t0)
	b.Release(tid(1), true, th0, ptrace.NewTraces())
	b.Release(tid(2), false, th0, ptrace.NewTraces())

	keep, _, known := b.Verdict(tid(1))
	assert.True(t, known)
	assert.True(t, keep)
	keep, _, known = b.Verdict(tid(2))
	assert.True(t, known)
	assert.False(t, keep)
	_, _, known = b.Verdict(tid(3))
	assert.False(t, known)
	assert.Equal(t, 2, b.CachedVerdicts())
}

func TestVerdictCacheBoundEvictsLeastRecentlyUsed(t *testing.T) {
	cfg := DefaultConfig()
	cfg.VerdictCacheSize = 2
	b := newBuffer(t, cfg)
	b.Release(tid(1), true, th0, ptrace.NewTraces())
	b.Release(tid(2), false, th0, ptrace.NewTraces())
	_, _, known := b.Verdict(tid(1)) // 2 becomes least recently used
	require.True(t, known)
	b.Release(tid(3), true, th0, ptrace.NewTraces())

	_, _, known = b.Verdict(tid(2))
	assert.False(t, known)
	_, _, known = b.Verdict(tid(1))
	assert.True(t, known)
	_, _, known = b.Verdict(tid(3))
	assert.True(t, known)
	assert.Equal(t, 2, b.CachedVerdicts())
}

func TestReleaseUnknownTraceCachesVerdict(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	dst := ptrace.NewTraces()
	kept, dropped := b.Release(tid(9), true, th0, dst)
	assert.Equal(t, 0, kept)
	assert.Equal(t, 0, dropped)
	assert.Equal(t, 0, dst.ResourceSpans().Len())
	keep, _, known := b.Verdict(tid(9))
	assert.True(t, known)
	assert.True(t, keep)

	// Releasing twice is as harmless, and a keep is permanent: the trace
	// was kept once (an agent's first model call), a later call's drop
	// does not undo it.
	kept, dropped = b.Release(tid(9), false, th0, dst)
	assert.Equal(t, 0, kept+dropped)
	keep, _, known = b.Verdict(tid(9))
	assert.True(t, known)
	assert.True(t, keep)

	// A drop is not: a later keep of the trace wins.
	b.Release(tid(8), false, th0, dst)
	b.Release(tid(8), true, th0, dst)
	keep, _, _ = b.Verdict(tid(8))
	assert.True(t, keep)
}

// Released spans carry the trace's sampling threshold in their tracestate,
// with their own entries kept; the lowest threshold of the trace's keeps
// wins, and a span already sampled at a higher one keeps its own.
func TestReleaseStampsThreshold(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	src := newSource("gateway", "scope")
	th := func(s string) sampling.Threshold {
		v, err := sampling.TValueToThreshold(s)
		require.NoError(t, err)
		return v
	}
	plain := src.span(tid(1), "plain")
	vendor := src.span(tid(1), "vendor")
	vendor.TraceState().FromRaw("vendor=x,ot=rv:ffffffffffffff")
	strict := src.span(tid(1), "strict")
	strict.TraceState().FromRaw("ot=th:ff")
	for _, sp := range []ptrace.Span{plain, vendor, strict} {
		require.True(t, b.Hold(tid(1), src.rs.Resource(), "", src.ss.Scope(), "", sp, t0))
	}
	b.Release(tid(2), true, th("c"), ptrace.NewTraces()) // another trace: no effect
	dst := ptrace.NewTraces()
	kept, _ := b.Release(tid(1), true, th("8"), dst)
	require.Equal(t, 3, kept)
	// The trace calls the model again; that session is kept at a higher
	// threshold: the trace's lower one stays.
	b.Hold(tid(1), src.rs.Resource(), "", src.ss.Scope(), "", src.span(tid(1), "late"), t0)
	kept, _ = b.Release(tid(1), true, th("c"), dst)
	require.Equal(t, 1, kept)
	got := map[string]string{}
	for _, rs := range dst.ResourceSpans().All() {
		for _, ss := range rs.ScopeSpans().All() {
			for _, sp := range ss.Spans().All() {
				got[sp.Name()] = sp.TraceState().AsRaw()
			}
		}
	}
	assert.Equal(t, map[string]string{
		"plain":  "ot=th:8",
		"vendor": "ot=rv:ffffffffffffff;th:8,vendor=x",
		"strict": "ot=th:ff",
		"late":   "ot=th:8",
	}, got)
}

func TestMaxHeldSpansRefusesAndFreesOnRelease(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxHeldSpans = 3
	b := newBuffer(t, cfg)
	src := newSource("vllm", "s")
	require.True(t, src.hold(b, tid(1), "a", t0))
	require.True(t, src.hold(b, tid(1), "b", t0))
	require.True(t, src.hold(b, tid(2), "c", t0))
	assert.False(t, src.hold(b, tid(2), "d", t0))
	assert.False(t, src.hold(b, tid(3), "e", t0), "a new trace is refused too")
	assert.Equal(t, 3, b.HeldSpans())
	assert.Equal(t, []byte{1, 2}, arrivalOrder(t, b))

	_, dropped := b.Release(tid(1), false, th0, ptrace.NewTraces())
	assert.Equal(t, 2, dropped)
	require.True(t, src.hold(b, tid(3), "e", t0))
	require.True(t, src.hold(b, tid(3), "f", t0))
	assert.False(t, src.hold(b, tid(3), "g", t0))

	dst := ptrace.NewTraces()
	kept, _ := b.Release(tid(2), true, th0, dst)
	assert.Equal(t, 1, kept)
	assert.Equal(t, []string{"vllm/s: c"}, layout(dst), "the refused span d was never held")
}

func TestExpireReleasesOnlyOldTracesInArrivalOrder(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxHold = 5 * time.Minute
	b := newBuffer(t, cfg)
	src := newSource("vllm", "s")
	src.hold(b, tid(1), "1a", t0)
	src.hold(b, tid(2), "2a", t0.Add(time.Minute))
	src.hold(b, tid(3), "3a", t0.Add(2*time.Minute))
	src.hold(b, tid(4), "4a", t0.Add(3*time.Minute))
	// A later span does not make its trace younger: its first span still waits.
	src.hold(b, tid(1), "1b", t0.Add(4*time.Minute))
	assert.Equal(t, []byte{1, 2, 3, 4}, arrivalOrder(t, b))

	// Trace 3 gets its verdict early: it leaves the order from the middle.
	b.Release(tid(3), false, th0, ptrace.NewTraces())
	assert.Equal(t, []byte{1, 2, 4}, arrivalOrder(t, b))

	dst := ptrace.NewTraces()
	assert.Equal(t, 0, b.Expire(t0.Add(5*time.Minute), dst), "exactly MaxHold is not longer than MaxHold")
	assert.Equal(t, 0, dst.SpanCount())

	assert.Equal(t, 3, b.Expire(t0.Add(6*time.Minute+time.Second), dst))
	assert.Equal(t, []string{"vllm/s: 1a 1b 2a"}, layout(dst))
	assert.Equal(t, []byte{4}, arrivalOrder(t, b))
	assert.Equal(t, 1, b.HeldSpans())

	// Expired traces get no verdict: a later span of theirs is held again,
	// with a fresh wait, behind the traces already waiting.
	_, _, known := b.Verdict(tid(1))
	assert.False(t, known)
	src.hold(b, tid(1), "1c", t0.Add(7*time.Minute))
	assert.Equal(t, []byte{4, 1}, arrivalOrder(t, b))

	dst = ptrace.NewTraces()
	assert.Equal(t, 1, b.Expire(t0.Add(9*time.Minute), dst))
	assert.Equal(t, []string{"vllm/s: 4a"}, layout(dst))
	assert.Equal(t, 0, b.Expire(t0.Add(9*time.Minute), dst))
}

func TestExpireStopsAtFirstYoungTrace(t *testing.T) {
	// The O(expired) property: Expire looks at the front of the arrival order
	// only. A trace behind a young one is not released even if, by a clock
	// that went backwards, it claims to be older.
	b := newBuffer(t, DefaultConfig())
	src := newSource("vllm", "s")
	src.hold(b, tid(1), "old", t0)
	src.hold(b, tid(2), "young", t0.Add(10*time.Minute))
	src.hold(b, tid(3), "clock-went-back", t0)
	dst := ptrace.NewTraces()
	assert.Equal(t, 1, b.Expire(t0.Add(6*time.Minute), dst))
	assert.Equal(t, []string{"vllm/s: old"}, layout(dst))
	assert.Equal(t, []byte{2, 3}, arrivalOrder(t, b))
}

func TestFlushReleasesEverythingWithoutVerdicts(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	src := newSource("vllm", "s")
	src.hold(b, tid(1), "a", t0)
	src.hold(b, tid(2), "b", t0.Add(time.Hour))
	dst := ptrace.NewTraces()
	assert.Equal(t, 2, b.Flush(dst))
	assert.Equal(t, []string{"vllm/s: a b"}, layout(dst))
	assert.Equal(t, 0, b.HeldSpans())
	assert.Equal(t, 0, b.HeldTraces())
	assert.Equal(t, 0, b.CachedVerdicts())
	assert.Equal(t, 0, b.Flush(dst))
}

func TestHoldCopiesSpanResourceAndScope(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	src := newSource("vllm", "vllm.tracing")
	sp := src.span(tid(1), "llm_request")
	require.True(t, b.Hold(tid(1), src.rs.Resource(), src.rs.SchemaUrl(), src.ss.Scope(), src.ss.SchemaUrl(), sp, t0))

	// The caller reuses its batch after Consume returns.
	sp.SetName("mutated")
	sp.Attributes().PutStr("gen_ai.request.model", "mutated")
	sp.Events().AppendEmpty().SetName("mutated")
	src.rs.Resource().Attributes().PutStr("service.name", "mutated")
	src.ss.Scope().SetName("mutated")
	src.ss.Spans().RemoveIf(func(ptrace.Span) bool { return true })

	dst := ptrace.NewTraces()
	b.Release(tid(1), true, th0, dst)
	assert.Equal(t, []string{"vllm/vllm.tracing: llm_request"}, layout(dst))
	got := dst.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0)
	assert.Equal(t, map[string]any{"gen_ai.request.model": "llama-3-8b"}, got.Attributes().AsRaw())
	assert.Equal(t, 0, got.Events().Len())
}

func TestVerdictDoesNotAllocate(t *testing.T) {
	b := newBuffer(t, DefaultConfig())
	b.Release(tid(1), true, th0, ptrace.NewTraces())
	allocs := testing.AllocsPerRun(100, func() {
		b.Verdict(tid(1))
		b.Verdict(tid(2))
	})
	assert.Zero(t, allocs)
}

func TestHoldMoveTakesSpansOutOfTheBatch(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxHeldSpans = 2
	b := newBuffer(t, cfg)
	src := newSource("vllm", "vllm.tracing")
	src.span(tid(1), "held-a")
	src.span(tid(2), "passes")
	src.span(tid(1), "held-b")
	src.span(tid(1), "refused") // over MaxHeldSpans: stays, intact

	active := func(id pcommon.TraceID) bool { return id == tid(1) }
	src.ss.Spans().RemoveIf(func(sp ptrace.Span) bool {
		return active(sp.TraceID()) &&
			b.HoldMove(sp.TraceID(), src.rs.Resource(), src.rs.SchemaUrl(), src.ss.Scope(), src.ss.SchemaUrl(), sp, t0)
	})
	var left []string
	for _, sp := range src.ss.Spans().All() {
		left = append(left, sp.Name())
		assert.Equal(t, map[string]any{"gen_ai.request.model": "llama-3-8b"}, sp.Attributes().AsRaw())
	}
	assert.Equal(t, []string{"passes", "refused"}, left)

	src.rs.Resource().Attributes().PutStr("service.name", "mutated")
	dst := ptrace.NewTraces()
	kept, _ := b.Release(tid(1), true, th0, dst)
	assert.Equal(t, 2, kept)
	assert.Equal(t, []string{"vllm/vllm.tracing: held-a held-b"}, layout(dst))
	got := dst.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(1)
	assert.Equal(t, tid(1), got.TraceID())
	assert.Equal(t, map[string]any{"gen_ai.request.model": "llama-3-8b"}, got.Attributes().AsRaw())
}

// th0 is the threshold of a trace every sampler keeps.
var th0 = sampling.AlwaysSampleThreshold
