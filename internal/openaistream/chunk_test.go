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
			ChunkFacts{UsageOnly: true, CompletionTokens: 5, PromptTokens: 10, Timing: RequestTiming{QueueMs: 10.5, PrefillMs: 50, DecodeMs: 200}},
			true,
		},
		{
			"per-request metrics, some null", `{"choices":[],"usage":{"completion_tokens":1},"metrics":{"queue_time_ms":null,"time_to_first_token_ms":3,"generation_time_ms":-4}}`,
			ChunkFacts{UsageOnly: true, CompletionTokens: 1, PromptTokens: -1, Timing: RequestTiming{QueueMs: -1, PrefillMs: 3, DecodeMs: -1}},
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
	if m := c.Metrics; m != nil {
		for _, p := range [...]struct {
			v   *float64
			dst *float64
		}{{m.QueueTimeMs, &f.Timing.QueueMs}, {m.TimeToFirstTokenMs, &f.Timing.PrefillMs}, {m.GenerationTimeMs, &f.Timing.DecodeMs}} {
			if p.v != nil && *p.v >= 0 {
				*p.dst = *p.v
			}
		}
	}
	return f, true
}

// chunkKeys are the keys the walker reads.
var chunkKeys = []string{
	"choices", "usage", "completion_tokens", "prompt_tokens", "text", "tool_calls",
	"finish_reason", "delta", "content", "reasoning", "reasoning_content", "error", "type", "code",
	"metrics", "queue_time_ms", "time_to_first_token_ms", "generation_time_ms",
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

func fixtureChunks(tb testing.TB) [][]byte {
	raw, err := os.ReadFile("../../testdata/fixtures/vllm/sse-streams.txt")
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
	for _, c := range fixtureChunks(t) {
		want, wantOK := referenceInspect(c)
		got, ok := InspectChunk(c)
		assert.Equal(t, wantOK, ok, "%s", c)
		assert.Equal(t, want, got, "%s", c)
	}
}

func FuzzInspectChunk(f *testing.F) {
	for _, c := range fixtureChunks(f) {
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
