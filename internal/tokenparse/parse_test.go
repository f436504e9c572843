// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenparse

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

const (
	startLine = `{"event":"start","session_id":"s-1","time_unix_nano":1700000000000000000,` +
		`"trace_id":"0af7651916cd43dd8448eb211c80319c","span_id":"b7ad6b7169203331","parent_span_id":"00f067aa0ba902b7",` +
		`"model":"meta-llama/Llama-3.1-8B-Instruct","operation":"chat","prompt_tokens":812,"engine":"vllm-0",` +
		`"attributes":{"quantization":"fp8","tenant":"a"}}`
	tokenLine = `{"event":"token","session_id":"s-1","time_unix_nano":1700000000250000000}`
	endLine   = `{"event":"end","session_id":"s-1","time_unix_nano":1700000001000000000,"completion_tokens":42,"finish_reason":"stop"}`
)

func parse(t *testing.T, line string) (tokenevent.Event, error) {
	t.Helper()
	var ev tokenevent.Event
	err := NewParser(tokenevent.Limits{}).Parse([]byte(line), &ev)
	return ev, err
}

func TestParseStart(t *testing.T) {
	ev, err := parse(t, startLine)
	require.NoError(t, err)
	assert.Equal(t, tokenevent.Event{
		Kind:             tokenevent.KindStart,
		SessionID:        "s-1",
		TimeUnixNano:     1700000000000000000,
		TraceID:          tokenevent.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
		SpanID:           tokenevent.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
		ParentSpanID:     tokenevent.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		Model:            "meta-llama/Llama-3.1-8B-Instruct",
		Operation:        "chat",
		PromptTokens:     812,
		Engine:           "vllm-0",
		Attributes:       []tokenevent.Attribute{{Key: "quantization", Value: "fp8"}, {Key: "tenant", Value: "a"}},
		Count:            1,
		CompletionTokens: -1,
		QueueTimeNs:      -1, PrefillTimeNs: -1, DecodeTimeNs: -1,
	}, ev)
}

// The optional fields wave 2 added to schema v1: stream and tracestate on a
// start, seq on a token. Absent, they mean what a v1 line always meant.
func TestParseOptionalFields(t *testing.T) {
	ev, err := parse(t, `{"event":"start","session_id":"s","time_unix_nano":1,"stream":false,"tracestate":"ot=th:fd70a;rv:0123456789abcd,vendor=x"}`)
	require.NoError(t, err)
	assert.True(t, ev.NoStream)
	assert.Equal(t, "ot=th:fd70a;rv:0123456789abcd,vendor=x", ev.TraceState)

	ev, err = parse(t, `{"event":"start","session_id":"s","time_unix_nano":1,"stream":true}`)
	require.NoError(t, err)
	assert.False(t, ev.NoStream)
	ev, err = parse(t, `{"event":"start","session_id":"s","time_unix_nano":1}`)
	require.NoError(t, err)
	assert.False(t, ev.NoStream, "streamed unless said otherwise")
	assert.Empty(t, ev.TraceState)

	// The compact fast path and the general parser agree on seq.
	for _, line := range []string{
		`{"event":"token","session_id":"s","time_unix_nano":7,"count":2,"seq":41}`,
		`{"seq":41,"event":"token","session_id":"s","time_unix_nano":7,"count":2}`,
	} {
		ev, err = parse(t, line)
		require.NoError(t, err, line)
		assert.Equal(t, uint64(41), ev.Seq, line)
		assert.True(t, ev.HasSeq, line)
		assert.Equal(t, int64(2), ev.Count, line)
	}
	ev, err = parse(t, tokenLine)
	require.NoError(t, err)
	assert.False(t, ev.HasSeq, "absent")

	for _, ev := range []tokenevent.Event{
		{
			Kind: tokenevent.KindStart, SessionID: "s", TimeUnixNano: 1, PromptTokens: -1, CompletionTokens: -1, Count: 1, NoStream: true, TraceState: "ot=rv:0123456789abcd",
			QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1,
		},
		{
			Kind: tokenevent.KindToken, SessionID: "s", TimeUnixNano: 1, PromptTokens: -1, CompletionTokens: -1, Count: tokenevent.MaxCount, Seq: 0, HasSeq: true,
			QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1,
		},
		{
			Kind: tokenevent.KindEnd, SessionID: "s", TimeUnixNano: 1, PromptTokens: -1, CompletionTokens: 3, Count: 1, ResponseModel: "m-fp8",
			QueueTimeNs: 120_000_000, PrefillTimeNs: -1, DecodeTimeNs: 0, TimingSource: tokenevent.TimingHook,
		},
		{
			Kind: tokenevent.KindEnd, SessionID: "s", TimeUnixNano: 1, PromptTokens: -1, CompletionTokens: 3, Count: 1,
			QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1, Migrations: 2,
		},
		{
			Kind: tokenevent.KindMove, SessionID: "s", TimeUnixNano: 1, PromptTokens: -1, CompletionTokens: -1, Count: 12,
			Engine: "vllm:8000", Error: "engine_stalled", QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1,
		},
		{
			Kind: tokenevent.KindMove, SessionID: "s", TimeUnixNano: 1, PromptTokens: -1, CompletionTokens: -1, Count: 0,
			QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1,
		},
	} {
		line := tokenevent.AppendJSON(nil, &ev)
		var got tokenevent.Event
		require.NoError(t, NewParser(tokenevent.Limits{}).Parse(line[:len(line)-1], &got), string(line))
		got.Attributes = nil
		assert.Equal(t, ev, got, string(line))
	}
}

