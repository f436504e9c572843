// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"math"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// Event names of the records this processor emits.
const (
	eventNameSummary = tokenrecord.EventNameSummary
	eventNameStall   = tokenrecord.EventNameStall

	spanEventFirstToken = "llm.first_token"
	// spanNameVerdict names the verdict span (traces::verdict_spans).
	spanNameVerdict = "llm.session.verdict"
	spanEventStall  = "llm.stall"
	// spanEventMigration is one move of the answer to another replica.
	spanEventMigration = "llm.session.migration"
)

// Attribute keys of the outputs, beside those of internal/tokenrecord.
const (
	attrProviderName      = "gen_ai.provider.name"
	attrRequestStream     = "gen_ai.request.stream"
	attrTimeToFirstChunk  = "gen_ai.response.time_to_first_chunk"
	attrSessionOutcome    = "llm.session.outcome"
	attrSessionTTFT       = "llm.session.ttft"
	attrSessionTPOT       = "llm.session.tpot"
	attrSessionWindowTPOT = "llm.session.window_tpot.max"
	attrSessionMaxGap     = "llm.session.max_gap"
	attrSessionDuration   = "llm.session.duration"
	attrSessionStalls     = "llm.session.stalls"
	attrSessionFreezes    = "llm.session.freezes"
	attrSessionChunks     = "llm.session.chunks"
	attrQueueTime         = "llm.session.queue_time"
	attrPrefillTime       = "llm.session.prefill_time"
	attrDecodeTime        = "llm.session.decode_time"
	attrTimingSource      = "llm.session.timing_source"
	attrResponseModel     = "gen_ai.response.model"
	// attrConversationID names the conversation a request belongs to (GenAI
	// semconv); a start attribute of that key is also put on the span and
	// the summary themselves, where trace UIs and log queries find it.
	attrConversationID = "gen_ai.conversation.id"
	attrSamplingReason = "llm.session.sampling.reason"
	attrStallFreeze    = "llm.stall.freeze"
	attrStallGaps      = "llm.stall.gaps"
	attrStallSince     = "llm.stall.since_unix_nano"
	attrServiceName    = "service.name"
	// attrMigrationFrom is where a move left: the session's engine for its
	// first, the endpoint the move before went to for each later one
	// (llm.migration.to and the others: tokenrecord's, as on the move).
	attrMigrationFrom = "llm.migration.from"

	// A session's share of its engine (the attribution's, or the engine's).
	attrEngineTime        = "llm.session.engine_time"
	attrEngineTimePrefill = "llm.session.engine_time.prefill"
	attrEngineTimeDecode  = "llm.session.engine_time.decode"
	attrEnergy            = "llm.session.energy"
	attrAttributionSource = "llm.session.attribution_source"
)

func seconds(d time.Duration) float64 { return d.Seconds() }

// putSessionAttributes writes what the session span and the summary record
// share.
func putSessionAttributes(m pcommon.Map, s *session.Session, e *session.End, provider string, engines *engineContext) {
	m.EnsureCapacity(24)
	putStr(m, tokenrecord.AttrOperation, s.Operation)
	m.PutStr(attrProviderName, provider)
	putStr(m, tokenrecord.AttrRequestModel, s.Model)
	m.PutBool(attrRequestStream, !s.NoStream)
	putStr(m, attrResponseModel, e.ResponseModel)
	if s.PromptTokens >= 0 {
		m.PutInt(tokenrecord.AttrInputTokens, int64(s.PromptTokens))
	}
	if n := s.OutputTokens(e); n >= 0 {
		m.PutInt(tokenrecord.AttrOutputTokens, n)
	}
	if e.FinishReason != "" {
		m.PutEmptySlice(tokenrecord.AttrFinishReasons).AppendEmpty().SetStr(e.FinishReason)
	}
	putStr(m, tokenrecord.AttrErrorType, s.ErrorType(e))
	m.PutStr(tokenrecord.AttrSessionID, s.ID)
	putStr(m, tokenrecord.AttrEngine, s.Engine)
	m.PutStr(attrSessionOutcome, s.Outcome.String())
	if ttft, ok := s.TTFT(); ok {
		m.PutDouble(attrTimeToFirstChunk, seconds(ttft))
		m.PutDouble(attrSessionTTFT, seconds(ttft))
	}
	if tpot, ok := s.TPOT(e.CompletionTokens); ok {
		m.PutDouble(attrSessionTPOT, seconds(tpot))
	}
	if s.WindowTPOTMax > 0 {
		m.PutDouble(attrSessionWindowTPOT, seconds(s.WindowTPOTMax))
	}
	if s.Chunks > 1 {
		m.PutDouble(attrSessionMaxGap, seconds(s.MaxGap))
	}
	m.PutDouble(attrSessionDuration, seconds(s.Duration(e)))
	if t := e.Timing; t.Known() {
		for _, p := range [...]struct {
			key string
			d   time.Duration
		}{{attrQueueTime, t.Queue}, {attrPrefillTime, t.Prefill}, {attrDecodeTime, t.Decode}} {
			if p.d >= 0 {
				m.PutDouble(p.key, seconds(p.d))
			}
		}
		m.PutStr(attrTimingSource, t.Source)
	}
	putShare(m, &e.Share)
	if e.Migrations > 0 {
		m.PutInt(tokenrecord.AttrMigrations, e.Migrations)
	}
	m.PutInt(attrSessionStalls, int64(s.StallCount))
	m.PutInt(attrSessionFreezes, int64(s.Freezes))
	m.PutInt(attrSessionChunks, int64(s.Chunks))
	if s.Keep {
		m.PutStr(attrSamplingReason, s.Reasons.String())
	}
	if len(s.Attributes()) > 0 {
		am := m.PutEmptyMap(tokenrecord.AttrSessionAttributes)
		for _, a := range s.Attributes() {
			am.PutStr(a.Key, a.Value)
			if a.Key == attrConversationID {
				m.PutStr(attrConversationID, a.Value)
			}
		}
	}
	engines.putSessionContext(m, s, s.EndedAt(e))
}

