// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenparse // import "github.com/otelcol-llm/otelcol-llm/internal/tokenparse"

import (
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// The general parser's JSON: the syntax of a line's object and of any
// value it skips, and the strings, numbers and hex IDs its fields take.

func (p *Parser) syntax(want string) error {
	if p.i >= len(p.b) {
		return &tokenevent.FieldError{Reason: "invalid JSON: want " + want + ", got end of line"}
	}
	return &tokenevent.FieldError{Reason: fmt.Sprintf("invalid JSON at byte %d: want %s, got %q", p.i+1, want, p.b[p.i])}
}

func (p *Parser) skipSpace() {
	// Compact JSON has no spaces: one comparison decides the common case.
	for p.i < len(p.b) && p.b[p.i] <= ' ' && isSpace(p.b[p.i]) {
		p.i++
	}
}

// end checks that nothing but spaces follows the object.
func (p *Parser) end() error {
	p.skipSpace()
	if p.i != len(p.b) {
		return &tokenevent.FieldError{Reason: fmt.Sprintf("invalid JSON at byte %d: data after the object", p.i+1)}
	}
	return nil
}

// member steps to the next member of the object whose '{' has been read:
// past the ',' before it unless first, its key and its ':'. It reports
// done, with the cursor after the '}', at the end of the object. field
// names the object for errors about a key that is not a string; empty
// means the top-level object. The key is valid until the next read.
func (p *Parser) member(first bool, field string) (key []byte, done bool, err error) {
	if done, err = p.next(first, '}'); done || err != nil {
		return nil, done, err
	}
	if key, err = p.str(field); err != nil {
		return nil, false, err
	}
	p.skipSpace()
	if p.i >= len(p.b) || p.b[p.i] != ':' {
		return nil, false, p.syntax("':'")
	}
	p.i++
	p.skipSpace()
	return key, false, nil
}

// next steps to the next entry of an object or array closed by end: past
// the ',' before it unless first. It reports done, with the cursor after
// end, when there is none.
func (p *Parser) next(first bool, end byte) (done bool, err error) {
	p.skipSpace()
	if p.i < len(p.b) && p.b[p.i] == end {
		p.i++
		return true, nil
	}
	if !first {
		if p.i >= len(p.b) || p.b[p.i] != ',' {
			return false, p.syntax("',' or '" + string(end) + "'")
		}
		p.i++
		p.skipSpace()
	}
	return false, nil
}

// skipRest checks the syntax of the rest of the top-level object, from the
// value of a member on: the values, the members after it, the end.
func (p *Parser) skipRest() error {
	for first := true; ; first = false {
		if !first {
			_, done, err := p.member(false, "")
			if err != nil {
				return err
			}
			if done {
				return p.end()
			}
		}
		if err := p.skipValue(0); err != nil {
			return err
		}
	}
}

// maxSkipDepth bounds the nesting skipValue follows, and with it its stack.
const maxSkipDepth = 64

// skipValue checks the syntax of any JSON value at the cursor and steps
// past it.
func (p *Parser) skipValue(depth int) error {
	if p.i >= len(p.b) {
		return p.syntax("a value")
	}
	switch c := p.b[p.i]; c {
	case '"':
		_, err := p.str("")
		return err
	case '{', '[':
		if depth >= maxSkipDepth {
			return &tokenevent.FieldError{Reason: fmt.Sprintf("invalid JSON at byte %d: nested deeper than %d", p.i+1, maxSkipDepth)}
		}
		p.i++
		if c == '{' {
			for first := true; ; first = false {
				_, done, err := p.member(first, "")
				if err != nil || done {
					return err
				}
				if err := p.skipValue(depth + 1); err != nil {
					return err
				}
			}
		}
		for first := true; ; first = false {
			if done, err := p.next(first, ']'); done || err != nil {
				return err
			}
			if err := p.skipValue(depth + 1); err != nil {
				return err
			}
		}
	case 't', 'f', 'n':
		for _, lit := range [...]string{"true", "false", "null"} {
			if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit {
				p.i += len(lit)
				return nil
			}
		}
		return p.syntax("a value")
	default:
		return p.number()
	}
}

// number checks the syntax of a JSON number at the cursor and steps past
// it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *Parser) number() error {
	b, i := p.b, p.i
	digits := func() int {
		start := i
		for i < len(b) && b[i]-'0' <= 9 {
			i++
		}
		return i - start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch n := digits(); {
	case n == 0:
		p.i = i
		return p.syntax("a value")
	case n > 1 && b[i-n] == '0':
		return &tokenevent.FieldError{Reason: fmt.Sprintf("invalid JSON at byte %d: number with a leading zero", i-n+1)}
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			p.i = i
			return p.syntax("a digit")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			p.i = i
			return p.syntax("a digit")
		}
	}
	p.i = i
	return nil
}

func (p *Parser) null() bool { return p.literal("null") }

// literal steps past lit, a JSON literal, if the cursor is at it.
func (p *Parser) literal(lit string) bool {
	if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit && (p.i+len(lit) == len(p.b) || isDelim(p.b[p.i+len(lit)])) {
		p.i += len(lit)
		return true
	}
	return false
}

