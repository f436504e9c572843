// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package openaistream

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestDecodeString(t *testing.T) {
	for _, tt := range []struct{ name, raw, want string }{
		{"plain", `meta-llama/Llama-3.1-8B-Instruct`, "meta-llama/Llama-3.1-8B-Instruct"},
		{"escapes", `a\"b\\c\/d\n\u00e9\ud83d\ude00`, "a\"b\\c/d\né\U0001F600"},
		{"lone surrogate", `x\ud800y`, "x\uFFFDy"},
		{"invalid UTF-8", "a\xffb\xc3", "a\uFFFDb\uFFFD"},
		{"cut escape", `ab\u00`, "ab"},
		{"cut backslash", `ab\`, "ab"},
		{"cut on a rune boundary", strings.Repeat("é", 5), strings.Repeat("é", 3)}, // limit 7: 3 runes of 2 bytes
	} {
		t.Run(tt.name, func(t *testing.T) {
			limit := 64
			if tt.name == "cut on a rune boundary" {
				limit = 7
			}
			got := DecodeString([]byte(tt.raw), limit)
			assert.Equal(t, tt.want, got)
			assert.True(t, utf8.ValidString(got))
		})
	}
}

// FuzzDecodeString holds DecodeString to encoding/json on valid strings,
// and to valid UTF-8 within the limit on any input.
func FuzzDecodeString(f *testing.F) {
	f.Add([]byte(`a\"b\u00e9\ud83d\ude00`), 8)
	f.Add([]byte("\xff\xfe"), 3)
	f.Fuzz(func(t *testing.T, raw []byte, limit int) {
		limit = 1 + int(uint(limit)%300)
		got := DecodeString(raw, limit)
		if !utf8.ValidString(got) || len(got) > limit {
			t.Fatalf("%q (limit %d): %q", raw, limit, got)
		}
		var want string
		if json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &want) == nil && utf8.Valid(raw) {
			for len(want) > limit {
				_, n := utf8.DecodeLastRuneInString(want)
				want = want[:len(want)-n]
			}
			if got != want {
				t.Fatalf("%q (limit %d): %q, encoding/json %q", raw, limit, got, want)
			}
		}
	})
}

func BenchmarkDecodeString(b *testing.B) {
	raw := []byte("meta-llama/Llama-3.1-8B-Instruct")
	b.ReportAllocs()
	for b.Loop() {
		_ = DecodeString(raw, 256)
	}
}
