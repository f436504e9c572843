// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/sse"
)

// Migration (proxy::migrate): a stream that stalls, breaks or ends in the
// engine's own error event mid-stream is continued on another replica
// instead of being cut. The request is sent again to the migrate endpoint
// with what the client already received as context (chat: a final
// assistant message the engine continues, continue_final_message without a
// generation prompt; completions: the prompt followed by it), its token
// budget reduced by what was delivered, and the new stream's chunks reach
// the client as the rest of the first one: the first stream's id, created,
// model and system_fingerprint, no second role chunk, one usage, one
// [DONE]. Whatever cannot be carried so (n > 1, tools, structured output,
// logprobs, a reasoning or tool call delta already delivered, …) is
// refused, and the stream is cut as it would have been.

// Triggers is the set of failures a stream is moved on.
type Triggers uint8

const (
	// TriggerStall: the stall breaker cut the stream (proxy::stall).
	TriggerStall Triggers = 1 << iota
	// TriggerIdleTimeout: the upstream was silent for stream_idle_timeout.
	TriggerIdleTimeout
	// TriggerBroken: the upstream's stream broke or ended before [DONE].
	TriggerBroken
	// TriggerEngineError: the engine sent an error event mid-stream.
	TriggerEngineError
)

// TriggerNames are the names of the triggers in the configuration and in
// the migrations counter's trigger attribute.
var TriggerNames = map[string]Triggers{
	"stall": TriggerStall, "idle_timeout": TriggerIdleTimeout, "broken": TriggerBroken, "engine_error": TriggerEngineError,
}

func (t Triggers) name() string {
	for n, v := range TriggerNames {
		if v == t {
			return n
		}
	}
	return ""
}

// MigrateConfig is proxy::migrate resolved.
type MigrateConfig struct {
	// Client reaches the healthy replicas; Endpoint is its URL, parsed.
	Client   confighttp.ClientConfig
	Endpoint *url.URL
	// Engine names the migrate endpoint in the logs and on the move events.
	Engine string
	// MaxMoves bounds the moves of one request; On is what moves a stream.
	MaxMoves int
	On       Triggers
	// MaxRequestBytes bounds the copy of a request kept to send it again;
	// a larger request is not moved.
	MaxRequestBytes int
}

// migrator sends the continuations.
type migrator struct {
	cfg    MigrateConfig
	client *http.Client
}

func (m *migrator) url(in *url.URL) string {
	u := *m.cfg.Endpoint
	u.Path = strings.TrimSuffix(m.cfg.Endpoint.Path, "/") + in.Path
	u.RawQuery = in.RawQuery
	return u.String()
}

// Refusal reasons: why a stream that met a trigger was not moved (the
// migrations counter's reason). The request's own are found once, when its
// stream starts (requestRefusal); the others when the trigger comes.
const (
	refuseBodyTooLarge   = "body_too_large"
	refuseBodyIncomplete = "body_incomplete"
	refuseNotJSON        = "not_json"
	refuseN              = "n"
	refuseBestOf         = "best_of"
	refuseEcho           = "echo"
	refuseTools          = "tools"
	refuseFormat         = "response_format"
	refuseGuided         = "guided_decoding"
	refuseLogprobs       = "logprobs"
	refuseTokenIDs       = "token_ids"
	refuseContinuation   = "continuation"
	refuseStreamOptions  = "stream_options"
	refusePrompt         = "prompt"
	refuseMessages       = "messages"
	refuseReasoning      = "reasoning"
	refuseToolCall       = "tool_call"
	refuseFinished       = "finished"
	refuseUnreadable     = "unreadable_chunk"
	refuseBudget         = "budget_spent"
	refuseMaxMoves       = "max_moves"
	refuseShutdown       = "shutdown"
)

// refusedFields are the request members that make a stream's state
// unmovable when present and not null (nor false, 0, 1 where that means
// the default): each with its refusal reason.
var refusedFields = []struct{ key, reason string }{
	{"best_of", refuseBestOf},
	{"echo", refuseEcho},
	{"tools", refuseTools},
	{"tool_choice", refuseTools},
	{"functions", refuseTools},
	{"function_call", refuseTools},
	{"response_format", refuseFormat},
	{"guided_json", refuseGuided},
	{"guided_regex", refuseGuided},
	{"guided_choice", refuseGuided},
	{"guided_grammar", refuseGuided},
	{"structured_outputs", refuseGuided},
	{"grammar", refuseGuided},
	{"json_schema", refuseGuided},
	{"logprobs", refuseLogprobs},
	{"top_logprobs", refuseLogprobs},
	{"prompt_logprobs", refuseLogprobs},
	{"n_probs", refuseLogprobs},
	{"return_token_ids", refuseTokenIDs},
	{"return_tokens_as_token_ids", refuseTokenIDs},
	{"continue_final_message", refuseContinuation},
}

