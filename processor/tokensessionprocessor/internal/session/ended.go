// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import "hash/maphash"

// endedSet remembers the latest ended session IDs, oldest forgotten first:
// a ring of the IDs by age and an open-addressing index of it (linear
// probing, deletion by backward shift, at most half full). A Go map of the
// IDs cost a session three operations on a table too large for the cache,
// the oldest ID's removal hashing and comparing an ID long gone cold; here
// each ID's hash is kept in the ring, so forgetting one touches no string,
// and the index is 8 bytes per slot.
type endedSet struct {
	ring  []endedID
	next  int // the ring's oldest entry, replaced next
	index []endedSlot
	mask  uint64
	seed  maphash.Seed
}

type endedID struct {
	id   string
	hash uint64
}

// endedSlot is a slot of the index: 1 + the ring position of its ID (0: an
// empty slot), and the low 32 bits of the ID's hash, which the slot the ID
// belongs in is read from and which rule out most other IDs without
// reading them.
type endedSlot struct {
	pos  int32
	hash uint32
}

func newEndedSet(n int) endedSet {
	size := 2
	for size < 2*n {
		size *= 2
	}
	return endedSet{ring: make([]endedID, n), index: make([]endedSlot, size), mask: uint64(size - 1), seed: maphash.MakeSeed()}
}

// find returns the index slot holding id (hash h), or the empty slot where
// it would go.
func (e *endedSet) find(id string, h uint64) (slot uint64, found bool) {
	for i := h & e.mask; ; i = (i + 1) & e.mask {
		sl := e.index[i]
		if sl.pos == 0 {
			return i, false
		}
		if sl.hash == uint32(h) && e.ring[sl.pos-1].id == id {
			return i, true
		}
	}
}

func (e *endedSet) has(id string) bool {
	_, ok := e.find(id, maphash.String(e.seed, id))
	return ok
}

// len is the number of IDs remembered.
func (e *endedSet) len() int {
	if e.ring[e.next].id != "" {
		return len(e.ring)
	}
	return e.next
}

func (e *endedSet) add(id string) {
	h := maphash.String(e.seed, id)
	if _, ok := e.find(id, h); ok {
		return
	}
	if old := e.ring[e.next]; old.id != "" {
		e.forget(old.hash, int32(e.next+1))
	}
	e.ring[e.next] = endedID{id: id, hash: h}
	slot, _ := e.find(id, h) // the forgotten ID's removal may have moved the slot
	e.index[slot] = endedSlot{pos: int32(e.next + 1), hash: uint32(h)}
	e.next++
	if e.next == len(e.ring) {
		e.next = 0
	}
}

// forget removes the index slot of ring position pos-1 (its ID's hash h),
// moving back the slots after it that probing would no longer reach.
func (e *endedSet) forget(h uint64, pos int32) {
	i := h & e.mask
	for e.index[i].pos != pos {
		i = (i + 1) & e.mask
	}
	for j := (i + 1) & e.mask; e.index[j].pos != 0; j = (j + 1) & e.mask {
		// Slot j's entry may move to the hole at i unless its home slot k
		// lies cyclically in (i, j].
		k := uint64(e.index[j].hash) & e.mask
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			e.index[i] = e.index[j]
			i = j
		}
	}
	e.index[i] = endedSlot{}
}
