// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenrecord // import "github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"

import (
	"encoding/hex"
	"errors"
	"fmt"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// IsTokenEvent reports whether lr is one of the token event records.
func IsTokenEvent(lr plog.LogRecord) bool {
	switch lr.EventName() {
	case EventNameStart, EventNameToken, EventNameEnd, EventNameShare, EventNameMove:
		return true
	}
	return false
}

// ReadRecord decodes a token event record, calling fn once per event: once
// for a start, end or single token record, once per packed event otherwise
// (of each session in turn in a batch record, AttrTokenSessions, whose
// events' SessionID is part of the record's attribute string: copy it to
// keep it).
// ev is the Event passed to fn, reused between calls. Every event is held to
// the rules and limits the wire parser applies (tokenevent's Validate with
// limits): a record from any OTLP sender is trusted no more than a hook's
// line. It returns a *tokenevent.FieldError naming the attribute at fault
// when lr is not a valid token event record; fn is not called then. Of a
// batch record it skips the session entries that are not valid, and the
// rest where its frame breaks, reads the others, and returns an
// *EntryError (see readBatch).
func ReadRecord(lr plog.LogRecord, limits tokenevent.Limits, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	ev.Reset()
	switch lr.EventName() {
	case EventNameStart:
		ev.Kind = tokenevent.KindStart
	case EventNameToken:
		ev.Kind = tokenevent.KindToken
	case EventNameEnd:
		ev.Kind = tokenevent.KindEnd
	case EventNameMove:
		ev.Kind = tokenevent.KindMove
	case EventNameShare:
		return readShare(lr, ev, fn)
	default:
		return &tokenevent.FieldError{Field: "event_name", Reason: fmt.Sprintf("want a token event, got %q", lr.EventName())}
	}
	attrs := lr.Attributes()
	if ev.Kind == tokenevent.KindToken {
		if v, ok := attrs.Get(AttrTokenSessions); ok {
			if err := readTime(lr, ev); err != nil {
				return err
			}
			return readBatch(attrs, v, limits, ev, fn)
		}
	}
	sid, err := strAttr(attrs, AttrSessionID)
	if err != nil {
		return err
	}
	if sid == "" {
		return &tokenevent.FieldError{Field: AttrSessionID, Reason: "missing"}
	}
	if err := tokenevent.CheckSessionID(sid, limits.MaxSessionIDBytes); err != nil {
		err.Field = AttrSessionID
		return err
	}
	ev.SessionID = sid
	if err := readTime(lr, ev); err != nil {
		return err
	}
	switch ev.Kind {
	case tokenevent.KindStart:
		return readStart(lr, attrs, limits, ev, fn)
	case tokenevent.KindToken:
		return readToken(attrs, ev, fn)
	case tokenevent.KindMove:
		return readMove(attrs, ev, fn)
	default:
		return readEnd(attrs, ev, fn)
	}
}

// readTime sets ev's time from lr's timestamp: present, within an int64.
func readTime(lr plog.LogRecord, ev *tokenevent.Event) error {
	ev.TimeUnixNano = uint64(lr.Timestamp())
	if ev.TimeUnixNano == 0 {
		return &tokenevent.FieldError{Field: "time_unix_nano", Reason: "missing"}
	}
	if err := tokenevent.CheckTime(ev.TimeUnixNano); err != nil {
		return err
	}
	return nil
}

// readMove decodes a move: where, why and the tokens carried (absent: 0).
func readMove(attrs pcommon.Map, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	var err error
	if ev.Engine, err = strAttr(attrs, AttrMigrationTo); err != nil {
		return err
	}
	if ev.Error, err = strAttr(attrs, AttrMigrationReason); err != nil {
		return err
	}
	if ev.Count, err = intAttr(attrs, AttrMigrationTokensCarried, 0); err != nil {
		return err
	}
	fn(ev)
	return nil
}

func readStart(lr plog.LogRecord, attrs pcommon.Map, limits tokenevent.Limits, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	ev.TraceID = tokenevent.TraceID(lr.TraceID())
	ev.SpanID = tokenevent.SpanID(lr.SpanID())
	var err error
	if ev.Operation, err = strAttr(attrs, AttrOperation); err != nil {
		return err
	}
	if ev.Model, err = strAttr(attrs, AttrRequestModel); err != nil {
		return err
	}
	if ev.Engine, err = strAttr(attrs, AttrEngine); err != nil {
		return err
	}
	if ev.TraceState, err = strAttr(attrs, AttrTraceState); err != nil {
		return err
	}
	if v, ok := attrs.Get(AttrRequestStream); ok {
		if v.Type() != pcommon.ValueTypeBool {
			return &tokenevent.FieldError{Field: AttrRequestStream, Reason: "want a bool, got " + v.Type().String()}
		}
		ev.NoStream = !v.Bool()
	}
	if ev.PromptTokens, err = intAttr(attrs, AttrInputTokens, -1); err != nil {
		return err
	}
	if ev.PromptBytes, err = intAttr(attrs, AttrPromptBytes, 0); err != nil {
		return err
	}
	parent, err := strAttr(attrs, AttrParentSpanID)
	if err != nil {
		return err
	}
	if parent != "" {
		if len(parent) != 16 {
			return &tokenevent.FieldError{Field: AttrParentSpanID, Reason: fmt.Sprintf("want 16 hex digits, got %d", len(parent))}
		}
		if _, err := hex.Decode(ev.ParentSpanID[:], []byte(parent)); err != nil {
			return &tokenevent.FieldError{Field: AttrParentSpanID, Reason: "want 16 hex digits"}
		}
	}
	if v, ok := attrs.Get(AttrSessionAttributes); ok {
		if v.Type() != pcommon.ValueTypeMap {
			return &tokenevent.FieldError{Field: AttrSessionAttributes, Reason: "want a map, got " + v.Type().String()}
		}
		for k, a := range v.Map().All() {
			ev.Attributes = append(ev.Attributes, tokenevent.Attribute{Key: k, Value: a.AsString()})
		}
	}
	if err := ev.Validate(limits); err != nil {
		return err
	}
	fn(ev)
	return nil
}

func readToken(attrs pcommon.Map, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	if v, ok := attrs.Get(AttrTokenEvents); ok {
		if v.Type() != pcommon.ValueTypeStr {
			return &tokenevent.FieldError{Field: AttrTokenEvents, Reason: "want a string, got " + v.Type().String()}
		}
		return readPacked(v.Str(), int64(ev.TimeUnixNano), ev, fn) // CheckTime: within an int64
	}
	n, err := intAttr(attrs, AttrTokenCount, 1)
	if err != nil {
		return err
	}
	if err := tokenevent.CheckCount(n); err != nil {
		err.Field = AttrTokenCount
		return err
	}
	seq, err := intAttr(attrs, AttrTokenSeq, -1)
	if err != nil {
		return err
	}
	setSeq(ev, seq)
	ev.Count = n
	fn(ev)
	return nil
}

func readEnd(attrs pcommon.Map, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	var err error
	if ev.CompletionTokens, err = intAttr(attrs, AttrOutputTokens, -1); err != nil {
		return err
	}
	if ev.PromptTokens, err = intAttr(attrs, AttrInputTokens, -1); err != nil {
		return err
	}
	if ev.Error, err = strAttr(attrs, AttrErrorType); err != nil {
		return err
	}
	if ev.ResponseModel, err = strAttr(attrs, AttrResponseModel); err != nil {
		return err
	}
	if ev.TimingSource, err = strAttr(attrs, AttrTimingSource); err != nil {
		return err
	}
	for _, t := range timingAttrs(ev) {
		if *t.ns, err = intAttr(attrs, t.key, -1); err != nil {
			return err
		}
		if *t.ns >= 0 && ev.TimingSource == "" {
			ev.TimingSource = tokenevent.TimingHook // an SDK's record that did not say
		}
	}
	for _, t := range shareAttrs(ev) {
		if *t.v, err = intAttr(attrs, t.key, -1); err != nil {
			return err
		}
		if *t.v >= 0 {
			*t.has = true
		} else {
			*t.v = 0
		}
	}
	if ev.Migrations, err = intAttr(attrs, AttrMigrations, 0); err != nil {
		return err
	}
	if err := tokenevent.CheckMigrations(ev.Migrations); err != nil {
		err.Field = AttrMigrations
		return err
	}
	if v, ok := attrs.Get(AttrFinishReasons); ok {
		switch v.Type() {
		case pcommon.ValueTypeSlice:
			if v.Slice().Len() > 0 {
				ev.FinishReason = v.Slice().At(0).AsString()
			}
		case pcommon.ValueTypeStr:
			ev.FinishReason = v.Str()
		default:
			return &tokenevent.FieldError{Field: AttrFinishReasons, Reason: "want a string array, got " + v.Type().String()}
		}
	}
	// The limits are those of the other kinds (session ID, time): checked
	// above, before the kind's own attributes.
	fn(ev)
	return nil
}

// readShare decodes a share record: named by the engine's request id, not
// by a session.
func readShare(lr plog.LogRecord, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	ev.Kind = tokenevent.KindShare
	attrs := lr.Attributes()
	var err error
	if ev.EngineRequestID, err = strAttr(attrs, AttrEngineRequestID); err != nil {
		return err
	}
	if ev.EngineRequestID == "" {
		return &tokenevent.FieldError{Field: AttrEngineRequestID, Reason: "missing"}
	}
	ev.TimeUnixNano = uint64(lr.Timestamp())
	if ev.TimeUnixNano == 0 {
		return &tokenevent.FieldError{Field: "time_unix_nano", Reason: "missing"}
	}
	if ev.Engine, err = strAttr(attrs, AttrEngine); err != nil {
		return err
	}
	for _, t := range shareAttrs(ev) {
		if *t.v, err = intAttr(attrs, t.key, -1); err != nil {
			return err
		}
		if *t.v >= 0 {
			*t.has = true
		} else {
			*t.v = 0
		}
	}
	if err := ev.Validate(tokenevent.Limits{}); err != nil {
		if fe := (*tokenevent.FieldError)(nil); errors.As(err, &fe) && fe.Field == "engine_request_id" {
			fe.Field = AttrEngineRequestID
		}
		return err
	}
	fn(ev)
	return nil
}

func strAttr(m pcommon.Map, k string) (string, error) {
	v, ok := m.Get(k)
	if !ok {
		return "", nil
	}
	if v.Type() != pcommon.ValueTypeStr {
		return "", &tokenevent.FieldError{Field: k, Reason: "want a string, got " + v.Type().String()}
	}
	return v.Str(), nil
}

func intAttr(m pcommon.Map, k string, absent int64) (int64, error) {
	v, ok := m.Get(k)
	if !ok {
		return absent, nil
	}
	if v.Type() != pcommon.ValueTypeInt || v.Int() < 0 {
		return 0, &tokenevent.FieldError{Field: k, Reason: "want a non-negative int, got " + v.AsString()}
	}
	return v.Int(), nil
}
