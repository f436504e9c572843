// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/llamacpp"
)

// healMaxTokens is each request's max_tokens: at about a millisecond a
// token, over half a second of generation, so that the engine is frozen or
// killed mid-answer once the client has its first chunks (the niced engine
// only slows on a busy machine, which widens the margin). Not more: each
// case generates it about three times (straight, the first stream, the
// continuation), and 3000 took this test past go test's 10 minutes beside
// a CPU hog.
const healMaxTokens = 600

// healCall is a request of TestMigrateLlamaCpp. Sampled with a fixed seed
// (llama.cpp seeds each request's sampler with it): the same request to
// two servers of the same model gets the same text, as greedy sampling
// would, while greedy on the random-weight model repeats one token (":::
// feeling feeling …"), where a span repeated at the join could not be
// seen.
type healCall struct {
	path   string // /v1/chat/completions or /v1/completions
	prompt string
	extra  map[string]any
}

func (c healCall) chat() bool { return c.path == "/v1/chat/completions" }

// request is the request's members; cache_prompt false: every answer is
// computed from the whole prompt, so that an answer replayed is computed
// as the first was.
func (c healCall) request() map[string]any {
	req := map[string]any{
		"model": "tiny", "max_tokens": healMaxTokens, "ignore_eos": true,
		"temperature": 1, "seed": 7, "cache_prompt": false,
	}
	if c.chat() {
		req["messages"] = []map[string]string{{"role": "user", "content": c.prompt}}
	} else {
		req["prompt"] = c.prompt
	}
	for k, v := range c.extra {
		req[k] = v
	}
	return req
}

// body is the request streamed, usage asked.
func (c healCall) body() []byte {
	req := c.request()
	req["stream"] = true
	req["stream_options"] = map[string]bool{"include_usage": true}
	raw, _ := json.Marshal(req)
	return raw
}

// healedAnswer is a streamed answer as the client read it.
type healedAnswer struct {
	status        int
	contents      []string // the text of each content chunk, in order
	ids, created  map[string]bool
	roles         int // chunks with a delta.role
	finishReasons []string
	usage         *llamaUsage
	errorType     string
	dones         int
	readErr       error
}

func (a *healedAnswer) text() string { return strings.Join(a.contents, "") }

// healChunk is what the test reads of a chunk.
type healChunk struct {
	ID      string          `json:"id"`
	Created json.RawMessage `json:"created"`
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *llamaUsage `json:"usage"`
	Error *struct {
		Type string `json:"type"`
	} `json:"error"`
}

// readHealed reads a streamed answer whole; mark, when set, is called once
// markAfter content chunks came (the engine is frozen or killed there).
func readHealed(body io.Reader, markAfter int, mark func()) healedAnswer {
	a := healedAnswer{ids: map[string]bool{}, created: map[string]bool{}}
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadBytes('\n')
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data: "))
		switch {
		case ok && string(data) == "[DONE]":
			a.dones++
		case ok:
			var c healChunk
			if jerr := json.Unmarshal(data, &c); jerr != nil {
				a.readErr = fmt.Errorf("chunk %q: %w", data, jerr)
				return a
			}
			if c.Error != nil {
				a.errorType = c.Error.Type
				break
			}
			a.ids[c.ID], a.created[string(c.Created)] = true, true
			if c.Usage != nil {
				a.usage = c.Usage
			}
			for _, ch := range c.Choices {
				if ch.Delta.Role != "" {
					a.roles++
				}
				if ch.FinishReason != nil {
					a.finishReasons = append(a.finishReasons, *ch.FinishReason)
				}
				if text := ch.Text + ch.Delta.Content; text != "" {
					a.contents = append(a.contents, text)
					if len(a.contents) == markAfter && mark != nil {
						mark()
					}
				}
			}
		}
		if err != nil {
			if err != io.EOF {
				a.readErr = err
			}
			return a
		}
	}
}

// recordedMove is a continuation the proxy sent to the migrate endpoint:
// its request and the engine's answer, as the proxy got them.
type recordedMove struct {
	path     string
	request  []byte
	response bytes.Buffer
}

// moveRecorder is the migrate endpoint: a reverse proxy in front of the
// healthy llama-server that keeps each request and answer.
type moveRecorder struct {
	*httptest.Server
	mu    sync.Mutex
	moves []*recordedMove // each once its answer has been relayed whole
}

type teeBody struct {
	io.ReadCloser
	to *bytes.Buffer
}

func (b teeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.to.Write(p[:n])
	return n, err
}

