// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"math/rand/v2"
	"testing"
)

// The index finds every key of a dense array kept as the table keeps its
// sessions (added at the end, removed by moving the last into the hole),
// and no other, as a map of the keys does: through growth from empty, and
// with hashes that collide in full and in their home slots, so that probe
// runs wrap and overlap and removals move slots back.
func TestIndexMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	hash := func(k int) uint64 { return uint64(k%13) * 0x9e3779b97f4a7c15 >> 3 }
	for _, keys := range []int{3, 20, 300} {
		x := newIndex(0)
		var dense []int
		model := map[int]int{} // key → position in dense
		for step := range 30_000 {
			k := rng.IntN(keys)
			pos, ok := x.find(hash(k), func(pos int) bool { return dense[pos] == k })
			if want, in := model[k]; ok != in || (ok && pos != want) {
				t.Fatalf("keys=%d step %d: find(%d) = %d, %v; want %d, %v", keys, step, k, pos, ok, want, in)
			}
			if !ok {
				model[k] = len(dense)
				x.add(hash(k), len(dense))
				dense = append(dense, k)
				continue
			}
			last := len(dense) - 1
			x.remove(hash(k), pos)
			if pos != last {
				x.move(hash(dense[last]), last, pos)
				dense[pos] = dense[last]
				model[dense[pos]] = pos
			}
			dense = dense[:last]
			delete(model, k)
			if x.used != len(dense) || 4*x.used > 3*len(x.slots) {
				t.Fatalf("keys=%d step %d: %d used of %d slots, want %d at most 3/4 full", keys, step, x.used, len(x.slots), len(dense))
			}
		}
	}
}
