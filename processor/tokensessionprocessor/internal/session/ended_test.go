// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The ended set remembers exactly the latest n distinct IDs added, as a
// map and a ring of them do, whatever the order of adds, repeats and
// lookups (small sets and few IDs, so that probe runs wrap the index and
// overlap, and removals move slots back).
func TestEndedSetMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{1, 2, 3, 5, 8, 13, 64} {
		e := newEndedSet(n)
		model := map[string]bool{}
		var order []string
		for step := range 20_000 {
			id := fmt.Sprintf("s-%d", rng.IntN(4*n+3))
			if rng.IntN(3) == 0 {
				if got := e.has(id); got != model[id] {
					t.Fatalf("n=%d step %d: has(%q) = %v, want %v", n, step, id, got, model[id])
				}
				continue
			}
			e.add(id)
			if !model[id] {
				model[id] = true
				order = append(order, id)
				if len(order) > n {
					delete(model, order[0])
					order = order[1:]
				}
			}
			if e.len() != len(order) {
				t.Fatalf("n=%d step %d: len %d, want %d", n, step, e.len(), len(order))
			}
		}
		for id := range model {
			if !e.has(id) {
				t.Fatalf("n=%d: %q forgotten", n, id)
			}
		}
	}
}
