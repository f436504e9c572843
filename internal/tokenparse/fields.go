// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenparse // import "github.com/otelcol-llm/otelcol-llm/internal/tokenparse"

import (
	"fmt"
	"math/bits"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// The fields of the schema: which a kind allows, and the value each takes.

// Bits of the fields a line carried; used for duplicate detection and for
// checking which fields a kind allows.
const (
	fEvent uint32 = 1 << iota
	fSessionID
	fTime
	fTraceID
	fSpanID
	fParentSpanID
	fModel
	fOperation
	fPromptTokens
	fEngine
	fAttributes
	fCount
	fCompletionTokens
	fFinishReason
	fError
	fStream
	fTraceState
	fSeq
	fResponseModel
	fQueueTime
	fPrefillTime
	fDecodeTime
	fEnginePrefill
	fEngineDecode
	fEnergy
	fEngineRequestID
	fMigrations
)

var fieldNames = [...]string{
	"event", "session_id", "time_unix_nano", "trace_id", "span_id", "parent_span_id", "model", "operation",
	"prompt_tokens", "engine", "attributes", "count", "completion_tokens", "finish_reason", "error",
	"stream", "tracestate", "seq", "response_model", "queue_time_ns", "prefill_time_ns", "decode_time_ns",
	"engine_time_prefill_ns", "engine_time_decode_ns", "energy_mj", "engine_request_id", "migrations",
}

const (
	fCommon  = fEvent | fSessionID | fTime
	allowedS = fCommon | fTraceID | fSpanID | fParentSpanID | fModel | fOperation | fPromptTokens | fEngine |
		fAttributes | fStream | fTraceState
	allowedT = fCommon | fCount | fSeq
	allowedE = fCommon | fCompletionTokens | fFinishReason | fError | fResponseModel | fQueueTime | fPrefillTime |
		fDecodeTime | fEnginePrefill | fEngineDecode | fEnergy | fMigrations
	// A share names the engine's request, not a session.
	allowedShare = fEvent | fEngineRequestID | fTime | fEngine | fEnginePrefill | fEngineDecode | fEnergy
	// A move: where the answer went (engine), why (error), the tokens
	// carried (count).
	allowedMove = fCommon | fEngine | fError | fCount
)

func validate(seen uint32, ev *tokenevent.Event) error {
	if seen&fEvent == 0 {
		return &tokenevent.FieldError{Field: "event", Reason: "missing"}
	}
	id := fSessionID
	if ev.Kind == tokenevent.KindShare {
		id = fEngineRequestID
	}
	if seen&id == 0 {
		return &tokenevent.FieldError{Field: fieldName(id), Reason: "missing"}
	}
	if seen&fTime == 0 {
		return &tokenevent.FieldError{Field: "time_unix_nano", Reason: "missing"}
	}
	allowed := allowedS
	switch ev.Kind {
	case tokenevent.KindToken:
		allowed = allowedT
	case tokenevent.KindEnd:
		allowed = allowedE
	case tokenevent.KindShare:
		allowed = allowedShare
	case tokenevent.KindMove:
		allowed = allowedMove
	}
	if extra := seen &^ allowed; extra != 0 {
		for i, name := range fieldNames {
			if extra&(1<<i) != 0 {
				return &tokenevent.FieldError{Field: name, Reason: "not allowed on a " + ev.Kind.String() + " event"}
			}
		}
	}
	if ev.Kind == tokenevent.KindMove {
		// A move's count is the tokens carried, which may be none: the
		// token's bounds (CheckCount) do not apply, nor its default of 1.
		if seen&fCount == 0 {
			ev.Count = 0
		}
		return nil
	}
	if seen&fCount != 0 {
		if err := tokenevent.CheckCount(ev.Count); err != nil {
			return err
		}
	}
	return nil
}

// fieldBit returns the bit of the field named key, or false for an unknown
// field.
func fieldBit(key []byte) (uint32, bool) {
	// A switch on string(key) compiles to a comparison without allocating.
	switch string(key) {
	case "event":
		return fEvent, true
	case "session_id":
		return fSessionID, true
	case "time_unix_nano":
		return fTime, true
	case "count":
		return fCount, true
	case "trace_id":
		return fTraceID, true
	case "span_id":
		return fSpanID, true
	case "parent_span_id":
		return fParentSpanID, true
	case "model":
		return fModel, true
	case "operation":
		return fOperation, true
	case "prompt_tokens":
		return fPromptTokens, true
	case "engine":
		return fEngine, true
	case "attributes":
		return fAttributes, true
	case "completion_tokens":
		return fCompletionTokens, true
	case "finish_reason":
		return fFinishReason, true
	case "error":
		return fError, true
	case "stream":
		return fStream, true
	case "tracestate":
		return fTraceState, true
	case "seq":
		return fSeq, true
	case "response_model":
		return fResponseModel, true
	case "queue_time_ns":
		return fQueueTime, true
	case "prefill_time_ns":
		return fPrefillTime, true
	case "decode_time_ns":
		return fDecodeTime, true
	case "engine_time_prefill_ns":
		return fEnginePrefill, true
	case "engine_time_decode_ns":
		return fEngineDecode, true
	case "energy_mj":
		return fEnergy, true
	case "engine_request_id":
		return fEngineRequestID, true
	case "migrations":
		return fMigrations, true
	}
	return 0, false
}

func fieldName(bit uint32) string { return fieldNames[bits.TrailingZeros32(bit)] }

// value parses the value of one field. It reports false for an optional
// field given as null, which counts as absent.
func (p *Parser) value(bit uint32, ev *tokenevent.Event) (bool, error) {
	name := fieldName(bit)
	if p.null() {
		switch bit {
		case fEvent, fSessionID, fTime, fEngineRequestID:
			return false, &tokenevent.FieldError{Field: name, Reason: "must not be null"}
		}
		return false, nil
	}
	switch bit {
	case fEvent:
		s, err := p.str(name)
		if err != nil {
			return false, err
		}
		switch string(s) {
		case "start":
			ev.Kind = tokenevent.KindStart
		case "token":
			ev.Kind = tokenevent.KindToken
		case "end":
			ev.Kind = tokenevent.KindEnd
		case "share":
			ev.Kind = tokenevent.KindShare
		case "move":
			ev.Kind = tokenevent.KindMove
		default:
			return false, &tokenevent.FieldError{Field: name, Reason: fmt.Sprintf("want start, token, end, share or move, got %q", tokenevent.Excerpt(s))}
		}
	case fSessionID:
		s, err := p.str(name)
		if err != nil {
			return false, err
		}
		if err := tokenevent.CheckSessionID(s, p.limits.MaxSessionIDBytes); err != nil {
			return false, err
		}
		ev.SessionID = p.intern(s)
	case fEngineRequestID:
		s, err := p.str(name)
		if err != nil {
			return false, err
		}
		if err := tokenevent.CheckEngineRequestID(s); err != nil {
			return false, err
		}
		// Each request's share comes once: not worth a place in the
		// intern table.
		ev.EngineRequestID = string(s)
	case fTime:
		v, err := p.uint(name)
		if err != nil {
			return false, err
		}
		if err := tokenevent.CheckTime(v); err != nil {
			return false, err
		}
		ev.TimeUnixNano = v
	case fCount:
		// Checked once the kind is known (validate): a token's count is
		// 1 to MaxCount, a move's any non-negative number.
		v, err := p.uint(name)
		if err != nil {
			return false, err
		}
		ev.Count = int64(v)
	case fSeq:
		v, err := p.uint(name)
		ev.Seq, ev.HasSeq = v, err == nil
		return true, err
	case fStream:
		switch {
		case p.literal("true"):
		case p.literal("false"):
			ev.NoStream = true
		default:
			return false, &tokenevent.FieldError{Field: name, Reason: "want true or false"}
		}
	case fTraceState:
		s, err := p.str(name)
		if err != nil {
			return false, err
		}
		if err := tokenevent.CheckTraceState(s); err != nil {
			return false, err
		}
		ev.TraceState = p.intern(s)
	case fPromptTokens:
		v, err := p.uint(name)
		ev.PromptTokens = int64(v)
		return true, err
	case fCompletionTokens:
		v, err := p.uint(name)
		ev.CompletionTokens = int64(v)
		return true, err
	case fQueueTime, fPrefillTime, fDecodeTime:
		v, err := p.uint(name)
		switch bit {
		case fQueueTime:
			ev.QueueTimeNs = int64(v)
		case fPrefillTime:
			ev.PrefillTimeNs = int64(v)
		default:
			ev.DecodeTimeNs = int64(v)
		}
		ev.TimingSource = tokenevent.TimingHook
		return true, err
	case fEnginePrefill, fEngineDecode, fEnergy:
		v, err := p.uint(name)
		switch bit {
		case fEnginePrefill:
			ev.EngineTimePrefillNs, ev.HasEngineTime = int64(v), true
		case fEngineDecode:
			ev.EngineTimeDecodeNs, ev.HasEngineTime = int64(v), true
		default:
			ev.EnergyMilliJ, ev.HasEnergy = int64(v), true
		}
		return true, err
	case fMigrations:
		v, err := p.uint(name)
		if err != nil {
			return false, err
		}
		if err := tokenevent.CheckMigrations(int64(v)); err != nil {
			return false, err
		}
		ev.Migrations = int64(v)
	case fResponseModel:
		return true, p.valueStr(name, &ev.ResponseModel, tokenevent.MaxValueBytes)
	case fTraceID:
		return true, p.hex(name, ev.TraceID[:])
	case fSpanID:
		return true, p.hex(name, ev.SpanID[:])
	case fParentSpanID:
		return true, p.hex(name, ev.ParentSpanID[:])
	case fOperation:
		s, err := p.str(name)
		if err != nil {
			return false, err
		}
		op, ferr := tokenevent.CheckOperation(s)
		if ferr != nil {
			return false, ferr
		}
		ev.Operation = op
	case fModel:
		return true, p.valueStr(name, &ev.Model, tokenevent.MaxValueBytes)
	case fEngine:
		return true, p.valueStr(name, &ev.Engine, tokenevent.MaxValueBytes)
	case fFinishReason:
		return true, p.valueStr(name, &ev.FinishReason, tokenevent.MaxValueBytes)
	case fError:
		return true, p.valueStr(name, &ev.Error, tokenevent.MaxErrorTypeBytes)
	case fAttributes:
		return true, p.attributes(ev)
	}
	return true, nil
}

// valueStr parses a string value into dst, cut to limit bytes (see
// tokenevent.CutValues, which names the fields and their bounds).
func (p *Parser) valueStr(name string, dst *string, limit int) error {
	s, err := p.str(name)
	if err != nil {
		return err
	}
	*dst = p.internValue(s, limit)
	return nil
}

func (p *Parser) attributes(ev *tokenevent.Event) error {
	const name = "attributes"
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return &tokenevent.FieldError{Field: name, Reason: "want an object of strings"}
	}
	p.i++
	for first := true; ; first = false {
		k, done, err := p.member(first, name)
		if err != nil || done {
			return err
		}
		var key string
		if len(k) > tokenevent.MaxAttributeKeyBytes {
			key = string(k) // rejected below: not worth a place in the intern table
		} else {
			key = p.intern(k)
		}
		if err := tokenevent.CheckAttribute(ev.Attributes, key, p.limits.MaxAttributes); err != nil {
			return err
		}
		v, err := p.str(name + "." + key)
		if err != nil {
			return err
		}
		ev.Attributes = append(ev.Attributes, tokenevent.Attribute{Key: key, Value: p.internValue(v, tokenevent.MaxValueBytes)})
	}
}

// object parses the top-level object into ev and returns the fields seen.
func (p *Parser) object(ev *tokenevent.Event) (uint32, error) {
	p.skipSpace()
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return 0, p.syntax("'{'")
	}
	p.i++
	var seen uint32
	for first := true; ; first = false {
		key, done, err := p.member(first, "")
		if err != nil {
			return 0, err
		}
		if done {
			break
		}
		bit, ok := fieldBit(key)
		if !ok {
			// A line that is not JSON at all is reported as such, not as
			// a schema error about the part read before the syntax broke.
			unknown := &tokenevent.FieldError{Field: tokenevent.Excerpt(key), Reason: "unknown field"}
			if err := p.skipRest(); err != nil {
				return 0, err
			}
			return 0, unknown
		}
		if seen&bit != 0 {
			return 0, &tokenevent.FieldError{Field: fieldName(bit), Reason: "duplicate field"}
		}
		present, err := p.value(bit, ev)
		if err != nil {
			return 0, err
		}
		if present {
			seen |= bit
		}
	}
	return seen, p.end()
}
