// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// series makes samples every 10 s over run, with RSS and goroutines from f.
func series(run time.Duration, f func(t time.Duration) (rss float64, goroutines int)) []sample {
	var out []sample
	for at := time.Duration(0); at <= run; at += 10 * time.Second {
		rss, g := f(at)
		out = append(out, sample{At: at, AtSeconds: at.Seconds(), RSSMiB: rss, Goroutines: g})
	}
	return out
}

func TestJudgeHealthyRunPasses(t *testing.T) {
	run := 15 * time.Minute
	// Warm-up growth, then a plateau that breathes with GC and streams.
	samples := series(run, func(at time.Duration) (float64, int) {
		if at < 40*time.Second {
			return 60 + at.Seconds(), 100 + int(at.Seconds())*10
		}
		wobble := float64(int(at.Seconds()/10)%3) * 4
		return 140 + wobble, 520 + int(at.Seconds()/10)%5*15
	})
	for _, g := range judge(samples, 0, run) {
		assert.False(t, g.Unbounded, "%+v", g)
		assert.Empty(t, g.Note)
	}
	o := outcome{Requests: 1000, Sessions: 1000}
	assert.Empty(t, failures(o, judge(samples, 0, run)))
}

// A leak of one goroutine per request at 20 requests/s, and of 2 KiB per
// request, fails.
func TestJudgeLeaksFail(t *testing.T) {
	run := 15 * time.Minute
	samples := series(run, func(at time.Duration) (float64, int) {
		requests := at.Seconds() * 20
		return 140 + requests*2/1024, 500 + int(requests)
	})
	gs := judge(samples, 0, run)
	require.Len(t, gs, 2)
	assert.True(t, gs[0].Unbounded, "RSS: %+v", gs[0])
	assert.True(t, gs[1].Unbounded, "goroutines: %+v", gs[1])
	fails := failures(outcome{Requests: 10, Sessions: 10, GoroutineStart: 20, GoroutineEnd: 18020}, gs)
	assert.Len(t, fails, 3)
	assert.Contains(t, fails[0], "goroutines did not come back after the load: 20 before it, 18020 after")
	assert.Contains(t, fails[2], "goroutines grew without bound")
}

func TestJudgeTooShortToJudge(t *testing.T) {
	samples := series(20*time.Second, func(time.Duration) (float64, int) { return 100, 100 })
	for _, g := range judge(samples, 0, 20*time.Second) {
		assert.False(t, g.Unbounded)
		assert.Contains(t, g.Note, "too few")
	}
}

// Samples outside the load (the idle start, the drain after it) are not
// judged: the streams ending there is not a shrinking heap's virtue nor a
// leak.
func TestJudgeOnlyUnderLoad(t *testing.T) {
	samples := series(5*time.Minute, func(at time.Duration) (float64, int) {
		if at < 30*time.Second || at > 4*time.Minute {
			return 60, 20 // idle
		}
		return 140, 800
	})
	for _, g := range judge(samples, 30*time.Second, 4*time.Minute) {
		assert.False(t, g.Unbounded, "%+v", g)
		assert.Equal(t, g.Middle, g.Last)
	}
}

func TestLostSessionsFail(t *testing.T) {
	fails := failures(outcome{Requests: 100, Sessions: 99, Lost: 1}, nil)
	require.Len(t, fails, 1)
	assert.Equal(t, "1 of 100 requests have no session", fails[0])
}

// The last line is in exactly the form scripts read.
func TestLastLine(t *testing.T) {
	o := outcome{Requests: 21345, Sessions: 21345, Lost: 0, RSSStart: 61.4, RSSEnd: 142.6, GoroutineStart: 40, GoroutineEnd: 523}
	assert.Equal(t, "soak: 21345 requests, 21345 sessions counted, 0 lost, RSS 61 -> 143 MiB, goroutines 40 -> 523", o.lastLine())
	r := report{
		Options: options{concurrency: 200, duration: time.Minute, interval: 10 * time.Second}, Outcome: o,
		Samples: series(time.Minute, func(time.Duration) (float64, int) { return 100, 100 }),
	}
	md := strings.TrimRight(r.markdown(), "\n")
	assert.True(t, strings.HasSuffix(md, "\n"+o.lastLine()), "the report ends with the last line")
	svg := plotSVG(r.Samples, 0, time.Minute)
	assert.True(t, strings.HasPrefix(svg, "<svg ") && strings.HasSuffix(svg, "</svg>\n"))
	assert.Equal(t, 4, strings.Count(svg, "<polyline"))
}
