// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package openaistream // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"

import "bytes"

// maxJSONDepth bounds the nesting of objects and arrays a jsonWalker
// enters: deeper input is reported malformed, so that a hostile payload
// (a megabyte of '[') cannot grow the goroutine's stack by hundreds of
// megabytes or overflow it. No chunk or request of an OpenAI-compatible
// server nests anywhere near as deep (encoding/json-like decoders stop at
// similar depths; Go's encoding/json at 10000, protobuf at 100).
const maxJSONDepth = 64

// jsonWalker walks JSON text without building values. Its methods report
// false on malformed input, and on input nested deeper than maxJSONDepth.
type jsonWalker struct {
	b     []byte
	i     int
	depth int // objects and arrays entered and not yet left
}

func (s *jsonWalker) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonWalker) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// end reports whether only whitespace is left.
func (s *jsonWalker) end() bool {
	s.ws()
	return s.i == len(s.b)
}

func (s *jsonWalker) null() bool {
	if s.peek() == 'n' && bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// offset is where sub, a slice of s.b (a string's contents as str returns
// them), begins in s.b.
func (s *jsonWalker) offset(sub []byte) int { return cap(s.b) - cap(sub) }

// str reads a string and returns its raw contents (escapes not decoded), a
// slice of s.b.
func (s *jsonWalker) str() ([]byte, bool) {
	if s.peek() != '"' {
		return nil, false
	}
	s.i++
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			return v, true
		case c == '\\':
			s.i += 2
		case c < 0x20:
			return nil, false
		default:
			s.i++
		}
	}
	return nil, false
}

func (s *jsonWalker) number() ([]byte, bool) {
	s.ws()
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			s.i++
			continue
		}
		break
	}
	return s.b[start:s.i], s.i > start
}

// object walks an object, calling member for each key; member must read
// the value.
func (s *jsonWalker) object(member func(key []byte) bool) bool {
	return s.items('{', '}', nil, member)
}

// array walks an array, calling elem for each element; elem must read it.
func (s *jsonWalker) array(elem func() bool) bool { return s.items('[', ']', elem, nil) }

// items is the one loop of objects and arrays: it walks the
// comma-separated items between opening and closing, reading each with
// member (an object's, after its key) or elem (an array's).
func (s *jsonWalker) items(opening, closing byte, elem func() bool, member func(key []byte) bool) bool {
	if s.peek() != opening {
		return false
	}
	if s.depth >= maxJSONDepth {
		return false
	}
	s.depth++
	ok := s.itemsIn(closing, elem, member)
	s.depth--
	return ok
}

// itemsIn walks the items after the opening byte, up to and including the
// closing one.
func (s *jsonWalker) itemsIn(closing byte, elem func() bool, member func(key []byte) bool) bool {
	s.i++
	if s.peek() == closing {
		s.i++
		return true
	}
	for {
		if member != nil {
			key, ok := s.str()
			if !ok || s.peek() != ':' {
				return false
			}
			s.i++
			if !member(key) {
				return false
			}
		} else if !elem() {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case closing:
			s.i++
			return true
		default:
			return false
		}
	}
}

// skip reads any value.
func (s *jsonWalker) skip() bool {
	switch c := s.peek(); {
	case c == '{':
		return s.object(func([]byte) bool { return s.skip() })
	case c == '[':
		return s.array(s.skip)
	case c == '"':
		_, ok := s.str()
		return ok
	case c == 't' && bytes.HasPrefix(s.b[s.i:], []byte("true")):
		s.i += 4
		return true
	case c == 'f' && bytes.HasPrefix(s.b[s.i:], []byte("false")):
		s.i += 5
		return true
	case c == 'n':
		return s.null()
	default:
		_, ok := s.number()
		return ok
	}
}
