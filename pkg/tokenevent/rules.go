// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenevent

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// The rules every token event is held to, whatever form it arrives in: the
// Parser applies them to wire lines, Event.Validate to events built in
// memory (pkg/tokenhook checks what an engine hands it with them). Each
// returns nil or a *FieldError naming the wire field.

// CheckSessionID checks a session_id: not empty, and at most limit bytes
// as the receiver decodes it (limit <= 0: DefaultMaxSessionIDBytes). An
// invalid UTF-8 byte counts as the three bytes of the U+FFFD that
// AppendJSON writes for it.
func CheckSessionID[S ~string | ~[]byte](id S, limit int) *FieldError {
	if limit <= 0 {
		limit = DefaultMaxSessionIDBytes
	}
	return checkID("session_id", id, limit)
}

// MaxEngineRequestIDBytes bounds a share's engine_request_id: the value of
// the start attribute it is joined by, which is cut to MaxValueBytes, so a
// longer one could never be joined.
const MaxEngineRequestIDBytes = MaxValueBytes

// CheckEngineRequestID checks a share's engine_request_id: not empty, and
// at most MaxEngineRequestIDBytes as the receiver decodes it (see
// CheckSessionID).
func CheckEngineRequestID[S ~string | ~[]byte](id S) *FieldError {
	return checkID("engine_request_id", id, MaxEngineRequestIDBytes)
}

// checkID checks the id of field: not empty, at most limit bytes decoded.
func checkID[S ~string | ~[]byte](field string, id S, limit int) *FieldError {
	if len(id) == 0 {
		return &FieldError{Field: field, Reason: "must not be empty"}
	}
	n := len(id)
	// Decoding at most triples a length, so short IDs need no closer look.
	if n > limit/3 {
		n = decodedLen(id)
	}
	if n > limit {
		return &FieldError{Field: field, Reason: fmt.Sprintf("%d bytes, limit is %d", n, limit)}
	}
	return nil
}

// decodedLen is the length of s once AppendJSON has replaced each invalid
// UTF-8 byte by U+FFFD and the parser has decoded the line.
func decodedLen[S ~string | ~[]byte](s S) int {
	n := len(s)
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		if r == utf8.RuneError && size == 1 {
			n += 2
		}
		i += size
	}
	return n
}

