// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/llamacpp"
)

// llamaBed is two llama-servers, each behind a proxy of one collector.
type llamaBed struct {
	sink    *sink
	col     *collector
	servers [2]*llamacpp.Server
	proxies [2]string
	client  *http.Client
}

// startLlamaBed starts two llama-servers (2 slots each, continuous
// batching, /metrics) and the collector with testdata/llamacpp.yaml.
func startLlamaBed(t *testing.T) *llamaBed {
	t.Helper()
	b := &llamaBed{}
	for i := range b.servers {
		b.servers[i] = llamacpp.Start(t, llamacpp.Options{Parallel: 2, Context: 8192})
	}
	t.Logf("llama.cpp %s", llamacpp.Release(t))
	var sinkAddr string
	b.sink, sinkAddr = startSink(t)
	proxyB := freePort(t, "tcp")
	b.col = startCollector(t, "llamacpp.yaml", sinkAddr,
		"UPSTREAM_URL="+b.servers[0].URL, "UPSTREAM_B_URL="+b.servers[1].URL, "PROXY_B_ENDPOINT="+proxyB)
	b.proxies = [2]string{b.col.proxyAddr, proxyB}
	transport := &http.Transport{MaxIdleConnsPerHost: 16, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &stampedConn{Conn: c}, nil
	}}
	b.client = &http.Client{Transport: transport, Timeout: 2 * time.Minute}
	t.Cleanup(transport.CloseIdleConnections)
	// Three requests through each proxy first, at once, as the other
	// timing tests warm up: the connections the clients then reuse, and the
	// first use of the code on each side, are not what the tests compare.
	var wg sync.WaitGroup
	warm := make([]llamaResult, 6)
	for i := range warm {
		c := llamaCall{kind: "warm-up", proxy: b.proxies[i%2], path: "/v1/chat/completions", prompt: "hi", maxTokens: 2, stream: true, traceID: newTraceID(t)}
		wg.Go(func() { warm[i] = b.call(c) })
	}
	wg.Wait()
	for _, r := range warm {
		require.True(t, r.status == http.StatusOK || isUnreachable(r), "warm-up through %s: %+v", r.call.proxy, r)
	}
	return b
}

// llamaCall is one request of a test client.
type llamaCall struct {
	kind      string // names it in failure messages
	proxy     string
	path      string // /v1/chat/completions or /v1/completions
	prompt    string
	maxTokens int
	stream    bool
	// askUsage adds stream_options.include_usage to a streamed request.
	askUsage bool
	// leaveAfter: the client goes away after that many content chunks
	// (0: it reads the whole answer).
	leaveAfter int
	// streaming, when set, is closed once three content chunks came.
	streaming chan struct{}
	traceID   pcommon.TraceID
}

// body is the request's JSON. Greedy sampling (temperature 0): the same
// request to two servers of the same model gets the same tokens.
func (c llamaCall) body() []byte {
	body := map[string]any{"model": "tiny", "max_tokens": c.maxTokens, "stream": c.stream, "ignore_eos": true, "temperature": 0}
	if c.path == "/v1/completions" {
		body["prompt"] = c.prompt
	} else {
		body["messages"] = []map[string]string{{"role": "user", "content": c.prompt}}
	}
	if c.stream && c.askUsage {
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	raw, _ := json.Marshal(body)
	return raw
}

// llamaUsage is the OpenAI usage object.
type llamaUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// llamaTimings is the part of llama.cpp's timings object the tests read.
type llamaTimings struct {
	PromptMs float64 `json:"prompt_ms"`
}

// llamaChunk is what a client reads of an answer or a stream's chunk.
type llamaChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string            `json:"content"`
			Reasoning        string            `json:"reasoning"`
			ReasoningContent string            `json:"reasoning_content"`
			ToolCalls        []json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage   *llamaUsage   `json:"usage"`
	Timings *llamaTimings `json:"timings"`
	Error   *struct {
		Type string `json:"type"`
	} `json:"error"`
}