func putStr(m pcommon.Map, k, v string) {
	if v != "" {
		m.PutStr(k, v)
	}
}

// appendSpan writes the session span into ss.
func appendSpan(ss ptrace.ScopeSpans, s *session.Session, e *session.End, provider string, engines *engineContext) {
	span := ss.Spans().AppendEmpty()
	span.SetTraceID(s.TraceID)
	span.SetSpanID(s.SpanID)
	span.SetParentSpanID(s.ParentSpanID)
	// The caller's tracestate, with the threshold the session was kept at.
	span.TraceState().FromRaw(s.TraceState())
	heldspans.StampThreshold(span.TraceState(), s.Threshold)
	span.SetName(spanName(s))
	span.SetKind(ptrace.SpanKindServer)
	span.SetStartTimestamp(pcommon.Timestamp(s.StartedAt()))
	span.SetEndTimestamp(pcommon.Timestamp(s.EndedAt(e)))
	putSessionAttributes(span.Attributes(), s, e, provider, engines)
	if s.FirstTokenTime != 0 {
		ev := span.Events().AppendEmpty()
		ev.SetName(spanEventFirstToken)
		ev.SetTimestamp(pcommon.Timestamp(s.FirstTokenTime))
		if ttft, ok := s.TTFT(); ok {
			ev.Attributes().PutDouble(attrTimeToFirstChunk, seconds(ttft))
		}
	}
	stalls := s.Stalls()
	for i := range stalls {
		ev := span.Events().AppendEmpty()
		ev.SetName(spanEventStall)
		ev.SetTimestamp(pcommon.Timestamp(stalls[i].DetectedAt))
		putStall(ev.Attributes(), &stalls[i])
		engines.putStallContext(ev.Attributes(), s.Engine, stalls[i].DetectedAt)
	}
	from := s.Engine
	for _, mv := range s.Moves() {
		ev := span.Events().AppendEmpty()
		ev.SetName(spanEventMigration)
		ev.SetTimestamp(pcommon.Timestamp(mv.Time))
		m := ev.Attributes()
		m.EnsureCapacity(4)
		putStr(m, attrMigrationFrom, from)
		putStr(m, tokenrecord.AttrMigrationTo, mv.To)
		putStr(m, tokenrecord.AttrMigrationReason, mv.Reason)
		m.PutInt(tokenrecord.AttrMigrationTokensCarried, mv.TokensCarried)
		from = mv.To
	}
	if et := s.ErrorType(e); et != "" {
		span.Status().SetCode(ptrace.StatusCodeError)
		span.Status().SetMessage(et)
	}
}

func putStall(m pcommon.Map, st *session.Stall) {
	m.PutBool(attrStallFreeze, st.Freeze)
	m.PutInt(attrStallSince, st.Since)
	if len(st.Gaps) > 0 {
		gaps := m.PutEmptySlice(attrStallGaps)
		gaps.EnsureCapacity(len(st.Gaps))
		for _, g := range st.Gaps {
			gaps.AppendEmpty().SetDouble(seconds(g))
		}
	}
}

