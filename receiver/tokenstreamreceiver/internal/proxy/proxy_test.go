// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// fixtureStreams reads the vLLM SSE fixture (the project's copy of
// shared/fixtures/vllm/sse-streams.txt): the chat stream, then the
// completions stream, each as its events ("data: …\n\n").
func fixtureStreams(t *testing.T) (chat, completions []string) {
	t.Helper()
	streams := readFixtureStreams(t, "../../../../testdata/fixtures/vllm/sse-streams.txt")
	require.Len(t, streams, 2)
	return streams[0], streams[1]
}

// readFixtureStreams reads an SSE fixture: its streams, each as its events
// ("data: …\n\n"), a comment line after events ending one.
func readFixtureStreams(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var streams [][]string
	var cur []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "data: "):
			cur = append(cur, line+"\n\n")
		case strings.HasPrefix(line, ":") && len(cur) > 0:
			streams = append(streams, cur)
			cur = nil
		}
	}
	if len(cur) > 0 {
		streams = append(streams, cur)
	}
	return streams
}

// scriptedUpstream replays events with a delay before each; it records the
// requests it got and whether their context ended early.
type scriptedUpstream struct {
	*httptest.Server
	mu        sync.Mutex
	bodies    []string
	headers   []http.Header
	hosts     []string
	cancelled int
}

func newScriptedUpstream(t *testing.T, handler func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request)) *scriptedUpstream {
	t.Helper()
	u := &scriptedUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, string(body))
		u.headers = append(u.headers, r.Header.Clone())
		u.hosts = append(u.hosts, r.Host)
		u.mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		handler(u, w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// replay writes events as an SSE response, waiting gap before each.
func replay(u *scriptedUpstream, w http.ResponseWriter, r *http.Request, events []string, gap func(i int) time.Duration) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	f := w.(http.Flusher)
	f.Flush()
	for i, ev := range events {
		select {
		case <-time.After(gap(i)):
		case <-r.Context().Done():
			u.mu.Lock()
			u.cancelled++
			u.mu.Unlock()
			return
		}
		if _, err := io.WriteString(w, ev); err != nil {
			return
		}
		f.Flush()
	}
}

// testProxy is a started proxy on a loopback port chosen by the OS, handing
// its events to a testSink.
type testProxy struct {
	p       *Server
	tel     *componenttest.Telemetry
	stopped bool
	// warnings holds what the proxy logged at warn level and above.
	warnings *observer.ObservedLogs
}

func startTestProxy(tb testing.TB, upstream string, next consumer.Logs, opts ...func(*Config)) *testProxy {
	tb.Helper()
	cfg := testConfig(tb, upstream)
	for _, o := range opts {
		o(cfg)
	}
	tel := componenttest.NewTelemetry()
	tb.Cleanup(func() { require.NoError(tb, tel.Shutdown(context.Background())) })
	sink := newTestSink(tb, tel.NewTelemetrySettings(), next)
	core, warnings := observer.New(zapcore.WarnLevel)
	sink.log = zap.New(core)
	p, err := Start(context.Background(), cfg, sink, componenttest.NewNopHost(), tel.NewTelemetrySettings())
	require.NoError(tb, err)
	tp := &testProxy{p: p, tel: tel, warnings: warnings}
	tb.Cleanup(func() {
		if !tp.stopped {
			require.NoError(tb, p.Shutdown(context.Background()))
		}
	})
	return tp
}

// shutdown shuts the proxy down as the receiver does, once.
func (tp *testProxy) shutdown() error {
	tp.stopped = true
	return tp.p.Shutdown(context.Background())
}

// testConfig is the receiver's default proxy configuration, listening on
// a loopback port chosen by the OS.
func testConfig(tb testing.TB, upstream string) *Config {
	u, err := url.Parse(upstream)
	require.NoError(tb, err)
	server := confighttp.NewDefaultServerConfig()
	server.NetAddr.Endpoint = "127.0.0.1:0"
	server.WriteTimeout = 0
	client := confighttp.NewDefaultClientConfig()
	client.Endpoint = upstream
	client.ReadBufferSize, client.WriteBufferSize = 2<<10, 2<<10
	return &Config{
		Server: server, Client: client, Upstream: u, Engine: u.Host,
		ResponseHeaderTimeout: 5 * time.Minute, StreamIdleTimeout: 5 * time.Minute,
		ClientBodyTimeout: time.Minute, ClientSendTimeout: time.Minute, DrainTimeout: 20 * time.Second,
		MaxStreams: 1024, EventQueueSize: 65_536,
	}
}

// testSink is the receiver's side of the proxy: the pipeline, with the
// standard receiver observability and the receiver's counters around it.
type testSink struct {
	next consumer.Logs
	obs  *receiverhelper.ObsReport
	tel  *metadata.TelemetryBuilder
	log  *zap.Logger
}

func newTestSink(tb testing.TB, ts component.TelemetrySettings, next consumer.Logs) *testSink {
	builder, err := metadata.NewTelemetryBuilder(ts)
	require.NoError(tb, err)
	tb.Cleanup(builder.Shutdown)
	set := receivertest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = ts
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{ReceiverID: set.ID, Transport: "proxy", ReceiverCreateSettings: set})
	require.NoError(tb, err)
	return &testSink{next: next, obs: obs, tel: builder, log: zap.NewNop()}
}

