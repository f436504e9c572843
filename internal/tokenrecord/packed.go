// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenrecord // import "github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"

import (
	"fmt"
	"math"

	"github.com/otelcol-llm/otelcol-llm/internal/swar"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

type packedEvent struct {
	time, count int64
	seq         int64 // -1 for none
	next        int32 // index in packed of the session's next event; -1 for none
}

// appendPacked appends the AttrTokenEvents form of the events chained from
// packed[first] to dst, offsets from base. Event times and base are
// positive int64s, so no offset overflows.
func appendPacked(dst []byte, packed []packedEvent, first int32, base int64) []byte {
	for i := first; i >= 0; i = packed[i].next {
		if i != first {
			dst = append(dst, ' ')
		}
		off := packed[i].time - base
		if off < 0 {
			dst = append(dst, '-')
			off = -off
		}
		dst = appendDecimal(dst, uint64(off))
		if c := packed[i].count; c != 1 {
			dst = append(dst, ':')
			dst = appendDecimal(dst, uint64(c)) // CheckCount: at least 1
		}
		if seq := packed[i].seq; seq >= 0 {
			dst = append(dst, '#')
			dst = appendDecimal(dst, uint64(seq))
		}
	}
	return dst
}

// seqOf is ev's seq in the record form, -1 for none.
func seqOf(ev *tokenevent.Event) int64 {
	if !ev.HasSeq {
		return -1
	}
	return int64(ev.Seq) // at most MaxInt64 (tokenevent.CheckSeq)
}

func setSeq(ev *tokenevent.Event, seq int64) {
	ev.Seq, ev.HasSeq = uint64(max(seq, 0)), seq >= 0
}

// readPacked reads the AttrTokenEvents form s of a record stamped base,
// all of it before fn sees any event: a record is valid or not. Up to
// len(buf) events are decoded once into buf, more are scanned twice.
func readPacked(s string, base int64, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	var buf [64]packedEvent
	return readPackedWith(s, base, buf[:], ev, fn)
}

// readPackedWith is readPacked with buf as its buffer: a batch record's
// entries share one, zeroed once per record rather than once per entry.
func readPackedWith(s string, base int64, buf []packedEvent, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	n, err := scanPacked(s, base, buf)
	if err != nil {
		return err
	}
	if n > len(buf) {
		scanPackedTo(s, base, ev, fn)
		return nil
	}
	for _, p := range buf[:n] {
		ev.TimeUnixNano, ev.Count = uint64(p.time), p.count
		setSeq(ev, p.seq)
		fn(ev)
	}
	return nil
}

// scanPacked checks s, storing its first len(buf) events in buf, and
// returns the number of events.
func scanPacked(s string, base int64, buf []packedEvent) (int, error) {
	for i, n := 0, 0; ; n++ {
		t, count, seq, j, err := packedEntry(s, i, base, n)
		if err != nil {
			return 0, err
		}
		if n < len(buf) {
			buf[n] = packedEvent{time: t, count: count, seq: seq}
		}
		if j == len(s) {
			return n + 1, nil
		}
		i = j + 1
	}
}

// scanPackedTo calls fn for each event of s, which scanPacked accepted.
func scanPackedTo(s string, base int64, ev *tokenevent.Event, fn func(*tokenevent.Event)) {
	for i, n := 0, 0; ; n++ {
		t, count, seq, j, _ := packedEntry(s, i, base, n)
		ev.TimeUnixNano, ev.Count = uint64(t), count
		setSeq(ev, seq)
		fn(ev)
		if j == len(s) {
			return
		}
		i = j + 1
	}
}

// packedEntry reads event n, "<offset>[:<count>][#<seq>]", from s[i:],
// returning its time, count and seq (-1 for none) and where it ends: at the
// end of s or at the space before the next event.
func packedEntry(s string, i int, base int64, n int) (t, count, seq int64, next int, err error) {
	off, j, ok := packedInt(s, i, true)
	count, seq = 1, -1
	if ok && j < len(s) && s[j] == ':' {
		count, j, ok = packedInt(s, j+1, false)
		ok = ok && count >= 1
	}
	if ok && j < len(s) && s[j] == '#' {
		seq, j, ok = packedInt(s, j+1, false)
	}
	if !ok || (j < len(s) && s[j] != ' ') {
		return 0, 0, 0, 0, &tokenevent.FieldError{Field: AttrTokenEvents, Reason: fmt.Sprintf("event %d: want <offset ns>[:<count>][#<seq>], events separated by one space", n)}
	}
	if ferr := tokenevent.CheckCount(count); ferr != nil {
		return 0, 0, 0, 0, &tokenevent.FieldError{Field: AttrTokenEvents, Reason: fmt.Sprintf("event %d: count %s", n, ferr.Reason)}
	}
	// base >= 0, so only a positive offset can overflow, and it wraps
	// below zero.
	if t = base + off; t <= 0 {
		return 0, 0, 0, 0, &tokenevent.FieldError{Field: AttrTokenEvents, Reason: fmt.Sprintf("event %d: time is not a positive int64", n)}
	}
	return t, count, seq, j, nil
}

// packedInt reads a decimal int64 from s[i:], with a leading '-' if signed:
// 1 to 19 digits.
func packedInt(s string, i int, signed bool) (v int64, next int, ok bool) {
	neg := signed && i < len(s) && s[i] == '-'
	if neg {
		i++
	}
	start := i
	var u uint64
	// Eight digits at a time while there are (an offset has about eight:
	// tens of ms), as tokenparse reads a line's times; digit by digit this
	// was the reader's largest cost per packed event.
	for i+8 <= len(s) && i-start <= 19-8 {
		x := swar.LoadLE64(s[i : i+8])
		if !swar.EightDigits(x) {
			break
		}
		u = u*100_000_000 + swar.EightDigitsValue(x)
		i += 8
	}
	for i < len(s) && i-start < 19 && s[i]-'0' <= 9 {
		u = u*10 + uint64(s[i]-'0')
		i++
	}
	if i == start || u > math.MaxInt64 || (i < len(s) && s[i]-'0' <= 9) {
		return 0, i, false
	}
	if neg {
		return -int64(u), i, true
	}
	return int64(u), i, true
}
