// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// The proxy's behavior is tested in internal/proxy; these tests cover its
// wiring: the configuration handed to it and its events reaching the
// pipeline through the receiver.

func startProxyReceiver(t *testing.T, upstream string, next *consumertest.LogsSink, opts ...func(*ProxyConfig)) *testReceiver {
	t.Helper()
	return startReceiver(t, next, func(c *Config) {
		c.Hooks.HTTP = configoptional.None[HTTPConfig]()
		c.Hooks.UDP = configoptional.None[UDPConfig]()
		p := c.Proxy.GetOrInsertDefault()
		p.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
		p.Upstream.ClientConfig.Endpoint = upstream
		for _, o := range opts {
			o(p)
		}
	})
}

func (tr *testReceiver) proxyURL() string { return "http://" + tr.r.proxy.Addr().String() }

// postStream posts a streaming chat request to the proxy and returns what
// the client got.
func postStream(t *testing.T, tr *testReceiver) string {
	t.Helper()
	resp, err := http.Post(tr.proxyURL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(got)
}

// proxyEvents waits until the sink holds the end of a session and returns
// its events, decoded.
func proxyEvents(t *testing.T, sink *consumertest.LogsSink) []tokenevent.Event {
	t.Helper()
	var evs []tokenevent.Event
	require.Eventually(t, func() bool {
		evs = evs[:0]
		var ev tokenevent.Event
		for _, ld := range sink.AllLogs() {
			for _, lr := range ld.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().All() {
				require.NoError(t, tokenrecord.ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
					evs = append(evs, *e)
				}))
			}
		}
		return len(evs) > 0 && evs[len(evs)-1].Kind == tokenevent.KindEnd
	}, 10*time.Second, 5*time.Millisecond)
	return evs
}

