// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenrecord

import (
	"encoding/binary"
	"math/bits"
)

// appendDecimal appends v in decimal, as strconv.AppendUint(dst, v, 10)
// does, eight digits at a time: a packed record's offsets have about eight
// digits, and strconv's two digits per step, written to a buffer of its own
// and then copied, was most of the cost of writing a packed event.
func appendDecimal(dst []byte, v uint64) []byte {
	switch {
	case v < 1e8:
		return appendShort(dst, v)
	case v < 1e16:
		return appendEight(appendShort(dst, v/1e8), v%1e8)
	}
	return appendEight(appendEight(appendShort(dst, v/1e16), v/1e8%1e8), v%1e8)
}

// appendShort appends v < 1e8 without leading zeros.
func appendShort(dst []byte, v uint64) []byte {
	if v == 0 {
		return append(dst, '0')
	}
	x := eightDigitsOf(v)
	// The leading zeros are the low bytes of x that are zero (before the
	// ASCII offset is added).
	zeros := bits.TrailingZeros64(x) / 8
	dst = binary.LittleEndian.AppendUint64(dst, (x+0x3030303030303030)>>(8*zeros))
	return dst[:len(dst)-zeros]
}

// appendEight appends v < 1e8 as exactly eight digits.
func appendEight(dst []byte, v uint64) []byte {
	return binary.LittleEndian.AppendUint64(dst, eightDigitsOf(v)+0x3030303030303030)
}

// eightDigitsOf spreads the eight decimal digits of v < 1e8 over the bytes
// of a word, the first in the lowest byte, by dividing within the word's
// lanes: v into two halves of four digits (32-bit lanes), each into two
// pairs (16-bit lanes), each pair into its digits (bytes). Each lane's
// quotient is a multiplication and a shift (x/100 = x*5243>>19 for x <
// 10 000, x/10 = x*103>>10 for x < 100); no lane's product reaches the
// next lane, and the bits a shift brings down from the next lane are
// masked off.
func eightDigitsOf(v uint64) uint64 {
	x := v/10000 | v%10000<<32
	q := (x * 5243 >> 19) & 0x0000007F0000007F
	x = q | (x-q*100)<<16
	q = (x * 103 >> 10) & 0x000F000F000F000F
	return q | (x-q*10)<<8
}