var transportProxy = metric.WithAttributeSet(attribute.NewSet(attribute.String("transport", "proxy")))

func (s *testSink) ConsumeEvents(ctx context.Context, logs plog.Logs, events int) error {
	ctx = s.obs.StartLogsOp(ctx)
	n := logs.LogRecordCount()
	err := s.next.ConsumeLogs(ctx, logs)
	s.obs.EndLogsOp(ctx, "sse", n, err)
	if err != nil {
		s.tel.ReceiverTokenStreamRefusedEvents.Add(ctx, int64(events), transportProxy)
		return err
	}
	s.tel.ReceiverTokenStreamAcceptedEvents.Add(ctx, int64(events), transportProxy)
	return nil
}

func (s *testSink) Counters() Counters {
	return Counters{
		RefusedRequests:     s.tel.ReceiverTokenStreamProxyRefusedRequests,
		PassthroughFailures: s.tel.ReceiverTokenStreamProxyPassthroughFailures,
		OversizedEvents:     s.tel.ReceiverTokenStreamProxyOversizedEvents,
		DroppedEvents:       s.tel.ReceiverTokenStreamProxyDroppedEvents,
		StalledStreams:      s.tel.ReceiverTokenStreamProxyStalledStreams,
		CutStreams:          s.tel.ReceiverTokenStreamProxyCutStreams,
		UpstreamRetries:     s.tel.ReceiverTokenStreamProxyUpstreamRetries,
		Migrations:          s.tel.ReceiverTokenStreamProxyMigrations,
		TruncatedValues:     s.tel.ReceiverTokenStreamTruncatedValues,
	}
}

func (s *testSink) Logger() *zap.Logger { return s.log }

func (tp *testProxy) proxyURL() string { return "http://" + tp.p.Addr().String() }

// sessionEvents waits until the sink holds an end event and returns every
// event of the proxy's sessions, decoded.
func sessionEvents(t *testing.T, sink *consumertest.LogsSink, sessions int) []tokenevent.Event {
	t.Helper()
	var evs []tokenevent.Event
	require.Eventually(t, func() bool {
		evs = evs[:0]
		ends := 0
		var ev tokenevent.Event
		for _, ld := range sink.AllLogs() {
			for _, rl := range ld.ResourceLogs().All() {
				for _, sl := range rl.ScopeLogs().All() {
					for _, lr := range sl.LogRecords().All() {
						require.NoError(t, tokenrecord.ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
							c := *e
							c.Attributes = append([]tokenevent.Attribute(nil), e.Attributes...) // e's are reused
							evs = append(evs, c)
							if e.Kind == tokenevent.KindEnd {
								ends++
							}
						}))
					}
				}
			}
		}
		return ends >= sessions
	}, 10*time.Second, 5*time.Millisecond)
	return evs
}

func postChat(t *testing.T, url, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer secret")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(got)
}

func TestProxyStreamObservedAndForwardedAsIs(t *testing.T) {
	chat, _ := fixtureStreams(t)
	const firstToken, gap = 60 * time.Millisecond, 25 * time.Millisecond
	// When the upstream began to answer and began to write each event: the
	// proxy cannot see an event before it is written, nor start the
	// session after the upstream got the request.
	var answered time.Time
	written := make([]time.Time, len(chat))
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
		u.mu.Lock()
		answered = time.Now()
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for i, ev := range chat {
			switch i {
			case 0:
			case 1:
				time.Sleep(firstToken)
			default:
				time.Sleep(gap)
			}
			u.mu.Lock()
			written[i] = time.Now()
			u.mu.Unlock()
			if _, err := io.WriteString(w, ev); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)

	body := `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"What is the capital of France?"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":32}`
	req, err := http.NewRequest(http.MethodPost, tr.proxyURL()+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer secret")
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	req.Header.Set("tracestate", "ot=th:8;rv:fedcba98765432,vendor=x")
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	// When the client had each event's data line: the proxy notes an event
	// before it relays it.
	var got strings.Builder
	var received []time.Time
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data:") {
			received = append(received, time.Now())
		}
		got.WriteString(line)
		if err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
	}
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, strings.Join(chat, ""), got.String(), "the client gets the stream byte for byte")
	assert.Equal(t, body, up.bodies[0], "a request that asked for usage is forwarded unchanged")

	evs := sessionEvents(t, sink, 1)
	require.Len(t, evs, 9, "start, 7 content chunks, end")
	start, end := evs[0], evs[8]
	assert.Equal(t, tokenevent.KindStart, start.Kind)
	assert.Equal(t, "meta-llama/Llama-3.1-8B-Instruct", start.Model)
	assert.Equal(t, tokenevent.OperationChat, start.Operation)
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", start.TraceID.String())
	assert.Equal(t, "00f067aa0ba902b7", start.ParentSpanID.String())
	assert.Equal(t, strings.TrimPrefix(up.URL, "http://"), start.Engine)
	assert.False(t, start.NoStream)
	assert.Equal(t, "ot=th:8;rv:fedcba98765432,vendor=x", start.TraceState, "the caller's sampling reaches the session")
	assert.Equal(t, "ot=th:8;rv:fedcba98765432,vendor=x", up.headers[0].Get("tracestate"), "and the upstream")
	// The upstream's request carries the session span as its parent.
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-"+start.SpanID.String()+"-01", up.headers[0].Get("traceparent"))
	assert.Equal(t, "Bearer secret", up.headers[0].Get("Authorization"), "forwarded to the upstream, never into telemetry")
	assert.Equal(t, tokenevent.KindEnd, end.Kind)
	assert.Equal(t, int64(8), end.CompletionTokens, "from the usage chunk")
	assert.Equal(t, int64(42), end.PromptTokens, "from the usage chunk")
	assert.Equal(t, "stop", end.FinishReason)
	assert.Empty(t, end.Error)

	// The times are the proxy's readings of what the client saw, whatever
	// the machine's load: the session starts between the client's send and
	// the upstream's answer, each token between the upstream's write of
	// its chunk and the client's receipt of it. So the TTFT is at least
	// the upstream's wait for the first token and at most the client's.
	at := func(ev tokenevent.Event) time.Time { return time.Unix(0, int64(ev.TimeUnixNano)) }
	up.mu.Lock()
	defer up.mu.Unlock()
	assert.False(t, at(start).Before(sent), "the session starts after the client sent")
	assert.False(t, at(start).After(answered), "and before the upstream answered")
	require.Len(t, received, len(chat))
	for k := 1; k <= 7; k++ {
		assert.False(t, at(evs[k]).Before(written[k]), "token %d before the upstream wrote it", k)
		assert.False(t, at(evs[k]).After(received[k]), "token %d after the client had it", k)
	}
	ttft := at(evs[1]).Sub(at(start))
	assert.GreaterOrEqual(t, ttft, firstToken, "TTFT %s", ttft)
	assert.LessOrEqual(t, ttft, received[1].Sub(sent), "TTFT %s", ttft)
}