// asDecoded is s as the receiver decodes it once AppendJSON has written it:
// each invalid UTF-8 byte replaced by U+FFFD. Valid s (every key the
// parser hands over, nearly every one a client sends) is returned as it is.
func asDecoded(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// CheckTime checks a time_unix_nano: after the epoch and within an int64.
func CheckTime(t uint64) *FieldError {
	if t == 0 {
		return &FieldError{Field: "time_unix_nano", Reason: "must be greater than 0"}
	}
	if t > math.MaxInt64 {
		return &FieldError{Field: "time_unix_nano", Reason: "integer out of range"}
	}
	return nil
}

// MaxCount is the most tokens one token event may carry. An engine
// streams a few tokens per chunk (a non-streamed response is one event for
// all of its tokens); a count beyond this is a broken client, and one count
// of 10^12 would outweigh every other gap in the histograms for good.
const MaxCount = 1 << 16

// MaxTraceStateBytes bounds a start event's tracestate: the 512 characters
// W3C Trace Context asks every vendor to propagate.
const MaxTraceStateBytes = 512

// CheckCount checks the count of a token event: 1 to MaxCount.
func CheckCount(n int64) *FieldError {
	if n < 1 {
		return &FieldError{Field: "count", Reason: "must be at least 1"}
	}
	if n > MaxCount {
		return &FieldError{Field: "count", Reason: fmt.Sprintf("at most %d, got %d", MaxCount, n)}
	}
	return nil
}

// MaxMigrations is the most moves an end event may report: a request
// moved more often is not being healed (the proxy moves one at most 8
// times).
const MaxMigrations = 64

// CheckMigrations checks the migrations of an end event: 0 to
// MaxMigrations.
func CheckMigrations(n int64) *FieldError {
	if n < 0 {
		return &FieldError{Field: "migrations", Reason: "must not be negative"}
	}
	if n > MaxMigrations {
		return &FieldError{Field: "migrations", Reason: fmt.Sprintf("at most %d, got %d", MaxMigrations, n)}
	}
	return nil
}

// CheckCarried checks the count of a move event, the tokens carried to
// the continuation: not negative (the wire's integers are within an int64).
func CheckCarried(n int64) *FieldError {
	if n < 0 {
		return &FieldError{Field: "count", Reason: fmt.Sprintf("must not be negative, got %d", n)}
	}
	return nil
}

// CheckSeq checks the seq of a token event that has one: within an int64,
// as the wire's integers are.
func CheckSeq(n uint64) *FieldError {
	if n > math.MaxInt64 {
		return &FieldError{Field: "seq", Reason: "integer out of range"}
	}
	return nil
}

// CheckTraceState checks a tracestate: at most MaxTraceStateBytes of
// printable ASCII, as W3C Trace Context allows. Its entries are read by
// token_session, which ignores what it cannot parse.
func CheckTraceState[S ~string | ~[]byte](ts S) *FieldError {
	if len(ts) > MaxTraceStateBytes {
		return &FieldError{Field: "tracestate", Reason: fmt.Sprintf("%d bytes, limit is %d", len(ts), MaxTraceStateBytes)}
	}
	for i := 0; i < len(ts); i++ {
		if c := ts[i]; c < 0x20 || c > 0x7e {
			return &FieldError{Field: "tracestate", Reason: fmt.Sprintf("byte %d is not printable ASCII", i+1)}
		}
	}
	return nil
}

// CheckTokens checks a token total, prompt_tokens or completion_tokens
// (field), that is present: not negative.
func CheckTokens(field string, n int64) *FieldError {
	if n < 0 {
		return &FieldError{Field: field, Reason: fmt.Sprintf("must not be negative, got %d", n)}
	}
	return nil
}

// CheckOperation checks an operation and returns it as one of the
// Operation constants.
func CheckOperation[S ~string | ~[]byte](op S) (string, *FieldError) {
	switch string(op) {
	case OperationChat:
		return OperationChat, nil
	case OperationTextCompletion:
		return OperationTextCompletion, nil
	}
	return "", &FieldError{Field: "operation", Reason: fmt.Sprintf("want chat or text_completion, got %q", Excerpt([]byte(op)))}
}

// CheckAttribute checks that an attribute with key may join attrs, a start
// event's attributes so far: the key is not empty, at most
// MaxAttributeKeyBytes and not in attrs, and attrs holds fewer than limit
// entries (limit <= 0: DefaultMaxAttributes).
func CheckAttribute(attrs []Attribute, key string, limit int) *FieldError {
	if key == "" {
		return &FieldError{Field: "attributes", Reason: "empty key"}
	}
	// As the receiver decodes it (see CheckSessionID).
	if n := len(key); n > MaxAttributeKeyBytes/3 {
		if n = decodedLen(key); n > MaxAttributeKeyBytes {
			return &FieldError{Field: "attributes", Reason: fmt.Sprintf("key %q: %d bytes, limit is %d", Excerpt([]byte(key)), n, MaxAttributeKeyBytes)}
		}
	}
	// Keys compare as the receiver decodes them: two keys that differ only
	// in invalid UTF-8 bytes arrive as the same key (each such byte becomes
	// U+FFFD), which the parser refuses as a duplicate.
	decoded := asDecoded(key)
	for _, a := range attrs {
		if a.Key == key || asDecoded(a.Key) == decoded {
			return &FieldError{Field: "attributes." + decoded, Reason: "duplicate key"}
		}
	}
	if limit <= 0 {
		limit = DefaultMaxAttributes
	}
	if len(attrs) >= limit {
		return &FieldError{Field: "attributes", Reason: fmt.Sprintf("more than %d entries", limit)}
	}
	return nil
}

// Validate checks ev against the rules and limits (zero: the defaults) the
// Parser applies to the line AppendJSON writes for it, but the line's
// length: an event Validate accepts encodes to a line the Parser accepts,
// and reads back with its values cut to their bounds (CutValues), which
// are no error.
// Fields the kind does not carry are ignored, as AppendJSON leaves them
// out; zero IDs and empty strings mean absent, as there. Unlike the wire,
// which has no way to write them, a token total below -1 (absent) is an
// error rather than absent.
func (ev *Event) Validate(limits Limits) error {
	switch ev.Kind {
	case KindStart, KindToken, KindEnd, KindMove:
		if err := CheckSessionID(ev.SessionID, limits.MaxSessionIDBytes); err != nil {
			return err
		}
	case KindShare:
		if err := CheckEngineRequestID(ev.EngineRequestID); err != nil {
			return err
		}
	default:
		return &FieldError{Field: "event", Reason: fmt.Sprintf("want start, token, end, share or move, got kind %d", ev.Kind)}
	}
	if err := CheckTime(ev.TimeUnixNano); err != nil {
		return err
	}
	switch ev.Kind {
	case KindStart:
		if ev.Operation != "" {
			if _, err := CheckOperation(ev.Operation); err != nil {
				return err
			}
		}
		if ev.PromptTokens != -1 {
			if err := CheckTokens("prompt_tokens", ev.PromptTokens); err != nil {
				return err
			}
		}
		for i, a := range ev.Attributes {
			if err := CheckAttribute(ev.Attributes[:i], a.Key, limits.MaxAttributes); err != nil {
				return err
			}
		}
		if err := CheckTraceState(ev.TraceState); err != nil {
			return err
		}
	case KindToken:
		if err := CheckCount(ev.Count); err != nil {
			return err
		}
		if ev.HasSeq {
			if err := CheckSeq(ev.Seq); err != nil {
				return err
			}
		}
	case KindEnd:
		if ev.CompletionTokens != -1 {
			if err := CheckTokens("completion_tokens", ev.CompletionTokens); err != nil {
				return err
			}
		}
		for _, t := range [...]struct {
			field string
			ns    int64
		}{{"queue_time_ns", ev.QueueTimeNs}, {"prefill_time_ns", ev.PrefillTimeNs}, {"decode_time_ns", ev.DecodeTimeNs}} {
			if ev.HasTiming() && t.ns != -1 {
				if err := CheckTokens(t.field, t.ns); err != nil {
					return err
				}
			}
		}
		if err := CheckMigrations(ev.Migrations); err != nil {
			return err
		}
		return checkEngineShare(ev)
	case KindShare:
		return checkEngineShare(ev)
	case KindMove:
		if err := CheckCarried(ev.Count); err != nil {
			return err
		}
	}
	return nil
}

// checkEngineShare checks the engine's share fields of an end or share.
func checkEngineShare(ev *Event) error {
	for _, t := range [...]struct {
		field string
		v     int64
		has   bool
	}{{"engine_time_prefill_ns", ev.EngineTimePrefillNs, ev.HasEngineTime}, {"engine_time_decode_ns", ev.EngineTimeDecodeNs, ev.HasEngineTime}, {"energy_mj", ev.EnergyMilliJ, ev.HasEnergy}} {
		if t.has {
			if err := CheckTokens(t.field, t.v); err != nil {
				return err
			}
		}
	}
	return nil
}
