package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"bytes"
	"encoding/json"
)

// streamChunk is what the proxy reads from one chat.completion.chunk or
// text_completion chunk of an OpenAI-compatible stream. Text is decoded only
// to be tested for emptiness; it never leaves this struct.
type streamChunk struct {
	Choices []chunkChoice `json:"choices"`
	Usage   *chunkUsage   `json:"usage"`
}

type chunkChoice struct {
	Delta        *chunkDelta     `json:"delta"`
	Text         *string         `json:"text"`
	FinishReason *string         `json:"finish_reason"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
}

type chunkDelta struct {
	Content          *string         `json:"content"`
	Reasoning        *string         `json:"reasoning"`
	ReasoningContent *string         `json:"reasoning_content"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
}

type chunkUsage struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
}

// chunkFacts is what a chunk means for the session.
type chunkFacts struct {
	// content: the chunk carries text, reasoning or a tool call delta (the
	// role-only first chunk and an empty finish chunk do not).
	content bool
	// usageOnly: the final usage chunk, with no choices.
	usageOnly bool
	// completionTokens and promptTokens from usage, -1 when absent.
	completionTokens, promptTokens int64
	finishReason                   string
}

var doneData = []byte("[DONE]")

// inspectChunk reads one SSE data payload. ok is false when it is not a
// chunk (the [DONE] marker, or malformed JSON).
func inspectChunk(data []byte) (f chunkFacts, ok bool) {
	f.completionTokens, f.promptTokens = -1, -1
	if bytes.Equal(bytes.TrimSpace(data), doneData) {
		return f, false
	}
	var c streamChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return f, false
	}
	for _, ch := range c.Choices {
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			f.finishReason = *ch.FinishReason
		}
		switch {
		case ch.Text != nil && *ch.Text != "":
			f.content = true
		case hasToolCalls(ch.ToolCalls):
			f.content = true
		case ch.Delta != nil:
			d := ch.Delta
			if nonEmpty(d.Content) || nonEmpty(d.Reasoning) || nonEmpty(d.ReasoningContent) || hasToolCalls(d.ToolCalls) {
				f.content = true
			}
		}
	}
	if c.Usage != nil {
		if c.Usage.CompletionTokens != nil {
			f.completionTokens = *c.Usage.CompletionTokens
		}
		if c.Usage.PromptTokens != nil {
			f.promptTokens = *c.Usage.PromptTokens
		}
		f.usageOnly = len(c.Choices) == 0
	}
	return f, true
}

func nonEmpty(s *string) bool { return s != nil && *s != "" }

func hasToolCalls(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null")) && !bytes.Equal(t, []byte("[]"))
}
