// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package openaistream reads the traffic of an OpenAI-compatible server
// (/v1/chat/completions, /v1/completions) as the token_stream receiver's
// proxy relays it: the request body on its way to the upstream (model,
// stream, and usage reporting added when the client did not ask for it) and
// each chunk of the response (content, finish reason, token counts).
//
// Both readers walk the bytes without decoding them into values: they run
// once per request byte and once per streamed token, and never copy prompt
// or completion text.
package openaistream // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// ChunkFacts is what one chat.completion.chunk or text_completion chunk of
// an OpenAI-compatible stream (or a whole non-streaming response) means for
// the session.
type ChunkFacts struct {
	// Content: the chunk carries text, reasoning or a tool call delta (the
	// role-only first chunk and an empty finish chunk do not).
	Content bool
	// UsageOnly: the final usage chunk, with no choices.
	UsageOnly bool
	// CompletionTokens and PromptTokens from usage, else from llama.cpp's
	// timings (predicted_n; prompt_n + cache_n), -1 when absent.
	CompletionTokens, PromptTokens int64
	FinishReason                   string
	// ErrorType is set when the payload is an error object, as vLLM sends
	// one inside a 200 stream when generation fails (`data: {"error":
	// {"message":…,"type":…,"code":…}}`, then [DONE]): the error's type,
	// else its code, else EngineError.
	ErrorType string
	// Timing is the engine's own timing of the request, when the payload
	// has it (vLLM's "metrics" object, llama.cpp's "timings").
	Timing RequestTiming
}

// RequestTiming is the engine's own timing of a request, in ms, from one of
// two objects (a field the engine did not give is -1):
//
//   - vLLM's per-request metrics (PerRequestTimingMetrics,
//     `--enable-per-request-metrics`, vLLM v0.25.0, PR #46768): a top-level
//     "metrics" member of a whole response, and of the final usage chunk of
//     a stream. queue_time_ms from queued to scheduled,
//     time_to_first_token_ms from scheduled to the first token (so, prefill:
//     not the client's TTFT), generation_time_ms from the first token to the
//     last. Source tokenevent.TimingResponse.
//   - llama.cpp's "timings" (server_slot_stats::to_json in tools/server at
//     v0.5.0, result_timings before): on the last chunk of a stream (and
//     with timings_per_token on every chunk, so far), and in a whole
//     response. prompt_ms from the start of the prompt's processing to the
//     first token, predicted_ms from the first token to the last. It has no
//     queue time: QueueMs is -1. Source tokenevent.TimingLlamaCpp.
//
// vLLM's wins when a payload has both: its queue is the engine's own.
type RequestTiming struct {
	QueueMs, PrefillMs, DecodeMs float64
	// Source is the object it was read from, as the end event names it
	// (tokenevent.TimingResponse, tokenevent.TimingLlamaCpp); "" for none.
	Source string
}

// Known reports whether t holds any of the times.
func (t RequestTiming) Known() bool { return t.QueueMs >= 0 || t.PrefillMs >= 0 || t.DecodeMs >= 0 }

// noTiming is the RequestTiming of a payload without one.
var noTiming = RequestTiming{QueueMs: -1, PrefillMs: -1, DecodeMs: -1}

// EngineError is the ErrorType of an error object that names no type or
// code.
const EngineError = "engine_error"

// maxErrorTypeBytes bounds an error type taken from the upstream: a rune
// over tokenevent.MaxErrorTypeBytes, as maxModelBytes.
const maxErrorTypeBytes = tokenevent.MaxErrorTypeBytes + utf8.UTFMax

var doneData = []byte("[DONE]")

// IsDone reports whether an SSE data payload is the [DONE] marker that ends
// a stream whose generation is whole.
func IsDone(data []byte) bool { return bytes.Equal(data, doneData) }