func TestProxyInjectsAndStripsUsage(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return time.Millisecond })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	_, got := postChat(t, tr.proxyURL(), body, nil)
	var want []string
	for _, ev := range chat {
		if !strings.Contains(ev, `"choices":[],"usage"`) {
			want = append(want, ev)
		}
	}
	assert.Equal(t, strings.Join(want, ""), got, "the client gets the stream it asked for: no usage chunk")
	assert.JSONEq(t, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`, up.bodies[0])
	evs := sessionEvents(t, sink, 1)
	assert.Equal(t, int64(8), evs[len(evs)-1].CompletionTokens, "usage read from the stripped chunk")
}

// vLLM with --enable-per-request-metrics (v0.25.0) puts its own timing of
// the request on the final usage chunk: the proxy hands it on with the end,
// in ns, with the model that answered.
func TestProxyPerRequestMetrics(t *testing.T) {
	chat, _ := fixtureStreams(t)
	var events []string
	for _, ev := range chat {
		if strings.Contains(ev, `"choices":[],"usage"`) {
			ev = strings.Replace(ev, `}}`+"\n\n", `},"metrics":{"time_to_first_token_ms":48.5,"generation_time_ms":180.25,"queue_time_ms":912.0,"mean_itl_ms":30.0,"tokens_per_second":33.3}}`+"\n\n", 1)
			require.Contains(t, ev, `"metrics"`, "the fixture's usage chunk ends with }}")
		}
		events = append(events, ev)
	}
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, events, func(int) time.Duration { return time.Millisecond })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	_, got := postChat(t, tr.proxyURL(), `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[],"stream":true,"stream_options":{"include_usage":true}}`, nil)
	assert.Contains(t, got, `"queue_time_ms":912.0`, "the client gets the metrics it asked for")
	evs := sessionEvents(t, sink, 1)
	end := evs[len(evs)-1]
	require.Equal(t, tokenevent.KindEnd, end.Kind)
	assert.Equal(t, tokenevent.TimingResponse, end.TimingSource)
	assert.Equal(t, int64(912*time.Millisecond), end.QueueTimeNs)
	assert.Equal(t, int64(48500*time.Microsecond), end.PrefillTimeNs)
	assert.Equal(t, int64(180250*time.Microsecond), end.DecodeTimeNs)
	assert.Equal(t, "meta-llama/Llama-3.1-8B-Instruct", end.ResponseModel)
}

func TestProxyNonStreaming(t *testing.T) {
	up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
		time.Sleep(30 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" Paris.","finish_reason":"stop"}],"usage":{"prompt_tokens":6,"total_tokens":9,"completion_tokens":3}}`)
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	resp, err := http.Post(tr.proxyURL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"The capital of France is"}`))
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(got), `"completion_tokens":3`)
	evs := sessionEvents(t, sink, 1)
	require.Len(t, evs, 3)
	assert.Equal(t, tokenevent.OperationTextCompletion, evs[0].Operation)
	assert.True(t, evs[0].NoStream, "the request did not ask for a stream")
	assert.Equal(t, int64(3), evs[1].Count, "the whole response is one token event, with usage's count")
	assert.GreaterOrEqual(t, time.Duration(evs[1].TimeUnixNano-evs[0].TimeUnixNano), 30*time.Millisecond)
	assert.Equal(t, int64(3), evs[2].CompletionTokens)
	assert.Equal(t, int64(6), evs[2].PromptTokens, "from usage")
	assert.Equal(t, "stop", evs[2].FinishReason)
}

func TestProxyStartsATraceWithoutTraceparent(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return 0 })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, map[string]string{"traceparent": "00-bad"})
	evs := sessionEvents(t, sink, 1)
	assert.False(t, evs[0].TraceID.IsEmpty())
	assert.True(t, evs[0].ParentSpanID.IsEmpty(), "a root session")
	assert.Equal(t, "00-"+evs[0].TraceID.String()+"-"+evs[0].SpanID.String()+"-01", up.headers[0].Get("traceparent"))
}

func TestProxyPassThrough(t *testing.T) {
	up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Path", r.URL.Path)
		_, _ = io.WriteString(w, r.Method+" "+r.URL.RequestURI()) //nolint:gosec // G705: a test upstream echoing to the test
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	for _, path := range []string{"/v1/models", "/health", "/metrics?x=1"} {
		resp, err := http.Get(tr.proxyURL() + path)
		require.NoError(t, err)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, "GET "+path, string(got))
	}
	resp, err := http.Get(tr.proxyURL() + "/v1/chat/completions")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 0, sink.LogRecordCount(), "only POSTs to the completions endpoints are sessions")
}

// assertUpstreamWarnedOnce: a failing upstream is said at warn level (the
// default level shows it), naming the upstream and the error, once however
// many requests failed.
func assertUpstreamWarnedOnce(t *testing.T, tp *testProxy, upstream string) {
	t.Helper()
	all := tp.warnings.All()
	require.Len(t, all, 1, "one warning for the failures of a minute")
	fields := all[0].ContextMap()
	assert.Equal(t, "http://"+upstream, fields["upstream"])
	assert.Contains(t, fields["error"], "connection refused")
}

func TestProxyUpstreamFailures(t *testing.T) {
	t.Run("500", func(t *testing.T) {
		up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"boom"}`, http.StatusInternalServerError)
		})
		sink := new(consumertest.LogsSink)
		tr := startTestProxy(t, up.URL, sink)
		resp, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		assert.Contains(t, got, "boom")
		evs := sessionEvents(t, sink, 1)
		assert.Equal(t, "500", evs[len(evs)-1].Error)
	})
	t.Run("unreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		ln.Close()
		sink := new(consumertest.LogsSink)
		tr := startTestProxy(t, "http://"+addr, sink)
		for range 3 {
			resp, _ := postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
			assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		}
		evs := sessionEvents(t, sink, 1)
		assert.Equal(t, errUpstreamUnreachable, evs[len(evs)-1].Error)
		assert.Equal(t, "m", evs[0].Model)
		assertUpstreamWarnedOnce(t, tr, addr)
	})
	t.Run("unreachable pass-through", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		ln.Close()
		tr := startTestProxy(t, "http://"+addr, new(consumertest.LogsSink))
		resp, err := http.Get(tr.proxyURL() + "/v1/models")
		require.NoError(t, err)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		assertOpenAIError(t, resp, string(got), errUpstreamUnreachable)
		assert.Equal(t, int64(1), reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_passthrough_failures", "unreachable"))
		assertUpstreamWarnedOnce(t, tr, addr)
	})
	t.Run("broken stream", func(t *testing.T) {
		chat, _ := fixtureStreams(t)
		up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, chat[0]+chat[1]+`data: {"choi`)
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close() // reset mid-event
			}
		})
		sink := new(consumertest.LogsSink)
		tr := startTestProxy(t, up.URL, sink)
		got, err := postStream(t, http.DefaultClient, tr.proxyURL())
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "the client sees the stream broken")
		require.True(t, strings.HasPrefix(got, chat[0]+chat[1]), "%q", got)
		assert.Regexp(t, cutEvent(errStreamBroken, http.StatusBadGateway), strings.TrimPrefix(got, chat[0]+chat[1]),
			"the events before the break, then the error event, without the unfinished event")
		evs := sessionEvents(t, sink, 1)
		assert.Equal(t, errStreamBroken, evs[len(evs)-1].Error)
		assert.Equal(t, tokenevent.KindToken, evs[1].Kind, "the content chunk before the break counted")
	})
	t.Run("malformed SSE", func(t *testing.T) {
		up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {not json\n\nretry: x\n\n: comment\n\ndata: [DONE]\n\n")
		})
		sink := new(consumertest.LogsSink)
		tr := startTestProxy(t, up.URL, sink)
		_, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, nil)
		assert.Equal(t, "data: {not json\n\nretry: x\n\n: comment\n\ndata: [DONE]\n\n", got, "forwarded as is")
		evs := sessionEvents(t, sink, 1)
		assert.Len(t, evs, 2, "a session without tokens")
		assert.Equal(t, errStreamMalformed, evs[1].Error, "not a completion: no chunk came")
		assert.Zero(t, reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_cut_streams", "malformed"), "relayed whole, not cut")
	})
}

