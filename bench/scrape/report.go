// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// report renders the results as Markdown: a summary table, then each
// measurement per run with the load average it ran under, then the
// correctness comparison.
func report(o options, res results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# vllm source vs prometheus receiver\n\n%s; %d runs; CPU runs: one scrape every %s for %s after %s of warm-up.\n",
		res.Machine, o.runs, o.cpuInterval, o.cpuFor, o.warmup)
	cpu := perScrape(res.CPU)
	cases := []string{}
	for _, c := range res.CPU {
		if c.Source != srcIdle && !slices.Contains(cases, c.Case) {
			cases = append(cases, c.Case)
		}
	}
	if len(res.CPU) > 0 || len(res.Latency) > 0 {
		b.WriteString("\n## Summary (medians)\n\n| measure | vllm source | prometheus receiver | prometheus / vllm |\n|---|---|---|---|\n")
	}
	for _, c := range cases {
		v, p := median(cpu[key{c, srcVLLM}]), median(cpu[key{c, srcProm}])
		fmt.Fprintf(&b, "| CPU per scrape, %s | %.3f ms | %.3f ms | %s |\n", c, v, p, ratio(p, v))
	}
	if len(cases) > 0 {
		c := cases[0]
		v, p := median(overIdle(res.CPU, c, srcVLLM, rssOf)), median(overIdle(res.CPU, c, srcProm, rssOf))
		fmt.Fprintf(&b, "| RSS over the idle collector, %s | %.1f MiB | %.1f MiB | %s |\n", c, v, p, ratio(p, v))
		v, p = median(overIdle(res.CPU, c, srcVLLM, heapOf)), median(overIdle(res.CPU, c, srcProm, heapOf))
		fmt.Fprintf(&b, "| Go heap over the idle collector, %s | %.1f MiB | %.1f MiB | %s |\n", c, v, p, ratio(p, v))
	}
	for _, iv := range o.latencyIntervals {
		v := latencies(res.Latency, srcVLLM, iv, false)
		for _, src := range []source{srcProm, srcReload} {
			p := latencies(res.Latency, src, iv, false)
			if len(v) == 0 || len(p) == 0 {
				continue
			}
			fmt.Fprintf(&b, "| first scrape after \"Everything is ready\", every %s (%s) | %.2f s | %.2f s | |\n", iv, src, median(v), median(p))
		}
	}

	if len(res.CPU) > 0 {
		b.WriteString("\n## CPU per scrape (ms; load average, 1 min, in brackets)\n\n")
		b.WriteString("(collector CPU − the idle collector's CPU rate × the same time) / scrapes the engine counted\n\n")
		runsTable(&b, o.runs, cases, func(c string, src source, r int) string {
			for _, x := range res.CPU {
				if x.Case == c && x.Source == src && x.Run == r {
					return fmt.Sprintf("%.3f (%d scrapes, %.0f points each) [%.2f]",
						cpuPerScrape(res.CPU, x), x.Scrapes, x.Points/float64(max(x.Scrapes, 1)), x.LoadTo)
				}
			}
			return ""
		}, func(c string, src source) string { return fmt.Sprintf("%.3f", median(cpu[key{c, src}])) })
		b.WriteString("\nIdle collector (otlp receiver, token_session, filter, debug; nothing sent): ")
		for _, x := range res.CPU {
			if x.Source == srcIdle {
				fmt.Fprintf(&b, "run %d %.1f ms CPU/s, RSS %.1f MiB, heap %.1f MiB [%.2f]; ", x.Run,
					float64(x.CPU.Microseconds())/1e3/x.Wall.Seconds(), mib(float64(x.RSS)), mib(x.Heap), x.LoadTo)
			}
		}
		b.WriteString("\n\n## Memory over the idle collector after the run (MiB: RSS / Go heap)\n\n")
		runsTable(&b, o.runs, cases, func(c string, src source, r int) string {
			for _, x := range res.CPU {
				if x.Case == c && x.Source == src && x.Run == r {
					idle := idleOf(res.CPU, r)
					return fmt.Sprintf("%.1f / %.1f [%.2f]", mib(float64(x.RSS-idle.RSS)), mib(x.Heap-idle.Heap), x.LoadTo)
				}
			}
			return ""
		}, func(c string, src source) string {
			return fmt.Sprintf("%.1f / %.1f", median(overIdle(res.CPU, c, src, rssOf)), median(overIdle(res.CPU, c, src, heapOf)))
		})
	}

	if len(res.Latency) > 0 {
		b.WriteString("\n## First scrape (s after \"Everything is ready\"; after process start in brackets)\n\n")
		b.WriteString("| interval | source | starts | median | min – max | median after start | load (median) |\n|---|---|---|---|---|---|---|\n")
		for _, iv := range o.latencyIntervals {
			for _, src := range []source{srcVLLM, srcProm, srcReload} {
				r := latencies(res.Latency, src, iv, false)
				if len(r) == 0 {
					continue
				}
				var loads []float64
				for _, x := range res.Latency {
					if x.Source == src && x.Interval == iv {
						loads = append(loads, x.Load)
					}
				}
				fmt.Fprintf(&b, "| %s | %s | %d | %.2f | %.2f – %.2f | %.2f | %.2f |\n", iv, src, len(r), median(r),
					slices.Min(r), slices.Max(r), median(latencies(res.Latency, src, iv, true)), median(loads))
			}
		}
	}
	if res.Correctness != "" {
		b.WriteString("\n## What each reads\n")
		b.WriteString(res.Correctness)
	}
	return b.String()
}

