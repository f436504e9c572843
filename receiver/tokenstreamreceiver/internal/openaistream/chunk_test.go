// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package openaistream

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

func TestInspectChunk(t *testing.T) {
	tests := []struct {
		name string
		data string
		want ChunkFacts
		ok   bool
	}{
		{
			"role chunk", `{"id":"chatcmpl-3f","object":"chat.completion.chunk","created":1754000123,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
			ChunkFacts{CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"content", `{"id":"chatcmpl-3f","object":"chat.completion.chunk","created":1754000123,"model":"m","choices":[{"index":0,"delta":{"content":"The"},"logprobs":null,"finish_reason":null}]}`,
			ChunkFacts{Content: true, CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"reasoning", `{"choices":[{"index":0,"delta":{"reasoning_content":"Let me think"}}]}`,
			ChunkFacts{Content: true, CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"tool call", `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`,
			ChunkFacts{Content: true, CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"EOS finish chunk", `{"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`,
			ChunkFacts{FinishReason: "stop", CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"usage chunk", `{"id":"chatcmpl-3f","object":"chat.completion.chunk","created":1754000123,"model":"m","choices":[],"usage":{"prompt_tokens":42,"total_tokens":50,"completion_tokens":8}}`,
			ChunkFacts{UsageOnly: true, CompletionTokens: 8, PromptTokens: 42, Timing: noTiming},
			true,
		},
		{
			"completions text with usage null", `{"id":"cmpl-9d","object":"text_completion","created":1754000200,"model":"m","choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
			ChunkFacts{Content: true, CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"completions last token", `{"choices":[{"index":0,"text":" It","finish_reason":"length"}],"usage":null}`,
			ChunkFacts{Content: true, FinishReason: "length", CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"continuous usage on a content chunk", `{"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`,
			ChunkFacts{Content: true, CompletionTokens: 1, PromptTokens: 5, Timing: noTiming},
			true,
		},
		{
			"empty tool calls", `{"choices":[{"delta":{"tool_calls":[ ]},"tool_calls":null}]}`,
			ChunkFacts{CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"escaped finish reason", `{"choices":[{"finish_reason":"st\u006fp"}]}`,
			ChunkFacts{FinishReason: "stop", CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"vLLM engine error", `{"error": {"object": "error", "message": "CUDA out of memory", "type": "InternalServerError", "param": null, "code": 500}}`,
			ChunkFacts{ErrorType: "InternalServerError", CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"error code only", `{"error":{"message":"m","type":null,"code":"context_length_exceeded"}}`,
			ChunkFacts{ErrorType: "context_length_exceeded", CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"error numeric code", `{"error":{"code":503}}`,
			ChunkFacts{ErrorType: "503", CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"error string", `{"error":"boom"}`,
			ChunkFacts{ErrorType: EngineError, CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"error null", `{"error":null,"choices":[]}`,
			ChunkFacts{CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		{
			"error type escaped and long", `{"error":{"type":"\u00e9` + strings.Repeat("é", 40) + `"}}`,
			// maxErrorTypeBytes (68): the proxy cuts it to 64.
			ChunkFacts{ErrorType: strings.Repeat("é", 34), CompletionTokens: -1, PromptTokens: -1, Timing: noTiming},
			true,
		},
		// vLLM's per-request metrics (--enable-per-request-metrics, v0.25.0)
		// on the final usage chunk of a stream: ms, measured in the engine.
		{
			"per-request metrics", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":10,"total_tokens":15,"completion_tokens":5},"metrics":{"time_to_first_token_ms":50.0,"generation_time_ms":200.0,"queue_time_ms":10.5,"mean_itl_ms":50.0,"tokens_per_second":20.0}}`,
			ChunkFacts{UsageOnly: true, CompletionTokens: 5, PromptTokens: 10, Timing: RequestTiming{QueueMs: 10.5, PrefillMs: 50, DecodeMs: 200, Source: tokenevent.TimingResponse}},
			true,
		},
		{
			"per-request metrics, some null", `{"choices":[],"usage":{"completion_tokens":1},"metrics":{"queue_time_ms":null,"time_to_first_token_ms":3,"generation_time_ms":-4}}`,
			ChunkFacts{UsageOnly: true, CompletionTokens: 1, PromptTokens: -1, Timing: RequestTiming{QueueMs: -1, PrefillMs: 3, DecodeMs: -1, Source: tokenevent.TimingResponse}},
			true,
		},
		// llama.cpp's timings (testdata/fixtures/llamacpp): prefill and decode,
		// no queue; its token counts stand in for usage when there is none.
		{
			"llama.cpp finish chunk", `{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1,"id":"chatcmpl-J","model":"m","system_fingerprint":"b1-de3ff81","object":"chat.completion.chunk","timings":{"cache_n":2,"prompt_n":10,"prompt_ms":106.123,"prompt_per_token_ms":10.6,"prompt_per_second":94.2,"predicted_n":4,"predicted_ms":9.6,"predicted_per_token_ms":3.2,"predicted_per_second":312.5}}`,
			ChunkFacts{FinishReason: "length", CompletionTokens: 4, PromptTokens: 12, Timing: RequestTiming{QueueMs: -1, PrefillMs: 106.123, DecodeMs: 9.6, Source: tokenevent.TimingLlamaCpp}},
			true,
		},
		{
			"llama.cpp usage chunk: usage wins", `{"choices":[],"object":"chat.completion.chunk","usage":{"completion_tokens":5,"prompt_tokens":13,"total_tokens":18},"timings":{"cache_n":0,"prompt_n":12,"prompt_ms":1.5,"predicted_n":4,"predicted_ms":2}}`,
			ChunkFacts{UsageOnly: true, CompletionTokens: 5, PromptTokens: 13, Timing: RequestTiming{QueueMs: -1, PrefillMs: 1.5, DecodeMs: 2, Source: tokenevent.TimingLlamaCpp}},
			true,
		},
		{
			"older llama.cpp timings: no cache_n, no prompt count", `{"choices":[],"timings":{"prompt_n":12,"prompt_ms":98.4,"predicted_n":5,"predicted_ms":30.1}}`,
			ChunkFacts{CompletionTokens: 5, PromptTokens: -1, Timing: RequestTiming{QueueMs: -1, PrefillMs: 98.4, DecodeMs: 30.1, Source: tokenevent.TimingLlamaCpp}},
			true,
		},
		{
			"vLLM's metrics win over timings", `{"choices":[],"timings":{"prompt_ms":1},"metrics":{"queue_time_ms":2}}`,
			ChunkFacts{CompletionTokens: -1, PromptTokens: -1, Timing: RequestTiming{QueueMs: 2, PrefillMs: -1, DecodeMs: -1, Source: tokenevent.TimingResponse}},
			true,
		},
		{"done", `[DONE]`, ChunkFacts{CompletionTokens: -1, PromptTokens: -1, Timing: noTiming}, false},
		{"malformed", `{"choices":[`, ChunkFacts{CompletionTokens: -1, PromptTokens: -1, Timing: noTiming}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := InspectChunk([]byte(tt.data))
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

// referenceChunk reads a chunk with encoding/json: the meaning the walker
// in InspectChunk must agree with.
type referenceChunk struct {
	Choices []struct {
		Delta *struct {
			Content          *string         `json:"content"`
			Reasoning        *string         `json:"reasoning"`
			ReasoningContent *string         `json:"reasoning_content"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text         *string         `json:"text"`
		FinishReason *string         `json:"finish_reason"`
		ToolCalls    json.RawMessage `json:"tool_calls"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     *int64 `json:"prompt_tokens"`
		CompletionTokens *int64 `json:"completion_tokens"`
	} `json:"usage"`
	Error   json.RawMessage `json:"error"`
	Metrics *struct {
		QueueTimeMs        *float64 `json:"queue_time_ms"`
		TimeToFirstTokenMs *float64 `json:"time_to_first_token_ms"`
		GenerationTimeMs   *float64 `json:"generation_time_ms"`
	} `json:"metrics"`
	Timings *struct {
		PromptMs    *float64 `json:"prompt_ms"`
		PredictedMs *float64 `json:"predicted_ms"`
		PromptN     *int64   `json:"prompt_n"`
		CacheN      *int64   `json:"cache_n"`
		PredictedN  *int64   `json:"predicted_n"`
	} `json:"timings"`
}

// envelopeKeys are the members every chunk of a stream carries.
var envelopeKeys = map[string]bool{
	"id": true, "object": true, "created": true, "model": true, "system_fingerprint": true,
	"service_tier": true, "obfuscation": true, "choices": true, "usage": true,
}

// referenceExtras reports whether the object data has a member, not null,
// beyond the envelope, choices and usage.
func referenceExtras(data []byte) bool {
	var members map[string]json.RawMessage
	if json.Unmarshal(data, &members) != nil {
		return false
	}
	for k, v := range members {
		if !envelopeKeys[k] && !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			return true
		}
	}
	return false
}

// referenceErrorType is the ErrorType of an "error" member's raw value.
func referenceErrorType(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return ""
	}
	var obj map[string]json.RawMessage
	if t[0] != '{' || json.Unmarshal(t, &obj) != nil {
		return EngineError
	}
	text := func(v json.RawMessage) string {
		var s string
		if json.Unmarshal(v, &s) == nil {
			return cutRunes(s, maxErrorTypeBytes)
		}
		if bytes.Equal(v, []byte("null")) {
			return ""
		}
		return cutRunes(string(v), maxErrorTypeBytes)
	}
	if v := text(obj["type"]); v != "" {
		return v
	}
	if v := text(obj["code"]); v != "" {
		return v
	}
	return EngineError
}

// cutRunes cuts s to at most n bytes on a rune boundary.
func cutRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func referenceInspect(data []byte) (ChunkFacts, bool) {
	f := ChunkFacts{CompletionTokens: -1, PromptTokens: -1, Timing: noTiming}
	if bytes.Equal(bytes.TrimSpace(data), doneData) {
		return f, false
	}
	var c referenceChunk
	if err := json.Unmarshal(data, &c); err != nil || nestingDepth(data) > maxJSONDepth {
		return f, false
	}
	nonEmpty := func(s *string) bool { return s != nil && *s != "" }
	toolCalls := func(raw json.RawMessage) bool {
		t := bytes.TrimSpace(raw)
		if len(t) == 0 || bytes.Equal(t, []byte("null")) {
			return false
		}
		return t[0] != '[' || len(bytes.TrimSpace(t[1:len(t)-1])) != 0
	}
	for _, ch := range c.Choices {
		if nonEmpty(ch.FinishReason) {
			f.FinishReason = *ch.FinishReason
		}
		if nonEmpty(ch.Text) || toolCalls(ch.ToolCalls) {
			f.Content = true
		}
		if d := ch.Delta; d != nil && (nonEmpty(d.Content) || nonEmpty(d.Reasoning) || nonEmpty(d.ReasoningContent) || toolCalls(d.ToolCalls)) {
			f.Content = true
		}
	}
	if c.Usage != nil {
		if c.Usage.CompletionTokens != nil {
			f.CompletionTokens = *c.Usage.CompletionTokens
		}
		if c.Usage.PromptTokens != nil {
			f.PromptTokens = *c.Usage.PromptTokens
		}
		f.UsageOnly = len(c.Choices) == 0
	}
	f.ErrorType = referenceErrorType(c.Error)
	ms := func(v *float64, dst *float64) {
		if v != nil && *v >= 0 {
			*dst = *v
		}
	}
	if m := c.Metrics; m != nil {
		ms(m.QueueTimeMs, &f.Timing.QueueMs)
		ms(m.TimeToFirstTokenMs, &f.Timing.PrefillMs)
		ms(m.GenerationTimeMs, &f.Timing.DecodeMs)
		if f.Timing.Known() {
			f.Timing.Source = tokenevent.TimingResponse
		}
	}
	if tm := c.Timings; tm != nil {
		if !f.Timing.Known() {
			ms(tm.PromptMs, &f.Timing.PrefillMs)
			ms(tm.PredictedMs, &f.Timing.DecodeMs)
			if f.Timing.Known() {
				f.Timing.Source = tokenevent.TimingLlamaCpp
			}
		}
		if f.CompletionTokens < 0 && tm.PredictedN != nil && *tm.PredictedN >= 0 {
			f.CompletionTokens = *tm.PredictedN
		}
		if f.PromptTokens < 0 && tm.PromptN != nil && tm.CacheN != nil && *tm.PromptN >= 0 && *tm.CacheN >= 0 {
			f.PromptTokens = *tm.PromptN + *tm.CacheN
		}
	}
	return f, true
}

// chunkKeys are the keys the walker reads.
var chunkKeys = []string{
	"choices", "usage", "completion_tokens", "prompt_tokens", "text", "tool_calls",
	"finish_reason", "delta", "content", "reasoning", "reasoning_content", "error", "type", "code",
	"metrics", "queue_time_ms", "time_to_first_token_ms", "generation_time_ms",
	"timings", "prompt_ms", "predicted_ms", "prompt_n", "cache_n", "predicted_n",
	"id", "object", "created", "model", "system_fingerprint", "service_tier", "obfuscation",
}

// readsDifferently reports whether valid JSON is read differently by
// encoding/json and by the walker, which are both right about it: a
// repeated key (encoding/json keeps the last, the walker reads all) or a key
// that differs from a chunk key only in case (encoding/json matches it,
// the wire format does not).
func readsDifferently(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		keys     map[string]bool
		isObject bool
		wantKey  bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF || err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.isObject && top.wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].isObject {
					stack[len(stack)-1].wantKey = true
				}
				continue
			}
			k := tok.(string)
			if top.keys[k] {
				return true
			}
			for _, ck := range chunkKeys {
				if k != ck && strings.EqualFold(k, ck) {
					return true
				}
			}
			top.keys[k] = true
			top.wantKey = false
			continue
		}
		switch d, _ := tok.(json.Delim); d {
		case '{':
			stack = append(stack, &frame{keys: map[string]bool{}, isObject: true, wantKey: true})
			continue
		case '[':
			stack = append(stack, &frame{})
			continue
		case ']':
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].isObject {
			stack[len(stack)-1].wantKey = true
		}
	}
}

// fixtureChunks are the data of every event of the vLLM fixture's streams.
func fixtureChunks(tb testing.TB) [][]byte {
	return readFixtureChunks(tb, "../../../../testdata/fixtures/vllm/sse-streams.txt")
}

// llamaCppChunks are those of the llama.cpp fixture's streams.
func llamaCppChunks(tb testing.TB) [][]byte {
	return readFixtureChunks(tb, "../../../../testdata/fixtures/llamacpp/sse-streams.txt")
}

func readFixtureChunks(tb testing.TB, path string) [][]byte {
	raw, err := os.ReadFile(path)
	require.NoError(tb, err)
	var out [][]byte
	for _, line := range strings.Split(string(raw), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, []byte(d))
		}
	}
	return out
}

func TestInspectChunkMatchesEncodingJSON(t *testing.T) {
	for _, c := range append(fixtureChunks(t), llamaCppChunks(t)...) {
		want, wantOK := referenceInspect(c)
		got, ok := InspectChunk(c)
		assert.Equal(t, wantOK, ok, "%s", c)
		assert.Equal(t, want, got, "%s", c)
	}
}

func FuzzInspectChunk(f *testing.F) {
	for _, c := range append(fixtureChunks(f), llamaCppChunks(f)...) {
		f.Add(c)
	}
	f.Add([]byte(`{"choices":[{"delta":{"tool_calls":[{"index":0}]}}],"usage":{"completion_tokens":3}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := InspectChunk(data)
		want, wantOK := referenceInspect(data)
		if wantOK && !ok {
			t.Fatalf("encoding/json reads %q, the walker does not", data)
		}
		// The walker is more lenient (a number where an int was wanted):
		// compare where both read the input by the same rules.
		if wantOK && ok && !readsDifferently(data) && got != want {
			t.Fatalf("%q:\nwalker    %+v\nreference %+v", data, got, want)
		}
	})
}

func TestResponseModel(t *testing.T) {
	assert.Equal(t, "meta-llama/Llama-3.1-8B-Instruct", ResponseModel([]byte(`{"id":"x","choices":[{"delta":{"content":"hi"}}],"model":"meta-llama\/Llama-3.1-8B-Instruct"}`)))
	assert.Empty(t, ResponseModel([]byte(`{"choices":[]}`)))
	assert.Empty(t, ResponseModel([]byte(`{"model":7}`)))
	assert.Empty(t, ResponseModel([]byte(`not json`)))
}

func BenchmarkInspectChunk(b *testing.B) {
	chunk := fixtureChunks(b)[1]
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := InspectChunk(chunk); !ok {
			b.Fatal("not a chunk")
		}
	}
}

// llamaCppStreams are the llama.cpp fixture's streams, each its chunks'
// data up to [DONE]: a chat stream without and with include_usage, a
// completions stream, and an older server's chat stream.
func llamaCppStreams(tb testing.TB) [][][]byte {
	var streams [][][]byte
	var cur [][]byte
	for _, c := range llamaCppChunks(tb) {
		if IsDone(c) {
			streams = append(streams, cur)
			cur = nil
			continue
		}
		cur = append(cur, c)
	}
	require.Len(tb, streams, 4)
	return streams
}

// What llama.cpp's chunks say, as its source writes them (v0.5.0, and
// b5440 for the older server): the engine's prefill and decode from the
// last chunk's timings, wherever that chunk is, and the token counts.
func TestInspectChunkLlamaCpp(t *testing.T) {
	streams := llamaCppStreams(t)
	chatTiming := RequestTiming{QueueMs: -1, PrefillMs: 106.123, DecodeMs: 9.6, Source: tokenevent.TimingLlamaCpp}
	last := func(i int) ChunkFacts {
		f, ok := InspectChunk(streams[i][len(streams[i])-1])
		require.True(t, ok)
		return f
	}
	assert.Equal(t, ChunkFacts{FinishReason: "length", CompletionTokens: 4, PromptTokens: 12, Timing: chatTiming}, last(0),
		"without include_usage: the finish chunk has the timings, and counts from them")
	assert.Equal(t, ChunkFacts{UsageOnly: true, CompletionTokens: 4, PromptTokens: 12, Timing: chatTiming}, last(1),
		"with include_usage: the usage chunk has them, and more than usage")
	assert.Equal(t, ChunkFacts{
		FinishReason: "length", CompletionTokens: 3, PromptTokens: 12,
		Timing: RequestTiming{QueueMs: -1, PrefillMs: 31.874, DecodeMs: 7.05, Source: tokenevent.TimingLlamaCpp},
	}, last(2),
		"completions: the final chunk is a choice with usage and timings")
	assert.Equal(t, ChunkFacts{
		FinishReason: "length", CompletionTokens: 5, PromptTokens: 12,
		Timing: RequestTiming{QueueMs: -1, PrefillMs: 98.412, DecodeMs: 30.112, Source: tokenevent.TimingLlamaCpp},
	}, last(3),
		"b5440: usage and timings on the finish chunk")
	for i, stream := range streams {
		for _, c := range stream[:len(stream)-1] {
			f, ok := InspectChunk(c)
			require.True(t, ok)
			assert.False(t, f.Timing.Known() || f.UsageOnly, "stream %d: %s", i, c)
		}
	}
}

func TestUsageMember(t *testing.T) {
	streams := llamaCppStreams(t)
	llamaUsage := string(streams[1][len(streams[1])-1])
	vllmUsage := `{"id":"chatcmpl-3f","object":"chat.completion.chunk","created":1754000123,"model":"m","choices":[],"usage":{"prompt_tokens":42,"total_tokens":50,"completion_tokens":8}}`
	tests := []struct {
		name, data, want string
		extras           bool
	}{
		{
			"llama.cpp's usage chunk: timings for the client", llamaUsage,
			strings.Replace(llamaUsage, `,"usage":{"completion_tokens":4,"prompt_tokens":12,"total_tokens":16,"prompt_tokens_details":{"cached_tokens":0}}`, "", 1), true,
		},
		{"vLLM's usage chunk: nothing else", vllmUsage, `{"id":"chatcmpl-3f","object":"chat.completion.chunk","created":1754000123,"model":"m","choices":[]}`, false},
		{"vLLM's with its metrics", `{"choices":[],"usage":{},"metrics":{"queue_time_ms":1}}`, `{"choices":[],"metrics":{"queue_time_ms":1}}`, true},
		{
			"OpenAI's, every envelope member", `{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","service_tier":"default","system_fingerprint":"fp","choices":[],"usage":{},"obfuscation":"aB3","timings":null,"other":null}`,
			`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","service_tier":"default","system_fingerprint":"fp","choices":[],"obfuscation":"aB3","timings":null,"other":null}`, false,
		},
		{"an error is for the client", `{"choices":[],"usage":{},"error":{"type":"x"}}`, `{"choices":[],"error":{"type":"x"}}`, true},
		{"a member no engine sends is for the client", `{"usage":{},"x_engine":[]}`, `{"x_engine":[]}`, true},
		{"first member", `{"usage":{"a":1},"timings":{}}`, `{"timings":{}}`, true},
		{"only member", `{"usage":{"a":[1,{"usage":2}]}}`, `{}`, false},
		{"blanks, in the middle", `{ "a" : 1 , "usage" : { "b" : [ 1 ] } , "c" : 2 }`, `{ "a" : 1  , "c" : 2 }`, true},
		{"blanks, first", "{\n  \"usage\": 1,\n  \"b\": 2\n}\n", "{\n  \"b\": 2\n}\n", true},
		{"blanks, last", "{\n  \"b\": 2,\n  \"usage\": null\n}", "{\n  \"b\": 2\n}", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			from, to, extras, ok := UsageMember([]byte(tt.data))
			require.True(t, ok)
			assert.Equal(t, tt.want, tt.data[:from]+tt.data[to:])
			assert.Equal(t, tt.extras, extras)
		})
	}
	for _, data := range []string{
		`{"choices":[]}`, `{"usage":1,"usage":2}`, `{"x":{"usage":1}}`, `[{"usage":1}]`, `{"usage":1} x`, `{"usage":`, `[DONE]`,
	} {
		_, _, _, ok := UsageMember([]byte(data))
		assert.False(t, ok, "%s", data)
	}
}

// FuzzUsageMember holds UsageMember to encoding/json: what is left of a
// valid object is a valid object with the same members but usage, and its
// extras are those encoding/json finds.
func FuzzUsageMember(f *testing.F) {
	for _, c := range append(fixtureChunks(f), llamaCppChunks(f)...) {
		f.Add(c)
	}
	f.Add([]byte("{ \"usage\" :{} ,\"a\":[1]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		from, to, extras, ok := UsageMember(data)
		var before map[string]json.RawMessage
		if json.Unmarshal(data, &before) != nil || nestingDepth(data) > maxJSONDepth {
			return
		}
		if _, has := before["usage"]; !has || readsDifferently(data) {
			return
		}
		if !ok {
			t.Fatalf("%q: encoding/json finds one usage member, UsageMember none", data)
		}
		if want := referenceExtras(data); extras != want {
			t.Fatalf("%q: extras %v, encoding/json finds %v", data, extras, want)
		}
		out := append(append([]byte{}, data[:from]...), data[to:]...)
		var after map[string]json.RawMessage
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("%q without usage is %q: %v", data, out, err)
		}
		delete(before, "usage")
		if len(after) != len(before) {
			t.Fatalf("%q without usage is %q", data, out)
		}
		for k, v := range before {
			if !bytes.Equal(after[k], v) {
				t.Fatalf("%q without usage is %q: %s changed", data, out, k)
			}
		}
	})
}

// FoldExtras gives, from llama.cpp's two chunks of a stream asked for
// usage, the finish chunk of the same stream not asked for it.
func TestFoldExtras(t *testing.T) {
	streams := llamaCppStreams(t)
	plain, withUsage := streams[0], streams[1]
	finish, usage := withUsage[len(withUsage)-2], withUsage[len(withUsage)-1]
	got, ok := FoldExtras([]byte("data: "), finish, usage)
	require.True(t, ok)
	assert.Equal(t, "data: "+string(plain[len(plain)-1]), string(got))

	for _, tt := range []struct{ name, finish, usage, want string }{
		{"in order", `{"a":1}`, `{"choices":[],"usage":{},"x":[1],"n":null,"y":{"z":2}}`, `{"a":1,"x":[1],"y":{"z":2}}`},
		{"blanks kept", "{ \"a\" : 1 }", `{"usage":{}, "x" : 2 }`, "{ \"a\" : 1 ,\"x\" : 2}"},
		{"an empty finish chunk", `{}`, `{"usage":{},"x":2}`, `{"x":2}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := FoldExtras(nil, []byte(tt.finish), []byte(tt.usage))
			require.True(t, ok)
			assert.Equal(t, tt.want, string(got))
			assert.True(t, json.Valid(got))
		})
	}
	for _, tt := range []struct{ name, finish, usage string }{
		{"nothing to fold", `{"a":1}`, `{"choices":[],"usage":{},"id":"x","model":null}`},
		{"the finish chunk has it already", `{"a":1,"timings":{}}`, `{"usage":{},"timings":{"b":2}}`},
		{"two usages", `{"a":1}`, `{"usage":{},"usage":{},"x":1}`},
		{"no usage", `{"a":1}`, `{"x":1}`},
		{"not an object", `[1]`, `{"usage":{},"x":1}`},
		{"malformed", `{"a":1}`, `{"usage":{},"x":1`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := FoldExtras([]byte("kept"), []byte(tt.finish), []byte(tt.usage))
			assert.False(t, ok)
			assert.Equal(t, "kept", string(got))
		})
	}
}

// TopLevelMembers gives each top-level member's value span, nested ones
// and whitespace left alone, and refuses what is not one object.
func TestTopLevelMembers(t *testing.T) {
	data := []byte(` { "id" : "chatcmpl-1", "choices":[{"id":"inner"}], "created":17 ,"usage":null } `)
	got := map[string]string{}
	require.True(t, TopLevelMembers(data, func(key []byte, from, to int) { got[string(key)] = string(data[from:to]) }))
	assert.Equal(t, map[string]string{"id": `"chatcmpl-1"`, "choices": `[{"id":"inner"}]`, "created": "17", "usage": "null"}, got)
	for _, bad := range []string{``, `[]`, `{"a":1} {}`, `{"a":}`, `"x"`} {
		assert.False(t, TopLevelMembers([]byte(bad), func([]byte, int, int) {}), bad)
	}
}
