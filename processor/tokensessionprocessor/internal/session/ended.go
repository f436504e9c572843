// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import "hash/maphash"

// endedSet remembers the latest ended session IDs, oldest forgotten first:
// a ring of the IDs by age and an index of it. A Go map of the IDs cost a
// session three operations on a table too large for the cache, the oldest
// ID's removal hashing and comparing an ID long gone cold; here each ID's
// hash is kept in the ring, so forgetting one touches no string.
type endedSet struct {
	ring  []endedID
	next  int // the ring's oldest entry, replaced next
	index index
	seed  maphash.Seed
}

type endedID struct {
	id   string
	hash uint64
}

func newEndedSet(n int) endedSet {
	return endedSet{ring: make([]endedID, n), index: newIndex(n), seed: maphash.MakeSeed()}
}

// find reports whether id (hash h) is in the set.
func (e *endedSet) find(id string, h uint64) bool {
	_, ok := e.index.find(h, func(pos int) bool { return e.ring[pos].id == id })
	return ok
}

func (e *endedSet) has(id string) bool {
	return e.find(id, maphash.String(e.seed, id))
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
	if e.find(id, h) {
		return
	}
	if old := e.ring[e.next]; old.id != "" {
		e.index.remove(old.hash, e.next)
	}
	e.ring[e.next] = endedID{id: id, hash: h}
	e.index.add(h, e.next)
	e.next++
	if e.next == len(e.ring) {
		e.next = 0
	}
}