func TestProxyClientDisconnectAbortsUpstream(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(i int) time.Duration {
			if i < 3 {
				return time.Millisecond
			}
			return time.Hour
		})
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tr.proxyURL()+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	_, err = br.ReadString('\n') // the first event arrived
	require.NoError(t, err)
	cancel()
	resp.Body.Close()
	evs := sessionEvents(t, sink, 1)
	assert.Equal(t, finishReasonAbort, evs[len(evs)-1].FinishReason)
	require.Eventually(t, func() bool {
		up.mu.Lock()
		defer up.mu.Unlock()
		return up.cancelled == 1
	}, 10*time.Second, 5*time.Millisecond, "the upstream request is cancelled")
}

// A client that stops reading at [DONE] and closes the stream before the
// upstream ends its response (vllm bench serve, many SDKs) got the whole
// answer: its session is completed, not aborted.
func TestProxyClientLeavingAfterDoneCompletes(t *testing.T) {
	chat, _ := fixtureStreams(t)
	require.Contains(t, chat[len(chat)-1], "[DONE]")
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return time.Millisecond })
		<-r.Context().Done() // holds the response open until the proxy gives up on it
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	req, err := http.NewRequest(http.MethodPost, tr.proxyURL()+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "data: [DONE]") {
			break
		}
	}
	resp.Body.Close()
	evs := sessionEvents(t, sink, 1)
	end := evs[len(evs)-1]
	assert.Equal(t, tokenevent.KindEnd, end.Kind)
	assert.Equal(t, "stop", end.FinishReason)
	assert.Empty(t, end.Error)
}

