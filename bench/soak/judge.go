// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"fmt"
	"slices"
	"time"
)

// sample is one reading of the collector, every -interval.
type sample struct {
	At         time.Duration `json:"-"` // since the collector started
	AtSeconds  float64       `json:"at_s"`
	RSSMiB     float64       `json:"rss_mib"`
	CPUPercent float64       `json:"cpu_percent"` // of one core, over the interval before
	Goroutines int           `json:"goroutines"`
	OpenFiles  int           `json:"open_files"`
}

// growth is the judgement of one series: whether it grew without bound.
type growth struct {
	Series    string  `json:"series"`
	Middle    float64 `json:"middle_third_median"`
	Last      float64 `json:"last_third_median"`
	Allowed   float64 `json:"allowed_growth"`
	Unbounded bool    `json:"unbounded"`
	Note      string  `json:"note,omitempty"`
}

// How a series is judged. The samples after the warm-up (the first quarter
// of the run, at most a minute: the collector's pools, buffers and the
// 200 streams' state fill up there) are cut into thirds. A series that
// levels off has the same median in the middle and last thirds; a leak
// grows the last third's median by what the leak adds over a third of the
// run. It is unbounded when the last third's median exceeds the middle
// third's by more than a tolerance: for RSS 5 % or 8 MiB, whichever is
// larger (RSS follows the Go heap's peaks and comes down slowly); for
// goroutines 10 % or 20 (streams open and close: 200 streams hold several
// hundred goroutines, and the count swings with how many are between
// requests). At the tens of requests per second the load makes, a leak of
// one goroutine per request, or of 2 KiB per request, fails a 15-minute run
// (judge_test.go). Medians, not maxima, so that one GC cycle or one burst
// does not decide.
const (
	rssRelTolerance       = 0.05
	rssMinToleranceMiB    = 8
	goroutineRelTolerance = 0.10
	goroutineMinTolerance = 20
	minSamplesPerThird    = 2
)

// warmup is the part of a run whose samples are not judged.
func warmup(run time.Duration) time.Duration { return min(run/4, time.Minute) }

// judge judges the series of the samples taken under load, from loadStart
// to loadEnd (times since the collector started).
func judge(samples []sample, loadStart, loadEnd time.Duration) []growth {
	var judged []sample
	from := loadStart + warmup(loadEnd-loadStart)
	for _, s := range samples {
		if s.At >= from && s.At <= loadEnd {
			judged = append(judged, s)
		}
	}
	rss := func(s sample) float64 { return s.RSSMiB }
	gor := func(s sample) float64 { return float64(s.Goroutines) }
	return []growth{
		judgeSeries("RSS (MiB)", judged, rss, rssRelTolerance, rssMinToleranceMiB),
		judgeSeries("goroutines", judged, gor, goroutineRelTolerance, goroutineMinTolerance),
	}
}

func judgeSeries(name string, samples []sample, value func(sample) float64, rel, floor float64) growth {
	g := growth{Series: name}
	third := len(samples) / 3
	if third < minSamplesPerThird {
		g.Note = fmt.Sprintf("%d samples after the warm-up: too few to judge growth (need %d)", len(samples), 3*minSamplesPerThird)
		return g
	}
	middle := samples[len(samples)-2*third : len(samples)-third]
	last := samples[len(samples)-third:]
	g.Middle, g.Last = median(middle, value), median(last, value)
	g.Allowed = max(g.Middle*rel, floor)
	g.Unbounded = g.Last-g.Middle > g.Allowed
	return g
}

func median(samples []sample, value func(sample) float64) float64 {
	v := make([]float64, len(samples))
	for i, s := range samples {
		v[i] = value(s)
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// outcome is what the soak found, for its last line and exit status.
type outcome struct {
	Requests       int     `json:"requests"`
	Sessions       int     `json:"sessions_counted"`
	Lost           int     `json:"lost"`
	RSSStart       float64 `json:"rss_start_mib"`
	RSSEnd         float64 `json:"rss_end_mib"`
	GoroutineStart int     `json:"goroutines_start"`
	GoroutineEnd   int     `json:"goroutines_end"`
}

// lastLine is the report's last line, in the one form scripts read.
func (o outcome) lastLine() string {
	return fmt.Sprintf("soak: %d requests, %d sessions counted, %d lost, RSS %.0f -> %.0f MiB, goroutines %d -> %d",
		o.Requests, o.Sessions, o.Lost, o.RSSStart, o.RSSEnd, o.GoroutineStart, o.GoroutineEnd)
}

// failures are the reasons the soak fails; none means it passed. Besides
// lost sessions and unbounded growth under load, the goroutines must come
// back to what the idle collector had before the load (within the same
// floor of 20: the proxy keeps a couple of idle upstream connections),
// once every stream has ended: a goroutine left behind per stream or per
// request shows there whatever the load's shape.
func failures(o outcome, growths []growth) []string {
	var out []string
	if o.GoroutineEnd > o.GoroutineStart+goroutineMinTolerance {
		out = append(out, fmt.Sprintf("goroutines did not come back after the load: %d before it, %d after", o.GoroutineStart, o.GoroutineEnd))
	}
	if o.Lost > 0 {
		out = append(out, fmt.Sprintf("%d of %d requests have no session", o.Lost, o.Requests))
	}
	if o.Requests == 0 {
		out = append(out, "no request was made")
	}
	for _, g := range growths {
		if g.Unbounded {
			out = append(out, fmt.Sprintf("%s grew without bound: median %.1f in the middle third, %.1f in the last (allowed +%.1f)",
				g.Series, g.Middle, g.Last, g.Allowed))
		}
	}
	return out
}
