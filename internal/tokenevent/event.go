// Package tokenevent is the one home of the token event wire schema, version 1:
// the NDJSON form engine hooks send (parse.go, encode.go) and the log record form
// the collector carries between the token_stream receiver and the token_session
// processor (records.go). Both sides use this package, so the processor reads
// exactly what the receiver writes.
package tokenevent // import "github.com/otelcol-llm/otelcol-llm/internal/tokenevent"

import (
	"go.opentelemetry.io/collector/pdata/pcommon"
)

// Kind says which of the three wire events an Event is.
type Kind uint8

const (
	// KindStart opens a session: the request was received by the engine.
	KindStart Kind = 1 + iota
	// KindToken is one streamed chunk of Count tokens.
	KindToken
	// KindEnd closes a session.
	KindEnd
)

// String returns the wire name of the kind ("start", "token", "end").
func (k Kind) String() string {
	switch k {
	case KindStart:
		return "start"
	case KindToken:
		return "token"
	case KindEnd:
		return "end"
	}
	return "unknown"
}

// Operation values a start event may carry (GenAI semconv gen_ai.operation.name).
const (
	OperationChat           = "chat"
	OperationTextCompletion = "text_completion"
)

// Attribute is one entry of a start event's free-form string attributes.
type Attribute struct {
	Key   string
	Value string
}

// Event is one token event. Which fields are meaningful depends on Kind;
// integer fields that are optional hold -1 when absent.
type Event struct {
	Kind         Kind
	SessionID    string
	TimeUnixNano uint64

	// Start only.
	TraceID      pcommon.TraceID
	SpanID       pcommon.SpanID
	ParentSpanID pcommon.SpanID
	Model        string
	Operation    string
	PromptTokens int64
	Engine       string
	// Attributes is owned by whoever filled the Event (a Parser reuses it
	// between calls); copy it to keep it.
	Attributes []Attribute

	// Token only: the number of tokens in this chunk, at least 1.
	Count int64

	// End only.
	CompletionTokens int64
	FinishReason     string
	Error            string
}

// Reset clears ev for reuse, keeping the capacity of Attributes.
func (ev *Event) Reset() {
	attrs := ev.Attributes[:0]
	*ev = Event{PromptTokens: -1, Count: 1, CompletionTokens: -1, Attributes: attrs}
}
