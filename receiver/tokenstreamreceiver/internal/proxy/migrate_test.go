// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// The first stream's identity in the migration tests, and the
// continuation's, which the client must never see.
const (
	firstID   = "chatcmpl-first"
	secondID  = "chatcmpl-second"
	firstTime = 1754000123
)

// chunk is a vLLM chat chunk of stream id with delta (JSON) and finish.
func chunk(id string, created int, delta, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return fmt.Sprintf(`data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":"m","choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}`+"\n\n", id, created, delta, fr)
}

func content(id string, created int, text string) string {
	b, _ := json.Marshal(text)
	return chunk(id, created, `{"content":`+string(b)+`}`, "")
}

func usageChunk(id string, created int, prompt, completion int) string {
	return fmt.Sprintf(`data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":"m","choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n",
		id, created, prompt, prompt+completion, completion)
}

// firstStream is what the failing engine sends before it fails: the role
// chunk and four tokens, "The capital of France".
func firstStream() []string {
	return []string{
		chunk(firstID, firstTime, `{"role":"assistant","content":""}`, ""),
		content(firstID, firstTime, "The"), content(firstID, firstTime, " capital"),
		content(firstID, firstTime, " of"), content(firstID, firstTime, " France"),
	}
}

// secondStream is the healthy replica's continuation: its own id, a role
// chunk, three tokens, the finish and usage (its prompt holds the four
// tokens carried), [DONE].
func secondStream() []string {
	return []string{
		chunk(secondID, 1754009999, `{"role":"assistant","content":""}`, ""),
		content(secondID, 1754009999, " is"), content(secondID, 1754009999, " Paris"), content(secondID, 1754009999, "."),
		chunk(secondID, 1754009999, `{"content":""}`, "stop"),
		usageChunk(secondID, 1754009999, 46, 3),
		"data: [DONE]\n\n",
	}
}

// continuingUpstream answers every request with events.
func continuingUpstream(t *testing.T, events []string) *scriptedUpstream {
	return newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, events, func(int) time.Duration { return time.Millisecond })
	})
}

// withMigrate turns migration on towards endpoint, for every trigger.
func withMigrate(endpoint string, maxMoves int) func(*Config) {
	return func(c *Config) {
		u, _ := url.Parse(endpoint)
		client := confighttp.NewDefaultClientConfig()
		client.Endpoint = endpoint
		c.Migrate = &MigrateConfig{
			Client: client, Endpoint: u, Engine: u.Host, MaxMoves: maxMoves,
			On: TriggerStall | TriggerIdleTimeout | TriggerBroken | TriggerEngineError, MaxRequestBytes: 1 << 20,
		}
	}
}

const chatRequest = `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"The capital of France?"}],` +
	`"stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"temperature":0.2}`

// post posts body to path and returns what the client read and the read's
// error (nil: the response ended whole).
func post(t *testing.T, base, path, body string) (string, error) {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got, err := io.ReadAll(resp.Body)
	return string(got), err
}

// clientView is the stream a client read, taken apart.
type clientView struct {
	roles, done, usages, errors int
	text                        string
	idsSeen                     map[string]bool
	usage                       struct{ Prompt, Completion, Total int64 }
	finish                      string
}