// neutral reports whether a member's value asks for nothing: null, false,
// 0, or 1 (best_of's and n's default).
func neutral(v json.RawMessage) bool {
	switch strings.TrimSpace(string(v)) {
	case "null", "false", "0", "1":
		return true
	}
	return false
}

// requestRefusal reads the request a stream answers, once, when its stream
// starts: the decoded members, or why it cannot be moved.
func requestRefusal(body []byte, chat bool) (map[string]json.RawMessage, string) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil || req == nil {
		return nil, refuseNotJSON
	}
	if v, ok := req["n"]; ok && !neutral(v) {
		return nil, refuseN
	}
	for _, f := range refusedFields {
		if v, ok := req[f.key]; ok && !neutral(v) {
			if f.key == "response_format" && isTextFormat(v) {
				continue
			}
			return nil, f.reason
		}
	}
	if v, ok := req["stream_options"]; ok {
		var so struct {
			Continuous json.RawMessage `json:"continuous_usage_stats"`
		}
		if json.Unmarshal(v, &so) != nil || (so.Continuous != nil && !neutral(so.Continuous)) {
			return nil, refuseStreamOptions
		}
	}
	if chat {
		var msgs []struct {
			Role string `json:"role"`
		}
		if json.Unmarshal(req["messages"], &msgs) != nil || len(msgs) == 0 {
			return nil, refuseMessages
		}
		if msgs[len(msgs)-1].Role == "assistant" {
			// A prefill of the client's own: the engines continue it
			// themselves (llama.cpp always), so it cannot be told apart.
			return nil, refuseContinuation
		}
		return req, ""
	}
	var prompt string
	if json.Unmarshal(req["prompt"], &prompt) != nil {
		// Token IDs, or several prompts.
		return nil, refusePrompt
	}
	return req, ""
}

func isTextFormat(v json.RawMessage) bool {
	var f map[string]json.RawMessage
	if json.Unmarshal(v, &f) != nil || len(f) != 1 {
		return false
	}
	var t string
	return json.Unmarshal(f["type"], &t) == nil && t == "text"
}

// requestCopy keeps the client's request body as it is read (up to limit)
// for a continuation. The upstream request is written on another goroutine
// when it goes through http.Transport: hence the lock.
type requestCopy struct {
	r     io.Reader
	limit int
	mu    sync.Mutex
	b     []byte
	over  bool // more than limit: nothing kept
	eof   bool // read whole
}

func (c *requestCopy) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.mu.Lock()
	if !c.over {
		if len(c.b)+n > c.limit {
			c.over, c.b = true, nil
		} else {
			c.b = append(c.b, p[:n]...)
		}
	}
	if errors.Is(err, io.EOF) {
		c.eof = true
	}
	c.mu.Unlock()
	return n, err
}

// body is the request read whole, or why there is none.
func (c *requestCopy) body() ([]byte, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.over:
		return nil, refuseBodyTooLarge
	case !c.eof:
		return nil, refuseBodyIncomplete
	}
	return c.b, ""
}

// moves is a session's migration state, when proxy::migrate is on.
type moves struct {
	m *migrator
	// scope is the client's side of the exchange: the continuations are
	// cancelled with it (client gone, drain over), not with the first
	// upstream request, which the breaker cancels.
	scope  context.Context
	copy   *requestCopy
	header http.Header // the upstream request's, sent again
	path   *url.URL
	chat   bool
	// req is the request's members; refusal why it cannot move ("": it
	// can), read when the stream starts.
	req     map[string]json.RawMessage
	refusal string
	// text is what the client got of the answer; unmovable why not all of
	// it can be carried (a reasoning or tool call delta, …).
	text      strings.Builder
	unmovable string
	finished  bool
	// identity is the first stream's id, created, model and
	// system_fingerprint, as written; set by its first chunk.
	identity    map[string][]byte
	hasIdentity bool
	// done counts the moves made; carried the token events delivered
	// before the current continuation (its usage is the rest).
	done    int
	carried int64
	// continuing: the stream relayed is a continuation; failed is the
	// error.type of the engine that failed first (the session's).
	continuing bool
	failed     string
	// held is the engine's error event and what followed it, held while
	// the stream may still move (TriggerEngineError).
	held    []byte
	holding bool
	// pending is the move under way, until its event is emitted: once the
	// continuation relays its first token or writes to the client.
	pending pendingMove
}

// pendingMove is a move whose event waits for the continuation to be
// relayed: a move that fails before is no move.
type pendingMove struct {
	set bool
	// at is when it began; reason the error type of the failure that moved
	// it; carried the tokens delivered before it.
	at      time.Time
	reason  string
	carried int64
}

