// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package keyset bounds and forgets the attribute values that a
// long-running aggregation keys its state by (models, engines, tenants).
// A Set admits at most its bound of distinct values; it forgets a value
// that no open session holds and that nothing used for its forgetting time,
// so that a collector running for months holds the values in use, not every
// value it ever saw. A new value when the bound is reached takes the place
// of a value idle since the last sweep (what it recorded has been flushed):
// the one idle longest. Only when none is idle does it go to Overflow, so
// that names made up by the thousand, or pods replaced for months, cannot
// keep a new engine's own series out until the forgetting time.
//
// Activity is the forgetting rule on its own, for the series built on
// those values: the same rule, swept at the same times, forgets a value and
// the series that carry it together.
//
// Neither is safe for concurrent use.
package keyset // import "github.com/otelcol-llm/otelcol-llm/internal/keyset"

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Overflow is the value that the values beyond a Set's bound are recorded
// under.
const Overflow = "_OTHER"

// Activity is when a piece of state was last used, at the resolution of
// the sweeps that forget it: Touch marks a use (one store, for the hot
// path) and Idle, called at each sweep, tells whether there was none for
// the forgetting time. The zero value is state never used.
type Activity struct {
	used bool
	// last is the time of the first sweep after the latest use.
	last int64
}

// Touch marks a use.
func (a *Activity) Touch() { a.used = true }

// Unused reports whether the state has not been used since the last sweep.
func (a *Activity) Unused() bool { return !a.used }

// UnusedSince is the first sweep after the state's latest use (Unix ns; 0
// before any sweep): of two states unused now, the one with the earlier
// UnusedSince has been idle longer.
func (a *Activity) UnusedSince() int64 { return a.last }

// Idle is the sweep at now (Unix ns): it reports whether the state went
// unused for at least after, counted from the first sweep after its latest
// use, so that state is forgotten between after and after plus one sweep
// interval after its latest use. after 0 means never.
func (a *Activity) Idle(now, after int64) bool {
	if a.used || a.last == 0 {
		a.used, a.last = false, now
		return false
	}
	return after > 0 && now-a.last >= after
}

// Key is one value of a Set, or its Overflow. The nil Key is the absent
// value (""), which is not counted against the bound; its methods do
// nothing.
type Key struct {
	name string
	// open counts the sessions that hold the key: it is not forgotten
	// while any does.
	open int32
	Activity
}

// Name is the value the key stands for: its own, Overflow, or "" for nil.
func (k *Key) Name() string {
	if k == nil {
		return ""
	}
	return k.name
}

// Close is the end of a session that Open gave the key to.
func (k *Key) Close() {
	if k != nil {
		k.open--
		k.used = true
	}
}

// Touch marks a use of the key by a recording outside a session's Open
// and Close (a timing that comes after the session's end).
func (k *Key) Touch() {
	if k != nil {
		k.used = true
	}
}

// Set is a bounded set of values that forgets idle ones.
type Set struct {
	bound       int
	forgetAfter int64
	keys        map[string]*Key
	overflow    Key

	// idle are the values idle at the last sweep: those a new value may
	// take the place of.
	idle IdleQueue[*Key]

	overflowed uint64
	forgotten  uint64
	displaced  uint64
}

// New returns a Set of at most bound values (0: no bound) that forgets a
// value at the first Sweep forgetAfter (0: never) after its last use.
func New(bound int, forgetAfter time.Duration) *Set {
	return &Set{bound: bound, forgetAfter: int64(forgetAfter), keys: make(map[string]*Key), overflow: Key{name: Overflow}}
}

// Open admits name for a session and returns its Key, which the session
// closes at its end: name's own, or the Overflow key when the bound is
// reached and name is not held (counted in Overflowed); nil for "".
func (s *Set) Open(name string) *Key {
	if name == "" {
		return nil
	}
	k, ok := s.keys[name]
	if !ok {
		if s.bound > 0 && len(s.keys) >= s.bound && !s.displace() {
			s.overflowed++
			k = &s.overflow
		} else {
			k = &Key{name: strings.Clone(name)}
			s.keys[k.name] = k
		}
	}
	k.open++
	k.used = true
	return k
}

// displace forgets the value idle longest that is still idle (no session
// opened or used it since the last sweep), to make room; false when none is.
func (s *Set) displace() bool {
	k, ok := s.idle.Take(func(k *Key) bool { return k.open <= 0 && !k.used && s.keys[k.name] == k })
	if ok {
		delete(s.keys, k.name)
		s.displaced++
	}
	return ok
}

// Sweep forgets, at now (Unix ns), the values no session holds open that
// went unused for the forgetting time, and returns how many it forgot. The
// values left that no session holds are those a new value may take the
// place of until the next sweep (a value used since is not).
func (s *Set) Sweep(now int64) int {
	n := 0
	s.idle.Reset()
	for name, k := range s.keys {
		switch {
		case k.Idle(now, s.forgetAfter) && k.open <= 0:
			delete(s.keys, name)
			n++
		case k.open <= 0 && s.bound > 0:
			s.idle.Add(k)
		}
	}
	s.idle.Sort((*Key).UnusedSince)
	s.forgotten += uint64(n)
	return n
}

// Len is the number of values held (Overflow not counted).
func (s *Set) Len() int { return len(s.keys) }

// Overflowed counts the Opens that got the Overflow key.
func (s *Set) Overflowed() uint64 { return s.overflowed }

// Forgotten counts the values forgotten by Sweep.
func (s *Set) Forgotten() uint64 { return s.forgotten }

// Displaced counts the values forgotten early, idle, to make room for a
// new one.
func (s *Set) Displaced() uint64 { return s.displaced }

// IdleQueue holds what was idle at the last sweep, for a new value or
// series to take the place of when its bound is reached: the one idle
// longest first. Filled at each sweep (Reset, Add, Sort), it is taken from
// between sweeps (Take), each taken item checked to be idle still, since a
// use since the sweep makes an item keep its place.
type IdleQueue[T any] struct{ items []T }

// Reset empties the queue for a sweep.
func (q *IdleQueue[T]) Reset() {
	clear(q.items)
	q.items = q.items[:0]
}

// Add queues an item idle at this sweep.
func (q *IdleQueue[T]) Add(x T) { q.items = append(q.items, x) }

// Sort orders the queue by since, the first sweep after each item's last
// use (Activity.UnusedSince): the item idle longest is taken first.
func (q *IdleQueue[T]) Sort(since func(T) int64) {
	slices.SortStableFunc(q.items, func(x, y T) int { return cmp.Compare(since(y), since(x)) })
}

// Take returns the item idle longest for which idle still holds, dropping
// those before it that were used since; false when none is left.
func (q *IdleQueue[T]) Take(idle func(T) bool) (T, bool) {
	for len(q.items) > 0 {
		x := q.items[len(q.items)-1]
		var zero T
		q.items[len(q.items)-1] = zero
		q.items = q.items[:len(q.items)-1]
		if idle(x) {
			return x, true
		}
	}
	var zero T
	return zero, false
}
