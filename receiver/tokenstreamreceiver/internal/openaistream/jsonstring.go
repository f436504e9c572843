// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package openaistream // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"

import (
	"unicode/utf16"
	"unicode/utf8"
)

// DecodeString decodes the raw bytes between a JSON string's quotes into
// valid UTF-8 of at most limit bytes, for telemetry: escapes are decoded,
// invalid bytes (and lone surrogates) become U+FFFD, and the result is cut
// on a rune boundary. An escape cut short at the end of raw is dropped. A
// capture bounded at 6×limit raw bytes loses nothing: that many raw bytes
// decode to at least limit bytes.
func DecodeString(raw []byte, limit int) string {
	out := make([]byte, 0, min(len(raw), limit))
	add := func(r rune) bool {
		if len(out)+utf8.RuneLen(r) > limit {
			return false
		}
		out = utf8.AppendRune(out, r)
		return true
	}
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			r, n := utf8.DecodeRune(raw[i:])
			if !add(r) {
				break
			}
			i += max(n, 1)
			continue
		}
		if i+1 >= len(raw) {
			break
		}
		var r rune
		switch raw[i+1] {
		case 'u':
			v, ok := hex4(raw, i+2)
			if !ok {
				return string(out) // cut or malformed: what came before
			}
			r, i = rune(v), i+6
			if utf16.IsSurrogate(r) {
				if lo, ok := hex4(raw, i+2); ok && i+1 < len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if pair := utf16.DecodeRune(r, rune(lo)); pair != utf8.RuneError {
						r, i = pair, i+6
					} else {
						r = utf8.RuneError
					}
				} else {
					r = utf8.RuneError
				}
			}
		case 'b':
			r, i = '\b', i+2
		case 'f':
			r, i = '\f', i+2
		case 'n':
			r, i = '\n', i+2
		case 'r':
			r, i = '\r', i+2
		case 't':
			r, i = '\t', i+2
		default: // '"', '\\', '/', or invalid: the character itself
			r, i = rune(raw[i+1]), i+2
			if r >= utf8.RuneSelf {
				r = utf8.RuneError
			}
		}
		if !add(r) {
			break
		}
	}
	return string(out)
}

func hex4(b []byte, at int) (uint16, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var v uint16
	for _, c := range b[at : at+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint16(c)
	}
	return v, true
}
