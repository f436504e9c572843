// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/llamacpp"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// TestDemoPipeline is `make demo` in short form: vllmsim behind the
// collector's proxy, its /metrics scraped, llmload through the proxy, the
// collector's output in the demo's OTLP sink. The collector's figures must
// agree with the client's: TTFT p50 and p99 within 5% (or 2 ms), every
// session the client finished counted in llm.sessions, every session the
// client saw as slow present as a span with the client's trace ID.
func TestDemoPipeline(t *testing.T) {
	bins := Binaries{Collector: testbin.Collector(t), Sim: testbin.Build(t, "./cmd/vllmsim"), Load: testbin.Build(t, "./cmd/llmload")}

	// All clients start at once and 30% of the prompts are long (3000
	// words, ~165 ms of prefill each) with chunked prefill off: the first
	// requests queue behind a second of prefill, so the run has slow
	// sessions (TTFT > 500 ms) for the span check as well as fast ones.
	p := Point{
		Scenario: ScenarioSweep, Label: "e2e",
		Engine: Engine{Profile: "fp16", KVBlocks: 4096},
		Load: Load{
			Concurrency: 16, Duration: 4 * time.Second, PromptTokens: "uniform:200-800", OutputTokens: "32",
			LongShare: 0.3, LongPromptTokens: 3000, Seed: 7,
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunPoint(ctx, bins, p, dir, "", t.Logf)
	require.NoError(t, err)

	c, k := res.Client, res.Collector
	t.Logf("client: %d ok, %d failed; TTFT p50 %.1f p99 %.1f ms; TPOT p50 %.1f p99 %.1f ms", c.Completed, c.Failed, c.TTFT.P50, c.TTFT.P99, c.TPOT.P50, c.TPOT.P99)
	t.Logf("collector: %g sessions; TTFT p50 %.1f p99 %.1f ms (bucket width %.1f%%); %d spans; %d of %d slow sessions with a span",
		k.Sessions, k.TTFT.P50, k.TTFT.P99, 100*k.TTFTBucketWidth, k.SpansKept, res.Slow.WithSpan, res.Slow.Slow)
	require.Positive(t, c.Completed)
	assert.Zero(t, c.Failed)
	if !assert.Zero(t, k.BadRequests, "the sink could read everything the collector sent; it refused: %q", k.BadRequestErrors) {
		logCollectorProblems(t, filepath.Join(dir, "otelcol.log"))
	}

	within := func(name string, client, collector float64) {
		tol := math.Max(0.05*client, 2)
		assert.InDelta(t, client, collector, tol, "%s: client %.1f ms, collector %.1f ms", name, client, collector)
	}
	within("TTFT p50", c.TTFT.P50, k.TTFT.P50)
	within("TTFT p99", c.TTFT.P99, k.TTFT.P99)
	within("TPOT p50", c.TPOT.P50, k.TPOT.P50)

	assert.InDelta(t, float64(c.Completed), k.SessionsCompleted, 0, "every finished session is counted, as completed; by outcome: %v", k.SessionsByOutcome)
	assert.InDelta(t, float64(c.Completed+c.Failed), k.Sessions, 0, "and no other")

	assert.Positive(t, res.Slow.Slow, "the run must have slow sessions for the span check to mean anything")
	assert.Equal(t, res.Slow.Slow, res.Slow.WithSpan, "slow sessions without a span: %v", res.Slow.Missing)

	// The engine's split on every session (the final chunk brings it), on
	// every kept span exactly the simulator's, each drawn as its phases.
	assert.InDelta(t, k.Sessions, k.SplitSessions, 0, "every session with the engine's split")
	assert.Positive(t, res.Split.Checked)
	assert.Zero(t, res.Split.Differ, "kept spans whose split is not the simulator's: %v", res.Split.DifferIDs)
	for _, sp := range k.Spans {
		assert.Equal(t, []string{"llm.session.queue", "llm.session.prefill", "llm.session.decode"}, sp.Phases, sp.TraceID)
	}

	assert.NotEmpty(t, k.KVUsage, "the simulator's /metrics was scraped")
	assert.Positive(t, k.MaxKVUsage)

	// Who used the GPU: both tenants, the collector's engine time beside
	// the simulator's exact shares.
	a := res.Attribution
	require.NotNil(t, a)
	require.Len(t, a.Tenants, 2, "%+v", a.Tenants)
	for _, tf := range a.Tenants {
		t.Logf("tenant %s: collector %.3f s, simulator %.3f s; %.0f J vs %.0f J; %d tokens", tf.Tenant, tf.CollectorS, tf.TruthS, tf.CollectorJ, tf.TruthJ, tf.Tokens)
	}
	t.Logf("sessions %d: error p50 %.1f%% p90 %.1f%% max %.1f%%; collector busy %.3f + idle %.3f s, simulator busy %.3f + idle %.3f = wall %.3f s",
		a.Sessions, a.ErrP50, a.ErrP90, a.ErrMax, a.CollectorBusyS, a.CollectorIdleS, a.TruthBusyS, a.TruthIdleS, a.TruthWallS)

	// The exact path beside it: the engine's own shares through the hook,
	// every session kept, each the simulator's.
	x := res.ExactAttribution
	require.NotNil(t, x)
	assert.Equal(t, c.Completed+c.Failed, x.Sessions, "every session of the exact path matched to the truth")
	assert.Less(t, x.ErrMax, 0.001, "each session's engine time is the engine's, to the nanosecond (%%)")
	for _, tf := range x.Tenants {
		assert.InEpsilon(t, tf.TruthS, tf.CollectorS, 1e-6, "tenant %s, exact path", tf.Tenant)
	}
}

// logCollectorProblems logs the collector's warnings and errors: the
// report folder goes with the test.
func logCollectorProblems(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("collector log: %v", err)
		return
	}
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, "\twarn\t") || strings.Contains(line, "\terror\t") {
			t.Logf("collector: %s", strings.TrimSpace(line))
		}
	}
}