func TestParseTokenAndEnd(t *testing.T) {
	ev, err := parse(t, tokenLine)
	require.NoError(t, err)
	assert.Equal(t, tokenevent.KindToken, ev.Kind)
	assert.Equal(t, int64(1), ev.Count)
	assert.Equal(t, uint64(1700000000250000000), ev.TimeUnixNano)

	ev, err = parse(t, `{"time_unix_nano":5,"count":3,"session_id":"x","event":"token"}`)
	require.NoError(t, err)
	assert.Equal(t, int64(3), ev.Count, "field order is free")

	ev, err = parse(t, endLine)
	require.NoError(t, err)
	assert.Equal(t, tokenevent.KindEnd, ev.Kind)
	assert.Equal(t, int64(42), ev.CompletionTokens)
	assert.Equal(t, "stop", ev.FinishReason)
	assert.Equal(t, int64(-1), ev.PromptTokens)

	ev, err = parse(t, `{"event":"end","session_id":"x","time_unix_nano":5,"error":"upstream_500","completion_tokens":null}`)
	require.NoError(t, err)
	assert.Equal(t, "upstream_500", ev.Error)
	assert.Equal(t, int64(-1), ev.CompletionTokens, "null is absent")

	ev, err = parse(t, `{"event":"end","session_id":"x","time_unix_nano":5,"engine_time_prefill_ns":2000,"engine_time_decode_ns":3000,"energy_mj":12}`)
	require.NoError(t, err)
	assert.True(t, ev.HasEngineTime)
	assert.True(t, ev.HasEnergy)
	assert.Equal(t, [3]int64{2000, 3000, 12}, [3]int64{ev.EngineTimePrefillNs, ev.EngineTimeDecodeNs, ev.EnergyMilliJ})
	ev, err = parse(t, endLine)
	require.NoError(t, err)
	assert.False(t, ev.HasEngineTime || ev.HasEnergy, "absent unless given")
	_, err = parse(t, `{"event":"token","session_id":"x","time_unix_nano":5,"energy_mj":1}`)
	assert.ErrorContains(t, err, "energy_mj: not allowed on a token event")

	ev, err = parse(t, `{"event":"end","session_id":"x","time_unix_nano":5,"migrations":2}`)
	require.NoError(t, err)
	assert.Equal(t, int64(2), ev.Migrations)
	ev, err = parse(t, `{"event":"end","session_id":"x","time_unix_nano":5,"migrations":null}`)
	require.NoError(t, err)
	assert.Zero(t, ev.Migrations, "null is absent: never moved")
	_, err = parse(t, `{"event":"end","session_id":"x","time_unix_nano":5,"migrations":65}`)
	assert.ErrorContains(t, err, "migrations: at most 64, got 65")
	_, err = parse(t, `{"event":"end","session_id":"x","time_unix_nano":5,"migrations":-1}`)
	assert.ErrorContains(t, err, "migrations: want a non-negative integer")
	_, err = parse(t, `{"event":"start","session_id":"x","time_unix_nano":5,"migrations":1}`)
	assert.ErrorContains(t, err, "migrations: not allowed on a start event")
}

// A share names the engine's request instead of a session: its fields are
// read as given, and a share without either part is a share of 0.
func TestParseShare(t *testing.T) {
	ev, err := parse(t, `{"event":"share","engine_request_id":"cmpl-7-0a1b2c3d","time_unix_nano":5,"engine":"vllm-0","engine_time_prefill_ns":1200,"engine_time_decode_ns":3400,"energy_mj":56}`)
	require.NoError(t, err)
	assert.Equal(t, tokenevent.KindShare, ev.Kind)
	assert.Equal(t, "cmpl-7-0a1b2c3d", ev.EngineRequestID)
	assert.Empty(t, ev.SessionID)
	assert.Equal(t, "vllm-0", ev.Engine)
	assert.True(t, ev.HasEngineTime && ev.HasEnergy)
	assert.Equal(t, [3]int64{1200, 3400, 56}, [3]int64{ev.EngineTimePrefillNs, ev.EngineTimeDecodeNs, ev.EnergyMilliJ})

	ev, err = parse(t, `{"time_unix_nano":5,"engine_request_id":"r","event":"share"}`)
	require.NoError(t, err, "field order is free, every part optional")
	assert.Equal(t, [2]int64{0, 0}, [2]int64{ev.EngineTimePrefillNs, ev.EngineTimeDecodeNs})
	assert.False(t, ev.HasEngineTime || ev.HasEnergy)
}