// hasContent says whether a chunk carries output, as the proxy counts a
// token event: non-empty text, content, reasoning or tool calls.
func (c *llamaChunk) hasContent() bool {
	for _, ch := range c.Choices {
		d := ch.Delta
		if ch.Text != "" || d.Content != "" || d.Reasoning != "" || d.ReasoningContent != "" || len(d.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// llamaResult is what the client measured.
type llamaResult struct {
	call   llamaCall
	status int
	// errorType is the type of the proxy's own error answer.
	errorType string
	// ttft is the time from sending the request to the first content
	// chunk; tpot (last − first content chunk)/(output tokens − 1).
	ttft, tpot    time.Duration
	contentChunks int
	usage         *llamaUsage
	// timings is the last timings object the client got.
	timings *llamaTimings
	done    bool  // the stream ended with [DONE]
	readErr error // the answer could not be read whole
}

func newTraceID(t *testing.T) pcommon.TraceID {
	var id pcommon.TraceID
	_, err := rand.Read(id[:])
	require.NoError(t, err)
	return id
}

// call makes c's request and measures the answer as the client sees it.
func (b *llamaBed) call(c llamaCall) llamaResult {
	r := llamaResult{call: c}
	raw := c.body()
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.proxy+c.path, bytes.NewReader(raw))
	if err != nil {
		r.readErr = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	spanID := c.traceID[8:]
	req.Header.Set("traceparent", "00-"+hex.EncodeToString(c.traceID[:])+"-"+hex.EncodeToString(spanID)+"-01")

	// The client's clocks are its socket's (see stampedConn), so that
	// the test's own work, slowed by the race detector, is not measured.
	var conn *stampedConn
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		conn = info.Conn.(*stampedConn)
		conn.firstWrite.Store(0)
	}}))
	resp, err := b.client.Do(req)
	if err != nil {
		r.readErr = err
		return r
	}
	defer resp.Body.Close()
	start := time.Unix(0, conn.firstWrite.Load())
	r.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var whole llamaChunk
		raw, err := io.ReadAll(resp.Body)
		if err == nil {
			err = json.Unmarshal(raw, &whole)
		}
		r.readErr = err
		r.usage, r.timings = whole.Usage, whole.Timings
		if whole.Error != nil {
			r.errorType = whole.Error.Type
		}
		return r
	}

	var first, last time.Time
	arrivals := &stampedReader{r: resp.Body, conn: conn}
	br := bufio.NewReader(arrivals)
	for {
		line, err := br.ReadBytes('\n')
		at := arrivals.arrival(len(line))
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data: "))
		switch {
		case ok && string(data) == "[DONE]":
			r.done = true
		case ok:
			var chunk llamaChunk
			if jerr := json.Unmarshal(data, &chunk); jerr != nil {
				r.readErr = fmt.Errorf("chunk %q: %w", data, jerr)
				return r
			}
			if chunk.Error != nil {
				r.errorType = chunk.Error.Type
			}
			if chunk.Usage != nil {
				r.usage = chunk.Usage
			}
			if chunk.Timings != nil {
				r.timings = chunk.Timings
			}
			if chunk.hasContent() {
				if first.IsZero() {
					first, r.ttft = at, at.Sub(start)
				}
				last = at
				r.contentChunks++
				if r.contentChunks == 3 && c.streaming != nil {
					close(c.streaming)
				}
				if r.contentChunks == c.leaveAfter {
					leave()
					return r
				}
			}
		}
		if err != nil {
			if err != io.EOF || !r.done {
				r.readErr = err
			}
			break
		}
	}
	if !first.IsZero() {
		n := int64(c.maxTokens)
		if r.usage != nil {
			n = r.usage.CompletionTokens
		}
		if n > 1 {
			r.tpot = last.Sub(first) / time.Duration(n-1)
		}
	}
	return r
}

// stampedConn notes when the first write of a request began (the request
// leaves: the collector's clock starts when it reads it) and when
// the latest read returned (the bytes a read of the body returns came with
// it or before: a chunk that came with the response's head is not dated by
// when the client got round to reading it).
type stampedConn struct {
	net.Conn
	firstWrite, lastRead atomic.Int64 // Unix nanoseconds
}

func (c *stampedConn) Write(p []byte) (int, error) {
	c.firstWrite.CompareAndSwap(0, time.Now().UnixNano())
	return c.Conn.Write(p)
}

func (c *stampedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.lastRead.Store(time.Now().UnixNano())
	}
	return n, err
}

