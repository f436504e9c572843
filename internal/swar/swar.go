// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package swar reads bytes eight at a time in one uint64 (SIMD within a
// register): the token path's parser and its record form read digits and
// session IDs so, each on every event.
package swar // import "github.com/otelcol-llm/otelcol-llm/internal/swar"

import "math/bits"

// LoadLE64 is the first 8 bytes of b as a little-endian word (the
// compiler makes it one load).
func LoadLE64[S string | []byte](b S) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// EightDigits reports whether the 8 bytes of x (little-endian) are all
// ASCII digits: each byte is 0x3_, and adding 6 to it does not carry out of
// the low nibble (no byte carries into the next, as all are below 0x40).
func EightDigits(x uint64) bool {
	const hi = 0xF0F0F0F0F0F0F0F0
	return x&hi == 0x3030303030303030 && (x+0x0606060606060606)&hi == 0x3030303030303030
}

// EightDigitsValue is the number eight ASCII digits spell, the first in the
// lowest byte of x: pairs, then quads, then the eight are combined by
// multiplications within the word (as simdjson parses eight digits).
func EightDigitsValue(x uint64) uint64 {
	x = (x & 0x0F0F0F0F0F0F0F0F) * (1 + 10<<8) >> 8
	x = (x & 0x00FF00FF00FF00FF) * (1 + 100<<16) >> 16
	return (x & 0x0000FFFF0000FFFF) * (1 + 10000<<32) >> 32
}

// IDSlots is the size of the direct-mapped caches of session IDs (the
// parser's intern cache, tokenrecord.RecordWriter's open records).
const (
	idSlotBits = 10
	IDSlots    = 1 << idSlotBits
)

// IDSlot is a cheap hash of a session ID for the direct-mapped caches: its
// first, middle and last 8 bytes (where IDs differ: counters, UUIDs,
// random suffixes) and its length, mixed by one multiplication. IDs that
// collide only miss the cache.
func IDSlot[S string | []byte](id S) int {
	n := len(id)
	var h uint64
	if n >= 8 {
		h = LoadLE64(id[:8]) ^ bits.RotateLeft64(LoadLE64(id[n/2-4:n/2+4]), 21) ^ bits.RotateLeft64(LoadLE64(id[n-8:]), 42)
	} else {
		for i := range n {
			h = h<<8 | uint64(id[i])
		}
	}
	h ^= uint64(n)
	return int((h * 0x9e3779b97f4a7c15) >> (64 - idSlotBits))
}
