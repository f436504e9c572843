// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenevent

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newEvent(kind Kind) Event {
	var ev Event
	ev.Reset()
	ev.Kind, ev.SessionID, ev.TimeUnixNano = kind, "s", 1
	return ev
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(ev *Event)
		kind Kind
		want string // "" for valid
	}{
		{"start", func(*Event) {}, KindStart, ""},
		{"every start field", func(ev *Event) {
			ev.TraceID, ev.SpanID, ev.ParentSpanID = TraceID{1}, SpanID{2}, SpanID{3}
			ev.Model, ev.Operation, ev.PromptTokens, ev.Engine = "m", OperationTextCompletion, 0, "e"
			ev.Attributes = []Attribute{{"a", ""}, {"b", "2"}}
		}, KindStart, ""},
		{"fields of other kinds are ignored", func(ev *Event) { ev.Count, ev.CompletionTokens, ev.Error = 0, -7, "x" }, KindStart, ""},
		{"no kind", func(ev *Event) { ev.Kind = 0 }, KindStart, "event: want start, token, end, share or move, got kind 0"},
		{"no session", func(ev *Event) { ev.SessionID = "" }, KindToken, "session_id: must not be empty"},
		{"long session", func(ev *Event) { ev.SessionID = strings.Repeat("x", 257) }, KindEnd, "session_id: 257 bytes, limit is 256"},
		{"session at the limit", func(ev *Event) { ev.SessionID = strings.Repeat("é", 128) }, KindEnd, ""},
		{"session with invalid UTF-8", func(ev *Event) { ev.SessionID = strings.Repeat("\xff", 86) }, KindEnd, "session_id: 258 bytes, limit is 256"},
		{"no time", func(ev *Event) { ev.TimeUnixNano = 0 }, KindToken, "time_unix_nano: must be greater than 0"},
		{"time past int64", func(ev *Event) { ev.TimeUnixNano = 1 << 63 }, KindToken, "time_unix_nano: integer out of range"},
		{"count 0", func(ev *Event) { ev.Count = 0 }, KindToken, "count: must be at least 1"},
		{"count over the cap", func(ev *Event) { ev.Count = MaxCount + 1 }, KindToken, "count: at most 65536, got 65537"},
		{"seq out of range", func(ev *Event) { ev.Seq, ev.HasSeq = 1<<63, true }, KindToken, "seq: integer out of range"},
		{"tracestate too long", func(ev *Event) { ev.TraceState = strings.Repeat("a", 513) }, KindStart, "tracestate: 513 bytes, limit is 512"},
		{"operation", func(ev *Event) { ev.Operation = "embeddings" }, KindStart, `operation: want chat or text_completion, got "embeddings"`},
		{"prompt tokens", func(ev *Event) { ev.PromptTokens = -2 }, KindStart, "prompt_tokens: must not be negative, got -2"},
		{"completion tokens", func(ev *Event) { ev.CompletionTokens = -2 }, KindEnd, "completion_tokens: must not be negative, got -2"},
		{"migrations at the cap", func(ev *Event) { ev.Migrations = MaxMigrations }, KindEnd, ""},
		{"migrations over the cap", func(ev *Event) { ev.Migrations = MaxMigrations + 1 }, KindEnd, "migrations: at most 64, got 65"},
		{"negative migrations", func(ev *Event) { ev.Migrations = -1 }, KindEnd, "migrations: must not be negative"},
		{"migrations of another kind are ignored", func(ev *Event) { ev.Migrations = -1 }, KindToken, ""},
		{"empty key", func(ev *Event) { ev.Attributes = []Attribute{{"", "v"}} }, KindStart, "attributes: empty key"},
		{
			"long key", func(ev *Event) { ev.Attributes = []Attribute{{strings.Repeat("k", 257), "v"}} }, KindStart,
			`attributes: key "` + strings.Repeat("k", 64) + `…": 257 bytes, limit is 256`,
		},
		{"key at the limit", func(ev *Event) { ev.Attributes = []Attribute{{strings.Repeat("é", 128), "v"}} }, KindStart, ""},
		{
			"key with invalid UTF-8", func(ev *Event) { ev.Attributes = []Attribute{{strings.Repeat("\xff", 86), "v"}} }, KindStart,
			fmt.Sprintf("attributes: key %q: 258 bytes, limit is 256", strings.Repeat("\xff", 64)+"…"),
		},
		{"long values are cut, not refused", func(ev *Event) {
			ev.Model, ev.Engine = strings.Repeat("m", 12000), strings.Repeat("e", 300)
			ev.Attributes = []Attribute{{"tenant", strings.Repeat("t", 300)}}
		}, KindStart, ""},
		{"duplicate key", func(ev *Event) { ev.Attributes = []Attribute{{"a", "1"}, {"a", "2"}} }, KindStart, "attributes.a: duplicate key"},
		// Both arrive as "a\uFFFD", which the parser refuses as a duplicate.
		{"keys equal once decoded", func(ev *Event) { ev.Attributes = []Attribute{{"a\xff", "1"}, {"a\xfe", "2"}} }, KindStart, "attributes.a\uFFFD: duplicate key"},
		{"share", func(ev *Event) {
			ev.SessionID, ev.EngineRequestID, ev.Engine = "", "cmpl-1-0a1b2c3d", "e"
			ev.EngineTimePrefillNs, ev.EngineTimeDecodeNs, ev.HasEngineTime = 1, 0, true
			ev.EnergyMilliJ, ev.HasEnergy = 0, true
		}, KindShare, ""},
		{"share without a part: a share of 0", func(ev *Event) { ev.EngineRequestID = "r" }, KindShare, ""},
		{"share without its id", func(*Event) {}, KindShare, "engine_request_id: must not be empty"},
		{"share's id over the value bound", func(ev *Event) { ev.EngineRequestID = strings.Repeat("r", 257) }, KindShare, "engine_request_id: 257 bytes, limit is 256"},
		{"share's id at the bound", func(ev *Event) { ev.EngineRequestID = strings.Repeat("é", 128) }, KindShare, ""},
		{"share's negative part", func(ev *Event) {
			ev.EngineRequestID, ev.EngineTimeDecodeNs, ev.HasEngineTime = "r", -1, true
		}, KindShare, "engine_time_decode_ns: must not be negative, got -1"},
		{"share's negative energy", func(ev *Event) {
			ev.EngineRequestID, ev.EnergyMilliJ, ev.HasEnergy = "r", -1, true
		}, KindShare, "energy_mj: must not be negative, got -1"},
		{"move", func(ev *Event) { ev.Engine, ev.Error, ev.Count = "vllm:8000", "engine_stalled", 12 }, KindMove, ""},
		{"move carrying nothing", func(ev *Event) { ev.Count = 0 }, KindMove, ""},
		{"move carrying more than a chunk's cap", func(ev *Event) { ev.Count = MaxCount + 1 }, KindMove, ""},
		{"move's negative count", func(ev *Event) { ev.Count = -1 }, KindMove, "count: must not be negative, got -1"},
		{"move without its session", func(ev *Event) { ev.SessionID = "" }, KindMove, "session_id: must not be empty"},
		{"move without its time", func(ev *Event) { ev.TimeUnixNano = 0 }, KindMove, "time_unix_nano: must be greater than 0"},
		{"too many", func(ev *Event) {
			for i := range 33 {
				ev.Attributes = append(ev.Attributes, Attribute{Key: fmt.Sprint(i)})
			}
		}, KindStart, "attributes: more than 32 entries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := newEvent(tt.kind)
			tt.edit(&ev)
			err := ev.Validate(Limits{})
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tt.want)
			var fe *FieldError
			assert.ErrorAs(t, err, &fe)
		})
	}
	ev := newEvent(KindStart)
	ev.SessionID = "12345"
	ev.Attributes = []Attribute{{"a", "1"}, {"b", "2"}}
	require.EqualError(t, ev.Validate(Limits{MaxSessionIDBytes: 4}), "session_id: 5 bytes, limit is 4")
	ev.SessionID = "1"
	require.EqualError(t, ev.Validate(Limits{MaxAttributes: 1}), "attributes: more than 1 entries")
}

