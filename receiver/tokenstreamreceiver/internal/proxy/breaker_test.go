// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

const testMaxGap = 200 * time.Millisecond

// streamUsage asks for the usage chunk, so that the client gets the
// fixture's stream whole (the proxy takes out the one it adds itself).
const streamUsage = `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`

// freezingUpstream sends events (gap(i) before event i), then freezes:
// it sends nothing more until its request is cancelled (counted in
// cancelled), or for at most 10 s, after which it ends the stream cleanly,
// without [DONE].
func freezingUpstream(t *testing.T, events []string, gap func(i int) time.Duration) *scriptedUpstream {
	return newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, events, gap)
		select {
		case <-r.Context().Done():
			u.mu.Lock()
			u.cancelled++
			u.mu.Unlock()
		case <-time.After(10 * time.Second):
		}
	})
}

func (u *scriptedUpstream) cancelCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.cancelled
}

// withStallBreaker turns the breaker on at testMaxGap.
func withStallBreaker(minTokens int64) func(*Config) {
	return func(c *Config) { c.StallMaxGap, c.StallMinTokens = testMaxGap, minTokens }
}

func stalledStreams(t *testing.T, tp *testProxy) int64 {
	t.Helper()
	m, err := tp.tel.GetMetric("otelcol_receiver_token_stream_proxy_stalled_streams")
	if err != nil {
		return 0
	}
	var total int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		total += dp.Value
	}
	return total
}

// lastEnd is the end event among evs.
func lastEnd(t *testing.T, evs []tokenevent.Event) tokenevent.Event {
	t.Helper()
	require.NotEmpty(t, evs)
	end := evs[len(evs)-1]
	require.Equal(t, tokenevent.KindEnd, end.Kind)
	return end
}

// An upstream that freezes mid-stream: the proxy cancels the upstream
// request, and the client gets what came before and an engine_stalled error
// event in vLLM's shape, then no [DONE] and no end of the response; the
// session ends error, engine_stalled, and the cut is counted.
func TestStallBreakerCutsAFrozenStream(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := freezingUpstream(t, chat[:4], func(int) time.Duration { return time.Millisecond })
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, up.URL, sink, withStallBreaker(0))
	t0 := time.Now()
	got, err := postStream(t, http.DefaultClient, tp.proxyURL())
	// A sanity bound only (the upstream would hold the stream 10 s).
	assert.Less(t, time.Since(t0), testMaxGap+2*time.Second)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "no end of the response: the stream is not whole")
	require.True(t, strings.HasPrefix(got, strings.Join(chat[:4], "")), "what came before the freeze, unchanged: %q", got)
	rest := strings.TrimPrefix(got, strings.Join(chat[:4], ""))
	assert.Regexp(t, cutEvent(errEngineStalled, http.StatusGatewayTimeout), rest, "the error event and nothing after it: no [DONE]")
	errEvent := strings.TrimSuffix(rest, "\n\n")
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(errEvent, "data: ")), &body), errEvent)
	assert.Equal(t, "engine_stalled", body.Error.Type)
	assert.Equal(t, http.StatusGatewayTimeout, body.Error.Code)
	assert.Contains(t, body.Error.Message, "200ms")

	require.Eventually(t, func() bool { return up.cancelCount() == 1 }, 5*time.Second, 5*time.Millisecond,
		"the upstream sees its request cancelled")
	evs := sessionEvents(t, sink, 1)
	end := lastEnd(t, evs)
	assert.Equal(t, errEngineStalled, end.Error)
	tokens := 0
	for _, ev := range evs {
		if ev.Kind == tokenevent.KindToken {
			tokens++
		}
	}
	assert.Equal(t, 3, tokens, "the tokens relayed before the cut")
	assert.Equal(t, int64(1), stalledStreams(t, tp))
}

// Gaps under max_gap never cut a stream, however long it lasts, and the
// wait for the first token (queue and prefill) is not a decode gap: a
// first token later than max_gap is waited for.
func TestStallBreakerLeavesNormalStreams(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(i int) time.Duration {
			if i == 1 {
				return 2 * testMaxGap // the first token
			}
			return testMaxGap / 4
		})
	})
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, up.URL, sink, withStallBreaker(0))
	resp, got := postChat(t, tp.proxyURL(), streamUsage, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, strings.Join(chat, ""), got, "the whole stream, unchanged")
	assert.Empty(t, lastEnd(t, sessionEvents(t, sink, 1)).Error)
	assert.Equal(t, 0, up.cancelCount())
	assert.Equal(t, int64(0), stalledStreams(t, tp))
}

// min_tokens: a pause longer than max_gap before a stream's N-th token is
// waited for; after it, the breaker watches.
func TestStallBreakerMinTokens(t *testing.T) {
	chat, _ := fixtureStreams(t)
	// chat[0] is the role chunk; chat[1] and chat[2] the first two tokens.
	up := freezingUpstream(t, chat[:5], func(i int) time.Duration {
		if i == 3 {
			return 3 * testMaxGap // before the third token
		}
		return time.Millisecond
	})
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, up.URL, sink, withStallBreaker(3))
	got, err := postStream(t, http.DefaultClient, tp.proxyURL())
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.True(t, strings.HasPrefix(got, strings.Join(chat[:5], "")), "the pause before the third token is waited for: %q", got)
	assert.Contains(t, got, `"type":"engine_stalled"`, "the freeze after it is cut")
	assert.Equal(t, errEngineStalled, lastEnd(t, sessionEvents(t, sink, 1)).Error)
	require.Eventually(t, func() bool { return up.cancelCount() == 1 }, 5*time.Second, 5*time.Millisecond)
}

