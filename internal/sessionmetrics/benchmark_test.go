// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sessionmetrics

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pmetric"
)

// benchGaps are per-token gaps between 5 ms and 300 ms, the range a decode phase produces.
var benchGaps = func() []time.Duration {
	r := rand.New(rand.NewPCG(3, 4))
	g := make([]time.Duration, 1024)
	for i := range g {
		g[i] = 5*time.Millisecond + time.Duration(r.Int64N(int64(295*time.Millisecond)))
	}
	return g
}()

func benchConfigs() []struct {
	name   string
	mutate func(*Config)
} {
	return []struct {
		name   string
		mutate func(*Config)
	}{
		{"explicit", nil},
		{"exponential", func(c *Config) { c.Histogram = Exponential }},
	}
}

func BenchmarkObserveGap(b *testing.B) {
	for _, bc := range benchConfigs() {
		b.Run(bc.name, func(b *testing.B) {
			a := newAggregator(b, bc.mutate)
			l := a.SessionStarted(chatDims)
			for _, g := range benchGaps {
				a.ObserveGap(l, g, 1)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				a.ObserveGap(l, benchGaps[i&1023], 1)
				i++
			}
		})
	}
}

func BenchmarkSessionLifecycle(b *testing.B) {
	r := Result{
		Outcome: "completed", TTFT: 120 * time.Millisecond, HasTTFT: true, TPOT: 25 * time.Millisecond, HasTPOT: true,
		Duration: 2600 * time.Millisecond, InputTokens: 512, OutputTokens: 101, HasInputTokens: true, HasOutputTokens: true,
	}
	for _, bc := range benchConfigs() {
		b.Run(bc.name, func(b *testing.B) {
			a := newAggregator(b, func(c *Config) {
				c.Dimensions = []string{"tenant"}
				if bc.mutate != nil {
					bc.mutate(c)
				}
			})
			d := chatDims
			d.Extra = []string{"acme"}
			a.SessionEnded(a.SessionStarted(d), r)
			b.ReportAllocs()
			for b.Loop() {
				l := a.SessionStarted(d)
				for j := range 100 {
					a.ObserveGap(l, benchGaps[j], 1)
				}
				a.SessionEnded(l, r)
			}
		})
	}
}

func BenchmarkAppendTo(b *testing.B) {
	const series = 2000
	for _, bc := range benchConfigs() {
		b.Run(bc.name, func(b *testing.B) {
			a := newAggregator(b, func(c *Config) {
				c.CardinalityLimit = series + 1
				if bc.mutate != nil {
					bc.mutate(c)
				}
			})
			for i := range series {
				l := a.SessionStarted(Dims{Operation: "chat", Provider: "vllm", Model: fmt.Sprintf("model-%04d", i), Engine: "vllm-0"})
				for j := range 20 {
					a.ObserveGap(l, benchGaps[(i+j)&1023], 1)
				}
				a.SessionEnded(l, Result{
					Outcome: "completed", TTFT: benchGaps[i&1023], HasTTFT: true, TPOT: benchGaps[(i+1)&1023], HasTPOT: true,
					Duration: time.Second, InputTokens: 100, OutputTokens: 20, HasInputTokens: true, HasOutputTokens: true,
				})
			}
			b.ReportAllocs()
			now := t1
			for b.Loop() {
				md := pmetric.NewMetrics()
				a.AppendTo(md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty(), now)
			}
		})
	}
}