// InspectChunk reads one SSE data payload. ok is false when it is not a
// chunk (the [DONE] marker, or not a JSON object).
//
// It walks the JSON without decoding it: a chunk passes through the proxy
// once per token, and encoding/json cost several µs and a dozen allocations
// per chunk (see BenchmarkInspectChunk, and the token_stream receiver's
// BenchmarkProxyRelayEvent for the whole relay). Text is only ever tested for
// emptiness; it is not copied anywhere. TestInspectChunkMatchesEncodingJSON
// and FuzzInspectChunk hold it to encoding/json's reading of valid input.
func InspectChunk(data []byte) (f ChunkFacts, ok bool) {
	f.CompletionTokens, f.PromptTokens, f.Timing = -1, -1, noTiming
	if bytes.Equal(bytes.TrimSpace(data), doneData) {
		return f, false
	}
	s := jsonWalker{b: data}
	if s.null() && s.end() {
		return f, true
	}
	choices, hasUsage := 0, false
	// llama.cpp's timings, kept apart until vLLM's metrics had their say.
	llama := noTiming
	promptN, cacheN, predictedN := int64(-1), int64(-1), int64(-1)
	ok = s.object(func(key []byte) bool {
		switch string(key) {
		case "choices":
			return s.null() || s.array(func() bool {
				choices++
				return s.choice(&f)
			})
		case "error":
			return s.null() || s.errorObject(&f)
		case "metrics":
			return s.null() || s.object(func(key []byte) bool {
				switch string(key) {
				case "queue_time_ms":
					return s.optionalFloat(&f.Timing.QueueMs)
				case "time_to_first_token_ms":
					return s.optionalFloat(&f.Timing.PrefillMs)
				case "generation_time_ms":
					return s.optionalFloat(&f.Timing.DecodeMs)
				}
				return s.skip()
			})
		case "timings":
			return s.null() || s.object(func(key []byte) bool {
				switch string(key) {
				case "prompt_ms":
					return s.optionalFloat(&llama.PrefillMs)
				case "predicted_ms":
					return s.optionalFloat(&llama.DecodeMs)
				case "prompt_n":
					return s.optionalInt(&promptN)
				case "cache_n":
					return s.optionalInt(&cacheN)
				case "predicted_n":
					return s.optionalInt(&predictedN)
				}
				return s.skip()
			})
		case "usage":
			if s.null() {
				return true
			}
			hasUsage = true
			return s.object(func(key []byte) bool {
				switch string(key) {
				case "completion_tokens":
					return s.optionalInt(&f.CompletionTokens)
				case "prompt_tokens":
					return s.optionalInt(&f.PromptTokens)
				}
				return s.skip()
			})
		}
		return s.skip()
	})
	if !ok || !s.end() {
		return ChunkFacts{CompletionTokens: -1, PromptTokens: -1, Timing: noTiming}, false
	}
	f.UsageOnly = hasUsage && choices == 0
	switch {
	case f.Timing.Known():
		f.Timing.Source = tokenevent.TimingResponse
	case llama.Known():
		f.Timing, f.Timing.Source = llama, tokenevent.TimingLlamaCpp
	}
	if f.CompletionTokens < 0 && predictedN >= 0 {
		f.CompletionTokens = predictedN
	}
	if f.PromptTokens < 0 && promptN >= 0 && cacheN >= 0 {
		f.PromptTokens = promptN + cacheN
	}
	return f, true
}

// UsageMember locates the top-level "usage" member of data, a JSON object,
// with the comma that separates it from the member beside it: data[:from] followed
// by data[to:] is the same object without it, every other byte as it was.
// extras reports whether data has a top-level member, not null, beyond
// usage, choices and the ones every chunk of a stream carries (id, object,
// created, model, system_fingerprint, service_tier, obfuscation): llama.cpp's
// timings, vLLM's metrics, an error. A usage chunk (no choices) without
// extras holds nothing but the usage. ok is false when data is not one object with
// exactly one "usage" member.
//
// The proxy asks it of a usage chunk it asked for, once per stream; every
// other chunk goes through InspectChunk alone.
func UsageMember(data []byte) (from, to int, extras, ok bool) {
	s := jsonWalker{b: data}
	n := 0
	whole := s.object(func(key []byte) bool {
		if string(key) == "usage" {
			n++
			from = s.offset(key) - 1 // the key's opening quote
			read := s.skip()
			to = s.i
			return read
		}
		if everyChunkCarries(key) {
			return s.skip()
		}
		if s.null() {
			return true
		}
		extras = true
		return s.skip()
	})
	if !whole || !s.end() || n != 1 {
		return 0, 0, false, false
	}
	// The comma before it (and what lies between), else the one after it
	// (and the blanks up to the next key).
	before := from - 1
	for isJSONSpace(data[before]) {
		before--
	}
	if data[before] == ',' {
		return before, to, extras, true
	}
	after := skipJSONSpace(data, to)
	if data[after] == ',' {
		return from, skipJSONSpace(data, after+1), extras, true
	}
	return from, to, extras, true
}

