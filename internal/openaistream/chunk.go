package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// chunkFacts is what one chat.completion.chunk or text_completion chunk of
// an OpenAI-compatible stream means for the session.
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
// chunk (the [DONE] marker, or not a JSON object).
//
// It walks the JSON without decoding it: a chunk passes through the proxy
// once per token, and encoding/json cost several µs and a dozen allocations
// per chunk (see BenchmarkProxyRelayEvent). Text is only ever tested for
// emptiness; it is not copied anywhere. TestInspectChunkMatchesEncodingJSON
// and FuzzInspectChunk hold it to encoding/json's reading of valid input.
func inspectChunk(data []byte) (f chunkFacts, ok bool) {
	f.completionTokens, f.promptTokens = -1, -1
	if bytes.Equal(bytes.TrimSpace(data), doneData) {
		return f, false
	}
	s := jsonWalker{b: data}
	if s.null() && s.end() {
		return f, true
	}
	choices, hasUsage := 0, false
	ok = s.object(func(key []byte) bool {
		switch string(key) {
		case "choices":
			if s.null() {
				return true
			}
			return s.array(func() bool {
				choices++
				return s.choice(&f)
			})
		case "usage":
			if s.null() {
				return true
			}
			hasUsage = true
			return s.object(func(key []byte) bool {
				switch string(key) {
				case "completion_tokens":
					return s.optionalInt(&f.completionTokens)
				case "prompt_tokens":
					return s.optionalInt(&f.promptTokens)
				}
				return s.skip()
			})
		}
		return s.skip()
	})
	if !ok || !s.end() {
		return chunkFacts{completionTokens: -1, promptTokens: -1}, false
	}
	f.usageOnly = hasUsage && choices == 0
	return f, true
}

// choice reads one element of choices.
func (s *jsonWalker) choice(f *chunkFacts) bool {
	if s.null() {
		return true
	}
	return s.object(func(key []byte) bool {
		switch string(key) {
		case "text":
			return s.nonEmptyString(&f.content)
		case "tool_calls":
			return s.nonEmptyToolCalls(&f.content)
		case "finish_reason":
			if s.null() {
				return true
			}
			v, ok := s.str()
			if ok && len(v) > 0 {
				f.finishReason = finishReasonString(v)
			}
			return ok
		case "delta":
			if s.null() {
				return true
			}
			return s.object(func(key []byte) bool {
				switch string(key) {
				case "content", "reasoning", "reasoning_content":
					return s.nonEmptyString(&f.content)
				case "tool_calls":
					return s.nonEmptyToolCalls(&f.content)
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

// jsonWalker walks JSON text without building values. Its methods report
// false on malformed input.
type jsonWalker struct {
	b []byte
	i int
}

func (s *jsonWalker) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonWalker) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// end reports whether only whitespace is left.
func (s *jsonWalker) end() bool {
	s.ws()
	return s.i == len(s.b)
}

func (s *jsonWalker) null() bool {
	if s.peek() == 'n' && bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// str reads a string and returns its raw contents (escapes not decoded).
func (s *jsonWalker) str() ([]byte, bool) {
	if s.peek() != '"' {
		return nil, false
	}
	s.i++
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			return v, true
		case c == '\\':
			s.i += 2
		case c < 0x20:
			return nil, false
		default:
			s.i++
		}
	}
	return nil, false
}

func (s *jsonWalker) number() ([]byte, bool) {
	s.ws()
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			s.i++
			continue
		}
		break
	}
	return s.b[start:s.i], s.i > start
}

// object walks an object, calling member for each key; member must read
// the value.
func (s *jsonWalker) object(member func(key []byte) bool) bool {
	if s.peek() != '{' {
		return false
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		key, ok := s.str()
		if !ok || s.peek() != ':' {
			return false
		}
		s.i++
		if !member(key) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// array walks an array, calling elem for each element; elem must read it.
func (s *jsonWalker) array(elem func() bool) bool {
	if s.peek() != '[' {
		return false
	}
	s.i++
	if s.peek() == ']' {
		s.i++
		return true
	}
	for {
		if !elem() {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return true
		default:
			return false
		}
	}
}

// skip reads any value.
func (s *jsonWalker) skip() bool {
	switch c := s.peek(); {
	case c == '{':
		return s.object(func([]byte) bool { return s.skip() })
	case c == '[':
		return s.array(s.skip)
	case c == '"':
		_, ok := s.str()
		return ok
	case c == 't' && bytes.HasPrefix(s.b[s.i:], []byte("true")):
		s.i += 4
		return true
	case c == 'f' && bytes.HasPrefix(s.b[s.i:], []byte("false")):
		s.i += 5
		return true
	case c == 'n':
		return s.null()
	default:
		_, ok := s.number()
		return ok
	}
}