// X-Otelcol-LLM-Stall-Breaker: off lets a request wait out a freeze; the
// field is the proxy's and never reaches the upstream. "on" is the
// configured behavior; any other value is refused before the upstream
// sees the request.
func TestStallBreakerHeader(t *testing.T) {
	chat, _ := fixtureStreams(t)
	pausing := func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(i int) time.Duration {
			if i == 3 {
				return 3 * testMaxGap
			}
			return time.Millisecond
		})
	}
	t.Run("off", func(t *testing.T) {
		up := newScriptedUpstream(t, pausing)
		sink := new(consumertest.LogsSink)
		tp := startTestProxy(t, up.URL, sink, withStallBreaker(0))
		_, got := postChat(t, tp.proxyURL(), streamUsage, map[string]string{"X-Otelcol-LLM-Stall-Breaker": "Off"})
		assert.Equal(t, strings.Join(chat, ""), got, "the pause is waited out")
		assert.Empty(t, lastEnd(t, sessionEvents(t, sink, 1)).Error)
		up.mu.Lock()
		defer up.mu.Unlock()
		require.Len(t, up.headers, 1)
		assert.NotContains(t, up.headers[0], StallBreakerHeader, "the proxy's field is not forwarded")
		assert.Equal(t, "Bearer secret", up.headers[0].Get("Authorization"))
	})
	t.Run("on", func(t *testing.T) {
		up := newScriptedUpstream(t, pausing)
		sink := new(consumertest.LogsSink)
		tp := startTestProxy(t, up.URL, sink, withStallBreaker(0))
		req, err := http.NewRequest(http.MethodPost, tp.proxyURL()+"/v1/chat/completions", strings.NewReader(streamUsage))
		require.NoError(t, err)
		req.Header.Set(StallBreakerHeader, "on")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		assert.Contains(t, string(got), `"type":"engine_stalled"`)
		assert.Equal(t, errEngineStalled, lastEnd(t, sessionEvents(t, sink, 1)).Error)
	})
	t.Run("invalid", func(t *testing.T) {
		up := newScriptedUpstream(t, pausing)
		sink := new(consumertest.LogsSink)
		tp := startTestProxy(t, up.URL, sink, withStallBreaker(0))
		resp, got := postChat(t, tp.proxyURL(), streamUsage, map[string]string{"X-Otelcol-LLM-Stall-Breaker": "2s"})
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assertOpenAIError(t, resp, got, errBadStallHeader)
		assert.Contains(t, got, "X-Otelcol-LLM-Stall-Breaker: want on or off")
		assert.Equal(t, int64(1), reasonCounter(t, tp, "otelcol_receiver_token_stream_proxy_refused_requests", "invalid_header"))
		up.mu.Lock()
		defer up.mu.Unlock()
		assert.Empty(t, up.bodies, "the upstream never sees the request")
	})
}

// Off by default: a freeze longer than any max_gap is waited out.
func TestStallBreakerOffByDefault(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(i int) time.Duration {
			if i == 3 {
				return 3 * testMaxGap
			}
			return time.Millisecond
		})
	})
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, up.URL, sink)
	_, got := postChat(t, tp.proxyURL(), streamUsage, nil)
	assert.Equal(t, strings.Join(chat, ""), got)
	assert.Empty(t, lastEnd(t, sessionEvents(t, sink, 1)).Error)
}

func TestStallBreakerWanted(t *testing.T) {
	for _, tt := range []struct {
		values []string
		want   bool
		err    bool
	}{
		{nil, true, false},
		{[]string{"on"}, true, false},
		{[]string{" OFF "}, false, false},
		{[]string{"off", "on"}, false, true},
		{[]string{"false"}, false, true},
		{[]string{""}, false, true},
	} {
		h := http.Header{}
		for _, v := range tt.values {
			h.Add("x-otelcol-llm-stall-breaker", v)
		}
		got, err := stallBreakerWanted(h)
		if tt.err {
			assert.Error(t, err, tt.values)
			continue
		}
		assert.NoError(t, err, tt.values)
		assert.Equal(t, tt.want, got, tt.values)
	}
}

// An event over the parser's bound (1 MiB) is forwarded unread: its tokens
// cannot be counted, so the breaker takes each of its pieces for a token
// rather than cut a stream that is sending.
func TestStallBreakerOversizedEventIsActivity(t *testing.T) {
	chat, _ := fixtureStreams(t)
	huge := "data: " + `{"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 1<<20) + `"}}]}` + "\n\n"
	const pieces = 6
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat[:2], func(int) time.Duration { return time.Millisecond })
		// The huge event trickles in over 6 × max_gap/2.
		size := len(huge)/pieces + 1
		for rest := huge; rest != ""; {
			n := min(size, len(rest))
			select {
			case <-time.After(testMaxGap / 2):
			case <-r.Context().Done():
				return
			}
			if _, err := io.WriteString(w, rest[:n]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			rest = rest[n:]
		}
		replay(u, w, r, chat[2:], func(int) time.Duration { return time.Millisecond })
	})
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, up.URL, sink, withStallBreaker(0))
	_, got := postChat(t, tp.proxyURL(), streamUsage, nil)
	assert.Equal(t, strings.Join(chat[:2], "")+huge+strings.Join(chat[2:], ""), got, "the whole stream")
	assert.Empty(t, lastEnd(t, sessionEvents(t, sink, 1)).Error)
	assert.Equal(t, int64(0), stalledStreams(t, tp))
}
