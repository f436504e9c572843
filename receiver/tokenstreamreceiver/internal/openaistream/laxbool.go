// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package openaistream // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"

import (
	"strconv"
	"strings"
)

// LaxBool reads a JSON value as vLLM's request models read their bool
// fields ("stream": Optional[bool]): pydantic's lax mode. v is the value's
// JSON text (true, false, null, a number), or, when isString, the string's
// decoded content. ok is false for a value pydantic refuses (vLLM answers
// 400) or null (None: not streamed).
//
// pydantic-core takes the JSON literals; the strings "0" and "1" and,
// ignoring ASCII case, "f", "n", "no", "off", "false" and "t", "y", "on",
// "yes", "true" (nothing trimmed); and a number that is a whole 0 or 1 (1,
// 0, 1.0, 1e0, -0). FastAPI hands it the body as json.loads made it, so a
// number is Python's int or float: float parsing rounds as Python's does.
func LaxBool(v string, isString bool) (value, ok bool) {
	if isString {
		switch v {
		case "0":
			return false, true
		case "1":
			return true, true
		}
		for _, f := range [...]string{"f", "n", "no", "off", "false"} {
			if strings.EqualFold(v, f) && isASCII(v) {
				return false, true
			}
		}
		for _, t := range [...]string{"t", "y", "on", "yes", "true"} {
			if strings.EqualFold(v, t) && isASCII(v) {
				return true, true
			}
		}
		return false, false
	}
	switch v {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	if !isJSONNumber(v) {
		return false, false // null, or not JSON
	}
	f, err := strconv.ParseFloat(v, 64)
	switch {
	case err != nil: // beyond float64: Python's inf, not a whole number
		return false, false
	case f == 0:
		return false, true
	case f == 1:
		return true, true
	}
	return false, false
}

// isASCII reports whether s is ASCII: EqualFold folds Unicode (the Kelvin
// sign K folds to k), pydantic's eq_ignore_ascii_case only ASCII.
func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// isJSONNumber reports whether s is a number as JSON writes one:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func isJSONNumber(s string) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}