// sseUpstream streams three content chunks and [DONE], gap apart.
func sseUpstream(t *testing.T, gap time.Duration) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{`{"choices":[{"delta":{"content":"a"}}]}`, `{"choices":[{"delta":{"content":"b"}}]}`, `{"choices":[{"delta":{"content":"c"},"finish_reason":"stop"}]}`, "[DONE]"} {
			time.Sleep(gap)
			_, _ = io.WriteString(w, "data: "+ev+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// A proxied session reaches the logs pipeline, counted as the proxy's.
func TestProxyEventsReachThePipeline(t *testing.T) {
	up := sseUpstream(t, 0)
	sink := new(consumertest.LogsSink)
	tr := startProxyReceiver(t, up.URL, sink)
	got := postStream(t, tr)
	assert.True(t, strings.HasSuffix(got, "data: [DONE]\n\n"), got)
	evs := proxyEvents(t, sink)
	require.Len(t, evs, 5, "start, 3 tokens, end")
	assert.Equal(t, strings.TrimPrefix(up.URL, "http://"), evs[0].Engine)
	assert.Equal(t, "stop", evs[4].FinishReason)
	require.Eventually(t, func() bool { return counter(t, tr.tel, "otelcol_receiver_token_stream_accepted_events", "proxy") == 5 },
		5*time.Second, 5*time.Millisecond)
}

// The deprecated proxy::upstream::timeout is read as
// response_header_timeout: it no longer cuts a stream longer than it.
func TestProxyDeprecatedTimeoutBoundsHeadersOnly(t *testing.T) {
	up := sseUpstream(t, 40*time.Millisecond)
	sink := new(consumertest.LogsSink)
	tr := startProxyReceiver(t, up.URL, sink, func(p *ProxyConfig) { p.Upstream.ClientConfig.Timeout = 100 * time.Millisecond })
	got := postStream(t, tr)
	assert.True(t, strings.HasSuffix(got, "data: [DONE]\n\n"), "the whole stream after 4×40 ms: %q", got)
	evs := proxyEvents(t, sink)
	assert.Empty(t, evs[len(evs)-1].Error)
}

// The strings that become keys are bounded alike on every path: the same
// over-long model, tenant, response model, finish reason and error type
// give the same values whether a hook sent them or the proxy observed
// them, each cut to its bound on a rune boundary, counted by transport in
// truncated_values, and the sessions are kept.
func TestLongValuesCutAlikeOnEveryPath(t *testing.T) {
	model := "m" + strings.Repeat("é", 6000)
	tenant := strings.Repeat("t", 300)
	finish := strings.Repeat("f", 300)
	errType := strings.Repeat("e", 100)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		body, _ := io.ReadAll(r.Body)
		events := []string{`{"model":"` + model + `","choices":[{"delta":{"content":"a"},"finish_reason":"` + finish + `"}]}`}
		if strings.Contains(string(body), `"fail"`) {
			events = []string{`{"error":{"message":"x","type":"` + errType + `","code":500}}`}
		}
		for _, ev := range append(events, "[DONE]") {
			_, _ = io.WriteString(w, "data: "+ev+"\n\n")
		}
	}))
	t.Cleanup(up.Close)
	sink := new(consumertest.LogsSink)
	tr := startReceiver(t, sink, func(c *Config) {
		p := c.Proxy.GetOrInsertDefault()
		p.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
		p.Upstream.ClientConfig.Endpoint = up.URL
		p.AttributesFromHeaders = map[string]string{"X-Tenant": "tenant"}
	})

	// The proxy: a session that finishes, one that fails.
	for _, body := range []string{`{"model":"` + model + `","stream":true}`, `{"model":"` + model + `","stream":true,"user":"fail"}`} {
		req, err := http.NewRequest(http.MethodPost, tr.proxyURL()+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// The hook: the same two sessions.
	hookLines := `{"event":"start","session_id":"h-1","time_unix_nano":1,"model":"` + model + `","attributes":{"tenant":"` + tenant + `"}}
{"event":"end","session_id":"h-1","time_unix_nano":2,"finish_reason":"` + finish + `","response_model":"` + model + `"}
{"event":"start","session_id":"h-2","time_unix_nano":1,"model":"` + model + `","attributes":{"tenant":"` + tenant + `"}}
{"event":"end","session_id":"h-2","time_unix_nano":2,"error":"` + errType + `"}
`
	status, _, br := post(t, tr.url, "application/x-ndjson", hookLines)
	require.Equal(t, http.StatusOK, status, br)
	assert.Equal(t, 4, br.Accepted, "every session kept")

	var starts, ends []tokenevent.Event
	require.Eventually(t, func() bool {
		starts, ends = starts[:0], ends[:0]
		var ev tokenevent.Event
		for _, ld := range sink.AllLogs() {
			for _, lr := range ld.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().All() {
				require.NoError(t, tokenrecord.ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
					e.Attributes = append([]tokenevent.Attribute(nil), e.Attributes...)
					switch e.Kind {
					case tokenevent.KindStart:
						starts = append(starts, *e)
					case tokenevent.KindEnd:
						ends = append(ends, *e)
					}
				}))
			}
		}
		return len(starts) == 4 && len(ends) == 4
	}, 10*time.Second, 5*time.Millisecond)

	wantModel := "m" + strings.Repeat("é", 127) // 255 bytes: the bound falls mid-rune
	for _, ev := range starts {
		assert.Equal(t, wantModel, ev.Model, ev.SessionID)
		assert.Equal(t, []tokenevent.Attribute{{Key: "tenant", Value: tenant[:tokenevent.MaxValueBytes]}}, ev.Attributes, ev.SessionID)
	}
	var errs, finishes, models []string
	for _, ev := range ends {
		switch {
		case ev.Error != "":
			errs = append(errs, ev.Error)
		default:
			finishes = append(finishes, ev.FinishReason)
			models = append(models, ev.ResponseModel)
		}
	}
	assert.Equal(t, []string{errType[:tokenevent.MaxErrorTypeBytes], errType[:tokenevent.MaxErrorTypeBytes]}, errs)
	assert.Equal(t, []string{finish[:tokenevent.MaxValueBytes], finish[:tokenevent.MaxValueBytes]}, finishes)
	assert.Equal(t, []string{wantModel, wantModel}, models)

	// model and tenant of both starts, finish reason and response model
	// of one end, error of the other: 7 a path.
	require.Eventually(t, func() bool {
		return counter(t, tr.tel, "otelcol_receiver_token_stream_truncated_values", "proxy") == 7
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, int64(7), counter(t, tr.tel, "otelcol_receiver_token_stream_truncated_values", "http"))
}
