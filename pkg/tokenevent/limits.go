// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenevent // import "github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"

import "unicode/utf8"

// Limits bound what one line may hold. Zero values mean the defaults.
type Limits struct {
	// MaxLineBytes is the longest line accepted, newline excluded.
	MaxLineBytes int
	// MaxSessionIDBytes is the longest session_id accepted.
	MaxSessionIDBytes int
	// MaxAttributes is the most entries a start event's attributes may hold.
	MaxAttributes int
}

// Default limits.
const (
	DefaultMaxLineBytes      = 16 << 10
	DefaultMaxSessionIDBytes = 256
	DefaultMaxAttributes     = 32
	// DefaultMaxLinesPerBatch is how many lines of one request body or
	// datagram the token_stream receiver reads by default (ParseBatch's
	// maxLines); the hook clients keep their batches within it.
	DefaultMaxLinesPerBatch = 10_000
)

// WithDefaults is l with each zero limit set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxLineBytes <= 0 {
		l.MaxLineBytes = DefaultMaxLineBytes
	}
	if l.MaxSessionIDBytes <= 0 {
		l.MaxSessionIDBytes = DefaultMaxSessionIDBytes
	}
	if l.MaxAttributes <= 0 {
		l.MaxAttributes = DefaultMaxAttributes
	}
	return l
}

// FieldError says why a line was rejected. Field is the JSON key at fault,
// or empty when the line is not a JSON object at all.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// Excerpt is input as a FieldError quotes it: its first 64 bytes and "…"
// when it is longer, so that a rejected line's error stays short whatever
// the line held. The rules here and the collector's parser quote alike.
func Excerpt(b []byte) string {
	const maxQuoted = 64
	if len(b) > maxQuoted {
		return string(b[:maxQuoted]) + "…"
	}
	return string(b)
}

// Bounds of the strings an event carries that become attribute values of
// the session's records, spans and metrics, and so parts of series keys
// and of the rows of the live view. They are not limits a line is rejected
// for: a longer value is cut to its bound on a UTF-8 rune boundary, by
// every source alike (the receiver's hook parser and its proxy, which
// cannot refuse the request it observes), so that one string makes one key
// whichever way it came and a session is never lost for a label's tail.
// Names are not cut: a session_id over its limit, or an attribute key over
// MaxAttributeKeyBytes, is an error, since two that differ beyond the
// bound would become one.
const (
	// MaxValueBytes bounds model, engine, response_model, finish_reason
	// and each attribute's value.
	MaxValueBytes = 256
	// MaxErrorTypeBytes bounds an end event's error (error.type): a class
	// of error, not its message.
	MaxErrorTypeBytes = 64
	// MaxAttributeKeyBytes bounds an attribute's key.
	MaxAttributeKeyBytes = 256
)

// CutValue returns s cut to at most limit bytes on a rune boundary, and
// whether it was cut.
func CutValue[S ~string | ~[]byte](s S, limit int) (S, bool) {
	if len(s) <= limit {
		return s, false
	}
	i := limit
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i], true
}

// CutValues cuts the values of ev that are over their bound (MaxValueBytes,
// MaxErrorTypeBytes) and returns how many it cut. Fields the kind does not
// carry are left alone, as AppendJSON leaves them out.
func (ev *Event) CutValues() int {
	n := 0
	cut := func(s *string, limit int) {
		var was bool
		if *s, was = CutValue(*s, limit); was {
			n++
		}
	}
	switch ev.Kind {
	case KindStart:
		cut(&ev.Model, MaxValueBytes)
		cut(&ev.Engine, MaxValueBytes)
		for i := range ev.Attributes {
			cut(&ev.Attributes[i].Value, MaxValueBytes)
		}
	case KindShare:
		cut(&ev.Engine, MaxValueBytes)
	case KindMove:
		cut(&ev.Engine, MaxValueBytes)
		cut(&ev.Error, MaxErrorTypeBytes)
	case KindEnd:
		cut(&ev.ResponseModel, MaxValueBytes)
		cut(&ev.FinishReason, MaxValueBytes)
		cut(&ev.Error, MaxErrorTypeBytes)
	}
	return n
}