func startMoveRecorder(t *testing.T, target string) *moveRecorder {
	u, err := url.Parse(target)
	require.NoError(t, err)
	transport := &http.Transport{}
	r := &moveRecorder{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		m := &recordedMove{path: req.URL.Path}
		m.request, _ = io.ReadAll(req.Body)
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(m.request)), int64(len(m.request))
		rp := &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
			Transport:     transport,
			FlushInterval: -1,
			ModifyResponse: func(resp *http.Response) error {
				resp.Body = teeBody{resp.Body, &m.response}
				return nil
			},
		}
		rp.ServeHTTP(w, req)
		r.mu.Lock()
		r.moves = append(r.moves, m)
		r.mu.Unlock()
	}))
	t.Cleanup(func() {
		r.Close()
		transport.CloseIdleConnections()
	})
	return r
}

func (r *moveRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.moves)
}

// wait waits for the n-th continuation's answer and returns it.
func (r *moveRecorder) wait(t *testing.T, n int) *recordedMove {
	t.Helper()
	require.Eventually(t, func() bool { return r.count() >= n }, time.Minute, 10*time.Millisecond, "continuation %d", n)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.moves[n-1]
}

// streamText is the text of a streamed answer.
func streamText(t *testing.T, raw []byte) string {
	t.Helper()
	a := readHealed(bytes.NewReader(raw), 0, nil)
	require.NoError(t, a.readErr)
	require.Empty(t, a.errorType)
	return a.text()
}

// healBed is three llama-servers of the same model: one the test freezes
// (SIGSTOP), one it kills, each behind a proxy of one collector, and the
// healthy one behind the recorder, the proxies' migrate endpoint.
type healBed struct {
	frozen, killed, healthy *llamacpp.Server
	recorder                *moveRecorder
	sink                    *sink
	proxyA, proxyB          string
	client                  *http.Client
}

func startHealBed(t *testing.T) *healBed {
	t.Helper()
	b := &healBed{}
	opts := llamacpp.Options{Parallel: 2, Context: 8192}
	b.frozen, b.killed, b.healthy = llamacpp.Start(t, opts), llamacpp.Start(t, opts), llamacpp.Start(t, opts)
	t.Logf("llama.cpp %s", llamacpp.Release(t))
	b.recorder = startMoveRecorder(t, b.healthy.URL)
	var sinkAddr string
	b.sink, sinkAddr = startSink(t)
	b.proxyB = freePort(t, "tcp")
	col := startCollector(t, "migrate.yaml", sinkAddr, "UPSTREAM_URL="+b.frozen.URL, "UPSTREAM_B_URL="+b.killed.URL,
		"PROXY_B_ENDPOINT="+b.proxyB, "MIGRATE_URL="+b.recorder.URL)
	b.proxyA = col.proxyAddr
	transport := &http.Transport{}
	b.client = &http.Client{Transport: transport, Timeout: 2 * time.Minute}
	t.Cleanup(transport.CloseIdleConnections)
	return b
}

// stream sends c to url and reads the answer (see readHealed).
func (b *healBed) stream(t *testing.T, url string, c healCall, traceID pcommon.TraceID, markAfter int, mark func()) healedAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+c.path, bytes.NewReader(c.body()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+hex.EncodeToString(traceID[:])+"-"+hex.EncodeToString(traceID[8:])+"-01")
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	a := readHealed(resp.Body, markAfter, mark)
	a.status = resp.StatusCode
	return a
}

