// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"fmt"
	"time"
)

// Scenario names and what each shows.
const (
	ScenarioQuant   = "a" // fp16 vs fp8 at a fixed concurrency
	ScenarioSweep   = "b" // concurrency sweep, long prompts mixed in, chunked prefill off (prefill first)
	ScenarioChunked = "c" // the same sweep, chunked prefill on (decode first, prefill chunks ride along)
)

// ScenarioTitles are the report's headings.
var ScenarioTitles = map[string]string{
	ScenarioQuant:   "(a) fp16 vs fp8 at a fixed concurrency",
	ScenarioSweep:   "(b) concurrency sweep, long prompts mixed in, chunked prefill off (prefill-first scheduling)",
	ScenarioChunked: "(c) the same sweep with chunked prefill on (decode-first, prefill chunks ride on decode steps)",
}

// The calibration, for a 2-core machine (see docs/demo.md):
//   - The KV pool holds sweepKVBlocks·16 tokens; a sweep request holds its
//     prompt (mean ~750 words with the long share) plus the output so far,
//     so the pool runs out between 75 and 100 concurrent requests.
//   - Token rates stay under ~4 000 events/s, so that the three processes
//     (proxy ~60 µs CPU per SSE event, plus the simulator and the client)
//     fit in 2 cores and the client's clock is not skewed by a saturated
//     machine: the report prints the cores used per point.
//
// The two sweeps are vLLM's two schedulers. Without chunked prefill, vLLM
// (V0) schedules prefills first: a step that admits waiting prompts runs
// only them, whole, and every decode in flight waits for it. With chunked
// prefill on it switches to decodes first: every running sequence gets its
// token, and prompts fill the rest of the step's token budget in chunks
// (vLLM V1 always works this way; Sarathi-Serve's stall-free batching).
const (
	quantConcurrency = 32
	quantKVBlocks    = 8192 // no KV pressure: the profile alone differs
	sweepKVBlocks    = 4096
	outputTokens     = "128"
	promptTokens     = "uniform:200-800"
	longShare        = 0.1
	longPromptTokens = 3000
	// chunkBudget is the step token budget with chunked prefill. In
	// vllmsim's roofline a decode step of ~75 sequences is bound by memory
	// reads (~27 ms) and leaves room for ~400 tokens of arithmetic, so a
	// step of 1024 tokens costs ~60 ms where the same prefill run alone
	// and a decode step after it would cost ~85: prompts ride along on the
	// decodes. A 3000-word prompt is cut into three or four such steps
	// instead of freezing every decode for one 165 ms step.
	chunkBudget = 1024
	// maxRampUp spreads the start of the clients (llmload -ramp-up), so that
	// a point's p99 TTFT is not just the queue of its first second.
	maxRampUp = 3 * time.Second
)

// SweepConcurrency are the sweep's points.
var SweepConcurrency = []int{25, 50, 75, 100, 150, 200}

// DefaultPoints returns the demo's points, each loaded for duration.
func DefaultPoints(duration time.Duration) []Point {
	ramp := min(maxRampUp, duration/3)
	var pts []Point
	for _, profile := range []string{"fp16", "fp8"} {
		pts = append(pts, Point{
			Scenario: ScenarioQuant, Label: profile,
			Engine: Engine{Profile: profile, KVBlocks: quantKVBlocks, ChunkedPrefill: true},
			Load: Load{
				Concurrency: quantConcurrency, Duration: duration, RampUp: ramp, PromptTokens: promptTokens,
				OutputTokens: outputTokens, LongPromptTokens: longPromptTokens, Seed: 1,
			},
		})
	}
	for _, sc := range []string{ScenarioSweep, ScenarioChunked} {
		for _, c := range SweepConcurrency {
			e := Engine{Profile: "fp16", KVBlocks: sweepKVBlocks, PrefillPriority: true}
			if sc == ScenarioChunked {
				e.ChunkedPrefill, e.PrefillPriority, e.MaxNumBatchedTokens = true, false, chunkBudget
			}
			pts = append(pts, Point{
				Scenario: sc, Label: fmt.Sprintf("c%d", c), Engine: e,
				Load: Load{
					Concurrency: c, Duration: duration, RampUp: ramp, PromptTokens: promptTokens, OutputTokens: outputTokens,
					LongShare: longShare, LongPromptTokens: longPromptTokens, Seed: 1,
				},
			})
		}
	}
	return pts
}