// start reads the request once its stream begins.
func (mv *moves) start() {
	body, why := mv.copy.body()
	if why != "" {
		mv.refusal = why
		return
	}
	mv.req, mv.refusal = requestRefusal(body, mv.chat)
}

// holdsErrors reports whether an engine's error event is held back: the
// stream may move on it.
func (mv *moves) holdsErrors() bool {
	return mv != nil && mv.m.cfg.On&TriggerEngineError != 0 && mv.refusal == "" && mv.unmovable == "" &&
		!mv.finished && mv.done < mv.m.cfg.MaxMoves
}

// deltaChunk is what a content chunk delivers, decoded: only for a stream
// that may move, only its content chunks.
type deltaChunk struct {
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Content          *string         `json:"content"`
			ReasoningContent *string         `json:"reasoning_content"`
			Reasoning        *string         `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text *string `json:"text"`
	} `json:"choices"`
}

// delivered takes what a chunk the client gets delivers.
func (mv *moves) delivered(f *openaistream.ChunkFacts, data []byte) {
	if f.FinishReason != "" {
		mv.finished = true
	}
	if !mv.hasIdentity && !f.UsageOnly {
		mv.hasIdentity, mv.identity = true, identityOf(data)
	}
	if !f.Content || mv.unmovable != "" || mv.refusal != "" {
		return
	}
	var c deltaChunk
	if err := json.Unmarshal(data, &c); err != nil {
		mv.unmovable = refuseUnreadable
		return
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			mv.unmovable = refuseN
			return
		}
		if ch.Text != nil {
			mv.text.WriteString(*ch.Text)
		}
		d := ch.Delta
		if d == nil {
			continue
		}
		switch {
		case len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null" && string(d.ToolCalls) != "[]":
			mv.unmovable = refuseToolCall
			return
		case d.ReasoningContent != nil && *d.ReasoningContent != "", d.Reasoning != nil && *d.Reasoning != "":
			mv.unmovable = refuseReasoning
			return
		case d.Content != nil:
			mv.text.WriteString(*d.Content)
		}
	}
}

// identityKeys are the members of a continuation's chunks given the first
// stream's values.
var identityKeys = []string{"id", "created", "model", "system_fingerprint"}

func identityOf(data []byte) map[string][]byte {
	out := map[string][]byte{}
	openaistream.TopLevelMembers(data, func(key []byte, from, to int) {
		for _, k := range identityKeys {
			if string(key) == k {
				out[k] = append([]byte(nil), data[from:to]...)
			}
		}
	})
	return out
}

// refusalNow is why the stream cannot move now ("": it can).
func (mv *moves) refusalNow(draining <-chan struct{}, tokens int64) string {
	switch {
	case mv.refusal != "":
		return mv.refusal
	case mv.unmovable != "":
		return mv.unmovable
	case mv.finished:
		return refuseFinished
	case mv.done >= mv.m.cfg.MaxMoves:
		return refuseMaxMoves
	}
	select {
	case <-draining:
		return refuseShutdown
	default:
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		if v, ok := mv.req[k]; ok && !isNull(v) {
			n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
			if err == nil && n-tokens <= 0 {
				return refuseBudget
			}
		}
	}
	return ""
}

func isNull(v json.RawMessage) bool { return strings.TrimSpace(string(v)) == "null" }

// continuation is the request that continues the stream, tokens token
// events delivered: the client's request with the delivered text carried
// and the budget reduced by them, usage asked for (its counts become the
// client's, see rewrite).
func (mv *moves) continuation(tokens int64) ([]byte, error) {
	req := make(map[string]json.RawMessage, len(mv.req)+3)
	for k, v := range mv.req {
		req[k] = v
	}
	text := mv.text.String()
	if mv.chat {
		if text != "" {
			var msgs []json.RawMessage
			if err := json.Unmarshal(mv.req["messages"], &msgs); err != nil {
				return nil, err
			}
			final, _ := json.Marshal(struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			}{"assistant", text})
			msgs = append(msgs, final)
			req["messages"], _ = json.Marshal(msgs)
			// vLLM's switches, which llama.cpp (v0.5.0) reads too
			// (tools/server/server-common.cpp:1298-1301).
			req["continue_final_message"] = json.RawMessage("true")
			req["add_generation_prompt"] = json.RawMessage("false")
		}
	} else {
		var prompt string
		if err := json.Unmarshal(mv.req["prompt"], &prompt); err != nil {
			return nil, err
		}
		req["prompt"], _ = json.Marshal(prompt + text)
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens", "min_tokens"} {
		if v, ok := req[k]; ok && !isNull(v) {
			if n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64); err == nil {
				req[k] = json.RawMessage(strconv.FormatInt(max(n-tokens, 0), 10))
			}
		}
	}
	req["stream"] = json.RawMessage("true")
	req["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	return json.Marshal(req)
}

// send sends the continuation; its response is a 200 stream, or an error.
func (mv *moves) send(ctx context.Context, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, mv.m.url(mv.path), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = mv.header.Clone()
	resp, err := mv.m.client.Do(req) //nolint:gosec // G704: the operator's configured migrate endpoint
	if err != nil {
		return nil, err
	}
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode != http.StatusOK || mediaType != "text/event-stream" {
		resp.Body.Close()
		return nil, fmt.Errorf("proxy::migrate::endpoint answered %d %s", resp.StatusCode, mediaType)
	}
	return resp, nil
}

// rewrite makes a continuation's event the client's: the first stream's
// identity, and, on a usage, the whole answer's counts (the prompt the
// client sent, the completion delivered before and after); f is read
// again from it. keep is false for a chunk that says nothing the client
// has not had (the role chunk).
func (mv *moves) rewrite(ev *sse.Event, f openaistream.ChunkFacts) (_ *sse.Event, _ openaistream.ChunkFacts, keep bool) {
	hasUsage := f.CompletionTokens >= 0 || f.PromptTokens >= 0
	if !mv.hasIdentity {
		// The client has had no chunk: the continuation's first one is
		// its first, role and all.
		return ev, f, true
	}
	if !f.Content && !f.UsageOnly && f.FinishReason == "" && f.ErrorType == "" && !hasUsage {
		return ev, f, false
	}
	at := bytes.Index(ev.Raw, ev.Data)
	if at < 0 {
		return ev, f, true
	}
	type span struct {
		from, to int
		with     []byte
	}
	var spans []span
	openaistream.TopLevelMembers(ev.Data, func(key []byte, from, to int) {
		if v, ok := mv.identity[string(key)]; ok {
			spans = append(spans, span{from, to, v})
			return
		}
		if string(key) == "usage" && hasUsage && !bytes.Equal(ev.Data[from:to], []byte("null")) {
			prompt := max(f.PromptTokens-mv.carried, 0)
			completion := mv.carried + max(f.CompletionTokens, 0)
			u := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, completion, prompt+completion)
			spans = append(spans, span{from, to, []byte(u)})
		}
	})
	raw := make([]byte, 0, len(ev.Raw)+64)
	raw = append(raw, ev.Raw[:at]...)
	last := 0
	for _, s := range spans {
		raw = append(raw, ev.Data[last:s.from]...)
		raw = append(raw, s.with...)
		last = s.to
	}
	raw = append(raw, ev.Data[last:]...)
	end := len(raw)
	raw = append(raw, ev.Raw[at+len(ev.Data):]...)
	out := *ev
	out.Raw, out.Data = raw, raw[at:end]
	f, _ = openaistream.InspectChunk(out.Data)
	return &out, f, true
}

// maxHeld bounds what is held after an engine's error event: the event and
// [DONE] fit many times over.
const maxHeld = 64 << 10

// hold keeps raw, an event after (or the) engine's error event, while the
// stream may move. Past maxHeld it is not the end of a failed generation:
// what was held goes, and the stream goes on as it came, not to move.
func (mv *moves) hold(raw []byte, write func(raw, rest []byte) error) error {
	if len(mv.held)+len(raw) <= maxHeld {
		mv.held = append(mv.held, raw...)
		return nil
	}
	held := mv.held
	mv.held, mv.holding, mv.unmovable = nil, false, refuseUnreadable
	return write(held, raw)
}

// Outcomes of a migration (the migrations counter's outcome).
const (
	outcomeMoved   = "moved"
	outcomeRefused = "refused"
	outcomeFailed  = "failed"
)

// moveOutcome is an attribute set of the migrations counter.
func moveOutcome(outcome string, t Triggers, reason string) metric.MeasurementOption {
	attrs := []attribute.KeyValue{attribute.String("outcome", outcome), attribute.String("trigger", t.name())}
	if reason != "" {
		attrs = append(attrs, attribute.String("reason", reason))
	}
	return metric.WithAttributeSet(attribute.NewSet(attrs...))
}

// trigger is what, of the triggers configured, ended the stream as e and
// cut say; 0: none.
func (mv *moves) trigger(cut *streamCut, engineError string) Triggers {
	var t Triggers
	switch {
	case engineError != "":
		t = TriggerEngineError
	case cut == nil:
		return 0
	case cut.errorType == errEngineStalled:
		t = TriggerStall
	case cut == &cutIdleTimeout:
		t = TriggerIdleTimeout
	case cut == &cutBroken:
		t = TriggerBroken
	default:
		return 0
	}
	if mv.m.cfg.On&t == 0 {
		return 0
	}
	return t
}