// plainByte marks the bytes a string may hold without a closer look: printable
// ASCII other than '"' and '\\'.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str parses a JSON string. The result aliases the line when the string has
// no escapes, or the parser's scratch buffer when it has; either way it is
// valid only until the next call. field names the field for errors; empty
// means an object key is being read.
func (p *Parser) str(field string) ([]byte, error) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		if field == "" {
			return nil, p.syntax("a string key")
		}
		return nil, &tokenevent.FieldError{Field: field, Reason: "want a string"}
	}
	p.i++
	start := p.i
	b := p.b
	i := plainEnd(b, p.i)
	ascii := true
	for ; i < len(b); i++ {
		c := b[i]
		switch {
		case plainByte[c]:
		case c == '"':
			p.i = i + 1
			s := b[start:i]
			if !ascii && !utf8.Valid(s) {
				return nil, &tokenevent.FieldError{Field: field, Reason: "invalid UTF-8"}
			}
			return s, nil
		case c == '\\':
			p.i = i
			return p.strEscaped(field, start)
		case c < 0x20:
			return nil, &tokenevent.FieldError{Field: field, Reason: "control character in string"}
		default:
			ascii = false
		}
	}
	p.i = i
	return nil, &tokenevent.FieldError{Field: field, Reason: "unterminated string"}
}

// strEscaped finishes a string that contains escapes, decoding it into scratch.
func (p *Parser) strEscaped(field string, start int) ([]byte, error) {
	out := append(p.scratch[:0], p.b[start:p.i]...) //nolint:gocritic // decodes into scratch; p.scratch = out keeps the grown buffer
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			p.scratch = out
			if !utf8.Valid(out) {
				return nil, &tokenevent.FieldError{Field: field, Reason: "invalid UTF-8"}
			}
			return out, nil
		case c < 0x20:
			return nil, &tokenevent.FieldError{Field: field, Reason: "control character in string"}
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		p.i++
		if p.i >= len(p.b) {
			break
		}
		e := p.b[p.i]
		p.i++
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return nil, &tokenevent.FieldError{Field: field, Reason: `invalid \u escape`}
			}
			if r >= 0xD800 && r < 0xDC00 {
				// A high surrogate must be followed by an escaped low one.
				if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
					p.i += 2
					lo, ok := p.hex4()
					if !ok || lo < 0xDC00 || lo >= 0xE000 {
						return nil, &tokenevent.FieldError{Field: field, Reason: `invalid \u escape`}
					}
					r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				} else {
					r = utf8.RuneError
				}
			} else if r >= 0xDC00 && r < 0xE000 {
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, &tokenevent.FieldError{Field: field, Reason: fmt.Sprintf("invalid escape \\%c", e)}
		}
	}
	p.scratch = out
	return nil, &tokenevent.FieldError{Field: field, Reason: "unterminated string"}
}

func (p *Parser) hex4() (rune, bool) {
	if len(p.b)-p.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		v := unhex(c)
		if v < 0 {
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	p.i += 4
	return r, true
}

// unhex is the value of hex digit c, -1 for any other byte.
func unhex(c byte) int { return int(hexValue[c]) }

// hexValue maps each byte to its hex digit's value, -1 for the others: a
// trace ID is 32 digits, and a lookup beats a comparison chain per digit.
var hexValue = func() (t [256]int8) {
	for c := range t {
		switch {
		case '0' <= c && c <= '9':
			t[c] = int8(c - '0')
		case 'a' <= c && c <= 'f':
			t[c] = int8(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			t[c] = int8(c - 'A' + 10)
		default:
			t[c] = -1
		}
	}
	return t
}()

// uint parses a non-negative JSON integer that fits an int64.
func (p *Parser) uint(field string) (uint64, error) {
	b, start := p.b, p.i
	end := min(len(b), start+20)
	var v uint64
	i := start
	// At most 20 digits are read; 19 cannot overflow a uint64, so the range
	// is checked once at the end.
	for ; i < end; i++ {
		c := b[i] - '0'
		if c > 9 {
			break
		}
		v = v*10 + uint64(c)
	}
	p.i = i
	n := i - start
	if n > 19 || v > math.MaxInt64 {
		return 0, &tokenevent.FieldError{Field: field, Reason: "integer out of range"}
	}
	if n == 0 || (n > 1 && b[start] == '0') || (i < len(b) && !isDelim(b[i])) {
		return 0, &tokenevent.FieldError{Field: field, Reason: "want a non-negative integer"}
	}
	return v, nil
}

func isDelim(c byte) bool { return c == ',' || c == '}' || isSpace(c) }

// hex parses a string of exactly 2*len(dst) hex digits into dst.
func (p *Parser) hex(field string, dst []byte) error {
	s, err := p.str(field)
	if err != nil {
		return err
	}
	want := 2 * len(dst)
	if len(s) != want {
		return &tokenevent.FieldError{Field: field, Reason: fmt.Sprintf("want %d hex digits, got %d", want, len(s))}
	}
	nonZero := false
	for i := range dst {
		hi, lo := unhex(s[2*i]), unhex(s[2*i+1])
		if hi < 0 || lo < 0 {
			return &tokenevent.FieldError{Field: field, Reason: fmt.Sprintf("want %d hex digits, got %q", want, tokenevent.Excerpt(s))}
		}
		dst[i] = byte(hi<<4 | lo)
		nonZero = nonZero || dst[i] != 0
	}
	if !nonZero {
		return &tokenevent.FieldError{Field: field, Reason: "must not be all zeros"}
	}
	return nil
}

// plainEnd is the index of the first byte of b from i on that plainByte
// does not mark (len(b) if none): eight bytes at a time while they are all
// plain, then byte by byte. A session ID or a model name is tens of bytes,
// and the byte-at-a-time scan was most of a token line's compact parse.
func plainEnd(b []byte, i int) int {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		quote, backslash := x^('"'*ones), x^('\\'*ones)
		// A byte of 0x80 or more, below 0x20, or a zero byte of quote or
		// backslash (the exact tests for "some byte is": no false alarm).
		if (x|((x-0x20*ones)&^x)|((quote-ones)&^quote)|((backslash-ones)&^backslash))&highs != 0 {
			break
		}
	}
	for i < len(b) && plainByte[b[i]] {
		i++
	}
	return i
}
