// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package swar

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Eight ASCII digits are recognized and read as the number they spell;
// a word with any other byte is not digits.
func TestEightDigits(t *testing.T) {
	for _, n := range []uint64{0, 1, 9, 10, 12345678, 87654321, 99999999, 10000000, 40506070} {
		s := fmt.Sprintf("%08d", n)
		x := LoadLE64(s)
		assert.True(t, EightDigits(x), s)
		assert.Equal(t, n, EightDigitsValue(x), s)
	}
	for _, s := range []string{"1234567a", "/2345678", ":2345678", "1234 678", "\x0012345678"[:8], "12345.78"} {
		assert.False(t, EightDigits(LoadLE64(s)), "%q", s)
	}
}

// LoadLE64 reads the first byte into the lowest, from a string or bytes.
func TestLoadLE64(t *testing.T) {
	assert.Equal(t, uint64(0x0807060504030201), LoadLE64([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}))
	assert.Equal(t, LoadLE64([]byte("session-")), LoadLE64("session-"))
}

// IDSlot is in range for IDs of every length, and alike for a string and
// its bytes (the parser hashes bytes, the record writer strings).
func TestIDSlot(t *testing.T) {
	for n := range 40 {
		id := fmt.Sprintf("%040d", n)[:n]
		slot := IDSlot(id)
		assert.GreaterOrEqual(t, slot, 0)
		assert.Less(t, slot, IDSlots)
		assert.Equal(t, slot, IDSlot([]byte(id)))
	}
}
