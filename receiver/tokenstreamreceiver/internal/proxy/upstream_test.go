// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configauth"
	"go.opentelemetry.io/collector/config/configcompression"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configmiddleware"
	"go.opentelemetry.io/collector/config/configopaque"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"
)

// usageBody asks for a stream with usage: the proxy forwards it unchanged.
const usageBody = `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`

// countingUpstream is an SSE upstream that counts the connections made to
// it.
func countingUpstream(t *testing.T, events []string, idleTimeout time.Duration) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	up.Config.IdleTimeout = idleTimeout
	up.Start()
	t.Cleanup(up.Close)
	return up, &conns
}

// The observed paths keep their upstream connections alive between
// requests, as http.Transport did.
func TestDirectUpstreamReusesConnections(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up, conns := countingUpstream(t, chat, 0)
	tr := startTestProxy(t, up.URL, new(consumertest.LogsSink))
	require.NotNil(t, tr.p.direct, "a plain-HTTP upstream is reached directly")
	for range 3 {
		resp, got := postChat(t, tr.proxyURL(), usageBody, nil)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, strings.Join(chat, ""), got)
	}
	assert.Equal(t, int64(1), conns.Load(), "one connection for three requests")
}

// A kept-alive connection the upstream closed meanwhile (its keep-alive
// timeout) is not reused: the next request gets a new one.
func TestDirectUpstreamDropsConnectionsTheUpstreamClosed(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up, conns := countingUpstream(t, chat, 50*time.Millisecond)
	tr := startTestProxy(t, up.URL, new(consumertest.LogsSink))
	for range 2 {
		resp, got := postChat(t, tr.proxyURL(), usageBody, nil)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, strings.Join(chat, ""), got)
		time.Sleep(300 * time.Millisecond)
	}
	assert.Equal(t, int64(2), conns.Load())
}

// The proxy asks for gzip as http.Transport does, so it undoes it: the
// client gets the answer as the upstream meant it, and the usage is read.
func TestDirectUpstreamGzip(t *testing.T) {
	up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "gzip", r.Header.Get("Accept-Encoding"))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		_, _ = io.WriteString(zw, `{"model":"m","choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}`)
		_ = zw.Close()
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	resp, got := postChat(t, tr.proxyURL(), `{"model":"m"}`, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, got, `"completion_tokens":2`)
	assert.Empty(t, resp.Header.Get("Content-Encoding"))
	evs := sessionEvents(t, sink, 1)
	assert.Equal(t, int64(2), evs[len(evs)-1].CompletionTokens)
}

// interimTestBody is the stream of TestDirectUpstreamSkipsInterimResponses:
// a chunk, then [DONE].
const interimTestBody = `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\ndata: [DONE]\n\n"

// An interim answer (100 Continue) is not the response.
func TestDirectUpstreamSkipsInterimResponses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		req, err := http.ReadRequest(r)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "+
			strconv.Itoa(len(interimTestBody))+"\r\n\r\n"+interimTestBody)
	}()
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, "http://"+ln.Addr().String(), sink)
	resp, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, interimTestBody, got)
	evs := sessionEvents(t, sink, 1)
	assert.Empty(t, evs[len(evs)-1].Error)
}

// The observed paths keep confighttp's transport when it has more to do
// than carry bytes; static headers are set by the direct client.
func TestDirectEligible(t *testing.T) {
	plain, err := url.Parse("http://engine:8000")
	require.NoError(t, err)
	tls, err := url.Parse("https://engine:8000")
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		edit func(*confighttp.ClientConfig)
		u    *url.URL
		want bool
	}{
		"plain":   {func(*confighttp.ClientConfig) {}, plain, true},
		"headers": {func(c *confighttp.ClientConfig) { c.Headers = configopaque.MapList{{Name: "X-Key", Value: "v"}} }, plain, true},
		"https":   {func(*confighttp.ClientConfig) {}, tls, false},
		"auth":    {func(c *confighttp.ClientConfig) { c.Auth = configoptional.Some(configauth.Config{}) }, plain, false},
		"middlewares": {func(c *confighttp.ClientConfig) {
			c.Middlewares = []configmiddleware.Config{{ID: component.MustNewID("m")}}
		}, plain, false},
		"proxy_url":   {func(c *confighttp.ClientConfig) { c.ProxyURL = "http://proxy:3128" }, plain, false},
		"compression": {func(c *confighttp.ClientConfig) { c.Compression = configcompression.TypeGzip }, plain, false},
		"conn limit":  {func(c *confighttp.ClientConfig) { c.MaxConnsPerHost = 4 }, plain, false},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := confighttp.NewDefaultClientConfig()
			tc.edit(&cfg)
			assert.Equal(t, tc.want, directEligible(&cfg, tc.u))
		})
	}
}

// proxy::upstream::headers reach the upstream on the observed paths too,
// as confighttp sets them: in place of the client's own (one value, not
// two), and a configured Host as the request's host.
func TestDirectUpstreamConfiguredHeaders(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return 0 })
	})
	tr := startTestProxy(t, up.URL, new(consumertest.LogsSink), func(c *Config) {
		c.Client.Headers = configopaque.MapList{{Name: "X-Engine-Key", Value: "k"}, {Name: "Host", Value: "engine.internal"}}
	})
	require.NotNil(t, tr.p.direct)
	_, _ = postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, map[string]string{"X-Engine-Key": "from-client"})
	require.Len(t, up.headers, 1)
	assert.Equal(t, []string{"k"}, up.headers[0].Values("X-Engine-Key"))
	assert.Equal(t, []string{"engine.internal"}, up.hosts)
}

// An https upstream goes through confighttp's transport: the observed
// paths work there as before.
func TestProxyStreamThroughTransport(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range chat {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink, func(c *Config) { c.Client.TLS.InsecureSkipVerify = true })
	require.Nil(t, tr.p.direct)
	resp, got := postChat(t, tr.proxyURL(), usageBody, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, strings.Join(chat, ""), got)
	evs := sessionEvents(t, sink, 1)
	assert.Equal(t, "stop", evs[len(evs)-1].FinishReason)
}

// An upstream that sends bytes after a stream's last chunk left its
// connection somewhere other than at a response's end: the client gets the
// stream, the connection is not reused.
func TestDirectUpstreamBytesAfterTheBodyCloseTheConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	const ev = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
	var conns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\nstray bytes", len(ev), ev)
				}
			}()
		}
	}()
	tr := startTestProxy(t, "http://"+ln.Addr().String(), new(consumertest.LogsSink))
	require.NotNil(t, tr.p.direct)
	for range 2 {
		resp, got := postChat(t, tr.proxyURL(), usageBody, nil)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, ev, got)
	}
	assert.Equal(t, int64(2), conns.Load(), "a new connection for each request")
}
