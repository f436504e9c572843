// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

// index finds the positions of a dense array its user keeps by their keys'
// 64-bit hashes: open addressing, linear probing, deletion by backward
// shift, at most 3/4 full. A slot is 8 bytes: 1 + a position (0: an empty
// slot) and the low 32 bits of its key's hash, which the slot the key
// belongs in is read from (so growing reads no key) and which rule out
// most other keys without reading them. Its size is any number of slots,
// grown by half: a key's home slot is its hash's place in [0, size) by
// multiplying, not a power of two's mask, so that the index is 1/2 to 3/4
// full as it grows (11 to 16 B a key) where powers of two at most half
// full left it 1/4 to 1/2 (16 to 32 B). Against a Go map of the keys it
// saves a session tens of bytes (a map's slot holds the key and the
// value, and its groups are at most 7/8 full).
type index struct {
	slots []indexSlot
	used  int
}

type indexSlot struct {
	pos  int32
	hash uint32
}

// newIndex returns an index of room for n positions before it grows.
func newIndex(n int) index {
	return index{slots: make([]indexSlot, max(4, (4*n+2)/3))}
}

// home is the slot a key of hash h belongs in.
func (x *index) home(h uint32) int {
	return int(uint64(h) * uint64(len(x.slots)) >> 32)
}

// next is the slot after i, the first after the last.
func (x *index) next(i int) int {
	if i++; i == len(x.slots) {
		return 0
	}
	return i
}

// find returns the position whose key has hash h and matches (is the key
// looked for).
func (x *index) find(h uint64, matches func(pos int) bool) (pos int, found bool) {
	for i := x.home(uint32(h)); ; i = x.next(i) {
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
// the index when it would be more than 3/4 full.
func (x *index) add(h uint64, pos int) {
	if 4*(x.used+1) > 3*len(x.slots) {
		x.grow()
	}
	x.put(indexSlot{pos: int32(pos + 1), hash: uint32(h)})
	x.used++
}

// put fills the first empty slot from sl's home on.
func (x *index) put(sl indexSlot) {
	i := x.home(sl.hash)
	for x.slots[i].pos != 0 {
		i = x.next(i)
	}
	x.slots[i] = sl
}

// grow adds half the slots again. The stored 32 bits of each hash place
// it.
func (x *index) grow() {
	old := x.slots
	x.slots = make([]indexSlot, len(old)+len(old)/2)
	for _, sl := range old {
		if sl.pos != 0 {
			x.put(sl)
		}
	}
}

// slotOf returns the slot of position pos, whose key has hash h.
func (x *index) slotOf(h uint64, pos int) int {
	i := x.home(uint32(h))
	for x.slots[i].pos != int32(pos+1) {
		i = x.next(i)
	}
	return i
}

// holds reports whether pos (its key's hash h) is in the index.
func (x *index) holds(h uint64, pos int) bool {
	for i := x.home(uint32(h)); x.slots[i].pos != 0; i = x.next(i) {
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
	for j := x.next(i); x.slots[j].pos != 0; j = x.next(j) {
		// Slot j's entry may move to the hole at i unless its home slot k
		// lies cyclically in (i, j].
		k := x.home(x.slots[j].hash)
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = indexSlot{}
	x.used--
}