// stampedReader dates each read of a response body by its connection's
// latest read, so that a line's time is when its last byte arrived, not
// when the client got round to it after handling the lines before it.
type stampedReader struct {
	r        io.Reader
	conn     *stampedConn
	ends     []int64 // bytes read in all after each read
	times    []time.Time
	total    int64
	consumed int64 // bytes of the lines handed out
}

func (s *stampedReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.total += int64(n)
		s.ends, s.times = append(s.ends, s.total), append(s.times, time.Unix(0, s.conn.lastRead.Load()))
	}
	return n, err
}

// arrival returns the time of the read that brought the last byte of the
// next n bytes.
func (s *stampedReader) arrival(n int) time.Time {
	s.consumed += int64(n)
	for len(s.ends) > 1 && s.ends[0] < s.consumed {
		s.ends, s.times = s.ends[1:], s.times[1:]
	}
	if len(s.times) == 0 {
		return time.Now()
	}
	return s.times[0]
}

// sessions returns the session spans' attributes by trace ID.
func (b *llamaBed) sessions() map[pcommon.TraceID]map[string]any {
	out := map[pcommon.TraceID]map[string]any{}
	for _, span := range b.sink.Spans() {
		if a := span.Attributes().AsRaw(); a["llm.session.id"] != nil {
			out[span.TraceID()] = a
		}
	}
	return out
}

// waitSessions waits for a session span for each result and returns them.
func (b *llamaBed) waitSessions(t *testing.T, results []llamaResult) map[pcommon.TraceID]map[string]any {
	t.Helper()
	have := func() int {
		s, n := b.sessions(), 0
		for _, r := range results {
			if s[r.call.traceID] != nil {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return have() == len(results) }, time.Minute, 20*time.Millisecond,
		"a session for each of %d requests; %d came\n%s", len(results), have(), b.col.Output)
	return b.sessions()
}

// timingCheck is a collector figure (seconds, from a span) against the
// client's own measurement.
type timingCheck struct {
	what      string
	collector any
	client    time.Duration
}

// within says whether the collector's figure is the client's within 1 ms
// or 2%, whichever is larger.
func (c timingCheck) within() bool {
	got, ok := c.collector.(float64)
	want := c.client.Seconds()
	return ok && math.Abs(got-want) <= max(0.001, 0.02*want)
}

// assertTimings requires 80% of the checks within 1 ms or 2% of the
// client, and half within 1 ms, and logs the others. Not all: on a loaded
// machine (the CI runs two packages' tests at once on two cores) a process
// is now and then scheduled milliseconds late, and the collector cannot
// see a wait before it reads the request, nor the client one after the
// collector relayed a chunk. A collector that measured from anything but
// the request and the first token misses by far more, every time.
func assertTimings(t *testing.T, what string, checks []timingCheck) {
	t.Helper()
	var out []string
	var diffs []float64
	for _, c := range checks {
		got, _ := c.collector.(float64)
		diffs = append(diffs, math.Abs(got-c.client.Seconds())*1e3)
		if !c.within() {
			out = append(out, fmt.Sprintf("%s: collector %.3f ms, client %.3f ms", c.what, got*1e3, c.client.Seconds()*1e3))
		}
	}
	require.NotEmpty(t, checks, what)
	t.Logf("%s: %d of %d within 1 ms or 2%% of the client; the difference's p50 %.3f ms, p90 %.3f ms", what,
		len(checks)-len(out), len(checks), quantile(diffs, 0.5), quantile(diffs, 0.9))
	for _, o := range out {
		t.Log(o)
	}
	assert.GreaterOrEqual(t, float64(len(checks)-len(out)), 0.8*float64(len(checks)),
		"%s: at least 80%% within 1 ms or 2%% of the client", what)
	assert.LessOrEqual(t, quantile(diffs, 0.5), 1.0, "%s: half within 1 ms of the client", what)
}

// longPrompt is a prompt of about n words, different from every other from
// its first word on, so that no request reuses another's cached prefix.
func longPrompt(id, words int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "request %d:", id)
	vocab := []string{"river", "stone", "lantern", "orbit", "meadow", "signal", "harbor", "copper", "thistle", "ember"}
	for i := range words {
		sb.WriteString(" ")
		sb.WriteString(vocab[(i*7+id)%len(vocab)])
	}
	return sb.String()
}