func readClientStream(t *testing.T, got string) clientView {
	t.Helper()
	v := clientView{idsSeen: map[string]bool{}}
	for ev := range strings.SplitSeq(strings.TrimSuffix(got, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		require.True(t, ok, "an event with one data line: %q", ev)
		if data == "[DONE]" {
			v.done++
			continue
		}
		var c struct {
			ID      string          `json:"id"`
			Created int64           `json:"created"`
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
				Total      int64 `json:"total_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &c), data)
		if c.Error != nil {
			v.errors++
			continue
		}
		v.idsSeen[c.ID] = true
		for _, ch := range c.Choices {
			if ch.Delta.Role != "" {
				v.roles++
			}
			v.text += ch.Delta.Content + ch.Text
			if ch.FinishReason != "" {
				v.finish = ch.FinishReason
			}
		}
		if c.Usage != nil {
			v.usages++
			v.usage.Prompt, v.usage.Completion, v.usage.Total = c.Usage.Prompt, c.Usage.Completion, c.Usage.Total
		}
	}
	return v
}

// migrations is the migrations counter for outcome, trigger and (refused)
// reason ("": any).
func migrations(t *testing.T, tp *testProxy, outcome, trigger, reason string) int64 {
	t.Helper()
	m, err := tp.tel.GetMetric("otelcol_receiver_token_stream_proxy_migrations")
	if err != nil {
		return 0
	}
	var total int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		o, _ := dp.Attributes.Value("outcome")
		tr, _ := dp.Attributes.Value("trigger")
		r, _ := dp.Attributes.Value("reason")
		if o.AsString() == outcome && tr.AsString() == trigger && (reason == "" || r.AsString() == reason) {
			total += dp.Value
		}
	}
	return total
}

// moveEvents are the move events of evs, and the index in evs of each.
func moveEvents(evs []tokenevent.Event) (moves []tokenevent.Event, at []int) {
	for i, ev := range evs {
		if ev.Kind == tokenevent.KindMove {
			moves, at = append(moves, ev), append(at, i)
		}
	}
	return moves, at
}

func tokenCount(evs []tokenevent.Event) int {
	n := 0
	for _, ev := range evs {
		if ev.Kind == tokenevent.KindToken {
			n++
		}
	}
	return n
}

// A stream frozen mid-answer is continued on the migrate endpoint: the
// healthy replica gets the request with the delivered text as a final
// assistant message to continue and the budget less what was delivered;
// the client gets one stream (one id, one role chunk, the text once, one
// usage that adds up, one [DONE], no error) and its response ends whole.
// The session is one, charged to the engine that stalled.
func TestMigrateStalledChatContinues(t *testing.T) {
	first := freezingUpstream(t, firstStream(), func(int) time.Duration { return time.Millisecond })
	second := continuingUpstream(t, secondStream())
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, first.URL, sink, withStallBreaker(0), withMigrate(second.URL, 1))

	got, err := post(t, tp.proxyURL(), "/v1/chat/completions", chatRequest)
	require.NoError(t, err, "the response ends whole: %q", got)
	v := readClientStream(t, got)
	assert.Equal(t, "The capital of France is Paris.", v.text, "the answer once, continued where it stopped")
	assert.Equal(t, map[string]bool{firstID: true}, v.idsSeen, "one id: the first stream's")
	assert.NotContains(t, got, `"created":1754009999`, "the first stream's created")
	assert.Equal(t, 1, v.roles, "one role chunk")
	assert.Equal(t, 1, v.done, "one [DONE]")
	assert.Equal(t, 0, v.errors, "no error event")
	assert.Equal(t, "stop", v.finish)
	require.Equal(t, 1, v.usages, "one usage")
	assert.Equal(t, int64(42), v.usage.Prompt, "the client's prompt: the continuation's less the four tokens carried")
	assert.Equal(t, int64(7), v.usage.Completion, "four tokens delivered before, three after")
	assert.Equal(t, int64(49), v.usage.Total)

	second.mu.Lock()
	require.Len(t, second.bodies, 1)
	var sent struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		Continue      *bool   `json:"continue_final_message"`
		GenPrompt     *bool   `json:"add_generation_prompt"`
		MaxTokens     int     `json:"max_tokens"`
		Temperature   float64 `json:"temperature"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	require.NoError(t, json.Unmarshal([]byte(second.bodies[0]), &sent), second.bodies[0])
	auth := second.headers[0].Get("Authorization")
	second.mu.Unlock()
	require.Len(t, sent.Messages, 3)
	assert.Equal(t, "user", sent.Messages[1].Role)
	assert.Equal(t, "assistant", sent.Messages[2].Role)
	assert.Equal(t, "The capital of France", sent.Messages[2].Content, "what the client got, to be continued")
	require.NotNil(t, sent.Continue)
	assert.True(t, *sent.Continue)
	require.NotNil(t, sent.GenPrompt)
	assert.False(t, *sent.GenPrompt)
	assert.Equal(t, 46, sent.MaxTokens, "the budget less the four tokens delivered")
	assert.InDelta(t, 0.2, sent.Temperature, 1e-9, "the client's other fields carried")
	assert.True(t, sent.StreamOptions.IncludeUsage)
	assert.Empty(t, auth, "postStream sends none; the client's headers are the first request's")

	evs := sessionEvents(t, sink, 1)
	end := lastEnd(t, evs)
	assert.Equal(t, 7, tokenCount(evs), "one session for the whole answer")
	assert.Equal(t, errEngineStalled, end.Error, "charged to the engine that stalled")
	assert.Equal(t, "stop", end.FinishReason)
	assert.Equal(t, int64(7), end.CompletionTokens)
	assert.Equal(t, int64(42), end.PromptTokens)
	assert.Equal(t, int64(1), end.Migrations, "moved once: llm.session.migrations")
	moves, at := moveEvents(evs)
	require.Len(t, moves, 1, "one move event")
	secondURL, _ := url.Parse(second.URL)
	assert.Equal(t, secondURL.Host, moves[0].Engine, "where it went: the migrate endpoint, as the proxy names engines")
	assert.Equal(t, errEngineStalled, moves[0].Error, "why")
	assert.Equal(t, int64(4), moves[0].Count, "the four tokens carried")
	assert.Equal(t, 4, tokenCount(evs[:at[0]]), "after the tokens it carried, before the continuation's")
	assert.Equal(t, tokenevent.KindToken, evs[at[0]+1].Kind)
	assert.LessOrEqual(t, evs[at[0]-1].TimeUnixNano, moves[0].TimeUnixNano, "at the move's time")
	assert.LessOrEqual(t, moves[0].TimeUnixNano, evs[at[0]+1].TimeUnixNano)
	assert.Equal(t, int64(1), migrations(t, tp, outcomeMoved, "stall", ""))
	assert.Equal(t, int64(0), stalledStreams(t, tp), "the client got no cut")
}

// A completions stream whose upstream drops its connection mid-stream is
// continued with the prompt followed by the text delivered; a client that
// did not ask for usage gets none from the continuation either.
func TestMigrateBrokenCompletionsContinues(t *testing.T) {
	cmpl := func(id string, text, finish string) string {
		fr := "null"
		if finish != "" {
			fr = `"` + finish + `"`
		}
		return fmt.Sprintf(`data: {"id":"%s","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":%q,"logprobs":null,"finish_reason":%s}],"usage":null}`+"\n\n", id, text, fr)
	}
	first := closingUpstream(t, []string{cmpl("cmpl-first", " Paris", ""), cmpl("cmpl-first", ",", "")}, "")
	second := continuingUpstream(t, []string{
		cmpl("cmpl-second", " of", ""), cmpl("cmpl-second", " course", "length"),
		`data: {"id":"cmpl-second","object":"text_completion","created":2,"model":"m","choices":[],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2}}` + "\n\n",
		"data: [DONE]\n\n",
	})
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, first.URL, sink, withMigrate(second.URL, 1))

	got, err := post(t, tp.proxyURL(), "/v1/completions", `{"model":"m","prompt":"The capital of France is","stream":true,"max_tokens":4}`)
	require.NoError(t, err, "%q", got)
	v := readClientStream(t, got)
	assert.Equal(t, " Paris, of course", v.text)
	assert.Equal(t, map[string]bool{"cmpl-first": true}, v.idsSeen)
	assert.Equal(t, 0, v.usages, "the client asked for no usage")
	assert.Equal(t, 1, v.done)
	assert.Equal(t, 0, v.errors)

	second.mu.Lock()
	var sent struct {
		Prompt    string `json:"prompt"`
		MaxTokens int    `json:"max_tokens"`
	}
	require.NoError(t, json.Unmarshal([]byte(second.bodies[0]), &sent))
	second.mu.Unlock()
	assert.Equal(t, "The capital of France is Paris,", sent.Prompt)
	assert.Equal(t, 2, sent.MaxTokens)

	evs := sessionEvents(t, sink, 1)
	end := lastEnd(t, evs)
	assert.Equal(t, errStreamBroken, end.Error)
	assert.Equal(t, int64(4), end.CompletionTokens, "two before, two after")
	moves, _ := moveEvents(evs)
	require.Len(t, moves, 1)
	assert.Equal(t, errStreamBroken, moves[0].Error, "moved for the broken stream")
	assert.Equal(t, int64(2), moves[0].Count)
	assert.Equal(t, int64(7), end.PromptTokens)
	assert.Equal(t, int64(1), migrations(t, tp, outcomeMoved, "broken", ""))
	assert.Equal(t, int64(0), reasonCounter(t, tp, "otelcol_receiver_token_stream_proxy_cut_streams", "broken"))
}

// The engine's own error event mid-stream (vLLM's, then [DONE]) is held
// back and the stream moved: the client never sees the error.
func TestMigrateEngineErrorContinues(t *testing.T) {
	events := append(firstStream(),
		`data: {"error": {"object": "error", "message": "engine is shutting down", "type": "EngineDeadError", "param": null, "code": 500}}`+"\n\n",
		"data: [DONE]\n\n")
	first := continuingUpstream(t, events)
	second := continuingUpstream(t, secondStream())
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, first.URL, sink, withMigrate(second.URL, 1))

	got, err := post(t, tp.proxyURL(), "/v1/chat/completions", chatRequest)
	require.NoError(t, err)
	v := readClientStream(t, got)
	assert.Equal(t, "The capital of France is Paris.", v.text)
	assert.Equal(t, 0, v.errors, "the engine's error was healed: %q", got)
	assert.Equal(t, 1, v.done)
	assert.Equal(t, 1, v.roles)
	evs := sessionEvents(t, sink, 1)
	end := lastEnd(t, evs)
	assert.Equal(t, "EngineDeadError", end.Error, "charged to the engine that failed")
	moves, _ := moveEvents(evs)
	require.Len(t, moves, 1)
	assert.Equal(t, "EngineDeadError", moves[0].Error, "moved for the engine's own error type")
	assert.Equal(t, int64(1), migrations(t, tp, outcomeMoved, "engine_error", ""))
}

// A request whose state cannot move is refused: the stream is cut as
// without proxy::migrate, byte for byte, the migrate endpoint gets
// nothing, and the refusal is counted with its reason.
func TestMigrateRefusals(t *testing.T) {
	chatWith := func(extra string) string {
		return `{"model":"m","messages":[{"role":"user","content":"q"}],"stream":true,"stream_options":{"include_usage":true},` + extra + `}`
	}
	tool := chunk(firstID, firstTime, `{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":""}}]}`, "")
	reasoning := chunk(firstID, firstTime, `{"reasoning_content":"Let me think"}`, "")
	for name, tt := range map[string]struct {
		path, body, reason string
		events             []string
	}{
		"n":                  {body: chatWith(`"n":2`), reason: refuseN},
		"best_of":            {path: "/v1/completions", body: `{"model":"m","prompt":"p","stream":true,"best_of":3}`, reason: refuseBestOf},
		"echo":               {path: "/v1/completions", body: `{"model":"m","prompt":"p","stream":true,"echo":true}`, reason: refuseEcho},
		"prompt ids":         {path: "/v1/completions", body: `{"model":"m","prompt":[1,2,3],"stream":true}`, reason: refusePrompt},
		"tools":              {body: chatWith(`"tools":[{"type":"function","function":{"name":"f"}}]`), reason: refuseTools},
		"tool_choice":        {body: chatWith(`"tool_choice":"auto"`), reason: refuseTools},
		"response_format":    {body: chatWith(`"response_format":{"type":"json_object"}`), reason: refuseFormat},
		"guided_json":        {body: chatWith(`"guided_json":{"type":"object"}`), reason: refuseGuided},
		"guided_regex":       {body: chatWith(`"guided_regex":"[a-z]+"`), reason: refuseGuided},
		"guided_choice":      {body: chatWith(`"guided_choice":["a","b"]`), reason: refuseGuided},
		"guided_grammar":     {body: chatWith(`"guided_grammar":"root ::= \"a\""`), reason: refuseGuided},
		"structured_outputs": {body: chatWith(`"structured_outputs":{"regex":"a+"}`), reason: refuseGuided},
		"logprobs":           {body: chatWith(`"logprobs":true`), reason: refuseLogprobs},
		"top_logprobs":       {body: chatWith(`"top_logprobs":2`), reason: refuseLogprobs},
		"assistant prefill":  {body: `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"A"}],"stream":true}`, reason: refuseContinuation},
		"continuous usage":   {body: chatWith(`"stream_options":{"include_usage":true,"continuous_usage_stats":true}`), reason: refuseStreamOptions},
		"budget spent":       {body: chatWith(`"max_tokens":4`), reason: refuseBudget},
		"tool call delta":    {body: chatWith(`"temperature":0`), reason: refuseToolCall, events: []string{firstStream()[0], tool, tool}},
		"reasoning delta":    {body: chatWith(`"temperature":0`), reason: refuseReasoning, events: []string{firstStream()[0], reasoning, reasoning}},
	} {
		t.Run(name, func(t *testing.T) {
			path := tt.path
			if path == "" {
				path = "/v1/chat/completions"
			}
			events := tt.events
			if events == nil {
				events = firstStream()
			}
			run := func(opts ...func(*Config)) (string, *testProxy, *consumertest.LogsSink) {
				first := freezingUpstream(t, events, func(int) time.Duration { return time.Millisecond })
				sink := new(consumertest.LogsSink)
				tp := startTestProxy(t, first.URL, sink, opts...)
				got, err := post(t, tp.proxyURL(), path, tt.body)
				require.ErrorIs(t, err, io.ErrUnexpectedEOF, "cut: %q", got)
				return got, tp, sink
			}
			second := continuingUpstream(t, secondStream())
			want, _, _ := run(withStallBreaker(0))
			got, tp, sink := run(withStallBreaker(0), withMigrate(second.URL, 1))
			assert.Equal(t, want, got, "today's cut, byte for byte")
			assert.Regexp(t, `"type":"engine_stalled"`, got)
			second.mu.Lock()
			assert.Empty(t, second.bodies, "nothing sent to the migrate endpoint")
			second.mu.Unlock()
			assert.Equal(t, int64(1), migrations(t, tp, outcomeRefused, "stall", tt.reason))
			assert.Equal(t, int64(1), stalledStreams(t, tp))
			evs := sessionEvents(t, sink, 1)
			end := lastEnd(t, evs)
			assert.Equal(t, errEngineStalled, end.Error)
			assert.Zero(t, end.Migrations, "not moved")
			moves, _ := moveEvents(evs)
			assert.Empty(t, moves, "a move refused has no event")
		})
	}
}

// A continuation that fails before its first token (the replica answers
// 503) leaves the stream as the failed engine left it: today's cut.
func TestMigrateContinuationFailsFallsBackToCut(t *testing.T) {
	first := freezingUpstream(t, firstStream(), func(int) time.Duration { return time.Millisecond })
	second := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":"overloaded"}`, http.StatusServiceUnavailable)
	})
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, first.URL, sink, withStallBreaker(0), withMigrate(second.URL, 1))
	got, err := post(t, tp.proxyURL(), "/v1/chat/completions", chatRequest)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, strings.Join(firstStream(), ""), strings.SplitAfter(got, " France\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")[0])
	assert.Regexp(t, `"type":"engine_stalled"`, got)
	assert.Equal(t, int64(1), migrations(t, tp, outcomeFailed, "stall", ""))
	assert.Equal(t, int64(1), stalledStreams(t, tp))
	evs := sessionEvents(t, sink, 1)
	assert.Zero(t, lastEnd(t, evs).Migrations, "a move that failed is no move")
	moves, _ := moveEvents(evs)
	assert.Empty(t, moves, "nor has it an event")
}