// everyChunkCarries reports whether key names a member every chunk of a
// stream carries, or choices (a usage chunk has none): what UsageMember
// does not count as extras.
func everyChunkCarries(key []byte) bool {
	switch string(key) {
	case "id", "object", "created", "model", "system_fingerprint", "service_tier", "obfuscation", "choices":
		return true
	}
	return false
}

// FoldExtras appends to dst finish, a chunk's JSON object, with the extras
// of usage (the usage chunk after it, as UsageMember counts them) added
// before its closing brace, each member as the engine wrote it and in its
// order. That is where an engine puts them when it is not asked for usage:
// llama.cpp puts its timings on the last chunk of a stream, the usage chunk
// when there is one, else the finish chunk (tools/server/server-task.cpp
// at v0.5.0, to_json_oaicompat_chat_stream), so the fold gives the bytes
// the client would have had straight from it. ok is false, and dst is
// returned as it was, when either is not one JSON object, usage has not
// exactly one "usage" member or no extras, or finish already has a member
// of one of their names.
func FoldExtras(dst, finish, usage []byte) (out []byte, ok bool) {
	type member struct{ key, text []byte }
	var extras []member
	usages := 0
	u := jsonWalker{b: usage}
	whole := u.object(func(key []byte) bool {
		if string(key) == "usage" {
			usages++
		}
		if string(key) == "usage" || everyChunkCarries(key) {
			return u.skip()
		}
		if u.null() {
			return true
		}
		from := u.offset(key) - 1
		read := u.skip()
		extras = append(extras, member{key, usage[from:u.i]})
		return read
	})
	if !whole || !u.end() || usages != 1 || len(extras) == 0 {
		return dst, false
	}
	f := jsonWalker{b: finish}
	members := 0
	clash := false
	whole = f.object(func(key []byte) bool {
		members++
		for _, m := range extras {
			clash = clash || bytes.Equal(m.key, key)
		}
		return f.skip()
	})
	if !whole || !f.end() || clash {
		return dst, false
	}
	closing := bytes.LastIndexByte(finish, '}')
	out = dst
	out = append(out, finish[:closing]...)
	for i, m := range extras {
		if i > 0 || members > 0 {
			out = append(out, ',')
		}
		out = append(out, m.text...)
	}
	return append(out, finish[closing:]...), true
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	return i
}

// errorObject reads a non-null "error" member: an object with type and
// code (either may be absent), or any other value.
func (s *jsonWalker) errorObject(f *ChunkFacts) bool {
	var typ, code []byte
	s.ws()
	if s.peek() != '{' {
		f.ErrorType = EngineError
		return s.skip()
	}
	ok := s.object(func(key []byte) bool {
		switch string(key) {
		case "type", "code":
			s.ws()
			var v []byte
			var ok bool
			switch s.peek() {
			case '"':
				v, ok = s.str()
			case 'n':
				return s.null()
			default:
				start := s.i
				if ok = s.skip(); ok {
					v = s.b[start:s.i]
				}
			}
			if string(key) == "type" {
				typ = v
			} else {
				code = v
			}
			return ok
		}
		return s.skip()
	})
	switch {
	case len(typ) > 0:
		f.ErrorType = DecodeString(typ, maxErrorTypeBytes)
	case len(code) > 0:
		f.ErrorType = DecodeString(code, maxErrorTypeBytes)
	}
	if f.ErrorType == "" {
		f.ErrorType = EngineError
	}
	return ok
}