type key struct {
	c   string
	src source
}

// perScrape is the CPU per scrape (ms) of every source run, by case.
func perScrape(all []cpuResult) map[key][]float64 {
	out := map[key][]float64{}
	for _, x := range all {
		if x.Source != srcIdle {
			out[key{x.Case, x.Source}] = append(out[key{x.Case, x.Source}], cpuPerScrape(all, x))
		}
	}
	return out
}

func idleOf(all []cpuResult, run int) cpuResult {
	for _, x := range all {
		if x.Source == srcIdle && x.Run == run {
			return x
		}
	}
	return cpuResult{}
}

// cpuPerScrape is x's CPU over the idle collector of its run, per scrape,
// in ms.
func cpuPerScrape(all []cpuResult, x cpuResult) float64 {
	idle := idleOf(all, x.Run)
	rate := 0.0
	if idle.Wall > 0 {
		rate = float64(idle.CPU) / float64(idle.Wall)
	}
	extra := float64(x.CPU) - rate*float64(x.Wall)
	return extra / float64(max(x.Scrapes, 1)) / float64(time.Millisecond)
}

func rssOf(x cpuResult) float64  { return float64(x.RSS) }
func heapOf(x cpuResult) float64 { return x.Heap }

// overIdle is f of each run of (c, src) minus f of its run's idle
// collector, in MiB.
func overIdle(all []cpuResult, c string, src source, f func(cpuResult) float64) []float64 {
	var out []float64
	for _, x := range all {
		if x.Case == c && x.Source == src {
			out = append(out, mib(f(x)-f(idleOf(all, x.Run))))
		}
	}
	return out
}

func latencies(all []latencyResult, src source, iv time.Duration, fromStart bool) []float64 {
	var out []float64
	for _, x := range all {
		if x.Source == src && x.Interval == iv {
			d := x.FromReady
			if fromStart {
				d = x.FromStart
			}
			out = append(out, d.Seconds())
		}
	}
	return out
}

// runsTable writes a table of one row per case and source, one column per
// run, and the median.
func runsTable(b *strings.Builder, runs int, cases []string, cell func(string, source, int) string, med func(string, source) string) {
	b.WriteString("| engine | source |")
	for r := 1; r <= runs; r++ {
		fmt.Fprintf(b, " run %d |", r)
	}
	b.WriteString(" median |\n|---|---|" + strings.Repeat("---|", runs+1) + "\n")
	for _, c := range cases {
		for _, src := range []source{srcVLLM, srcProm} {
			fmt.Fprintf(b, "| %s | %s |", c, src)
			for r := 1; r <= runs; r++ {
				fmt.Fprintf(b, " %s |", cell(c, src, r))
			}
			fmt.Fprintf(b, " %s |\n", med(c, src))
		}
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 1 {
		return s[n/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ratio(a, b float64) string {
	if b <= 0 {
		return ""
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func mib(x float64) float64 { return x / (1 << 20) }