// A continuation that stalls in turn is cut once max_moves is spent: the
// client has both streams' text, once each, then the cut.
func TestMigrateMaxMoves(t *testing.T) {
	first := freezingUpstream(t, firstStream(), func(int) time.Duration { return time.Millisecond })
	cont := secondStream()[:3] // role, " is", " Paris", then it freezes
	second := freezingUpstream(t, cont, func(int) time.Duration { return time.Millisecond })
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, first.URL, sink, withStallBreaker(0), withMigrate(second.URL, 1))
	got, err := post(t, tp.proxyURL(), "/v1/chat/completions", chatRequest)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	events := strings.SplitAfter(got, "\n\n")
	last := events[len(events)-2]
	assert.Regexp(t, cutEvent(errEngineStalled, http.StatusGatewayTimeout), last)
	v := readClientStream(t, strings.Join(events[:len(events)-2], ""))
	assert.Equal(t, "The capital of France is Paris", v.text)
	assert.Equal(t, map[string]bool{firstID: true}, v.idsSeen)
	assert.Equal(t, int64(1), migrations(t, tp, outcomeMoved, "stall", ""))
	assert.Equal(t, int64(1), migrations(t, tp, outcomeRefused, "stall", refuseMaxMoves))
	end := lastEnd(t, sessionEvents(t, sink, 1))
	assert.Equal(t, errEngineStalled, end.Error)
	assert.Equal(t, int64(1), end.Migrations, "the move made, not the one refused")
	assert.Equal(t, 6, tokenCount(sessionEvents(t, sink, 1)))
}