// isUnreachable says whether a request failed with the proxy's own 502.
// Issue 39: llama-server closes its connection after every streamed answer
// while announcing keep-alive; before the proxy retried a reused connection
// that failed before any answer byte, 0 to 5 of 40 requests got this 502
// from a healthy engine. None may now.
func isUnreachable(r llamaResult) bool {
	return r.status == http.StatusBadGateway && r.errorType == "upstream_unreachable"
}

// TestLlamaCppEndToEnd: two real llama-servers (llama.cpp, a tiny
// random-weight model, 2 slots each) behind the collector's proxies, six
// clients at a time with prompts of about 600 words: streamed chat and
// completions, with and without usage asked, and non-streamed chat, so that
// requests wait for a slot. The sessions' TTFT and TPOT are the client's
// within 1 ms or 2% (see assertTimings), every session's token counts are
// the engine's usage and its outcome completed.
func TestLlamaCppEndToEnd(t *testing.T) {
	b := startLlamaBed(t)

	const requests, clients = 40, 6
	kinds := []llamaCall{
		{kind: "streamed chat, usage asked", path: "/v1/chat/completions", stream: true, askUsage: true},
		{kind: "streamed completions, usage asked", path: "/v1/completions", stream: true, askUsage: true},
		{kind: "non-streamed chat", path: "/v1/chat/completions"},
		{kind: "streamed chat", path: "/v1/chat/completions", stream: true},
		{kind: "streamed completions", path: "/v1/completions", stream: true},
	}
	calls := make([]llamaCall, requests)
	for i := range calls {
		c := kinds[i%len(kinds)]
		c.proxy, c.prompt, c.maxTokens, c.traceID = b.proxies[i%2], longPrompt(i, 600), 24+i%9, newTraceID(t)
		calls[i] = c
	}
	results := make([]llamaResult, requests)
	var wg sync.WaitGroup
	work := make(chan int)
	for range clients {
		wg.Go(func() {
			for i := range work {
				results[i] = b.call(calls[i])
			}
		})
	}
	for i := range calls {
		work <- i
	}
	close(work)
	wg.Wait()

	sessions := b.waitSessions(t, results)
	var unreachable, waited, chatsWithoutUsage, timingsWithoutUsage, sawWaiting int
	var maxWait time.Duration
	var ttft, tpot []timingCheck
	for i, r := range results {
		name := fmt.Sprintf("request %d (%s)", i, r.call.kind)
		if isUnreachable(r) {
			unreachable++
			continue
		}
		if !assert.Equal(t, http.StatusOK, r.status, name) || !assert.NoError(t, r.readErr, name) {
			continue
		}
		s := sessions[r.call.traceID]
		assert.Equal(t, "completed", s["llm.session.outcome"], name)
		// llama.cpp's own timings split every session (issue 39, finding 3).
		assert.Equal(t, "llamacpp_timings", s["llm.session.timing_source"], "%s: timing source", name)
		assert.Equal(t, r.call.stream, s["gen_ai.request.stream"], name)
		// The engine's state from its real /metrics (requests_deferred),
		// scraped every 200 ms from the start: no KV figure, which a
		// current llama.cpp does not expose.
		if w, ok := s["llamacpp.num_requests_waiting.start"].(float64); assert.True(t, ok, "%s: requests waiting at the start", name) && w > 0 {
			sawWaiting++
		}
		assert.NotContains(t, s, "llamacpp.kv_cache_usage.start", name)
		// ignore_eos: the engine generates max_tokens, whether or not the
		// client asked for usage.
		assert.Equal(t, int64(r.call.maxTokens), s["gen_ai.usage.output_tokens"], name)
		if r.usage != nil {
			assert.Equal(t, r.usage.PromptTokens, s["gen_ai.usage.input_tokens"], "%s: input tokens", name)
			assert.Equal(t, r.usage.CompletionTokens, s["gen_ai.usage.output_tokens"], "%s: output tokens", name)
		} else {
			assert.False(t, r.call.askUsage || !r.call.stream, "%s: the client got no usage", name)
		}
		if !r.call.stream {
			continue
		}
		if r.call.path == "/v1/chat/completions" && !r.call.askUsage {
			chatsWithoutUsage++
			if r.timings != nil {
				timingsWithoutUsage++
			}
		}
		assert.True(t, r.done, "%s: [DONE]", name)
		ttft = append(ttft, timingCheck{name, s["llm.session.ttft"], r.ttft})
		tpot = append(tpot, timingCheck{name, s["llm.session.tpot"], r.tpot})
		if r.timings != nil {
			if prefill, ok := s["llm.session.prefill_time"].(float64); assert.True(t, ok, "%s: prefill time", name) {
				assert.InDelta(t, r.timings.PromptMs/1000, prefill, 1e-6, "%s: prefill is llama.cpp's prompt_ms", name)
			}
			waited++
			maxWait = max(maxWait, r.ttft-time.Duration(r.timings.PromptMs*float64(time.Millisecond)))
		}
	}
	assertTimings(t, "TTFT", ttft)
	assertTimings(t, "TPOT", tpot)
	assert.Zero(t, unreachable, "requests that got the proxy's 502 upstream_unreachable from a healthy engine")
	// A request waits for a slot when its TTFT is well beyond the engine's
	// own prefill time (prompt_ms): the load is what this test is about.
	require.NotZero(t, waited, "llama.cpp's timings reached some client")
	assert.Greater(t, maxWait, 30*time.Millisecond, "some request waited for a slot")
	t.Logf("longest wait for a slot: %s; %d sessions started with requests waiting (llama.cpp's /metrics)", maxWait, sawWaiting)
	assert.NotZero(t, sawWaiting, "sessions that started while llama.cpp said requests were waiting for a slot")
	// Issue 39: llama.cpp puts its timings on a stream's last chunk, the
	// usage chunk when usage is asked; the proxy, which asks for usage for
	// its own counting, takes out only the usage it asked for.
	assert.Equal(t, chatsWithoutUsage, timingsWithoutUsage, "streamed chats that did not ask for usage and got llama.cpp's timings")
}

