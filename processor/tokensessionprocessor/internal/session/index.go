// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

// index finds the positions of a dense array its user keeps by their keys'
// 64-bit hashes: open addressing, linear probing, deletion by backward
// shift, at most half full. A slot is 8 bytes: 1 + a position (0: an empty
// slot) and the low 32 bits of its key's hash, which the slot the key
// belongs in is read from (so growing reads no key) and which rule out
// most other keys without reading them. Against a Go map of the keys it
// saves a session tens of bytes (a map's slot holds the key and the value,
// and its groups are at most 7/8 full).
type index struct {
	slots []indexSlot
	mask  uint64
	used  int
}

type indexSlot struct {
	pos  int32
	hash uint32
}

// newIndex returns an index of room for n positions before it grows.
func newIndex(n int) index {
	size := 2
	for size < 2*n {
		size *= 2
	}
	return index{slots: make([]indexSlot, size), mask: uint64(size - 1)}
}

// find returns the position whose key has hash h and matches (is the key
// looked for).
func (x *index) find(h uint64, matches func(pos int) bool) (pos int, found bool) {
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		sl := x.slots[i]
		if sl.pos == 0 {
			return 0, false
		}
		if sl.hash == uint32(h) && matches(int(sl.pos-1)) {
			return int(sl.pos - 1), true
		}
	}
}

// add indexes position pos, of a key (hash h) not in the index, growing
// the index when it gets more than half full.
func (x *index) add(h uint64, pos int) {
	if 2*(x.used+1) > len(x.slots) {
		x.grow()
	}
	x.put(indexSlot{pos: int32(pos + 1), hash: uint32(h)})
	x.used++
}

// put fills the first empty slot from sl's home on.
func (x *index) put(sl indexSlot) {
	i := uint64(sl.hash) & x.mask
	for x.slots[i].pos != 0 {
		i = (i + 1) & x.mask
	}
	x.slots[i] = sl
}

// grow doubles the slots. The stored 32 bits of each hash place it: the
// mask stays under 32 bits.
func (x *index) grow() {
	old := x.slots
	x.slots = make([]indexSlot, 2*len(old))
	x.mask = uint64(len(x.slots) - 1)
	for _, sl := range old {
		if sl.pos != 0 {
			x.put(sl)
		}
	}
}

// slotOf returns the slot of position pos, whose key has hash h.
func (x *index) slotOf(h uint64, pos int) uint64 {
	i := h & x.mask
	for x.slots[i].pos != int32(pos+1) {
		i = (i + 1) & x.mask
	}
	return i
}

// holds reports whether pos (its key's hash h) is in the index.
func (x *index) holds(h uint64, pos int) bool {
	for i := h & x.mask; x.slots[i].pos != 0; i = (i + 1) & x.mask {
		if x.slots[i].pos == int32(pos+1) {
			return true
		}
	}
	return false
}

// move records that the key at position from (hash h) is now at to.
func (x *index) move(h uint64, from, to int) {
	x.slots[x.slotOf(h, from)].pos = int32(to + 1)
}

// remove takes out position pos (its key's hash h), moving back the slots
// after it that probing would no longer reach.
func (x *index) remove(h uint64, pos int) {
	i := x.slotOf(h, pos)
	for j := (i + 1) & x.mask; x.slots[j].pos != 0; j = (j + 1) & x.mask {
		// Slot j's entry may move to the hole at i unless its home slot k
		// lies cyclically in (i, j].
		k := uint64(x.slots[j].hash) & x.mask
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = indexSlot{}
	x.used--
}