func TestProxyConcurrentStreamsNoCrossTalk(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		// Each request asks for its own number of content chunks.
		var req struct {
			MaxTokens int `json:"max_tokens"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		events := append([]string{chat[0]}, chat[1:1+req.MaxTokens]...)
		events = append(events, chat[len(chat)-1])
		replay(u, w, r, events, func(int) time.Duration { return time.Millisecond })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	const streams = 1000
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 1 + i%7
			body := `{"model":"m` + strings.Repeat("x", n) + `","stream":true,"max_tokens":` + string(rune('0'+n)) + `}`
			resp, err := client.Post(tr.proxyURL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if !assert.NoError(t, err) {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wg.Wait()
	evs := sessionEvents(t, sink, streams)
	type sess struct {
		model  string
		tokens int
		ended  bool
	}
	bySession := map[string]*sess{}
	for _, ev := range evs {
		s := bySession[ev.SessionID]
		if s == nil {
			s = &sess{}
			bySession[ev.SessionID] = s
		}
		switch ev.Kind {
		case tokenevent.KindStart:
			s.model = ev.Model
		case tokenevent.KindToken:
			s.tokens += int(ev.Count)
		case tokenevent.KindEnd:
			s.ended = true
		}
	}
	require.Len(t, bySession, streams)
	for id, s := range bySession {
		require.True(t, s.ended, id)
		// The model names the number of content chunks that session got.
		assert.Equal(t, len(s.model)-1, s.tokens, "session %s (%s)", id, s.model)
	}
	client.CloseIdleConnections()
}

// assertOpenAIError checks an answer of the proxy's own: JSON in the shape
// of OpenAI's error responses.
func assertOpenAIError(t *testing.T, resp *http.Response, body, errType string) {
	t.Helper()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	assert.NotEmpty(t, e.Error.Message)
	assert.Equal(t, errType, e.Error.Type)
	assert.Equal(t, resp.StatusCode, e.Error.Code)
}

// A stream lasts as long as its completion: neither the header bound nor
// the idle bound cuts it while its bytes keep coming.
func TestProxyStreamOutlivesTimeouts(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return 40 * time.Millisecond })
	})
	for name, set := range map[string]func(*Config){
		"response_header_timeout": func(c *Config) { c.ResponseHeaderTimeout = 100 * time.Millisecond },
		"stream_idle_timeout":     func(c *Config) { c.StreamIdleTimeout = 200 * time.Millisecond },
	} {
		t.Run(name, func(t *testing.T) {
			sink := new(consumertest.LogsSink)
			tr := startTestProxy(t, up.URL, sink, set)
			resp, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, nil)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, strings.Join(chat, ""), got, "the whole stream, [DONE] included, after %d×40 ms", len(chat))
			evs := sessionEvents(t, sink, 1)
			assert.Empty(t, evs[len(evs)-1].Error)
			assert.Equal(t, "stop", evs[len(evs)-1].FinishReason)
		})
	}
}

func TestProxyHangBeforeHeaders(t *testing.T) {
	up := newScriptedUpstream(t, func(_ *scriptedUpstream, _ http.ResponseWriter, r *http.Request) {
		select { // never answers, until the proxy gives up
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink, func(c *Config) { c.ResponseHeaderTimeout = 100 * time.Millisecond })
	t0 := time.Now()
	resp, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
	assert.Less(t, time.Since(t0), 5*time.Second)
	assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
	assertOpenAIError(t, resp, got, errUpstreamTimeout)
	evs := sessionEvents(t, sink, 1)
	assert.Equal(t, errUpstreamTimeout, evs[len(evs)-1].Error)

	// The pass-through paths have the same bound and answer.
	presp, err := http.Get(tr.proxyURL() + "/v1/models")
	require.NoError(t, err)
	pgot, _ := io.ReadAll(presp.Body)
	presp.Body.Close()
	assert.Equal(t, http.StatusGatewayTimeout, presp.StatusCode)
	assertOpenAIError(t, presp, string(pgot), errUpstreamTimeout)
	assert.Equal(t, int64(1), reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_passthrough_failures", "timeout"))
}

func TestProxyHangMidStream(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat[:3], func(int) time.Duration { return time.Millisecond })
		select { // hangs, until the proxy gives up
		case <-r.Context().Done():
			u.mu.Lock()
			u.cancelled++
			u.mu.Unlock()
		case <-time.After(10 * time.Second):
		}
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink, func(c *Config) { c.StreamIdleTimeout = 150 * time.Millisecond })
	t0 := time.Now()
	got, err := postStream(t, http.DefaultClient, tr.proxyURL())
	assert.Less(t, time.Since(t0), 5*time.Second)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "no clean end")
	require.True(t, strings.HasPrefix(got, strings.Join(chat[:3], "")), "%q", got)
	assert.Regexp(t, cutEvent(errUpstreamIdleTimeout, http.StatusGatewayTimeout), strings.TrimPrefix(got, strings.Join(chat[:3], "")),
		"what came before the hang, then the error event")
	evs := sessionEvents(t, sink, 1)
	end := evs[len(evs)-1]
	assert.Equal(t, errUpstreamIdleTimeout, end.Error)
	assert.Equal(t, int64(1), reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_cut_streams", "idle_timeout"))
	assert.Equal(t, tokenevent.KindToken, evs[1].Kind)
	require.Eventually(t, func() bool {
		up.mu.Lock()
		defer up.mu.Unlock()
		return up.cancelled == 1
	}, 5*time.Second, 5*time.Millisecond, "the upstream request is cancelled")
}

// vLLM reports a generation that fails after its 200 inside the stream, as
// an error object followed by [DONE]: the session ends in error, with the
// error's type (else its code), so that keep-errors sampling sees it.
func TestProxyEngineErrorMidStream(t *testing.T) {
	chat, _ := fixtureStreams(t)
	for name, tt := range map[string]struct{ event, want string }{
		"type": {`data: {"error": {"object": "error", "message": "CUDA out of memory", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n", "InternalServerError"},
		"code": {`data: {"error": {"message": "x", "code": "context_length_exceeded"}}` + "\n\n", "context_length_exceeded"},
		"bare": {`data: {"error": "boom"}` + "\n\n", "engine_error"},
	} {
		t.Run(name, func(t *testing.T) {
			events := append(append([]string{}, chat[:3]...), tt.event, "data: [DONE]\n\n")
			up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
				replay(u, w, r, events, func(int) time.Duration { return time.Millisecond })
			})
			sink := new(consumertest.LogsSink)
			tr := startTestProxy(t, up.URL, sink)
			resp, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, nil)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, strings.Join(events, ""), got, "the client gets the error as the engine sent it")
			evs := sessionEvents(t, sink, 1)
			end := evs[len(evs)-1]
			assert.Equal(t, tokenevent.KindEnd, end.Kind)
			assert.Equal(t, tt.want, end.Error)
		})
	}
}