// choice reads one element of choices.
func (s *jsonWalker) choice(f *ChunkFacts) bool {
	return s.null() || s.object(func(key []byte) bool {
		switch string(key) {
		case "text":
			return s.nonEmptyString(&f.Content)
		case "tool_calls":
			return s.nonEmptyToolCalls(&f.Content)
		case "finish_reason":
			if s.null() {
				return true
			}
			v, ok := s.str()
			if ok && len(v) > 0 {
				f.FinishReason = finishReasonString(v)
			}
			return ok
		case "delta":
			return s.null() || s.object(func(key []byte) bool {
				switch string(key) {
				case "content", "reasoning", "reasoning_content":
					return s.nonEmptyString(&f.Content)
				case "tool_calls":
					return s.nonEmptyToolCalls(&f.Content)
				}
				return s.skip()
			})
		}
		return s.skip()
	})
}

// finishReasonString interns the common finish reasons.
func finishReasonString(v []byte) string {
	switch string(v) {
	case "stop":
		return "stop"
	case "length":
		return "length"
	case "tool_calls":
		return "tool_calls"
	case "abort":
		return "abort"
	}
	if bytes.IndexByte(v, '\\') >= 0 {
		var decoded string
		if err := json.Unmarshal(append(append([]byte{'"'}, v...), '"'), &decoded); err == nil {
			return decoded
		}
	}
	return string(v)
}

// nonEmptyString reads a string or null, setting *found for a non-empty one.
func (s *jsonWalker) nonEmptyString(found *bool) bool {
	if s.null() {
		return true
	}
	v, ok := s.str()
	if ok && len(v) > 0 {
		*found = true
	}
	return ok
}

// nonEmptyToolCalls reads tool_calls, setting *found unless it is null or [].
func (s *jsonWalker) nonEmptyToolCalls(found *bool) bool {
	if s.null() {
		return true
	}
	s.ws()
	start := s.i
	if !s.skip() {
		return false
	}
	v := s.b[start:s.i]
	empty := len(v) >= 2 && v[0] == '[' && len(bytes.TrimSpace(v[1:len(v)-1])) == 0
	if !empty {
		*found = true
	}
	return true
}

// optionalFloat reads a number into dst, leaving it for null; a number
// that does not parse, or is negative, leaves it too (a time that cannot
// be right is no time).
func (s *jsonWalker) optionalFloat(dst *float64) bool {
	if s.null() {
		return true
	}
	v, ok := s.number()
	if !ok {
		return false
	}
	if x, err := strconv.ParseFloat(string(v), 64); err == nil && x >= 0 {
		*dst = x
	}
	return true
}

// ResponseModel returns the top-level "model" of a chunk or response, the
// model that answered: decoded, valid UTF-8, at most maxModelBytes (the
// proxy cuts it to tokenevent.MaxValueBytes); "" when
// it has none. The proxy asks once per session, of its first chunk.
func ResponseModel(data []byte) string {
	s := jsonWalker{b: data}
	var model string
	s.object(func(key []byte) bool {
		if string(key) != "model" {
			return s.skip()
		}
		s.ws()
		if s.peek() != '"' {
			return s.skip()
		}
		raw, ok := s.str()
		if ok {
			model = DecodeString(raw, maxModelBytes)
		}
		return ok
	})
	return model
}

func (s *jsonWalker) optionalInt(dst *int64) bool {
	if s.null() {
		return true
	}
	v, ok := s.number()
	if !ok {
		return false
	}
	if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
		*dst = n
	}
	return true
}

// TopLevelMembers calls visit for each top-level member of the JSON object
// data, with its key as written (without its quotes) and where its value
// lies: data[from:to]. ok is false when data is not one JSON object. The
// proxy asks it only of the chunks of a migrated stream (to give them the
// first stream's id) and of their first stream's first chunk.
func TopLevelMembers(data []byte, visit func(key []byte, from, to int)) bool {
	s := jsonWalker{b: data}
	whole := s.object(func(key []byte) bool {
		s.ws()
		from := s.i
		if !s.skip() {
			return false
		}
		visit(key, from, s.i)
		return true
	})
	return whole && s.end()
}
