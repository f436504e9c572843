// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package keyset

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

const minute = int64(time.Minute)

// Beyond the bound a value gets the Overflow key, counted; the values held
// stay at the bound however many come.
func TestSetBound(t *testing.T) {
	s := New(2, time.Hour)
	a, b := s.Open("a"), s.Open("b")
	assert.Equal(t, "a", a.Name())
	assert.Equal(t, "b", b.Name())
	for i := range 100_000 {
		assert.Equal(t, Overflow, s.Open(fmt.Sprint("model-", i)).Name())
	}
	assert.Same(t, a, s.Open("a"), "a value held is found")
	assert.Equal(t, 2, s.Len())
	assert.Equal(t, uint64(100_000), s.Overflowed())
	assert.Nil(t, s.Open(""), "the absent value is no value")
	assert.Empty(t, (*Key)(nil).Name())

	unbounded := New(0, 0)
	for i := range 1000 {
		assert.Equal(t, fmt.Sprint(i), unbounded.Open(fmt.Sprint(i)).Name())
	}
	assert.Zero(t, unbounded.Overflowed())
}

// A value no session holds is forgotten at the first sweep a forgetting
// time after the sweep that followed its last use; its place goes to a new
// value. One held open is never forgotten.
func TestSetForgets(t *testing.T) {
	s := New(1, 10*time.Minute)
	k := s.Open("a")
	k.Close()
	s.Sweep(1 * minute) // the first sweep after its last use
	s.Sweep(10 * minute)
	assert.Equal(t, 1, s.Len(), "9 minutes idle: held")
	s.Sweep(11 * minute)
	assert.Zero(t, s.Len(), "10 minutes idle: forgotten")
	assert.Equal(t, uint64(1), s.Forgotten())
	b := s.Open("b")
	assert.Equal(t, "b", b.Name(), "the place is free")

	// b stays open an hour: held throughout, forgotten only once idle
	// after its close.
	for at := int64(12); at <= 72; at++ {
		s.Sweep(at * minute)
	}
	assert.Equal(t, 1, s.Len())
	b.Close()
	s.Sweep(73 * minute)
	s.Sweep(82 * minute)
	assert.Equal(t, 1, s.Len())
	b.Touch() // a recording after the session's end
	s.Sweep(84 * minute)
	s.Sweep(93 * minute)
	assert.Equal(t, 1, s.Len(), "the touch counted as a use")
	s.Sweep(94 * minute)
	assert.Zero(t, s.Len())

	never := New(1, 0)
	never.Open("a").Close()
	for at := range int64(1000) {
		never.Sweep(at * minute)
	}
	assert.Equal(t, 1, never.Len(), "forget_after 0: never forgotten")
}

// A new value when the bound is reached takes the place of a value idle
// since the last sweep, the one idle longest first; a value open, or used
// since the last sweep, keeps its place, and without an idle value the new
// one goes to Overflow.
func TestSetDisplacesIdleValues(t *testing.T) {
	s := New(3, time.Hour)
	s.Open("old").Close()
	s.Sweep(1 * minute)
	s.Open("recent").Close()
	open := s.Open("open")
	s.Sweep(2 * minute)
	assert.Equal(t, "new-1", s.Open("new-1").Name(), "old, idle longest, makes room")
	assert.Equal(t, "new-2", s.Open("new-2").Name(), "then recent")
	assert.Equal(t, Overflow, s.Open("new-3").Name(), "open is held, new-1 and new-2 are in use")
	assert.Same(t, open, s.Open("open"))
	assert.Equal(t, uint64(2), s.Displaced())
	assert.Equal(t, uint64(1), s.Overflowed())

	// Used since the sweep: not displaced.
	s = New(1, time.Hour)
	k := s.Open("a")
	k.Close()
	s.Sweep(1 * minute)
	k.Touch()
	assert.Equal(t, Overflow, s.Open("b").Name())
	s.Sweep(2 * minute)
	assert.Equal(t, "b", s.Open("b").Name())

	// 100 000 new values, a sweep every 1 000: the set stays at its bound,
	// each sweep's idle values making room for as many new ones.
	s = New(100, time.Hour)
	for i := range 100_000 {
		if i%1000 == 0 {
			s.Sweep(int64(i/1000+1) * minute)
		}
		s.Open(fmt.Sprint("name-", i)).Close()
	}
	assert.Equal(t, 100, s.Len())
	assert.Equal(t, uint64(100_000-100), s.Displaced()+s.Overflowed())
	assert.Equal(t, uint64(99*100), s.Displaced(), "100 places freed at each sweep after the first")
}

func TestActivity(t *testing.T) {
	var a Activity
	assert.False(t, a.Idle(1*minute, 5*minute), "the first sweep starts the count")
	assert.False(t, a.Idle(5*minute, 5*minute))
	assert.True(t, a.Idle(6*minute, 5*minute))
	a.Touch()
	assert.False(t, a.Idle(7*minute, 5*minute))
	assert.False(t, a.Idle(11*minute, 5*minute))
	assert.True(t, a.Idle(12*minute, 5*minute))
	assert.False(t, a.Idle(1000*minute, 0), "0: never idle")
}

// BenchmarkOpenClose is the per-session cost: a value held, opened and
// closed.
func BenchmarkOpenClose(b *testing.B) {
	s := New(100, time.Hour)
	for i := range 100 {
		s.Open(fmt.Sprintf("meta-llama/Llama-3.1-%dB-Instruct", i)).Close()
	}
	name := "meta-llama/Llama-3.1-42B-Instruct"
	b.ReportAllocs()
	for b.Loop() {
		s.Open(name).Close()
	}
}