// straight is the healthy server's own answer to body at path.
func (b *healBed) straight(t *testing.T, path string, body []byte) string {
	t.Helper()
	resp, err := b.client.Post(b.healthy.URL+path, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	return streamText(t, raw)
}

// thaw resumes the frozen server and waits until it has noticed that the
// proxy left its request: the next request then has the server to itself
// and is computed as a lone request is.
func (b *healBed) thaw(t *testing.T) {
	t.Helper()
	require.NoError(t, b.frozen.Thaw())
	require.Eventually(t, func() bool {
		resp, err := b.client.Get(b.frozen.URL + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return bytes.Contains(raw, []byte("\nllamacpp:requests_processing 0\n"))
	}, time.Minute, 20*time.Millisecond, "the thawed server goes idle")
}

// session is the attributes of the session span of traceID.
func (b *healBed) session(t *testing.T, traceID pcommon.TraceID) map[string]any {
	t.Helper()
	var attrs map[string]any
	require.Eventually(t, func() bool {
		for _, span := range b.sink.Spans() {
			if a := span.Attributes().AsRaw(); span.TraceID() == traceID && a["llm.session.id"] != nil {
				attrs = a
				return true
			}
		}
		return false
	}, time.Minute, 20*time.Millisecond, "the session span")
	return attrs
}

// carriedText is what a continuation carried of the answer, read from its
// request: the final assistant message it continues (chat) or what follows
// the client's prompt (completions). It also checks that the rest of the
// request is the client's, max_tokens reduced by carried token events.
func carriedText(t *testing.T, c healCall, m *recordedMove) (text string, maxTokens int64) {
	t.Helper()
	assert.Equal(t, c.path, m.path)
	var got map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(m.request, &got), "%s", m.request)
	want := c.request()
	for k, v := range want {
		switch k {
		case "max_tokens", "messages", "prompt":
			continue
		}
		raw, _ := json.Marshal(v)
		assert.JSONEq(t, string(raw), string(got[k]), "the continuation carries %s as the client sent it", k)
	}
	require.NoError(t, json.Unmarshal(got["max_tokens"], &maxTokens))
	assert.JSONEq(t, `true`, string(got["stream"]))
	if !c.chat() {
		var prompt string
		require.NoError(t, json.Unmarshal(got["prompt"], &prompt))
		require.True(t, strings.HasPrefix(prompt, c.prompt), "the continuation's prompt begins with the client's: %q", prompt)
		return strings.TrimPrefix(prompt, c.prompt), maxTokens
	}
	var msgs []map[string]string
	require.NoError(t, json.Unmarshal(got["messages"], &msgs))
	require.Len(t, msgs, 2, "the client's message and the answer so far")
	assert.Equal(t, map[string]string{"role": "user", "content": c.prompt}, msgs[0])
	assert.Equal(t, "assistant", msgs[1]["role"])
	assert.JSONEq(t, `true`, string(got["continue_final_message"]))
	assert.JSONEq(t, `false`, string(got["add_generation_prompt"]))
	return msgs[1]["content"], maxTokens
}

// assertHealed checks an answer healed by one move, m: the client got one
// whole answer (one id, one role chunk, one finish_reason, the usage of
// max_tokens, one [DONE], no error) that is the text of the failed engine
// up to the move followed by the healthy engine's continuation, nothing
// repeated and nothing lost:
//   - the continuation carried exactly the text of the first j content
//     chunks the client got, and max_tokens less j;
//   - the client's chunks after the j-th are the continuation's text as
//     the healthy engine sent it, and that text is what the engine gives
//     again to the same request sent straight (the continuation is the
//     engine's, not the proxy's);
//   - the text carried is a prefix of the healthy engine's own answer to
//     the client's request (the failed engine wrote what the healthy one
//     would have: same model, same seed);
//   - the continuation does not begin with the text carried (the engine
//     continued it, it did not write it again).
//
// The healed answer is not asserted equal to the healthy engine's own
// answer: the continuation is another request, with its own sampling from
// the seed, and the chat template renders the carried text as a message
// ("assistant: …") where the first request had the generation prompt
// ("assistant:") before it.
func (b *healBed) assertHealed(t *testing.T, c healCall, a healedAnswer, m *recordedMove, straight string) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status)
	require.NoError(t, a.readErr)
	assert.Empty(t, a.errorType, "no error reaches the client")
	assert.Equal(t, 1, a.dones, "one [DONE]")
	assert.Len(t, a.ids, 1, "one id")
	assert.Len(t, a.created, 1, "one created")
	assert.Equal(t, []string{"length"}, a.finishReasons, "one finish_reason")
	if c.chat() {
		assert.Equal(t, 1, a.roles, "one role chunk")
	}
	if assert.NotNil(t, a.usage, "the usage asked") {
		assert.Equal(t, int64(healMaxTokens), a.usage.CompletionTokens, "the usage says the whole answer")
	}

	carried, maxTokens := carriedText(t, c, m)
	j, text := 0, ""
	for j < len(a.contents) && len(text) < len(carried) {
		text += a.contents[j]
		j++
	}
	require.Equal(t, carried, text, "the continuation carries the text of the client's first %d chunks", j)
	require.Less(t, j, len(a.contents), "the continuation delivered something")
	assert.Equal(t, int64(healMaxTokens-j), maxTokens, "max_tokens less the %d chunks delivered", j)

	continued := streamText(t, m.response.Bytes())
	assert.Equal(t, continued, strings.Join(a.contents[j:], ""), "the client's chunks after the move are the continuation's")
	again := b.straight(t, c.path, m.request)
	assert.Equal(t, continued, again, "the continuation is what the healthy engine gives that request straight")
	assert.True(t, strings.HasPrefix(straight, carried), "the failed engine's text is the healthy engine's own answer so far:\n%q\n%q", carried, straight[:min(len(straight), len(carried)+40)])
	assert.False(t, strings.HasPrefix(continued, carried), "the continuation does not write the carried text again")
	t.Logf("%s: moved after %d of %d content chunks (%d bytes carried, %d continued)", c.path, j, len(a.contents), len(carried), len(continued))
}

