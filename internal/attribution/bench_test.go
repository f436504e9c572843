// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package attribution

import (
	"fmt"
	"testing"
)

// BenchmarkStepsToken: the cost per token of the steps' account, with
// running sessions each decoding a token every 20 ms step, delivered in
// 100 ms batches grouped by session as the receiver hands them over, and
// settled after every batch; each session ends after 128 tokens and a new
// one takes its place.
func BenchmarkStepsToken(b *testing.B) {
	for _, c := range []struct {
		running int
		// apart: each session's tokens this far from the previous
		// session's (ns): 0, an engine's steps; 2 ms (over Join), a sender whose
		// tokens fit no steps (each its own, bounded by maxStepsHeld).
		apart int64
	}{{10, 0}, {200, 0}, {200, 2e6}} {
		running := c.running
		name := fmt.Sprintf("running=%d", running)
		if c.apart > 0 {
			name += "/unaligned"
		}
		b.Run(name, func(b *testing.B) {
			e := NewSteps(StepsConfig{StepTokens: 2048, Join: 1e6, Lag: 2e9})
			e.SetPower(300)
			accts := make([]*Account, running)
			toks := make([]int, running)
			for i := range accts {
				accts[i] = &Account{}
				e.Arrive(accts[i], 0, 500)
			}
			const step, perBatch = int64(20e6), 5
			batch := int64(0)
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; {
				for i := range accts {
					for k := int64(1); k <= perBatch; k++ {
						e.Token(accts[i], batch+k*step+int64(i)*c.apart, 1)
						n++
					}
					if toks[i] += perBatch; toks[i] >= 128 {
						// A new session: the ended one's account is
						// the engine's until it is final.
						e.End(accts[i], batch+perBatch*step, 500, 128)
						accts[i] = &Account{}
						e.Arrive(accts[i], batch+perBatch*step, 500)
						toks[i] = 0
					}
				}
				batch += perBatch * step
				e.Settle(batch)
			}
		})
	}
}
