// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
)

// f1 formats a figure with one decimal, "–" when there is none.
func f1(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return fmt.Sprintf("%.1f", v)
}

// diff formats client − collector.
func diff(client, collector float64) string {
	d := client - collector
	if math.IsNaN(d) || math.IsInf(d, 0) {
		return "–"
	}
	return fmt.Sprintf("%+.1f", d)
}

func (r *PointResult) concurrency() int { return r.Point.Load.Concurrency }

// markdown renders report.md.
func markdown(rep *Report, runErr error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# make demo report\n\n")
	fmt.Fprintf(&b, "Started %s on %d CPUs, %d points in %.0f s. Each point: a fresh `vllmsim`, the collector (`token_stream` proxy in front of it, "+
		"`/metrics` scraped every 500 ms, `token_session` with exponential histograms) and `llmload` through the proxy.\n\n",
		rep.StartedAt.Format("2006-01-02 15:04:05 UTC"), runtime.NumCPU(), len(rep.Points), rep.WallS)
	if rep.LoadAvg[0] > 0 {
		fmt.Fprintf(&b, "Load average (1 min) %.2f at the start, %.2f at the end: timings are wall-clock, and other work on the machine moves them.\n\n",
			rep.LoadAvg[0], rep.LoadAvg[1])
	}
	if runErr != nil {
		fmt.Fprintf(&b, "**The run did not finish:** %v. The tables hold the points done.\n\n", runErr)
	}

	b.WriteString("## Latency: client vs collector (ms)\n\n")
	b.WriteString("Client: `llmload`, every request of the point. Collector: quantiles of its `gen_ai.server.time_to_first_token` and " +
		"`gen_ai.server.time_per_output_token` exponential histograms. Δ = client − collector.\n\n")
	b.WriteString("| point | conc. | TTFT p50 client | collector | Δ | TTFT p99 client | collector | Δ | TPOT p50 client | collector | Δ | TPOT p99 client | collector | Δ |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rep.Points {
		c, k := r.Client, r.Collector
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Point.Name(), r.concurrency(),
			f1(c.TTFT.P50), f1(k.TTFT.P50), diff(c.TTFT.P50, k.TTFT.P50),
			f1(c.TTFT.P99), f1(k.TTFT.P99), diff(c.TTFT.P99, k.TTFT.P99),
			f1(c.TPOT.P50), f1(k.TPOT.P50), diff(c.TPOT.P50, k.TPOT.P50),
			f1(c.TPOT.P99), f1(k.TPOT.P99), diff(c.TPOT.P99, k.TPOT.P99))
	}

	b.WriteString("\n## Why was it slow: the engine's split of TTFT (ms)\n\n")
	b.WriteString("Collector: quantiles of `token_session`'s `llm.session.queue_time` and `llm.session.prefill_time` histograms, the " +
		"engine's own timing joined to each session (vllmsim sends its per-request metrics on the final chunk and its `llm_request` " +
		"spans to the collector's `otlp` receiver; `engine_timing::expect_spans` is on). Simulator: the true queue (arrival to first " +
		"scheduled) and prefill (scheduled to first token) of every request, written by vllmsim (`-timings-out`). Both sides' " +
		"quantiles interpolate between the closest ranks, as llmload's do: the collector's within its histogram's buckets, whose " +
		"relative width (`bucket`) bounds the difference. TTFT is the collector's, for scale. **With split**: the sessions counted " +
		"with the engine's split (the queue histogram's count) of all counted. **Kept spans**: the kept sessions' spans by " +
		"`llm.session.timing_source`, and of those with the split, how many differ from the simulator's figures for the same " +
		"request (by trace ID) by more than 0.01 ms.\n\n")
	b.WriteString("| point | conc. | with split | kept spans (by source) | differ | TTFT p50 | queue p50 collector | simulator | prefill p50 collector | simulator | TTFT p99 | queue p99 collector | simulator | prefill p99 collector | simulator | bucket |\n")
	b.WriteString("|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rep.Points {
		k, t := r.Collector, r.Truth
		fmt.Fprintf(&b, "| %s | %d | %.0f / %.0f | %d %s | %d / %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f%% |\n", r.Point.Name(), r.concurrency(),
			k.SplitSessions, k.Sessions, r.Split.Kept, reasons(r.Split.BySource), r.Split.Differ, r.Split.Checked,
			f1(k.TTFT.P50), f1(k.Queue.P50), f1(t.Queue.P50), f1(k.Prefill.P50), f1(t.Prefill.P50),
			f1(k.TTFT.P99), f1(k.Queue.P99), f1(t.Queue.P99), f1(k.Prefill.P99), f1(t.Prefill.P99),
			100*max(k.QueueBucketWidth, k.PrefillBucketWidth))
	}

	b.WriteString("\n## Throughput and what the collector saw\n\n")
	b.WriteString("| point | requests ok / failed | sessions counted (not completed) | req/s | output tok/s | spans kept (by reason) | slow sessions with a span | stall alerts | pre-emptions | max KV usage | CPU cores |\n")
	b.WriteString("|---|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|\n")
	for _, r := range rep.Points {
		c, k := r.Client, r.Collector
		fmt.Fprintf(&b, "| %s | %d / %d | %.0f %s | %.2f | %.0f | %d %s | %d / %d | %d | %.0f | %.0f%% | %.2f |\n", r.Point.Name(),
			c.Completed, c.Failed, k.Sessions, otherOutcomes(k.SessionsByOutcome), c.RequestThroughput, c.OutputThroughput,
			k.SpansKept, reasons(k.SpansByReason), r.Slow.WithSpan, r.Slow.Slow,
			len(k.StallAlerts), k.PreemptionCount, 100*k.MaxKVUsage, r.CPUCores())
	}

	b.WriteString("\n## Scenarios\n\n")
	for _, sc := range []string{ScenarioQuant, ScenarioSweep, ScenarioChunked} {
		var pts []*PointResult
		for _, r := range rep.Points {
			if r.Point.Scenario == sc {
				pts = append(pts, r)
			}
		}
		if len(pts) == 0 {
			continue
		}
		p := pts[0].Point
		fmt.Fprintf(&b, "- **%s**: vllmsim `%s`; llmload `-prompt-tokens %s -output-tokens %s -long-share %g -long-prompt-tokens %d -duration %s`, concurrency %s.\n",
			ScenarioTitles[sc], strings.Join(p.Engine.args("…")[2:], " "), p.Load.PromptTokens, p.Load.OutputTokens,
			p.Load.LongShare, p.Load.LongPromptTokens, p.Load.Duration, concurrencies(pts))
	}

	b.WriteString("\n")
	b.WriteString(attributionMarkdown(rep))
	b.WriteString("## Plots\n\n")
	for _, p := range rep.Plots {
		fmt.Fprintf(&b, "![%s](%s)\n\n", strings.TrimSuffix(p, filepath.Ext(p)), p)
	}

	b.WriteString("## Files\n\n`points/<point>/`: `vllmsim.log`, `otelcol.log`, `llmload.log` (its table), `llmload.json` (its result), " +
		"`requests.ndjson` (one line per request with its trace ID), `timings.ndjson` (the simulator's true split of each request), `collector.yaml`. `report.json` has every figure above, " +
		"the scraped KV usage and pre-emption series and the stall alerts.\n")
	return b.String()
}

// otherOutcomes lists the sessions that did not complete, by outcome.
func otherOutcomes(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if k != "completed" && m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %g", k, m[k]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

func reasons(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

func concurrencies(pts []*PointResult) string {
	var s []string
	for _, r := range pts {
		if c := fmt.Sprint(r.concurrency()); !slices.Contains(s, c) {
			s = append(s, c)
		}
	}
	return strings.Join(s, ", ")
}
