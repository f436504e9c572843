// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package openaistream

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The values vLLM's request models (pydantic, lax mode) take for a bool,
// and some they refuse.
func TestLaxBool(t *testing.T) {
	type want struct{ value, ok bool }
	yes, no, refused := want{true, true}, want{false, true}, want{false, false}
	for _, tt := range []struct {
		v        string
		isString bool
		want     want
	}{
		{"true", false, yes},
		{"false", false, no},
		{"null", false, refused},
		{"1", false, yes},
		{"0", false, no},
		{"-0", false, no},
		{"1.0", false, yes},
		{"1e0", false, yes},
		{"10E-1", false, yes},
		{"0.0", false, no},
		{"-0.0", false, no},
		{"0e5", false, no},
		{"2", false, refused},
		{"-1", false, refused},
		{"0.5", false, refused},
		{"1e400", false, refused},
		{"01", false, refused},
		{"1.", false, refused},
		{"+1", false, refused},
		{"0x1", false, refused},
		{"True", false, refused},
		{"", false, refused},

		{"true", true, yes},
		{"True", true, yes},
		{"TRUE", true, yes},
		{"tRuE", true, yes},
		{"1", true, yes},
		{"yes", true, yes},
		{"Yes", true, yes},
		{"on", true, yes},
		{"ON", true, yes},
		{"t", true, yes},
		{"T", true, yes},
		{"y", true, yes},
		{"false", true, no},
		{"False", true, no},
		{"0", true, no},
		{"no", true, no},
		{"off", true, no},
		{"Off", true, no},
		{"f", true, no},
		{"n", true, no},
		{"N", true, no},
		{"", true, refused},
		{" true", true, refused},
		{"true ", true, refused},
		{"1.0", true, refused},
		{"01", true, refused},
		{"-0", true, refused},
		{"2", true, refused},
		{"yeſ", true, refused}, // U+017F folds to s in Unicode, not in ASCII
		{"maybe", true, refused},
		{"null", true, refused},
	} {
		value, ok := LaxBool(tt.v, tt.isString)
		assert.Equal(t, tt.want, want{value, ok}, "%q (string: %v)", tt.v, tt.isString)
	}
}

// LaxBool never panics, takes no number JSON would refuse, and takes a
// value for true only where it also takes it for a bool.
func FuzzLaxBool(f *testing.F) {
	for _, s := range []string{"true", "1", "1.0e0", "-0", "yes", "OFF", "0x1", "1e400", "\xff"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, v string, isString bool) {
		value, ok := LaxBool(v, isString)
		if value && !ok {
			t.Fatalf("%q: true but not ok", v)
		}
		if ok && !isString && !json.Valid([]byte(v)) {
			t.Fatalf("%q: taken, but not JSON", v)
		}
	})
}
