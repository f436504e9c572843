// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// closeMode is when a oneAnswerUpstream closes a connection it answered on.
type closeMode int

const (
	// closeAfterAnswer closes it as soon as the answer is written, as
	// llama.cpp's server does after every streamed answer: the close
	// races the proxy's reuse of the connection.
	closeAfterAnswer closeMode = iota
	// closeAtNextRequest closes it, unanswered, when the next request
	// comes: the race lost every time.
	closeAtNextRequest
	// dropNextRequest reads the next request whole, then closes the
	// connection unanswered.
	dropNextRequest
	// headAtNextRequest answers the next request with part of a response
	// head, then closes.
	headAtNextRequest
	// bodyAtNextRequest answers the next request with a stream's head and
	// first event, then closes.
	bodyAtNextRequest
	// closeAtFirstRequest closes every connection when its first request
	// comes, unanswered: a new connection fails.
	closeAtFirstRequest
)

// oneAnswerUpstream is an engine on a raw TCP listener that answers one
// request per connection and closes it, while its answers advertise
// keep-alive as llama.cpp's do (Keep-Alive: timeout=5, max=100, never
// Connection: close). Streamed answers are chunked, one chunk per event;
// the others have a Content-Length.
type oneAnswerUpstream struct {
	ln   net.Listener
	mode closeMode
	// conns counts the connections accepted, answered the requests
	// answered, unanswered those a connection was closed on.
	conns, answered, unanswered atomic.Int64
	mu                          sync.Mutex
	open                        map[net.Conn]struct{}
	// requests are the requests read whole (the unanswered ones of
	// closeAtNextRequest are not), in order.
	requests []recordedRequest
	wg       sync.WaitGroup
	// chat and completions are the streams it answers (the vLLM
	// fixture's, usage included).
	chat, completions []string
}

type recordedRequest struct {
	path   string
	header http.Header
	body   []byte
	reused bool // the connection's second request
}

func newOneAnswerUpstream(t *testing.T, mode closeMode) *oneAnswerUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u := &oneAnswerUpstream{ln: ln, mode: mode, open: map[net.Conn]struct{}{}}
	u.chat, u.completions = fixtureStreams(t)
	u.wg.Add(1)
	go u.accept()
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		for c := range u.open {
			c.Close()
		}
		u.mu.Unlock()
		u.wg.Wait()
	})
	return u
}

func (u *oneAnswerUpstream) url() string { return "http://" + u.ln.Addr().String() }

func (u *oneAnswerUpstream) accept() {
	defer u.wg.Done()
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.conns.Add(1)
		u.mu.Lock()
		u.open[c] = struct{}{}
		u.mu.Unlock()
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			u.serve(c)
			u.mu.Lock()
			delete(u.open, c)
			u.mu.Unlock()
		}()
	}
}

func (u *oneAnswerUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	if u.mode == closeAtFirstRequest {
		if _, err := br.Peek(1); err == nil {
			u.unanswered.Add(1)
		}
		return
	}
	req, ok := u.read(br, false)
	if !ok {
		return
	}
	u.answer(c, req)
	u.answered.Add(1)
	switch u.mode {
	case closeAfterAnswer:
		return
	case closeAtNextRequest:
		if _, err := br.Peek(1); err == nil {
			u.unanswered.Add(1)
		}
		return
	}
	if _, ok := u.read(br, true); !ok {
		return
	}
	u.unanswered.Add(1)
	switch u.mode {
	case dropNextRequest:
		return
	case headAtNextRequest:
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-")
		return
	}
	_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(retryFirstEvent), retryFirstEvent)
}

func (u *oneAnswerUpstream) read(br *bufio.Reader, reused bool) (recordedRequest, bool) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return recordedRequest{}, false
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return recordedRequest{}, false
	}
	r := recordedRequest{path: req.URL.Path, header: req.Header, body: body, reused: reused}
	u.mu.Lock()
	u.requests = append(u.requests, r)
	u.mu.Unlock()
	return r, true
}