// A move says where a session's answer went, why and the tokens carried:
// its count may be 0 or above a token's cap, and is 0 when absent; a token
// keeps its own bounds whichever field comes first.
func TestParseMove(t *testing.T) {
	ev, err := parse(t, `{"event":"move","session_id":"x","time_unix_nano":5,"engine":"vllm:8000","error":"engine_stalled","count":70000}`)
	require.NoError(t, err)
	assert.Equal(t, tokenevent.KindMove, ev.Kind)
	assert.Equal(t, "x", ev.SessionID)
	assert.Equal(t, "vllm:8000", ev.Engine)
	assert.Equal(t, "engine_stalled", ev.Error)
	assert.Equal(t, int64(70000), ev.Count)

	ev, err = parse(t, `{"count":0,"time_unix_nano":5,"session_id":"x","event":"move"}`)
	require.NoError(t, err, "field order is free")
	assert.Equal(t, int64(0), ev.Count)
	ev, err = parse(t, `{"event":"move","session_id":"x","time_unix_nano":5}`)
	require.NoError(t, err)
	assert.Equal(t, int64(0), ev.Count, "absent: nothing carried")
	ev, err = parse(t, `{"event":"move","session_id":"x","time_unix_nano":5,"error":"`+strings.Repeat("e", 100)+`"}`)
	require.NoError(t, err)
	assert.Len(t, ev.Error, tokenevent.MaxErrorTypeBytes, "cut to the error type's bound")

	for _, tt := range []struct{ line, want string }{
		{`{"event":"move","time_unix_nano":5,"count":1}`, "session_id: missing"},
		{`{"event":"move","session_id":"x","count":1}`, "time_unix_nano: missing"},
		{`{"event":"move","session_id":"x","time_unix_nano":5,"count":-1}`, "count: want a non-negative integer"},
		{`{"event":"move","session_id":"x","time_unix_nano":5,"model":"m"}`, "model: not allowed on a move event"},
		{`{"event":"move","session_id":"x","time_unix_nano":5,"migrations":1}`, "migrations: not allowed on a move event"},
		{`{"count":0,"time_unix_nano":5,"session_id":"x","event":"token"}`, "count: must be at least 1"},
		{`{"event":"token","session_id":"x","time_unix_nano":5,"count":65537}`, "count: at most 65536, got 65537"},
		{`{"event":"end","session_id":"x","time_unix_nano":5,"count":2}`, "count: not allowed on a end event"},
	} {
		_, err := parse(t, tt.line)
		assert.EqualError(t, err, tt.want, tt.line)
	}
}

func TestParseEscapes(t *testing.T) {
	ev, err := parse(t, `{"event":"start","session_id":"a\"b\\c\u00e9\ud83d\ude00","time_unix_nano":1,"attributes":{"k\n":"v\t"}}`)
	require.NoError(t, err)
	assert.Equal(t, "a\"b\\cé😀", ev.SessionID)
	assert.Equal(t, []tokenevent.Attribute{{Key: "k\n", Value: "v\t"}}, ev.Attributes)
}