// TestDemoReal is `make demo-real` in short form: a real llama-server
// behind the collector's proxy, llmload through it at 1 and 4 clients on 2
// slots. No request fails, every completed one has its session with
// llama.cpp's timings, and at 4 clients requests wait for a slot: the
// derived queue grows. The collector's TTFT and TPOT are the client's and
// its TPOT llama.cpp's at the median (within 1 ms or 2%): the report's
// per-session shares are figures, which a busy machine moves (the engine
// runs niced, and one request of a few can be held for seconds).
func TestDemoReal(t *testing.T) {
	dir, err := llamacpp.Find(testbin.ModuleRoot(t))
	var m *llamacpp.MissingError
	if errors.As(err, &m) && os.Getenv("CI") == "" {
		t.Skip(m.What)
	}
	require.NoError(t, err)
	bins := Binaries{Collector: testbin.Collector(t), Load: testbin.Build(t, "./cmd/llmload")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	setup := RealSetup{LlamaDir: dir, Slots: 2, Threads: 1, Context: 4096}
	points := []RealPoint{
		{Concurrency: 1, Duration: 3 * time.Second, PromptWords: "uniform:50-400", OutputTokens: 16},
		{Concurrency: 4, Duration: 3 * time.Second, PromptWords: "uniform:50-400", OutputTokens: 16},
	}
	out := t.TempDir()
	rep, err := RunReal(ctx, bins, setup, points, out, t.Logf)
	require.NoError(t, err)
	require.Len(t, rep.Points, 2)
	for _, r := range rep.Points {
		name := fmt.Sprintf("%d clients", r.Point.Concurrency)
		require.Positive(t, r.Requests, name)
		assert.Zero(t, r.Failed, name)
		assert.Equal(t, r.Requests, r.Matched, "%s: a session for every request", name)
		assert.Equal(t, map[string]int{"llamacpp_timings": r.Matched}, r.BySource, name)
		assert.LessOrEqual(t, r.TTFTDiff.P50, max(1, 0.02*r.ClientTTFT.P50), "%s: TTFT against the client's", name)
		assert.LessOrEqual(t, r.TPOTDiff.P50, max(1, 0.02*r.ClientTPOT.P50), "%s: TPOT against the client's", name)
		assert.LessOrEqual(t, r.EngineTPOTDiff.P50, max(1, 0.02*r.EngineTPOT.P50), "%s: TPOT against llama.cpp's", name)
	}
	one, four := rep.Points[0], rep.Points[1]
	assert.Greater(t, four.Queue.P99, one.Queue.P99, "beyond the slots, requests wait")
	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(report), "| 4 | llamacpp_timings ")
}