// reasonCounter is a proxy counter's value for one reason.
func reasonCounter(t *testing.T, tr *testProxy, name, reason string) int64 {
	t.Helper()
	m, err := tr.tel.GetMetric(name)
	if err != nil {
		return 0
	}
	var total int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value("reason"); ok && v.AsString() == reason {
			total += dp.Value
		}
	}
	return total
}

// A body over the limit is the client's error: 413 with a JSON body, and
// no session that would blame the engine for it.
func TestProxyBodyOverLimit(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return 0 })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink, func(c *Config) { c.Server.MaxRequestBodySize = 1024 })
	big := `{"model":"m","stream":true,"prompt":"` + strings.Repeat("x", 4096) + `"}`
	for name, body := range map[string]io.Reader{
		"content-length": strings.NewReader(big),
		"chunked":        io.MultiReader(strings.NewReader(big)),
	} {
		t.Run(name, func(t *testing.T) {
			resp, err := http.Post(tr.proxyURL()+"/v1/chat/completions", "application/json", body)
			require.NoError(t, err)
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
			assertOpenAIError(t, resp, string(got), errBodyTooLarge)
		})
	}
	assert.Equal(t, int64(2), reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_refused_requests", "body_too_large"))
	// A request within the limit still makes a session; it is the only one.
	_, _ = postChat(t, tr.proxyURL(), `{"model":"ok","stream":true}`, nil)
	evs := sessionEvents(t, sink, 1)
	assert.Equal(t, "ok", evs[0].Model)
	for _, ev := range evs {
		assert.Equal(t, evs[0].SessionID, ev.SessionID, "no session for the refused requests")
	}
}

// The model name goes into telemetry decoded, valid UTF-8, at most 256
// bytes cut on a rune boundary, whatever the client wrote.
func TestProxyHostileModelNames(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return 0 })
	})
	for name, tt := range map[string]struct{ model, want string }{
		"escapes":         {`llama\u00e9\"\/`, `llamaé"/`},
		"invalid UTF-8":   {"llama\xff\xc3", "llama\uFFFD\uFFFD"},
		"lone surrogate":  {`x\ud800`, "x\uFFFD"},
		"long, mid-rune":  {"a" + strings.Repeat("é", 300), "a" + strings.Repeat("é", 127)},
		"long, escaped":   {strings.Repeat(`\u4e16`, 300), strings.Repeat("世", 85)},
		"control escapes": {`a\u0000b\n`, "a\x00b\n"},
	} {
		t.Run(name, func(t *testing.T) {
			sink := new(consumertest.LogsSink)
			tr := startTestProxy(t, up.URL, sink)
			resp, _ := postChat(t, tr.proxyURL(), `{"model":"`+tt.model+`","stream":true}`, nil)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			evs := sessionEvents(t, sink, 1)
			assert.Equal(t, tt.want, evs[0].Model)
			assert.True(t, utf8.ValidString(evs[0].Model))
			assert.LessOrEqual(t, len(evs[0].Model), 256)
		})
	}
}