// TestLlamaCppLeftAndKilled: a client that goes away mid-stream ends its
// session aborted, and a llama-server killed mid-stream ends its streams'
// sessions in an error, while the clients of the other server are served.
func TestLlamaCppLeftAndKilled(t *testing.T) {
	b := startLlamaBed(t)
	var (
		results = make([]llamaResult, 5)
		wg      sync.WaitGroup
	)
	prompt := "tell me a long story"
	// Two clients go away after five chunks of long answers, one on each
	// engine.
	for i := range 2 {
		c := llamaCall{
			kind: "client left", proxy: b.proxies[i], path: "/v1/chat/completions", prompt: prompt, maxTokens: 2000,
			stream: true, askUsage: true, leaveAfter: 5, traceID: newTraceID(t),
		}
		wg.Go(func() { results[i] = b.call(c) })
	}
	wg.Wait()

	// Two long streams on engine b, which is killed once both stream; one
	// on engine a, which goes on.
	var streaming []chan struct{}
	for i := 2; i < 5; i++ {
		proxy := b.proxies[1]
		if i == 4 {
			proxy = b.proxies[0]
		}
		c := llamaCall{
			kind: "engine killed", proxy: proxy, path: "/v1/chat/completions", prompt: prompt, maxTokens: 600,
			stream: true, askUsage: true, streaming: make(chan struct{}), traceID: newTraceID(t),
		}
		if i == 4 {
			c.kind, c.maxTokens = "other engine", 64
		}
		streaming = append(streaming, c.streaming)
		wg.Go(func() { results[i] = b.call(c) })
	}
	for _, ch := range streaming[:2] {
		select {
		case <-ch:
		case <-time.After(time.Minute):
			t.Fatal("the streams to engine b did not start")
		}
	}
	b.servers[1].Kill()
	wg.Wait()

	sessions := b.waitSessions(t, results)
	for i, r := range results {
		name := fmt.Sprintf("request %d (%s)", i, r.call.kind)
		s := sessions[r.call.traceID]
		require.False(t, isUnreachable(r), "%s: the proxy's 502 upstream_unreachable from a healthy engine", name)
		require.Equal(t, http.StatusOK, r.status, name)
		switch r.call.kind {
		case "client left":
			assert.Equal(t, 5, r.contentChunks, name)
			assert.Equal(t, "aborted", s["llm.session.outcome"], name)
			// The proxy may have relayed a chunk the client did not read.
			assert.GreaterOrEqual(t, s["gen_ai.usage.output_tokens"], int64(r.contentChunks), name)
		case "engine killed":
			assert.False(t, r.done, "%s: no [DONE] from a killed engine", name)
			// The cut as the proxy tells it: an error event, then no end
			// of the response.
			assert.Equal(t, "upstream_stream_broken", r.errorType, "%s: the error event", name)
			assert.ErrorIs(t, r.readErr, io.ErrUnexpectedEOF, name)
			assert.Equal(t, "error", s["llm.session.outcome"], name)
			assert.Equal(t, "upstream_stream_broken", s["error.type"], name)
			assert.Equal(t, int64(r.contentChunks), s["gen_ai.usage.output_tokens"], "%s: the tokens the client got", name)
		case "other engine":
			assert.NoError(t, r.readErr, name)
			assert.True(t, r.done, name)
			assert.Equal(t, "completed", s["llm.session.outcome"], name)
			assert.Equal(t, r.usage.CompletionTokens, s["gen_ai.usage.output_tokens"], name)
		}
	}
}

