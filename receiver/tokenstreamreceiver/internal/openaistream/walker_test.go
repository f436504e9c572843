// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package openaistream

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// nested is depth arrays, one inside the other, around 1.
func nested(depth int) string {
	return strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth)
}

func TestJSONWalkerDepthLimit(t *testing.T) {
	for _, tc := range []struct {
		depth int
		ok    bool
	}{{1, true}, {maxJSONDepth, true}, {maxJSONDepth + 1, false}} {
		s := jsonWalker{b: []byte(nested(tc.depth))}
		assert.Equal(t, tc.ok, s.skip() && s.end(), "depth %d", tc.depth)
		assert.Zero(t, s.depth, "depth %d: every level left", tc.depth)
	}
	// Objects count as arrays do, and the limit applies across them.
	obj := strings.Repeat(`{"a":`, maxJSONDepth) + "1" + strings.Repeat("}", maxJSONDepth)
	s := jsonWalker{b: []byte(obj)}
	assert.True(t, s.skip() && s.end())
	s = jsonWalker{b: []byte("[" + obj + "]")}
	assert.False(t, s.skip())
}

// TestInspectChunkDeepNesting: a hostile chunk of a megabyte of nesting is
// reported as no chunk, with a stack that stays small (before the limit,
// the walk recursed once per level: this test's 16 MiB stack bound made
// the process fail with "goroutine stack exceeds limit").
func TestInspectChunkDeepNesting(t *testing.T) {
	defer debug.SetMaxStack(debug.SetMaxStack(16 << 20))
	for _, data := range []string{
		`{"choices":` + strings.Repeat("[", 1<<20),
		`{"usage":{"x":` + nested(1<<19) + `}}`,
		`{"error":` + strings.Repeat(`{"a":`, 1<<18) + `1` + strings.Repeat("}", 1<<18) + `}`,
	} {
		f, ok := InspectChunk([]byte(data))
		assert.False(t, ok)
		assert.Equal(t, ChunkFacts{CompletionTokens: -1, PromptTokens: -1, Timing: noTiming}, f)
	}
}

// FuzzJSONWalkerSkip: skip never panics or recurses without bound, and
// leaves the depth where it found it.
func FuzzJSONWalkerSkip(f *testing.F) {
	for _, seed := range []string{
		`{"a":[1,2,{"b":null}],"c":"d"}`, nested(maxJSONDepth), nested(maxJSONDepth + 1),
		strings.Repeat("[", 10000), strings.Repeat(`{"a":`, 1000), `[{"a":[{"a":[`, "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := jsonWalker{b: b}
		s.skip()
		if s.depth != 0 {
			t.Fatalf("depth %d after skip", s.depth)
		}
		if s.i > len(b)+1 {
			t.Fatalf("read to %d past %d bytes", s.i, len(b))
		}
	})
}

// nestingDepth is the deepest nesting of objects and arrays in JSON text,
// strings skipped: the reference readers' stand-in for the walker's limit.
func nestingDepth(b []byte) int {
	depth, deepest, inString, esc := 0, 0, false, false
	for _, c := range b {
		switch {
		case esc:
			esc = false
		case inString && c == '\\':
			esc = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}