// One header policy on both paths (RFC 9110, section 7.6.1): the upstream
// gets the same fields from an observed and a passed-through request, and
// the client none of the upstream's hop-by-hop fields.
func TestProxyHeaderPolicyParity(t *testing.T) {
	up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Connection", "X-Up-Hop")
		h.Set("X-Up-Hop", "1")
		h.Set("X-Up-End", "1")
		h.Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})
	tr := startTestProxy(t, up.URL, new(consumertest.LogsSink))
	var responses []*http.Response
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		req, err := http.NewRequest(http.MethodPost, tr.proxyURL()+path, strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		req.Host = "llm.example"
		for k, v := range map[string]string{
			"Authorization": "Bearer secret", "Content-Type": "application/json", "X-End": "1",
			"Connection": "X-Hop", "X-Hop": "1", "Keep-Alive": "300", "Proxy-Authorization": "Basic cHJveHk=",
			"Proxy-Connection": "keep-alive", "X-Forwarded-For": "203.0.113.7", "Forwarded": "for=198.51.100.1",
			"X-Forwarded-Proto": "https",
		} {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		responses = append(responses, resp)
	}
	require.Len(t, up.headers, 2)
	observed, passed := up.headers[0].Clone(), up.headers[1].Clone()
	assert.NotEmpty(t, observed.Get("Traceparent"), "the observed path's own")
	for _, h := range []http.Header{observed, passed} {
		h.Del("Traceparent")
		h.Del("Content-Length")
		for _, k := range []string{"Connection", "X-Hop", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Forwarded"} {
			assert.Empty(t, h.Values(k), k)
		}
		assert.Equal(t, "203.0.113.7, 127.0.0.1", h.Get("X-Forwarded-For"), "the client's address appended")
		assert.Equal(t, "llm.example", h.Get("X-Forwarded-Host"))
		assert.Equal(t, "http", h.Get("X-Forwarded-Proto"), "what the proxy saw, not what the client claimed")
		assert.Equal(t, "Bearer secret", h.Get("Authorization"))
		assert.Equal(t, "1", h.Get("X-End"))
	}
	assert.Equal(t, observed, passed, "one policy on both paths")
	upstreamHost := strings.TrimPrefix(up.URL, "http://")
	assert.Equal(t, []string{upstreamHost, upstreamHost}, up.hosts, "Host: the upstream's on both paths")
	for i, resp := range responses {
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Empty(t, resp.Header.Values("Keep-Alive"), "response %d", i)
		assert.Empty(t, resp.Header.Values("X-Up-Hop"), "response %d", i)
		assert.Empty(t, resp.Header.Values("Connection"), "response %d", i)
		assert.Equal(t, "1", resp.Header.Get("X-Up-End"), "response %d", i)
	}
}

// The header bound starts once the request is written, as
// http.Transport's ResponseHeaderTimeout: a client slow to upload does not
// make the upstream time out.
func TestProxySlowUploadIsNotAnUpstreamTimeout(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return 0 })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink, func(c *Config) { c.ResponseHeaderTimeout = 100 * time.Millisecond })
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, `{"model":"m","stream":true,`)
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(pw, `"stream_options":{"include_usage":true}}`)
		pw.Close()
	}()
	resp, err := http.Post(tr.proxyURL()+"/v1/chat/completions", "application/json", pr)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, strings.Join(chat, ""), string(got))
	evs := sessionEvents(t, sink, 1)
	assert.Empty(t, evs[len(evs)-1].Error)
}

// A client that sends its body drop by drop, then stalls, is the client's
// fault: 408 with a JSON body, no session, counted.
func TestProxySlowDripUpload(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return 0 })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink, func(c *Config) { c.ClientBodyTimeout = 150 * time.Millisecond })
	conn, err := net.Dial("tcp", tr.p.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
	require.NoError(t, err)
	for _, drop := range []string{`{"model"`, `:"m",`, `"stream":true,`} {
		time.Sleep(50 * time.Millisecond) // within the bound: each drop re-arms it
		_, err = io.WriteString(conn, drop)
		require.NoError(t, err)
	}
	t0 := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil) // then nothing more
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Less(t, time.Since(t0), 5*time.Second)
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	assertOpenAIError(t, resp, string(got), errBodyTimeout)
	assert.Equal(t, int64(1), reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_refused_requests", "body_timeout"))
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, 0, sink.LogRecordCount(), "no session for the client's error")
}