// Values over their bound are cut on a rune boundary, each counted once;
// the fields a kind does not carry are left alone.
func TestCutValues(t *testing.T) {
	long := strings.Repeat("x", 12000)
	ev := newEvent(KindStart)
	ev.Model, ev.Engine, ev.Error = long, "a"+strings.Repeat("é", 200), long
	ev.Attributes = []Attribute{{"tenant", long}, {"short", "s"}}
	assert.Equal(t, 3, ev.CutValues())
	assert.Equal(t, strings.Repeat("x", MaxValueBytes), ev.Model)
	assert.Equal(t, "a"+strings.Repeat("é", 127), ev.Engine, "cut before the rune the bound falls in")
	assert.Equal(t, []Attribute{{"tenant", strings.Repeat("x", MaxValueBytes)}, {"short", "s"}}, ev.Attributes)
	assert.Equal(t, long, ev.Error, "not a start's field")
	assert.Zero(t, ev.CutValues(), "within the bounds now")

	ev = newEvent(KindEnd)
	ev.ResponseModel, ev.FinishReason, ev.Error, ev.Model = long, long, long, long
	assert.Equal(t, 3, ev.CutValues())
	assert.Len(t, ev.ResponseModel, MaxValueBytes)
	assert.Len(t, ev.FinishReason, MaxValueBytes)
	assert.Len(t, ev.Error, MaxErrorTypeBytes)
	assert.Equal(t, long, ev.Model, "not an end's field")

	ev = newEvent(KindShare)
	ev.Engine, ev.Model = long, long
	assert.Equal(t, 1, ev.CutValues())
	assert.Len(t, ev.Engine, MaxValueBytes)
	assert.Equal(t, long, ev.Model, "not a share's field")

	ev = newEvent(KindMove)
	ev.Engine, ev.Error, ev.Model = long, long, long
	assert.Equal(t, 2, ev.CutValues())
	assert.Len(t, ev.Engine, MaxValueBytes)
	assert.Len(t, ev.Error, MaxErrorTypeBytes)
	assert.Equal(t, long, ev.Model, "not a move's field")
}