// perRequest matches what differs between two answers of llama.cpp to the
// same request: the ID, the creation time, the measured times (the
// timings' *_ms, *_per_token_ms and *_per_second) and how the prompt split
// between the server's prompt cache and computing (cache_n, prompt_n: a
// slot that served an earlier request may hold the chat template's first
// tokens, and which slot a request gets is the server's choice); the
// other counts stay.
var perRequest = regexp.MustCompile(`"(id|created|cache_n|prompt_n|[a-z]+_ms|[a-z]+_per_token_ms|[a-z]+_per_second)":("[^"]*"|[-+0-9.eE]+)`)

// TestLlamaCppByteForByte (issue 39): what a client receives through the
// proxy is what it receives from llama.cpp itself, byte for byte but the
// values that differ from one answer to the next (perRequest): streamed
// chat and completions with and without usage asked (the proxy asks for
// it when the client did not, and llama.cpp then moves its timings to
// another chunk), and whole answers. Each request goes once to server a
// through the proxy and once to server b straight; both serve the same
// model, greedy, each prompt new to both.
func TestLlamaCppByteForByte(t *testing.T) {
	b := startLlamaBed(t)
	kinds := []llamaCall{
		{kind: "streamed chat", path: "/v1/chat/completions", stream: true},
		{kind: "streamed chat, usage asked", path: "/v1/chat/completions", stream: true, askUsage: true},
		{kind: "streamed completions", path: "/v1/completions", stream: true},
		{kind: "streamed completions, usage asked", path: "/v1/completions", stream: true, askUsage: true},
		{kind: "whole chat", path: "/v1/chat/completions"},
		{kind: "whole completions", path: "/v1/completions"},
	}
	get := func(url string, c llamaCall) (contentType, body string) {
		t.Helper()
		resp, err := b.client.Post(url+c.path, "application/json", bytes.NewReader(c.body()))
		require.NoError(t, err, c.kind)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err, c.kind)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", c.kind, raw)
		return resp.Header.Get("Content-Type"), string(raw)
	}
	for i, c := range kinds {
		c.prompt, c.maxTokens = fmt.Sprintf("byte for byte %d: %s", i, longPrompt(100+i, 20)), 8
		proxiedType, proxied := get("http://"+b.proxies[0], c)
		directType, direct := get(b.servers[1].URL, c)
		assert.Equal(t, directType, proxiedType, c.kind)
		want, got := perRequest.ReplaceAllString(direct, `"$1":_`), perRequest.ReplaceAllString(proxied, `"$1":_`)
		assert.Equal(t, want, got, "%s: through the proxy, against straight from llama.cpp", c.kind)
		if c.stream {
			assert.Equal(t, strings.Contains(direct, `"choices":[]`), strings.Contains(proxied, `"choices":[]`), "%s: a usage chunk", c.kind)
		}
		assert.Contains(t, proxied, `"timings":{"cache_n":`, "%s: llama.cpp's timings", c.kind)
	}
}