// A client that stops reading (its connection open, its window full) is
// let go after client_send_timeout: its session ends aborted and the
// upstream request is cancelled, instead of holding both forever.
func TestProxyClientStopsReading(t *testing.T) {
	event := "data: " + `{"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 4000) + `"}}]}` + "\n\n"
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for range 64 << 20 / len(event) { // far more than the sockets' buffers hold
			if _, err := io.WriteString(w, event); err != nil {
				break
			}
			f.Flush()
		}
		select {
		case <-r.Context().Done():
			u.mu.Lock()
			u.cancelled++
			u.mu.Unlock()
		case <-time.After(10 * time.Second):
		}
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink, func(c *Config) { c.ClientSendTimeout = 200 * time.Millisecond })
	conn, err := net.Dial("tcp", tr.p.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`
	_, err = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	require.NoError(t, err)
	// and never reads
	evs := sessionEvents(t, sink, 1)
	end := evs[len(evs)-1]
	assert.Equal(t, tokenevent.KindEnd, end.Kind)
	assert.Equal(t, finishReasonAbort, end.FinishReason)
	require.Eventually(t, func() bool {
		up.mu.Lock()
		defer up.mu.Unlock()
		return up.cancelled == 1
	}, 10*time.Second, 5*time.Millisecond, "the upstream request is cancelled")
}

// An SSE event over the parser's bound (1 MiB) reaches the client
// unchanged but is not read: counted, so that the loss of its tokens shows.
func TestProxyOversizedEventCounted(t *testing.T) {
	chat, _ := fixtureStreams(t)
	huge := "data: " + `{"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 1<<20) + `"}}]}` + "\n\n"
	events := append([]string{chat[0], huge}, chat[1:]...)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, events, func(int) time.Duration { return 0 })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	_, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, nil)
	assert.Equal(t, strings.Join(events, ""), got)
	sessionEvents(t, sink, 1)
	m, err := tr.tel.GetMetric("otelcol_receiver_token_stream_proxy_oversized_events")
	require.NoError(t, err)
	assert.Equal(t, int64(1), m.Data.(metricdata.Sum[int64]).DataPoints[0].Value)
}

// splitReader returns data in reads of the sizes sizes gives, cycling.
type splitReader struct {
	data  []byte
	sizes []byte
	i     int
}

func (r *splitReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := len(r.data)
	if len(r.sizes) > 0 {
		n = 1 + int(r.sizes[r.i%len(r.sizes)])
		r.i++
	}
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

type bufferResponse struct {
	discardResponse
	bytes.Buffer
}

func (b *bufferResponse) Write(p []byte) (int, error) { return b.Buffer.Write(p) }

// FuzzRelayStream: whatever the upstream sends and however its reads are
// split, the client gets the upstream's bytes (minus the usage chunk the
// proxy added and strips; a stream without [DONE] cut, its unfinished
// event left out, with the error event after), and the session the same
// facts.
func FuzzRelayStream(f *testing.F) {
	chat, completions := fixtureStreams(&testing.T{})
	f.Add([]byte(strings.Join(chat, "")), []byte{0, 7, 200}, true)
	f.Add([]byte(strings.Join(completions, "")), []byte{3}, false)
	f.Add([]byte("data: {\"error\":{\"type\":\"x\"}}\r\n\r\n: c\n\ndata: [DONE]\n\n"), []byte{1}, false)
	f.Add([]byte("data: a\ndata: b\r\rid: 1\n\nretry: x"), []byte{}, true)
	p := relayOnly(newTestSink(f, componenttest.NewNopTelemetrySettings(), consumertest.NewNop()), testConfig(f, "http://localhost:8000").EventQueueSize)
	f.Cleanup(p.batch.shutdown)
	relay := func(data, sizes []byte, strip bool) (string, *session, bool) {
		w := &bufferResponse{discardResponse: discardResponse{h: http.Header{}}}
		s := &session{p: p, id: "fuzz", completionTokens: -1, promptTokens: -1}
		relayedWhole := s.relayStream(context.Background(), w, &splitReader{data: data, sizes: sizes}, strip)
		return w.String(), s, relayedWhole
	}
	f.Fuzz(func(t *testing.T, data, sizes []byte, strip bool) {
		whole, ws, wholeOK := relay(data, nil, strip)
		split, ss, splitOK := relay(data, sizes, strip)
		if whole != split || wholeOK != splitOK {
			t.Fatalf("read splits %v change the client's bytes:\nwhole %q\nsplit %q", sizes, whole, split)
		}
		relayed := whole
		if !wholeOK {
			// Cut (no [DONE]): what was relayed, an unfinished event left
			// out, then the error event.
			var ok bool
			for _, c := range []*streamCut{&cutBroken, &cutMalformed} {
				if r, found := strings.CutSuffix(whole, string(c.event())); found {
					relayed, ok = strings.TrimSuffix(r, string(eventEnd)), true
				}
			}
			if !ok {
				t.Fatalf("a cut stream does not end with the error event: %q", whole)
			}
		}
		if !strip && (wholeOK && relayed != string(data) || !strings.HasPrefix(string(data), relayed)) {
			t.Fatalf("not forwarded as is:\nin  %q\nout %q", data, whole)
		}
		if strip && len(relayed) > len(data) {
			t.Fatalf("stripping added bytes: %q -> %q", data, whole)
		}
		if ws.chunks != ss.chunks || ws.completionTokens != ss.completionTokens || ws.promptTokens != ss.promptTokens ||
			ws.finishReason != ss.finishReason || ws.engineError != ss.engineError {
			t.Fatalf("read splits change the session: %+v vs %+v", *ws, *ss)
		}
	})
}
