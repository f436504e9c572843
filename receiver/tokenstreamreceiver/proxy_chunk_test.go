package tokenstreamreceiver

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestInspectChunk(t *testing.T) {
	tests := []struct {
		name string
		data string
		want chunkFacts
		ok   bool
	}{
		{"role chunk", `{"id":"chatcmpl-3f","object":"chat.completion.chunk","created":1754000123,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
			chunkFacts{completionTokens: -1, promptTokens: -1}, true},
		{"content", `{"id":"chatcmpl-3f","object":"chat.completion.chunk","created":1754000123,"model":"m","choices":[{"index":0,"delta":{"content":"The"},"logprobs":null,"finish_reason":null}]}`,
			chunkFacts{content: true, completionTokens: -1, promptTokens: -1}, true},
		{"reasoning", `{"choices":[{"index":0,"delta":{"reasoning_content":"Let me think"}}]}`,
			chunkFacts{content: true, completionTokens: -1, promptTokens: -1}, true},
		{"tool call", `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`,
			chunkFacts{content: true, completionTokens: -1, promptTokens: -1}, true},
		{"EOS finish chunk", `{"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`,
			chunkFacts{finishReason: "stop", completionTokens: -1, promptTokens: -1}, true},
		{"usage chunk", `{"id":"chatcmpl-3f","object":"chat.completion.chunk","created":1754000123,"model":"m","choices":[],"usage":{"prompt_tokens":42,"total_tokens":50,"completion_tokens":8}}`,
			chunkFacts{usageOnly: true, completionTokens: 8, promptTokens: 42}, true},
		{"completions text with usage null", `{"id":"cmpl-9d","object":"text_completion","created":1754000200,"model":"m","choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
			chunkFacts{content: true, completionTokens: -1, promptTokens: -1}, true},
		{"completions last token", `{"choices":[{"index":0,"text":" It","finish_reason":"length"}],"usage":null}`,
			chunkFacts{content: true, finishReason: "length", completionTokens: -1, promptTokens: -1}, true},
		{"continuous usage on a content chunk", `{"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`,
			chunkFacts{content: true, completionTokens: 1, promptTokens: 5}, true},
		{"done", `[DONE]`, chunkFacts{completionTokens: -1, promptTokens: -1}, false},
		{"malformed", `{"choices":[`, chunkFacts{completionTokens: -1, promptTokens: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := inspectChunk([]byte(tt.data))
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}