// answer writes what the engine answers to req, by path and stream.
func (u *oneAnswerUpstream) answer(c net.Conn, req recordedRequest) {
	const head = "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nServer: llama.cpp\r\n"
	events := u.stream(req.path, bytes.Contains(req.body, []byte(`"stream":true`)))
	if events == nil {
		body := retryJSON(req.path)
		_, _ = fmt.Fprintf(c, "%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", head, len(body), body)
		return
	}
	var b bytes.Buffer
	b.WriteString(head + "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	for _, ev := range events {
		fmt.Fprintf(&b, "%x\r\n%s\r\n", len(ev), ev)
	}
	b.WriteString("0\r\n\r\n")
	_, _ = c.Write(b.Bytes())
}

// retryFirstEvent is the first event of bodyAtNextRequest's broken stream.
const retryFirstEvent = `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"

// stream is the SSE answer to a streamed request on path, nil for any
// other.
func (u *oneAnswerUpstream) stream(path string, stream bool) []string {
	switch {
	case !stream:
		return nil
	case path == "/v1/completions":
		return u.completions
	}
	return u.chat
}

func retryJSON(path string) string {
	switch path {
	case "/v1/embeddings":
		return `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,0.25]}],"model":"m"}`
	case "/v1/models":
		return `{"object":"list","data":[{"id":"m","object":"model"}]}`
	}
	return `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`
}

// retryRequest is the i-th request of a mixed load: streamed chat,
// streamed completions, non-streamed chat (each a session), a
// pass-through POST and a pass-through GET; want is what the client gets.
func retryRequest(t *testing.T, u *oneAnswerUpstream, base string, i int) (req *http.Request, want string, observed bool) {
	var err error
	switch i % 5 {
	case 0:
		req, err = http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(usageBody))
		want, observed = strings.Join(u.chat, ""), true
	case 1:
		req, err = http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"p","stream":true,"stream_options":{"include_usage":true}}`))
		want, observed = strings.Join(u.completions, ""), true
	case 2:
		req, err = http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
		want, observed = retryJSON("/v1/chat/completions"), true
	case 3:
		req, err = http.NewRequest(http.MethodPost, base+"/v1/embeddings", strings.NewReader(`{"model":"m","input":"x"}`))
		want = retryJSON("/v1/embeddings")
	default:
		req, err = http.NewRequest(http.MethodGet, base+"/v1/models", http.NoBody)
		want = retryJSON("/v1/models")
	}
	require.NoError(t, err)
	return req, want, observed
}

// sendMixedLoad sends n requests of retryRequest's mix through the proxy to u,
// half one after another, half in bursts of 10 concurrent clients; it
// returns the sessions the observed ones made and the requests that did
// not get the engine's answer whole, with why.
func sendMixedLoad(t *testing.T, u *oneAnswerUpstream, base string, n int) (sessions int, failed []string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 10}}
	defer client.CloseIdleConnections()
	type request struct {
		req      *http.Request
		want     string
		observed bool
	}
	reqs := make([]request, n)
	for i := range reqs {
		r := &reqs[i]
		r.req, r.want, r.observed = retryRequest(t, u, base, i)
		if r.observed {
			sessions++
		}
	}
	var mu sync.Mutex
	do := func(i int) {
		req, want := reqs[i].req, reqs[i].want
		resp, err := client.Do(req)
		var got []byte
		if err == nil {
			got, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			failed = append(failed, fmt.Sprintf("%d %s: %v", i, req.URL.Path, err))
		case resp.StatusCode != http.StatusOK || string(got) != want:
			failed = append(failed, fmt.Sprintf("%d %s: %d %.120s", i, req.URL.Path, resp.StatusCode, got))
		}
	}
	for i := range n / 2 {
		do(i)
	}
	const burst = 10
	for start := n / 2; start < n; start += burst {
		var wg sync.WaitGroup
		for i := start; i < min(start+burst, n); i++ {
			wg.Go(func() { do(i) })
		}
		wg.Wait()
	}
	return sessions, failed
}

// retryCount is the proxy's upstream retries with outcome.
func retryCount(t *testing.T, tr *testProxy, outcome string) int64 {
	t.Helper()
	m, err := tr.tel.GetMetric("otelcol_receiver_token_stream_proxy_upstream_retries")
	if err != nil {
		return 0
	}
	var total int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value("outcome"); ok && v.AsString() == outcome {
			total += dp.Value
		}
	}
	return total
}

// transportPath keeps the observed paths on confighttp's transport (a
// connection limit is one thing it does that the proxy's own client does
// not), the upstream staying plain HTTP.
func transportPath(c *Config) { c.Client.MaxConnsPerHost = 64 }

