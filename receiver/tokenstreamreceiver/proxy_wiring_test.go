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
