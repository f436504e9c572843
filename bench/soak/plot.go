// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// plotSVG draws the four series over time, one panel each, sharing the time
// axis, with the warm-up shaded: a plain SVG, readable in any browser and on
// a code host's file view.
func plotSVG(samples []sample, loadStart, loadEnd time.Duration) string {
	const (
		width, panelH, left, right, top, gap = 900, 150, 70, 20, 30, 40
	)
	panels := []struct {
		title string
		value func(sample) float64
	}{
		{"RSS (MiB)", func(s sample) float64 { return s.RSSMiB }},
		{"CPU (% of one core)", func(s sample) float64 { return s.CPUPercent }},
		{"goroutines", func(s sample) float64 { return float64(s.Goroutines) }},
		{"open file descriptors", func(s sample) float64 { return float64(s.OpenFiles) }},
	}
	height := top + len(panels)*(panelH+gap) + 10
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	tMax := loadEnd.Seconds()
	for _, s := range samples {
		tMax = max(tMax, s.At.Seconds())
	}
	if tMax <= 0 {
		tMax = 1
	}
	plotW := float64(width - left - right)
	x := func(t float64) float64 { return left + t/tMax*plotW }
	for i, p := range panels {
		y0 := float64(top + i*(panelH+gap))
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range samples {
			v := p.value(s)
			lo, hi = min(lo, v), max(hi, v)
		}
		if len(samples) == 0 {
			lo, hi = 0, 1
		}
		lo = min(lo, 0)
		if hi <= lo {
			hi = lo + 1
		}
		hi *= 1.1
		y := func(v float64) float64 { return y0 + panelH - (v-lo)/(hi-lo)*panelH }
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", left, y0-8, html.EscapeString(p.title))
		// Shaded: not judged (idle before the load, its warm-up, the drain after it).
		judgedFrom, judgedTo := x((loadStart + warmup(loadEnd-loadStart)).Seconds()), x(loadEnd.Seconds())
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="%.0f" height="%d" fill="#f0f0f0"/>`+"\n", left, y0, judgedFrom-left, panelH)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%d" fill="#f0f0f0"/>`+"\n", judgedTo, y0, left+plotW-judgedTo, panelH)
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="%.0f" height="%d" fill="none" stroke="#888"/>`+"\n", left, y0, plotW, panelH)
		for _, v := range []float64{lo, (lo + hi) / 2, hi} {
			fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, trimFloat(v))
		}
		var pts []string
		for _, s := range samples {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.At.Seconds()), y(p.value(s))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="%s"/>`+"\n", strings.Join(pts, " "))
		// Time ticks under each panel: minutes.
		step := max(60.0, math.Ceil(tMax/10/60)*60)
		for t := 0.0; t <= tMax; t += step {
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#555">%.0f min</text>`+"\n", x(t), y0+panelH+14, t/60)
		}
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">grey: not judged (idle, warm-up, drain)</text>`+"\n", width-right-250, 14)
	b.WriteString("</svg>\n")
	return b.String()
}

func trimFloat(v float64) string {
	if v >= 100 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