// An engine that closes its connection after every answer while it
// advertises keep-alive loses no request: a request whose kept-alive
// connection fails before any byte of the answer is sent again, once, on
// a new connection; the client gets the engine's answer, the session ends
// as the engine answered it (engine_health has no failure to count), and
// the retry is counted.
func TestProxyRetriesUpstreamThatClosesAfterEveryAnswer(t *testing.T) {
	const requests = 600
	for _, tc := range []struct {
		name   string
		mode   closeMode
		direct bool
	}{
		{"own client, every reuse fails", closeAtNextRequest, true},
		{"own client, closed after the answer", closeAfterAnswer, true},
		{"transport, every reuse fails", closeAtNextRequest, false},
		{"transport, closed after the answer", closeAfterAnswer, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newOneAnswerUpstream(t, tc.mode)
			sink := new(consumertest.LogsSink)
			var opts []func(*Config)
			if !tc.direct {
				opts = append(opts, transportPath)
			}
			tr := startTestProxy(t, up.url(), sink, opts...)
			require.Equal(t, tc.direct, tr.p.direct != nil)

			sessions, failed := sendMixedLoad(t, up, tr.proxyURL(), requests)
			assert.Empty(t, failed, "%d of %d requests failed; the first: %q", len(failed), requests, failed[:min(len(failed), 3)])
			ends, failedSessions := 0, map[string]int{}
			for _, ev := range sessionEvents(t, sink, sessions) {
				if ev.Kind == tokenevent.KindEnd {
					ends++
					if ev.Error != "" {
						failedSessions[ev.Error]++
					}
				}
			}
			assert.Equal(t, sessions, ends)
			assert.Empty(t, failedSessions, "sessions that ended in error, by error.type")
			assert.Zero(t, retryCount(t, tr, "failed"))
			assert.Zero(t, retryCount(t, tr, "body_too_large"))
			retried := retryCount(t, tr, "succeeded")
			t.Logf("%d connections, %d requests answered, %d closed unanswered, %d retried", up.conns.Load(), up.answered.Load(), up.unanswered.Load(), retried)
			if tc.mode == closeAtNextRequest {
				// The pass-through GETs' are retried by http.Transport itself.
				assert.Positive(t, retried)
				assert.LessOrEqual(t, retried, up.unanswered.Load())
				assert.Equal(t, int64(requests), up.answered.Load(), "each request answered once")
			}
		})
	}
}

// A retried request is the request the engine would have got: the same
// head and the same body, byte for byte (include_usage added once),
// whether the client sent its body with a length or chunked.
func TestProxyRetrySendsTheSameRequest(t *testing.T) {
	body := `{"model":"m","stream":true,"prompt":"` + strings.Repeat("x", 200<<10) + `"}`
	for _, path := range []struct {
		name string
		opts []func(*Config)
	}{{"own client", nil}, {"transport", []func(*Config){transportPath}}} {
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, chunked %v", path.name, chunked), func(t *testing.T) {
				up := newOneAnswerUpstream(t, dropNextRequest)
				tr := startTestProxy(t, up.url(), new(consumertest.LogsSink), path.opts...)
				// The first request leaves a connection to reuse.
				resp, _ := postChat(t, tr.proxyURL(), usageBody, nil)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				var r io.Reader = strings.NewReader(body)
				if chunked {
					r = io.MultiReader(r)
				}
				req, err := http.NewRequest(http.MethodPost, tr.proxyURL()+"/v1/completions", r)
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
				resp, err = http.DefaultClient.Do(req)
				require.NoError(t, err)
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				assert.Contains(t, string(got), "data: [DONE]")

				up.mu.Lock()
				reqs := up.requests
				up.mu.Unlock()
				require.Len(t, reqs, 3)
				dropped, retried := reqs[1], reqs[2]
				assert.True(t, dropped.reused)
				assert.False(t, retried.reused, "sent again on a new connection")
				assert.Equal(t, "/v1/completions", retried.path)
				want := strings.TrimSuffix(body, "}") + `,"stream_options":{"include_usage":true}}`
				assert.Equal(t, want, string(dropped.body))
				assert.Equal(t, want, string(retried.body))
				for _, h := range []string{"Traceparent", "Content-Type", "User-Agent", "X-Forwarded-For", "Accept-Encoding", "Authorization"} {
					assert.Equal(t, dropped.header.Values(h), retried.header.Values(h), h)
				}
				assert.Contains(t, retried.header.Get("Traceparent"), "4bf92f3577b34da6a3ce929d0e0e4736")
				assert.Equal(t, int64(1), retryCount(t, tr, "succeeded"))
			})
		}
	}
}