// TestMigrateLlamaCpp (issue 43): proxy::migrate through the binary with
// real engines. Three llama-servers of the same model; the collector's two
// proxies front the first two, the stall breaker on (2 s), and continue a
// failing stream on the third (through a recorder that keeps what the
// proxy sent and got). (a) The first server frozen (SIGSTOP) mid-answer,
// chat and completions: the stall breaker cuts it, the client gets one
// whole answer (see assertHealed), its session ends error engine_stalled
// (the failed engine's fault) with the whole answer's tokens and
// llm.session.migrations 1. (b) The second server killed mid-answer: the
// same, error.type upstream_stream_broken. (c) A request the proxy must
// not move (logprobs): the cut as without migration, nothing sent to the
// continuation's engine, no llm.session.migrations. (d) The official
// OpenAI JS client, the first server frozen mid-answer: it reads one
// uninterrupted answer, the text delivered then the continuation's.
func TestMigrateLlamaCpp(t *testing.T) {
	b := startHealBed(t)
	proxyA, proxyB := "http://"+b.proxyA, "http://"+b.proxyB
	moves := 0

	healed := func(t *testing.T, proxy string, c healCall, fail func() error, errorType string) {
		straight := b.straight(t, c.path, c.body())
		traceID := newTraceID(t)
		a := b.stream(t, proxy, c, traceID, 3, func() { require.NoError(t, fail()) })
		moves++
		m := b.recorder.wait(t, moves)
		b.assertHealed(t, c, a, m, straight)
		s := b.session(t, traceID)
		assert.Equal(t, "error", s["llm.session.outcome"], "the session is the failed engine's")
		assert.Equal(t, errorType, s["error.type"])
		assert.Equal(t, int64(healMaxTokens), s["gen_ai.usage.output_tokens"], "the whole answer's tokens")
		assert.Equal(t, int64(1), s["llm.session.migrations"], "moved once")
	}

	t.Run("frozen chat", func(t *testing.T) {
		defer b.thaw(t)
		healed(t, proxyA, healCall{path: "/v1/chat/completions", prompt: "tell me a long story"}, b.frozen.Freeze, "engine_stalled")
	})
	t.Run("frozen completions", func(t *testing.T) {
		defer b.thaw(t)
		healed(t, proxyA, healCall{path: "/v1/completions", prompt: "Once upon a time"}, b.frozen.Freeze, "engine_stalled")
	})

	t.Run("refused: logprobs", func(t *testing.T) {
		defer b.thaw(t)
		c := healCall{path: "/v1/chat/completions", prompt: "tell me another story", extra: map[string]any{"logprobs": true}}
		traceID := newTraceID(t)
		a := b.stream(t, proxyA, c, traceID, 3, func() { require.NoError(t, b.frozen.Freeze()) })
		assert.Equal(t, http.StatusOK, a.status)
		assert.Equal(t, "engine_stalled", a.errorType, "the cut's error event")
		assert.Zero(t, a.dones, "no [DONE]")
		assert.ErrorIs(t, a.readErr, io.ErrUnexpectedEOF, "the response does not end: the stream is not whole")
		s := b.session(t, traceID)
		assert.Equal(t, "engine_stalled", s["error.type"])
		assert.NotContains(t, s, "llm.session.migrations", "not moved")
		assert.Equal(t, moves, b.recorder.count(), "nothing sent to the migrate endpoint")
	})

	t.Run("openai-js", func(t *testing.T) {
		defer b.thaw(t)
		node, dir := openAIJSClient(t)
		c := healCall{path: "/v1/chat/completions", prompt: "tell me a story in JavaScript"}
		req, err := json.Marshal(c.request())
		require.NoError(t, err)
		straight := b.straight(t, c.path, c.body())
		cmd := exec.Command(node, "stream.mjs")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "BASE_URL="+proxyA+"/v1", "REQUEST="+string(req), "MARK_AFTER=3")
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		var o jsOutcome
		lines := bufio.NewScanner(stdout)
		lines.Buffer(nil, 1<<20)
		for lines.Scan() {
			if lines.Text() == `{"streaming":true}` {
				require.NoError(t, b.frozen.Freeze())
				continue
			}
			require.NoError(t, json.Unmarshal(lines.Bytes(), &o), "%s", lines.Bytes())
		}
		require.NoError(t, cmd.Wait(), "node stream.mjs: %s", stderr.Bytes())
		moves++
		m := b.recorder.wait(t, moves)
		carried, _ := carriedText(t, c, m)
		continued := streamText(t, m.response.Bytes())
		assert.Equal(t, jsOutcome{Outcome: "completed", Text: carried + continued, IDs: 1}, o,
			"one uninterrupted answer: the text delivered, then the continuation's")
		assert.NotEmpty(t, carried)
		assert.NotEmpty(t, continued)
		assert.True(t, strings.HasPrefix(straight, carried), "the failed engine's text is the healthy engine's own answer so far")
	})

	t.Run("killed chat", func(t *testing.T) {
		healed(t, proxyB, healCall{path: "/v1/chat/completions", prompt: "tell me a story about a crash"},
			func() error { b.killed.Kill(); return nil }, "upstream_stream_broken")
	})
}
