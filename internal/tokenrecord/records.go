// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package tokenrecord is the log record form of token events: what the
// token_stream receiver writes (RecordWriter) and token_session reads back
// (ReadRecord), so both sides share one definition of the attributes.
package tokenrecord // import "github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"

import "github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"

// Event names of the log records that carry token events in the collector.
const (
	EventNameStart = "llm.session.start"
	EventNameToken = "llm.token"
	EventNameEnd   = "llm.session.end"
	// EventNameShare is a request's share of the engine's busy time, sent
	// by the engine's scheduler: keyed by AttrEngineRequestID, it has no
	// llm.session.id.
	EventNameShare = "llm.session.share"
	// EventNameMove is one move of a session's answer to another replica
	// (the proxy's proxy::migrate), in the session's order.
	EventNameMove = "llm.session.move"
)

// Event names of the log records token_session emits: a session's summary
// and a stall alert. They are named here, beside the records it reads, for
// what reads its output (engine_health, the demo, the bench).
const (
	EventNameSummary = "llm.session.summary"
	EventNameStall   = "llm.session.stall"
)

// Attribute keys of the log record form. GenAI semantic convention names are
// used where one exists.
const (
	AttrSessionID         = "llm.session.id"
	AttrOperation         = "gen_ai.operation.name"
	AttrRequestModel      = "gen_ai.request.model"
	AttrInputTokens       = "gen_ai.usage.input_tokens"
	AttrPromptBytes       = "llm.request.prompt_bytes"
	AttrEngine            = "llm.engine"
	AttrParentSpanID      = "llm.session.parent_span_id"
	AttrSessionAttributes = "llm.session.attributes"
	AttrOutputTokens      = "gen_ai.usage.output_tokens"
	AttrFinishReasons     = "gen_ai.response.finish_reasons"
	AttrErrorType         = "error.type"
	// AttrRequestStream is false on the start of a request that was not
	// streamed; absent means streamed.
	AttrRequestStream = "gen_ai.request.stream"
	// AttrTraceState is the caller's W3C tracestate, on a start.
	AttrTraceState = "llm.session.tracestate"
	// AttrTokenSeq is the seq of a record holding one token event.
	AttrTokenSeq = "llm.token.seq"
	// AttrResponseModel is the model that answered, on an end.
	AttrResponseModel = "gen_ai.response.model"
	// The engine's timing on an end, in ns, and where it came from.
	AttrQueueTimeNs   = "llm.session.queue_time_ns"
	AttrPrefillTimeNs = "llm.session.prefill_time_ns"
	AttrDecodeTimeNs  = "llm.session.decode_time_ns"
	AttrTimingSource  = "llm.session.timing_source"
	// The engine's own share of its busy time (ns) and energy (mJ), on an
	// end.
	AttrEngineTimePrefillNs = "llm.session.engine_time_prefill_ns"
	AttrEngineTimeDecodeNs  = "llm.session.engine_time_decode_ns"
	AttrEnergyMilliJ        = "llm.session.energy_mj"
	// AttrMigrations is how often the answer's stream was moved to another
	// replica, on an end (absent: never).
	AttrMigrations = "llm.session.migrations"
	// A move's where (the endpoint the answer moved to, as the proxy names
	// engines), why (the error type of the failure that moved it) and the
	// tokens carried to the continuation; token_session's span event of
	// the move carries them under the same keys.
	AttrMigrationTo            = "llm.migration.to"
	AttrMigrationReason        = "llm.migration.reason"
	AttrMigrationTokensCarried = "llm.migration.tokens_carried"
	// AttrEngineRequestID is the engine's own id of the request, on a
	// share (the start names it among its attributes, under the same key).
	AttrEngineRequestID = tokenevent.AttrEngineRequestID

	// AttrTokenCount is the token count of a record holding one token event
	// (absent means 1).
	AttrTokenCount = "llm.token.count"
	// AttrTokenEvents holds a packed token record: several token events of
	// one session as one string, the events separated by single spaces, each
	// "<offset>[:<count>][#<seq>]": offset is the event's time minus the
	// record's timestamp in ns (decimal, negative for an event older than
	// the record's first), count the event's token count, written only when
	// it is not 1, seq its sequence number, written only when it has one.
	// The record's timestamp is the first event's time, so the first offset
	// is 0: "0 20000113 39998760:3 60001002".
	//
	// One string is the densest form pdata can carry at a cost per record
	// rather than per event: pdata boxes each element of an array attribute
	// in an allocation of its own.
	AttrTokenEvents = "llm.token.events"
	// AttrTokenSessions holds a batch token record: the token events of
	// several sessions, one entry per session, entries separated by a
	// newline, each "<ID length> <session ID> <events>": the session ID's
	// length in bytes (decimal), the ID itself, which may hold any byte,
	// and its events in the AttrTokenEvents form, offsets from the record's
	// timestamp. A batch record has no AttrSessionID.
	//
	// The receiver writes one per batch for the sessions whose tokens do
	// not have to go before an event of their own: a record per session
	// per batch was the cost where a batch holds few tokens of each.
	AttrTokenSessions = "llm.token.sessions"
)

// timingAttrs pairs ev's timing fields with their attributes.
func timingAttrs(ev *tokenevent.Event) [3]struct {
	key string
	ns  *int64
} {
	return [3]struct {
		key string
		ns  *int64
	}{{AttrQueueTimeNs, &ev.QueueTimeNs}, {AttrPrefillTimeNs, &ev.PrefillTimeNs}, {AttrDecodeTimeNs, &ev.DecodeTimeNs}}
}

// shareAttrs pairs ev's engine share fields with their attributes.
func shareAttrs(ev *tokenevent.Event) [3]struct {
	key string
	v   *int64
	has *bool
} {
	return [3]struct {
		key string
		v   *int64
		has *bool
	}{
		{AttrEngineTimePrefillNs, &ev.EngineTimePrefillNs, &ev.HasEngineTime},
		{AttrEngineTimeDecodeNs, &ev.EngineTimeDecodeNs, &ev.HasEngineTime},
		{AttrEnergyMilliJ, &ev.EnergyMilliJ, &ev.HasEnergy},
	}
}