// A body over 1 MiB is not kept for a retry: the proxy's own client sends
// one whose length the client gave on a new connection, where there is no
// race to lose; one that comes chunked, or through confighttp's transport,
// is not sent again when its reused connection fails (counted
// body_too_large, the session ends upstream_unreachable as before).
func TestProxyRetryBodyOverLimit(t *testing.T) {
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"prompt":"` + strings.Repeat("x", maxReplayBody) + `"}`
	for _, tc := range []struct {
		name    string
		opts    []func(*Config)
		chunked bool
		want    int
	}{
		{"own client, length", nil, false, http.StatusOK},
		{"own client, chunked", nil, true, http.StatusBadGateway},
		{"transport, length", []func(*Config){transportPath}, false, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newOneAnswerUpstream(t, dropNextRequest)
			sink := new(consumertest.LogsSink)
			tr := startTestProxy(t, up.url(), sink, tc.opts...)
			resp, _ := postChat(t, tr.proxyURL(), usageBody, nil)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			var r io.Reader = strings.NewReader(body)
			if tc.chunked {
				r = io.MultiReader(r)
			}
			resp, err := http.Post(tr.proxyURL()+"/v1/completions", "application/json", r)
			require.NoError(t, err)
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, tc.want, resp.StatusCode)
			evs := sessionEvents(t, sink, 2)
			end := evs[len(evs)-1]
			assert.Zero(t, retryCount(t, tr, "succeeded"))
			if tc.want == http.StatusOK {
				assert.Empty(t, end.Error)
				assert.Zero(t, up.unanswered.Load(), "a new connection")
				assert.Zero(t, retryCount(t, tr, "body_too_large"))
				return
			}
			assert.Equal(t, errUpstreamUnreachable, end.Error)
			assert.Equal(t, int64(1), retryCount(t, tr, "body_too_large"))
		})
	}
}

// Only a reused connection that failed before any byte of the answer is
// retried: an answer that broke in its head or its body is the engine's,
// and a new connection that fails is a real failure. Each request reaches
// the engine once.
func TestProxyRetryOnlyBeforeTheAnswer(t *testing.T) {
	for _, path := range []struct {
		name string
		opts []func(*Config)
	}{{"own client", nil}, {"transport", []func(*Config){transportPath}}} {
		for _, tc := range []struct {
			name    string
			mode    closeMode
			errType string
		}{
			{"part of the head", headAtNextRequest, errUpstreamUnreachable},
			{"part of the body", bodyAtNextRequest, errStreamBroken},
			{"new connection", closeAtFirstRequest, errUpstreamUnreachable},
		} {
			t.Run(path.name+", "+tc.name, func(t *testing.T) {
				up := newOneAnswerUpstream(t, tc.mode)
				sink := new(consumertest.LogsSink)
				tr := startTestProxy(t, up.url(), sink, path.opts...)
				sessions := 1
				if tc.mode != closeAtFirstRequest {
					resp, _ := postChat(t, tr.proxyURL(), usageBody, nil)
					require.Equal(t, http.StatusOK, resp.StatusCode)
					sessions++
				}
				if tc.mode == bodyAtNextRequest {
					got, err := postStream(t, http.DefaultClient, tr.proxyURL())
					require.ErrorIs(t, err, io.ErrUnexpectedEOF, "the client sees the stream broken")
					assert.True(t, strings.HasPrefix(got, retryFirstEvent), "the answer's first event relayed: %q", got)
				} else {
					resp, _ := postChat(t, tr.proxyURL(), usageBody, nil)
					assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
				}
				evs := sessionEvents(t, sink, sessions)
				assert.Equal(t, tc.errType, evs[len(evs)-1].Error)
				assert.Equal(t, int64(1), up.unanswered.Load())
				assert.Equal(t, int64(1), up.conns.Load(), "no connection for a retry")
				for _, outcome := range []string{"succeeded", "failed", "body_too_large"} {
					assert.Zero(t, retryCount(t, tr, outcome), outcome)
				}
			})
		}
	}
}