// The session's end counts every move of the answer (llm.session.migrations):
// with max_moves 2 and a continuation that stalls in turn, two.
func TestMigrateCountsMovesOnTheEnd(t *testing.T) {
	first := freezingUpstream(t, firstStream(), func(int) time.Duration { return time.Millisecond })
	second := freezingUpstream(t, secondStream()[:3], func(int) time.Duration { return time.Millisecond })
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, first.URL, sink, withStallBreaker(0), withMigrate(second.URL, 2))
	_, err := post(t, tp.proxyURL(), "/v1/chat/completions", chatRequest)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "the third stall is cut")
	assert.Equal(t, int64(2), migrations(t, tp, outcomeMoved, "stall", ""))
	evs := sessionEvents(t, sink, 1)
	assert.Equal(t, int64(2), lastEnd(t, evs).Migrations)
	moves, at := moveEvents(evs)
	require.Len(t, moves, 2, "one move event per move made, none for the one refused")
	secondURL, _ := url.Parse(second.URL)
	for i, mv := range moves {
		assert.Equal(t, secondURL.Host, mv.Engine, "move %d", i)
		assert.Equal(t, errEngineStalled, mv.Error, "move %d", i)
		assert.Equal(t, int64(tokenCount(evs[:at[i]])), mv.Count, "move %d carries what was delivered before it", i)
	}
	assert.Equal(t, int64(4), moves[0].Count)
	assert.Greater(t, moves[1].Count, moves[0].Count, "the second carries the first continuation's tokens too")
}

// With migration on but its trigger not chosen, a stall is today's cut.
func TestMigrateTriggerNotChosen(t *testing.T) {
	first := freezingUpstream(t, firstStream(), func(int) time.Duration { return time.Millisecond })
	second := continuingUpstream(t, secondStream())
	only := func(c *Config) { c.Migrate.On = TriggerBroken }
	tp := startTestProxy(t, first.URL, new(consumertest.LogsSink), withStallBreaker(0), withMigrate(second.URL, 1), only)
	got, err := post(t, tp.proxyURL(), "/v1/chat/completions", chatRequest)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, strings.Join(firstStream(), ""), strings.TrimSuffix(got, strings.SplitAfter(got, "\n\n")[5]))
	second.mu.Lock()
	assert.Empty(t, second.bodies)
	second.mu.Unlock()
	assert.Equal(t, int64(1), stalledStreams(t, tp))
}