// A move's line names where the answer went (engine), why (error) and the
// tokens carried (count, written even when 0: a move carries some or none).
func TestAppendJSONMove(t *testing.T) {
	ev := newEvent(KindMove)
	ev.TimeUnixNano, ev.Engine, ev.Error, ev.Count = 1700000000000000000, "vllm:8000", "engine_stalled", 12
	ev.Model, ev.CompletionTokens = "ignored", 3
	assert.Equal(t, `{"event":"move","session_id":"s","time_unix_nano":1700000000000000000,"engine":"vllm:8000","error":"engine_stalled","count":12}`+"\n",
		string(AppendJSON(nil, &ev)))
	ev.Count = 0
	assert.Contains(t, string(AppendJSON(nil, &ev)), `,"count":0}`)
}

// A share's line names the request by engine_request_id, not session_id,
// and carries the engine and its parts as given.
func TestAppendJSONShare(t *testing.T) {
	ev := newEvent(KindShare)
	ev.SessionID, ev.EngineRequestID, ev.TimeUnixNano, ev.Engine = "ignored", "cmpl-7-0a1b2c3d", 1700000000000000000, "vllm-0"
	ev.EngineTimePrefillNs, ev.EngineTimeDecodeNs, ev.HasEngineTime = 1200, 3400, true
	assert.Equal(t, `{"event":"share","engine_request_id":"cmpl-7-0a1b2c3d","time_unix_nano":1700000000000000000,"engine":"vllm-0","engine_time_prefill_ns":1200,"engine_time_decode_ns":3400}`+"\n",
		string(AppendJSON(nil, &ev)))
	ev.EnergyMilliJ, ev.HasEnergy = 56, true
	assert.Contains(t, string(AppendJSON(nil, &ev)), `,"energy_mj":56}`)
}

// An error quotes at most 64 bytes of what it names, then "…".
func TestExcerpt(t *testing.T) {
	assert.Empty(t, Excerpt(nil))
	assert.Equal(t, strings.Repeat("a", 64), Excerpt([]byte(strings.Repeat("a", 64))))
	assert.Equal(t, strings.Repeat("a", 64)+"…", Excerpt([]byte(strings.Repeat("a", 65))))
	_, err := CheckOperation(strings.Repeat("x", 100))
	assert.EqualError(t, err, fmt.Sprintf("operation: want chat or text_completion, got %q", strings.Repeat("x", 64)+"…"))
}