// appendVerdictSpan writes the verdict span of a session kept before its
// end: a child of the session span (which comes at the end), at the moment
// of the verdict on the engine's clock (at: the first token for a TTFT
// breach, the detection of a stall), with its reasons so far and the
// trace's threshold. A tail sampler that sees the trace's spans in one
// place (a gateway tier behind the loadbalancing exporter) keeps the trace
// on it without waiting for the session to end.
func appendVerdictSpan(ss ptrace.ScopeSpans, s *session.Session, th sampling.Threshold, at int64) {
	span := ss.Spans().AppendEmpty()
	span.SetTraceID(s.TraceID)
	span.SetSpanID(session.NewSpanID())
	span.SetParentSpanID(s.SpanID)
	span.TraceState().FromRaw(s.TraceState())
	heldspans.StampThreshold(span.TraceState(), th)
	span.SetName(spanNameVerdict)
	span.SetKind(ptrace.SpanKindInternal)
	span.SetStartTimestamp(pcommon.Timestamp(at))
	span.SetEndTimestamp(pcommon.Timestamp(at))
	m := span.Attributes()
	m.PutStr(tokenrecord.AttrSessionID, s.ID)
	m.PutStr(attrSamplingReason, s.Reasons.String())
	putStr(m, tokenrecord.AttrOperation, s.Operation)
	putStr(m, tokenrecord.AttrRequestModel, s.Model)
	putStr(m, tokenrecord.AttrEngine, s.Engine)
}

// spanName is "{gen_ai.operation.name} {gen_ai.request.model}", GenAI
// semconv's inference span name, with what is known of it: the operation
// alone without a model, and "gen_ai" without an operation (a model name
// alone would say nothing of what was done).
func spanName(s *session.Session) string {
	switch {
	case s.Operation == "":
		return "gen_ai"
	case s.Model == "":
		return s.Operation
	}
	return s.Operation + " " + s.Model
}

// appendSummary writes the summary record of a kept session into records.
func appendSummary(records plog.LogRecordSlice, s *session.Session, e *session.End, now pcommon.Timestamp, provider string, engines *engineContext) {
	lr := records.AppendEmpty()
	lr.SetEventName(eventNameSummary)
	lr.SetTimestamp(pcommon.Timestamp(s.EndedAt(e)))
	lr.SetObservedTimestamp(now)
	lr.SetTraceID(s.TraceID)
	lr.SetSpanID(s.SpanID)
	switch {
	case s.Outcome == session.OutcomeError || s.Outcome == session.OutcomeTimeout:
		lr.SetSeverityNumber(plog.SeverityNumberError)
		lr.SetSeverityText("ERROR")
	case s.Reasons&(session.ReasonTTFT|session.ReasonTPOT|session.ReasonStall|session.ReasonFreeze) != 0:
		lr.SetSeverityNumber(plog.SeverityNumberWarn)
		lr.SetSeverityText("WARN")
	default:
		lr.SetSeverityNumber(plog.SeverityNumberInfo)
		lr.SetSeverityText("INFO")
	}
	putSessionAttributes(lr.Attributes(), s, e, provider, engines)
}

// appendStallAlert writes the alert for the stall episode r reports, with
// the session's counts when it was detected.
func appendStallAlert[S any](records plog.LogRecordSlice, r *session.Report[S], now pcommon.Timestamp, provider string, engines *engineContext) {
	s, st := r.Session, &r.Stall
	lr := records.AppendEmpty()
	lr.SetEventName(eventNameStall)
	lr.SetTimestamp(pcommon.Timestamp(st.DetectedAt))
	lr.SetObservedTimestamp(now)
	lr.SetTraceID(s.TraceID)
	lr.SetSpanID(s.SpanID)
	lr.SetSeverityNumber(plog.SeverityNumberWarn)
	lr.SetSeverityText("WARN")
	m := lr.Attributes()
	m.PutStr(tokenrecord.AttrSessionID, s.ID)
	putStr(m, tokenrecord.AttrOperation, s.Operation)
	m.PutStr(attrProviderName, provider)
	putStr(m, tokenrecord.AttrRequestModel, s.Model)
	putStr(m, tokenrecord.AttrEngine, s.Engine)
	m.PutInt(attrSessionStalls, int64(r.StallCount))
	m.PutInt(attrSessionChunks, int64(r.Chunks))
	// The session's own wait before its first token, beside the engine's
	// queue depth (engine context below): was it slow to start as well?
	if ttft, ok := s.TTFT(); ok {
		m.PutDouble(attrSessionTTFT, seconds(ttft))
	}
	putStall(m, st)
	engines.putStallContext(m, s.Engine, st.DetectedAt)
}

// putShare writes a session's share of its engine on its summary and span.
func putShare(m pcommon.Map, sh *session.EngineShare) {
	if sh.Source == "" {
		return
	}
	m.PutDouble(attrEngineTime, sh.Prefill+sh.Decode)
	m.PutDouble(attrEngineTimePrefill, sh.Prefill)
	m.PutDouble(attrEngineTimeDecode, sh.Decode)
	if sh.HasEnergy && !math.IsNaN(sh.Energy) {
		m.PutDouble(attrEnergy, sh.Energy)
	}
	m.PutStr(attrAttributionSource, sh.Source)
}
