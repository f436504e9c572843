// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package tokenevent is the token event model and wire schema, version 1,
// that engines program against: the Event, its NDJSON encoder (AppendJSON),
// and the rules and limits every event is held to (Validate, the Check
// functions, Limits). It needs nothing of the collector or pdata, so that
// pkg/tokenhook and an engine's own code can use it without pulling either
// into their build. The collector reads the wire form with its own parser
// (internal/tokenparse, held to the same rules); the log record form it
// carries between token_stream and token_session is internal/tokenrecord.
package tokenevent // import "github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"

import "encoding/hex"

// Kind says which of the five wire events an Event is.
type Kind uint8

const (
	// KindStart opens a session: the request was received by the engine.
	KindStart Kind = 1 + iota
	// KindToken is one streamed chunk of Count tokens.
	KindToken
	// KindEnd closes a session.
	KindEnd
	// KindShare is a request's share of the engine's busy time, sent by
	// the engine's scheduler, another process than the one that sends the
	// request's session: it names the request by the engine's own id
	// (EngineRequestID), which the session's start names in its
	// AttrEngineRequestID attribute, and has no session ID.
	KindShare
	// KindMove is one move of a session's answer to another replica
	// mid-answer (the token_stream proxy's proxy::migrate): Engine is where
	// it went, Error the error type of the failure that moved it, Count the
	// tokens carried to the continuation.
	KindMove
)

// String returns the wire name of the kind ("start", "token", "end",
// "share", "move").
func (k Kind) String() string {
	switch k {
	case KindStart:
		return "start"
	case KindToken:
		return "token"
	case KindEnd:
		return "end"
	case KindShare:
		return "share"
	case KindMove:
		return "move"
	}
	return "unknown"
}

// AttrEngineRequestID is the start attribute that names the engine's own
// id of the request (vLLM's internal request id), the id its share event
// carries: token_session joins the two by it.
const AttrEngineRequestID = "llm.engine.request_id"

// Operation values a start event may carry (GenAI semconv gen_ai.operation.name).
const (
	OperationChat           = "chat"
	OperationTextCompletion = "text_completion"
)

// ErrorShutdown is the error an end event carries when its source stopped
// before the session ended (the proxy cut the stream at shutdown): the
// session ends as shutdown, as the sessions token_session still holds when
// it stops do.
const ErrorShutdown = "shutdown"

// TraceID and SpanID are W3C trace context IDs: the bytes of pdata's
// pcommon.TraceID and pcommon.SpanID (convert with a type conversion), kept
// here so that the event model, and pkg/tokenhook with it, needs no pdata.
type (
	TraceID [16]byte
	SpanID  [8]byte
)

// IsEmpty reports whether id is all zeros (no trace ID).
func (id TraceID) IsEmpty() bool { return id == TraceID{} }

// String returns id in lower-case hex, or "" when it is empty.
func (id TraceID) String() string {
	if id.IsEmpty() {
		return ""
	}
	return hex.EncodeToString(id[:])
}

// IsEmpty reports whether id is all zeros (no span ID).
func (id SpanID) IsEmpty() bool { return id == SpanID{} }

// String returns id in lower-case hex, or "" when it is empty.
func (id SpanID) String() string {
	if id.IsEmpty() {
		return ""
	}
	return hex.EncodeToString(id[:])
}

// Attribute is one entry of a start event's free-form string attributes.
type Attribute struct {
	Key   string
	Value string
}

// Event is one token event. Which fields are meaningful depends on Kind;
// integer fields that are optional hold -1 when absent.
type Event struct {
	Kind Kind
	// SessionID names the session; a share has none (EngineRequestID).
	SessionID    string
	TimeUnixNano uint64

	// Start only.
	TraceID      TraceID
	SpanID       SpanID
	ParentSpanID SpanID
	Model        string
	Operation    string
	PromptTokens int64
	// PromptBytes is the size of the request's prompt in bytes (0:
	// unknown), where its tokens are not known at the start: the proxy's
	// measure of the body, for the GPU time's estimate. Only in the
	// record form (llm.request.prompt_bytes); no wire field carries it.
	PromptBytes int64
	// Engine names the engine instance, on a start or a share; on a move,
	// the endpoint the answer moved to.
	Engine string
	// Attributes is owned by whoever filled the Event (a Parser reuses it
	// between calls); copy it to keep it.
	Attributes []Attribute
	// NoStream is set when the request asked for one whole response
	// (wire "stream": false): its session has no first token, TPOT or
	// gaps to measure. The zero Event, like the wire, is streamed.
	NoStream bool
	// TraceState is the caller's W3C tracestate, "" when none: its OTel
	// entry's explicit randomness (rv) and head-sampling threshold (th)
	// take part in the session's sampling (OTEP 235).
	TraceState string

	// Token: the number of tokens in this chunk, 1 to MaxCount. Move: the
	// tokens carried to the continuation, 0 or more.
	Count int64
	// Seq numbers a session's token events from the source that sends
	// them, so that a retried event is folded once; meaningful when HasSeq
	// (the zero Event has none).
	Seq    uint64
	HasSeq bool

	// End only, but Error: an end's error type, or a move's (the failure
	// that moved it).
	CompletionTokens int64
	FinishReason     string
	Error            string
	// ResponseModel is the model that answered (the chunks' "model"), ""
	// when not known.
	ResponseModel string
	// The engine's own split of the request's time, in ns: waiting in its
	// queue, in prefill (scheduled to first token), and in decode (first to
	// last token). Meaningful only when TimingSource is set (the zero Event
	// has none); then -1 for a part the engine did not give.
	QueueTimeNs, PrefillTimeNs, DecodeTimeNs int64
	// TimingSource says where the split came from: TimingHook (the hook's
	// end event), TimingResponse (vLLM's per-request metrics in its
	// response, read by the proxy) or TimingLlamaCpp (llama.cpp's timings in
	// its response, read by the proxy, the queue derived); "" without a
	// split.
	TimingSource string
	// End and share: the request's share of the engine's busy time, as
	// the engine computed it from its steps (each step's time split among
	// its requests by the tokens each computed in it), in ns, prefill and
	// decode: meaningful when HasEngineTime (a part not given is 0; a
	// share without either part is a share of 0). EnergyMilliJ is its
	// share of the GPU's energy in mJ, when HasEnergy.
	EngineTimePrefillNs, EngineTimeDecodeNs int64
	EnergyMilliJ                            int64
	HasEngineTime, HasEnergy                bool
	// Migrations is how often the answer's stream was moved to another
	// replica mid-answer (the proxy's proxy::migrate), 0 to
	// MaxMigrations; 0 (absent on the wire) when it never was.
	Migrations int64

	// Share only: the engine's own id of the request (see KindShare).
	EngineRequestID string
}

// Sources of an end event's engine timing.
const (
	TimingHook     = "hook"
	TimingResponse = "response"
	// TimingLlamaCpp: llama.cpp's "timings" give prefill (prompt_ms) and
	// decode (predicted_ms) but no queue; the proxy derives the queue from
	// its own wait for the first token, less the prefill.
	TimingLlamaCpp = "llamacpp_timings"
)

// HasTiming reports whether the end event carries the engine's timing.
func (ev *Event) HasTiming() bool { return ev.TimingSource != "" }

// Reset clears ev for reuse, keeping the capacity of Attributes.
func (ev *Event) Reset() {
	attrs := ev.Attributes[:0]
	*ev = Event{
		PromptTokens: -1, Count: 1, CompletionTokens: -1, QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1,
		Attributes: attrs,
	}
}