func TestParseErrors(t *testing.T) {
	long := strings.Repeat("x", 300)
	tests := []struct {
		line string
		want string
	}{
		{``, `invalid JSON: want '{', got end of line`},
		{`[1]`, `invalid JSON at byte 1: want '{', got '['`},
		{`{"event":"token","session_id":"s","time_unix_nano":1`, `invalid JSON: want ',' or '}', got end of line`},
		{`{"event":"token","session_id":"s","time_unix_nano":1} x`, `invalid JSON at byte 55: data after the object`},
		{`{"event":"tok","session_id":"s","time_unix_nano":1}`, `event: want start, token, end, share or move, got "tok"`},
		{`{"session_id":"s","time_unix_nano":1}`, `event: missing`},
		{`{"event":"token","time_unix_nano":1}`, `session_id: missing`},
		{`{"event":"token","session_id":"s"}`, `time_unix_nano: missing`},
		{`{"event":"token","session_id":"","time_unix_nano":1}`, `session_id: must not be empty`},
		{`{"event":"token","session_id":"` + long + `","time_unix_nano":1}`, `session_id: 300 bytes, limit is 256`},
		{`{"event":"token","session_id":5,"time_unix_nano":1}`, `session_id: want a string`},
		{`{"event":"token","session_id":null,"time_unix_nano":1}`, `session_id: must not be null`},
		{`{"event":"token","session_id":"s","time_unix_nano":-1}`, `time_unix_nano: want a non-negative integer`},
		{`{"event":"token","session_id":"s","time_unix_nano":1.5}`, `time_unix_nano: want a non-negative integer`},
		{`{"event":"token","session_id":"s","time_unix_nano":01}`, `time_unix_nano: want a non-negative integer`},
		{`{"event":"token","session_id":"s","time_unix_nano":"1"}`, `time_unix_nano: want a non-negative integer`},
		{`{"event":"token","session_id":"s","time_unix_nano":99999999999999999999}`, `time_unix_nano: integer out of range`},
		{`{"event":"token","session_id":"s","time_unix_nano":0}`, `time_unix_nano: must be greater than 0`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"count":0}`, `count: must be at least 1`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"count":65537}`, `count: at most 65536, got 65537`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"count":1000000000000}`, `count: at most 65536, got 1000000000000`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"seq":-1}`, `seq: want a non-negative integer`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"seq":9223372036854775808}`, `seq: integer out of range`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"seq":"1"}`, `seq: want a non-negative integer`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"seq":1}`, `seq: not allowed on a start event`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"stream":"no"}`, `stream: want true or false`},
		{`{"event":"end","session_id":"s","time_unix_nano":1,"queue_time_ns":-5}`, `queue_time_ns: want a non-negative integer`},
		{`{"event":"end","session_id":"s","time_unix_nano":1,"prefill_time_ns":1.5}`, `prefill_time_ns: want a non-negative integer`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"decode_time_ns":5}`, `decode_time_ns: not allowed on a token event`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"response_model":"m"}`, `response_model: not allowed on a start event`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"stream":falsey}`, `stream: want true or false`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"stream":false}`, `stream: not allowed on a token event`},
		{"{\"event\":\"start\",\"session_id\":\"s\",\"time_unix_nano\":1,\"tracestate\":\"ot=th:0\\u00e9\"}", `tracestate: byte 8 is not printable ASCII`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"tracestate":"` + strings.Repeat("a", 513) + `"}`, `tracestate: 513 bytes, limit is 512`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"trace_id":"0af7651916cd43dd8448eb211c80319"}`, `trace_id: want 32 hex digits, got 31`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"trace_id":"0af7651916cd43dd8448eb211c80319z"}`, `trace_id: want 32 hex digits, got "0af7651916cd43dd8448eb211c80319z"`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"trace_id":"00000000000000000000000000000000"}`, `trace_id: must not be all zeros`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"span_id":"abc"}`, `span_id: want 16 hex digits, got 3`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"operation":"embeddings"}`, `operation: want chat or text_completion, got "embeddings"`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"attributes":{"a":1}}`, `attributes.a: want a string`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"attributes":{"a":"1","a":"2"}}`, `attributes.a: duplicate key`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"attributes":[]}`, `attributes: want an object of strings`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"model":"m"}`, `model: not allowed on a token event`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"count":2}`, `count: not allowed on a start event`},
		{`{"event":"end","session_id":"s","time_unix_nano":1,"prompt_tokens":2}`, `prompt_tokens: not allowed on a end event`},
		{`{"event":"token","session_id":"s","session_id":"t","time_unix_nano":1}`, `session_id: duplicate field`},
		{`{"event":"token","session_id":"s","time_unix_nano":1,"prompt":"secret"}`, `prompt: unknown field`},
		{"{\"event\":\"token\",\"session_id\":\"s\x01\",\"time_unix_nano\":1}", `session_id: control character in string`},
		{`{"event":"token","session_id":"s\q","time_unix_nano":1}`, `session_id: invalid escape \q`},
		{"{\"event\":\"token\",\"session_id\":\"\xff\",\"time_unix_nano\":1}", `session_id: invalid UTF-8`},
		{`{"event":"token","session_id":"s`, `session_id: unterminated string`},
		// A line that is not JSON is reported as such, also after an
		// unknown key; an unknown field only in a line that is JSON.
		{`{"bad"}`, `invalid JSON at byte 7: want ':', got '}'`},
		{`{"bad":}`, `invalid JSON at byte 8: want a value, got '}'`},
		{`{"bad":1,}`, `invalid JSON at byte 10: want a string key, got '}'`},
		{`{"bad":01}`, `invalid JSON at byte 8: number with a leading zero`},
		{`{"bad":1.}`, `invalid JSON at byte 10: want a digit, got '}'`},
		{`{"bad":1e+}`, `invalid JSON at byte 11: want a digit, got '}'`},
		{`{"bad":tru}`, `invalid JSON at byte 8: want a value, got 't'`},
		{`{"bad":[1,]}`, `invalid JSON at byte 11: want a value, got ']'`},
		{`{"bad":[1 2]}`, `invalid JSON at byte 11: want ',' or ']', got '2'`},
		{`{"bad":"x"} x`, `invalid JSON at byte 13: data after the object`},
		{`{"bad":"x","event":"token"`, `invalid JSON: want ',' or '}', got end of line`},
		{`{"bad":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`, `invalid JSON at byte 72: nested deeper than 64`},
		{`{"bad":{"a":[true,false,null,-1.5e-3,"\u00e9",{}],"b":[]},"c":0}`, `bad: unknown field`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"attributes":{"a"}}`, `invalid JSON at byte 71: want ':', got '}'`},
		{`{"event":"start","session_id":"s","time_unix_nano":1,"attributes":{"":"v"}}`, `attributes: empty key`},
		{`{"event":"share","time_unix_nano":1}`, `engine_request_id: missing`},
		{`{"event":"share","engine_request_id":"r"}`, `time_unix_nano: missing`},
		{`{"event":"share","engine_request_id":"","time_unix_nano":1}`, `engine_request_id: must not be empty`},
		{`{"event":"share","engine_request_id":null,"time_unix_nano":1}`, `engine_request_id: must not be null`},
		{`{"event":"share","engine_request_id":7,"time_unix_nano":1}`, `engine_request_id: want a string`},
		{`{"event":"share","engine_request_id":"` + long + `","time_unix_nano":1}`, `engine_request_id: 300 bytes, limit is 256`},
		{`{"event":"share","engine_request_id":"r","session_id":"s","time_unix_nano":1}`, `session_id: not allowed on a share event`},
		{`{"event":"share","engine_request_id":"r","time_unix_nano":1,"model":"m"}`, `model: not allowed on a share event`},
		{`{"event":"share","engine_request_id":"r","time_unix_nano":1,"engine_time_decode_ns":-1}`, `engine_time_decode_ns: want a non-negative integer`},
		{`{"event":"share","engine_request_id":"r","time_unix_nano":1,"energy_mj":1.5}`, `energy_mj: want a non-negative integer`},
		{`{"event":"end","session_id":"s","engine_request_id":"r","time_unix_nano":1}`, `engine_request_id: not allowed on a end event`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			_, err := parse(t, tt.line)
			require.Error(t, err)
			assert.Equal(t, tt.want, err.Error())
		})
	}
}

func TestParseLimits(t *testing.T) {
	p := NewParser(tokenevent.Limits{MaxLineBytes: 100, MaxSessionIDBytes: 4, MaxAttributes: 1})
	var ev tokenevent.Event
	err := p.Parse([]byte(startLine), &ev)
	require.EqualError(t, err, fmt.Sprintf("line is %d bytes, limit is 100", len(startLine)))
	err = p.Parse([]byte(`{"event":"token","session_id":"12345","time_unix_nano":1}`), &ev)
	require.EqualError(t, err, "session_id: 5 bytes, limit is 4")
	err = p.Parse([]byte(`{"event":"start","session_id":"1","time_unix_nano":1,"attributes":{"a":"1","b":"2"}}`), &ev)
	require.EqualError(t, err, "attributes: more than 1 entries")
}

// The values that become keys (model, engine, attribute values,
// response_model, finish_reason, error) are cut to their bounds, in the
// compact form and any other alike, as tokenevent.CutValues cuts them, and
// counted; the line is taken. An attribute key over its bound is refused.
func TestParseCutsLongValues(t *testing.T) {
	long := strings.Repeat("x", 12000)
	var start, end tokenevent.Event
	start.Reset()
	start.Kind, start.SessionID, start.TimeUnixNano = tokenevent.KindStart, "s-1", 1
	start.Model, start.Engine = long, "vllm-"+strings.Repeat("é", 200)
	start.Attributes = []tokenevent.Attribute{{Key: "tenant", Value: long}, {Key: "q", Value: "fp8"}}
	end.Reset()
	end.Kind, end.SessionID, end.TimeUnixNano = tokenevent.KindEnd, "s-1", 2
	end.ResponseModel, end.FinishReason, end.Error = long, long, long

	p := NewParser(tokenevent.Limits{MaxLineBytes: 1 << 20})
	for _, ev := range []tokenevent.Event{start, end} {
		compact := tokenevent.AppendJSON(nil, &ev)
		compact = compact[:len(compact)-1]
		// The same fields, the session ID last: not the compact form.
		general := []byte(`{"event":"` + ev.Kind.String() + `","time_unix_nano":1` +
			string(compact[bytes.Index(compact, []byte(`,"time_unix_nano":`))+len(`,"time_unix_nano":1`):len(compact)-1]) + `,"session_id":"s-1"}`)
		want := ev
		want.Attributes = append([]tokenevent.Attribute(nil), ev.Attributes...)
		want.TimeUnixNano = 1
		require.Equal(t, 3, want.CutValues())
		for _, line := range [][]byte{compact, general} {
			var got tokenevent.Event
			n := 0
			p.ParseBatch(line, 0, func(e *tokenevent.Event) { got, n = *e, n+1 }, func(e *LineError) { t.Fatal(e) })
			require.Equal(t, 1, n, "%s", line)
			got.TimeUnixNano = 1
			assert.Equal(t, fmt.Sprint(want), fmt.Sprint(got), "%s", line)
			assert.Equal(t, 3, p.TakeCuts(), "%s", line)
		}
	}
	assert.Zero(t, p.TakeCuts(), "taken")
	for s := range p.interned {
		assert.LessOrEqual(t, len(s), tokenevent.MaxValueBytes, "the intern table holds no value over its bound")
	}

	// A line rejected for another reason counts no cut.
	p.ParseBatch([]byte(`{"event":"start","session_id":"s","time_unix_nano":1,"model":"`+long+`","count":1}`), 0,
		func(*tokenevent.Event) { t.Fatal("taken") }, func(*LineError) {})
	assert.Zero(t, p.TakeCuts())

	_, err := parse(t, `{"event":"start","session_id":"s","time_unix_nano":1,"attributes":{"`+strings.Repeat("k", 300)+`":"v"}}`)
	require.EqualError(t, err, `attributes: key "`+strings.Repeat("k", 64)+`…": 300 bytes, limit is 256`)
}

// The intern table is bounded in bytes as well as in entries: session IDs
// of a raised max_session_id_bytes do not grow it past maxInternedBytes.
func TestInternTableBounded(t *testing.T) {
	p := NewParser(tokenevent.Limits{MaxLineBytes: 1 << 20, MaxSessionIDBytes: 64 << 10})
	var ev tokenevent.Event
	id := []byte(strings.Repeat("s", 60<<10))
	for i := range 100 {
		copy(id, fmt.Sprintf("%08d", i))
		line := `{"event":"token","session_id":"` + string(id) + `","time_unix_nano":1}`
		require.NoError(t, p.Parse([]byte(line), &ev))
		assert.LessOrEqual(t, p.internedBytes, maxInternedBytes)
	}
	n := 0
	for s := range p.interned {
		n += len(s)
	}
	assert.Equal(t, n, p.internedBytes)
}

func TestParseBatch(t *testing.T) {
	body := startLine + "\r\n" + tokenLine + "\n\n" + `{"event":"token","session_id":"s-1","time_unix_nano":1,"trace_id":"0af7651916cd43dd8448eb211c80319"}` +
		"\n" + `not json` + "\n" + endLine // no trailing newline
	var kinds []tokenevent.Kind
	var errs []string
	NewParser(tokenevent.Limits{}).ParseBatch([]byte(body), 0, func(ev *tokenevent.Event) { kinds = append(kinds, ev.Kind) }, func(e *LineError) { errs = append(errs, e.Error()) })
	assert.Equal(t, []tokenevent.Kind{tokenevent.KindStart, tokenevent.KindToken, tokenevent.KindEnd}, kinds)
	assert.Equal(t, []string{
		"line 4: trace_id: want 32 hex digits, got 31",
		"line 5: invalid JSON at byte 1: want '{', got 'n'",
	}, errs)
}

func TestParseBatchMaxLines(t *testing.T) {
	body := strings.Repeat(tokenLine+"\n", 5)
	var n int
	var errs []string
	NewParser(tokenevent.Limits{}).ParseBatch([]byte(body), 3, func(*tokenevent.Event) { n++ }, func(e *LineError) { errs = append(errs, e.Error()) })
	assert.Equal(t, 3, n)
	assert.Equal(t, []string{"line 4: batch holds more than 3 lines: this line and the 1 after it not read"}, errs)
}

func TestAppendJSONRoundTrip(t *testing.T) {
	for _, line := range []string{
		startLine, tokenLine, endLine,
		`{"event":"token","session_id":"q\"\\\u0001é","time_unix_nano":7,"count":4}`,
		`{"event":"end","session_id":"s","time_unix_nano":9,"error":"aborted"}`,
		`{"event":"end","session_id":"s","time_unix_nano":9,"engine_time_prefill_ns":10,"engine_time_decode_ns":0,"energy_mj":3}`,
		`{"event":"share","engine_request_id":"r-\u00e9","time_unix_nano":9,"engine":"e","engine_time_prefill_ns":10,"engine_time_decode_ns":20,"energy_mj":3}`,
		`{"event":"share","engine_request_id":"r","time_unix_nano":9}`,
	} {
		want, err := parse(t, line)
		require.NoError(t, err)
		out := tokenevent.AppendJSON(nil, &want)
		require.True(t, bytes.HasSuffix(out, []byte("\n")))
		got, err := parse(t, string(out[:len(out)-1]))
		require.NoError(t, err, string(out))
		assert.Equal(t, want, got)
	}
}

func TestAppendJSONInvalidUTF8(t *testing.T) {
	ev := tokenevent.Event{Kind: tokenevent.KindToken, SessionID: "a\xffb", TimeUnixNano: 1, Count: 1}
	got, err := parse(t, strings.TrimSpace(string(tokenevent.AppendJSON(nil, &ev))))
	require.NoError(t, err)
	assert.Equal(t, "a\ufffdb", got.SessionID)
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		startLine, tokenLine, endLine, `{}`, `{"event":"token","session_id":"a","time_unix_nano":12,"count":3}`,
		`{"event":"token","session_id":"a","time_unix_nano":012}`, `{"event":"token","session_id":"a","time_unix_nano":1,"count":0}`, `{"attributes":{"a":"\ud800"}}`, `{"event":"token","session_id":"\u00e9","time_unix_nano":1,"count":2}`,
		`{"bad"}`, `{"bad":[1,{"x":-0.5E+2}],"event":"token"}`, `{"event":"token","x":[[[[]]]]}`,
		`{"event":"start","session_id":"a","time_unix_nano":5,"trace_id":"0af7651916cd43dd8448eb211c80319c","span_id":"b7ad6b7169203331","parent_span_id":"00f067aa0ba902b7","model":"m","operation":"chat","prompt_tokens":3,"engine":"e","stream":false,"tracestate":"ot=th:8"}`,
		`{"event":"start","session_id":"a","time_unix_nano":5,"operation":"chatx"}`, `{"event":"start","session_id":"a","time_unix_nano":5,"trace_id":"00000000000000000000000000000000"}`,
		`{"event":"end","session_id":"a","time_unix_nano":5,"completion_tokens":7,"finish_reason":"stop","error":"E","response_model":"r","queue_time_ns":1,"prefill_time_ns":2,"decode_time_ns":3}`,
		`{"event":"end","session_id":"a","time_unix_nano":5,"decode_time_ns":3}`, `{"event":"end","session_id":"a","time_unix_nano":5,"completion_tokens":07}`,
		`{"event":"share","engine_request_id":"r","time_unix_nano":5,"engine":"e","engine_time_prefill_ns":1,"engine_time_decode_ns":2,"energy_mj":3}`,
		`{"event":"share","session_id":"a","time_unix_nano":5}`,
		// time_unix_nano of 19 digits (the fast path's three words), 20,
		// beyond int64, with a leading zero, and with a non-digit inside.
		`{"event":"token","session_id":"a","time_unix_nano":1733500000123456789,"count":1}`,
		`{"event":"token","session_id":"a","time_unix_nano":17335000001234567890,"count":1}`,
		`{"event":"token","session_id":"a","time_unix_nano":9300000000000000000,"count":1}`,
		`{"event":"token","session_id":"a","time_unix_nano":0733500000123456789,"count":1}`,
		`{"event":"token","session_id":"a","time_unix_nano":17335000001234:6789,"count":1}`,
	} {
		f.Add([]byte(s))
	}
	p := NewParser(tokenevent.Limits{})
	f.Fuzz(func(t *testing.T, line []byte) {
		var ev tokenevent.Event
		// The compact fast path and the general parser agree on every line
		// the fast path takes.
		var fast, general tokenevent.Event
		if p.parseCompact(line, &fast) {
			if err := p.parseObject(line, &general); err != nil {
				t.Fatalf("fast path took %q, general parser rejects it: %v", line, err)
			}
			if fmt.Sprint(fast) != fmt.Sprint(general) {
				t.Fatalf("paths disagree on %q:\n%+v\n%+v", line, fast, general)
			}
		}
		if err := p.Parse(line, &ev); err != nil {
			var fe *tokenevent.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error of type %T", err)
			}
			return
		}
		// Whatever parses must encode and parse back to the same event.
		out := tokenevent.AppendJSON(nil, &ev)
		var again tokenevent.Event
		if err := p.Parse(out[:len(out)-1], &again); err != nil {
			t.Fatalf("re-parse of %q: %v", out, err)
		}
		if fmt.Sprint(ev) != fmt.Sprint(again) {
			t.Fatalf("round trip changed the event:\n%+v\n%+v", ev, again)
		}
	})
}

func BenchmarkParseToken(b *testing.B) {
	p := NewParser(tokenevent.Limits{})
	line := []byte(tokenLine)
	var ev tokenevent.Event
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if err := p.Parse(line, &ev); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkParseTokenGeneral parses a token line the compact fast path does
// not take (another field order), as any other JSON encoder might write it.
func BenchmarkParseTokenGeneral(b *testing.B) {
	p := NewParser(tokenevent.Limits{})
	line := []byte(`{"session_id":"s-1","event":"token","time_unix_nano":1700000000250000000}`)
	var ev tokenevent.Event
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Parse(line, &ev); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkParseBatch parses a hook batch: 100 concurrent sessions, 10 tokens
// each, interleaved as a real hook would send them.
func BenchmarkParseBatch(b *testing.B) {
	var body []byte
	for step := range 10 {
		for s := range 100 {
			ev := tokenevent.Event{Kind: tokenevent.KindToken, SessionID: fmt.Sprintf("req-%08d", s), TimeUnixNano: uint64(1700000000000000000 + step*25_000_000 + s), Count: 1}
			body = tokenevent.AppendJSON(body, &ev)
		}
	}
	p := NewParser(tokenevent.Limits{})
	n := 0
	onEvent := func(*tokenevent.Event) { n++ }
	onError := func(e *LineError) { b.Fatal(e) }
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		p.ParseBatch(body, 0, onEvent, onError)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(n), "ns/event")
}

// compactUintByDigit is compactUint a digit at a time, the reference for
// its eight-digit steps.
func compactUintByDigit(line []byte, i int) (uint64, int, bool) {
	start := i
	var v uint64
	for i < len(line) && i-start < 19 && line[i]-'0' <= 9 {
		v = v*10 + uint64(line[i]-'0')
		i++
	}
	if i == start || (line[start] == '0' && i-start > 1) || v > math.MaxInt64 {
		return 0, i, false
	}
	return v, i, true
}

func TestCompactUint(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	alphabet := []byte("0123456789/:,}a \x00\xff")
	for range 200_000 {
		line := make([]byte, rng.IntN(28))
		for j := range line {
			if rng.IntN(8) == 0 {
				line[j] = alphabet[rng.IntN(len(alphabet))]
			} else {
				line[j] = '0' + byte(rng.IntN(10))
			}
		}
		i := 0
		if len(line) > 0 {
			i = rng.IntN(len(line))
		}
		v, next, ok := compactUint(line, i)
		wv, wnext, wok := compactUintByDigit(line, i)
		require.Equal(t, [3]any{wv, wnext, wok}, [3]any{v, next, ok}, "%q from %d", line, i)
	}
	// 19 digits (a time_unix_nano) take a path of their own.
	for _, s := range []string{
		"1700000000000000000", "9223372036854775807", "9223372036854775808", "99999999", "12345678", "00000000",
		"1700000000000000000}", "0700000000000000000,", "17000000000000000001", "9999999999999999999", "1234567890123456789,\"count\":2}",
	} {
		v, next, ok := compactUint([]byte(s), 0)
		wv, wnext, wok := compactUintByDigit([]byte(s), 0)
		assert.Equal(t, wv, v, s)
		assert.Equal(t, wnext, next, s)
		assert.Equal(t, wok, ok, s)
	}
}

// TestParseBatchCutOnce: past the limit, one error stands for every
// further non-blank line, however many.
func TestParseBatchCutOnce(t *testing.T) {
	body := tokenLine + "\n" + tokenLine + "\n\n  \n" + strings.Repeat("1\n\n", 1000) + "x"
	var errs []*LineError
	NewParser(tokenevent.Limits{}).ParseBatch([]byte(body), 1, func(*tokenevent.Event) {}, func(e *LineError) { c := *e; errs = append(errs, &c) })
	require.Len(t, errs, 1)
	assert.Equal(t, 2, errs[0].Line)
	assert.Equal(t, 1001, errs[0].Unread, "999+1 lines of 1 and the x, blank lines not counted")
}

// The compact paths take the lines the clients write (AppendJSON's form)
// for every kind, and parse them as the general parser does; a start with
// attributes is left to the general parser.
func TestCompactPathsTakeClientLines(t *testing.T) {
	p := NewParser(tokenevent.Limits{})
	start := tokenevent.Event{}
	start.Reset()
	start.Kind, start.SessionID, start.TimeUnixNano = tokenevent.KindStart, "chat-1", 1_700_000_000_000_000_000
	start.TraceID = tokenevent.TraceID{1, 2, 3}
	start.SpanID, start.ParentSpanID = tokenevent.SpanID{4}, tokenevent.SpanID{5}
	start.Model, start.Operation, start.PromptTokens, start.Engine = "llama", tokenevent.OperationChat, 812, "vllm-0"
	start.NoStream, start.TraceState = true, "ot=th:8"
	end := tokenevent.Event{}
	end.Reset()
	end.Kind, end.SessionID, end.TimeUnixNano = tokenevent.KindEnd, "chat-1", 1_700_000_001_000_000_000
	end.CompletionTokens, end.FinishReason, end.Error, end.ResponseModel = 7, "stop", "Timeout", "llama-lora"
	end.TimingSource, end.QueueTimeNs, end.PrefillTimeNs, end.DecodeTimeNs = tokenevent.TimingHook, 1, 2, 3
	minimal := tokenevent.Event{}
	minimal.Reset()
	minimal.Kind, minimal.SessionID, minimal.TimeUnixNano = tokenevent.KindEnd, "x", 1
	withAttrs := start
	withAttrs.Attributes = []tokenevent.Attribute{{Key: "a", Value: "b"}}
	for _, tc := range []struct {
		ev      tokenevent.Event
		compact bool
	}{{start, true}, {end, true}, {minimal, true}, {withAttrs, false}} {
		line := tokenevent.AppendJSON(nil, &tc.ev)
		line = line[:len(line)-1]
		var fast, general tokenevent.Event
		require.Equal(t, tc.compact, p.parseCompact(line, &fast), "%s", line)
		require.NoError(t, p.parseObject(line, &general))
		if tc.compact {
			assert.Equal(t, fmt.Sprint(general), fmt.Sprint(fast), "%s", line)
		}
		assert.Equal(t, fmt.Sprint(tc.ev), fmt.Sprint(general), "%s", line)
	}
}

// BenchmarkParseStartEnd parses a start and an end line of the clients'
// form (a start without attributes): compact through Parse's compact paths,
// general through the general parser alone.
func BenchmarkParseStartEnd(b *testing.B) {
	withoutAttrs, _, _ := strings.Cut(startLine, `,"attributes"`)
	start := []byte(withoutAttrs + "}")
	lines := [][]byte{start, []byte(endLine)}
	for _, path := range []string{"compact", "general"} {
		b.Run(path, func(b *testing.B) {
			p := NewParser(tokenevent.Limits{})
			var ev tokenevent.Event
			b.ReportAllocs()
			for b.Loop() {
				for _, l := range lines {
					if path == "general" {
						if err := p.parseObject(l, &ev); err != nil {
							b.Fatal(err)
						}
					} else if !p.parseCompact(l, &ev) {
						b.Fatalf("not compact: %s", l)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/line")
		})
	}
}

// plainEnd finds the first byte plainByte does not mark, as a byte-at-a-time
// scan does, for every such byte at every offset of an eight-byte word.
func TestPlainEnd(t *testing.T) {
	naive := func(b []byte, i int) int {
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		return i
	}
	for c := range 256 {
		for pos := range 20 {
			b := []byte(strings.Repeat("abcdefgh", 3))
			if pos < len(b) {
				b[pos] = byte(c)
			}
			for from := range 3 {
				require.Equal(t, naive(b, from), plainEnd(b, from), "byte %#x at %d, from %d", c, pos, from)
			}
		}
	}
}

// The token line's two long keys, matched by words, match as
// bytes.HasPrefix does: each byte of them checked, and no shorter line.
func TestTokenKeysByWords(t *testing.T) {
	for _, k := range []struct {
		key []byte
		has func([]byte) bool
	}{{compactTokenPrefix, hasTokenPrefix}, {compactTokenTime, hasTokenTime}} {
		line := append(append([]byte(nil), k.key...), "1}"...)
		for i := range k.key {
			for _, c := range []byte{0, 'x', k.key[i] ^ 0x20, k.key[i] ^ 1} {
				b := append([]byte(nil), line...)
				b[i] = c
				assert.Equal(t, bytes.HasPrefix(b, k.key), k.has(b), "%q", b)
			}
		}
		assert.True(t, k.has(line))
		assert.True(t, k.has(line[:len(k.key)]))
		assert.False(t, k.has(line[:len(k.key)-1]))
	}
}
