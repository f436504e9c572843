// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package attribution

import (
	"fmt"
	"testing"
)

// BenchmarkSessionCycle: one session's arrival, first token and end on an
// engine with open sessions already decoding: the cost per session (three
// events) must not grow with them.
func BenchmarkSessionCycle(b *testing.B) {
	for _, open := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("open=%d", open), func(b *testing.B) {
			e := NewEngine(Limits{StepTokens: 2048})
			bg := make([]Share, open)
			at := int64(0)
			for i := range bg {
				e.Arrive(&bg[i], at, 100)
				e.FirstToken(&bg[i], at)
			}
			e.SetPower(at, 300)
			var s Share
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				at += 1000
				s = Share{}
				e.Arrive(&s, at, 500)
				e.FirstToken(&s, at+100)
				e.End(&s, at+200, 50)
			}
		})
	}
}
