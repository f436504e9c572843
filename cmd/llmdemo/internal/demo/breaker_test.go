// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// TestBreakerStory is make demo-breaker in short form, with a real HAProxy:
// two vllmsim replicas behind the collector's proxies, HAProxy checking
// each with engine_health's agent-check, llmload through HAProxy. B freezes:
// engine_health ejects it and HAProxy sends it no request while it is out;
// B is healed, re-admitted after its ejection time, and gets requests again.
func TestBreakerStory(t *testing.T) {
	haproxy := testbin.Tool(t, "haproxy", "haproxy")
	bins := Binaries{Collector: testbin.Collector(t), Sim: testbin.Build(t, "./cmd/vllmsim"), Load: testbin.Build(t, "./cmd/llmload")}
	story := BreakerStory{
		Degrade: 4 * time.Second, Heal: 9 * time.Second, Total: 22 * time.Second, Concurrency: 6,
		Freeze: 1500 * time.Millisecond, Every: 8, BaseTime: 5 * time.Second,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := t.TempDir()
	rep, err := RunBreaker(ctx, bins, haproxy, story, out, t.Logf)
	require.NoError(t, err)
	t.Logf("degraded %.2f, ejected %.2f (%s), down %.2f, healed %.2f, re-admitted %.2f, up %.2f", rep.DegradedS,
		rep.EjectedS, rep.EjectReason, rep.DownS, rep.HealedS, rep.ReadmittedS, rep.UpS)
	for _, ph := range rep.Phases {
		t.Logf("%s: %d requests, %d stalled, gap p50 %.1f p99 %.1f ms", ph.Name, ph.Requests, ph.Stalled, ph.GapP50Ms, ph.GapP99Ms)
	}

	require.Positive(t, rep.EjectedS, "engine_health ejected B")
	assert.Greater(t, rep.EjectedS, rep.DegradedS)
	assert.Less(t, rep.EjectedS, rep.HealedS, "while it froze")
	assert.Equal(t, "stall_ratio", rep.EjectReason)
	require.GreaterOrEqual(t, rep.DownS, rep.EjectedS, "HAProxy took B out")
	require.Positive(t, rep.ReadmittedS, "engine_health re-admitted B")
	assert.GreaterOrEqual(t, rep.ReadmittedS, rep.EjectedS+story.BaseTime.Seconds()-0.5, "not before its ejection time")
	require.GreaterOrEqual(t, rep.UpS, rep.ReadmittedS, "HAProxy put B back")

	var toB, toA, toBAfter int
	for _, s := range rep.Seconds {
		switch {
		case float64(s.T) >= rep.DownS && float64(s.T+1) < rep.UpS:
			toB += s.RequestsB
			toA += s.RequestsA
		case float64(s.T) >= rep.UpS:
			toBAfter += s.RequestsB
		}
	}
	assert.Zero(t, toB, "no request went to B while it was out")
	assert.Positive(t, toA, "A took them")
	assert.Positive(t, toBAfter, "B got requests again once re-admitted")
	assert.Zero(t, rep.Failed)
	require.Len(t, rep.Phases, 4)
	var stalls int
	for _, s := range rep.Seconds {
		if float64(s.T) >= rep.DegradedS {
			stalls += s.ClientStalls
		}
	}
	assert.Positive(t, stalls, "the client saw B's freezes")
	assert.FileExists(t, filepath.Join(out, PlotBreaker))
	assert.FileExists(t, filepath.Join(out, "report.md"))
}

// TestBreakerStoryStallBreaker is the story with the proxies' stall breaker
// on: the streams B freezes are cut instead of waiting the freeze out, and
// llmload's retries (through HAProxy) complete every request.
func TestBreakerStoryStallBreaker(t *testing.T) {
	haproxy := testbin.Tool(t, "haproxy", "haproxy")
	bins := Binaries{Collector: testbin.Collector(t), Sim: testbin.Build(t, "./cmd/vllmsim"), Load: testbin.Build(t, "./cmd/llmload")}
	story := BreakerStory{
		Degrade: 4 * time.Second, Heal: 9 * time.Second, Total: 14 * time.Second, Concurrency: 6,
		Freeze: 1500 * time.Millisecond, Every: 8, BaseTime: 5 * time.Second, StallMaxGap: 500 * time.Millisecond,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := t.TempDir()
	rep, err := RunBreaker(ctx, bins, haproxy, story, out, t.Logf)
	require.NoError(t, err)
	cut, retried := 0, 0
	for _, ph := range rep.Phases {
		t.Logf("%s: %d requests, %d stalled, %d cut (%d retried), gap p50 %.1f p99 %.1f ms", ph.Name, ph.Requests, ph.Stalled,
			ph.Cut, ph.Retried, ph.GapP50Ms, ph.GapP99Ms)
		cut += ph.Cut
		retried += ph.Retried
	}
	require.Positive(t, cut, "the breaker cut B's frozen streams")
	assert.Equal(t, cut, retried, "llmload sent every cut request again")
	assert.Zero(t, rep.Failed, "and every one completed")
	// The breaker cuts at 500 ms a freeze that lasts 1.5 s: a generous
	// bound, as the machine is shared.
	assert.Less(t, rep.Phases[1].GapP99Ms, float64(story.Freeze.Milliseconds()), "the client no longer waits out B's freezes")
	require.Positive(t, rep.EjectedS, "engine_health still ejects B")
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "stall breaker is on (`proxy::stall::max_gap: 500ms`)")
}

// TestBreakerStoryHeal is the story with proxy::migrate on as well: the
// streams the breaker cuts are continued through HAProxy, so the client
// gets no error event (no cut attempt, no retry) and every request
// completes; the collector counts the moves, and the client's gaps of
// max_gap or more, each a move, are counted beside them.
func TestBreakerStoryHeal(t *testing.T) {
	haproxy := testbin.Tool(t, "haproxy", "haproxy")
	bins := Binaries{Collector: testbin.Collector(t), Sim: testbin.Build(t, "./cmd/vllmsim"), Load: testbin.Build(t, "./cmd/llmload")}
	story := BreakerStory{
		Degrade: 4 * time.Second, Heal: 9 * time.Second, Total: 14 * time.Second, Concurrency: 6,
		Freeze: 1500 * time.Millisecond, Every: 8, BaseTime: 5 * time.Second, StallMaxGap: 500 * time.Millisecond,
		Migrate: true,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := t.TempDir()
	rep, err := RunBreaker(ctx, bins, haproxy, story, out, t.Logf)
	require.NoError(t, err)
	cut := 0
	for _, ph := range rep.Phases {
		t.Logf("%s: %d requests, %d stalled, %d cut, gap p50 %.1f p99 %.1f ms", ph.Name, ph.Requests, ph.Stalled, ph.Cut,
			ph.GapP50Ms, ph.GapP99Ms)
		cut += ph.Cut
	}
	require.NotNil(t, rep.Moves)
	m := rep.Moves
	t.Logf("moves: %+v", *m)
	require.Positive(t, m.Moved, "the proxies moved B's frozen streams")
	assert.Zero(t, cut, "no error event reached the client")
	assert.Zero(t, rep.Failed, "every request completed")
	assert.Positive(t, m.Gaps, "the client saw the moves' gaps")
	require.Positive(t, rep.EjectedS, "engine_health still ejects B")
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "## Moves")
}
