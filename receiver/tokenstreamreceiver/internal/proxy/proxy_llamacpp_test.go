// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/sse"
)

// llamaCppStreams reads the llama.cpp fixture (testdata/fixtures/llamacpp,
// from llama.cpp v0.5.0's tools/server and b5440's): a chat stream as a
// request without stream_options gets it, the same with include_usage, a
// completions stream, and an older server's chat stream.
func llamaCppStreams(t *testing.T) (chat, chatUsage, completions, older []string) {
	t.Helper()
	streams := readFixtureStreams(t, "../../../../testdata/fixtures/llamacpp/sse-streams.txt")
	require.Len(t, streams, 4)
	return streams[0], streams[1], streams[2], streams[3]
}

// llamaCppUsage is the usage member of the fixture's include_usage stream,
// with the comma before it: what the proxy takes out when it asked for it.
const llamaCppUsage = `,"usage":{"completion_tokens":4,"prompt_tokens":12,"total_tokens":16,"prompt_tokens_details":{"cached_tokens":0}}`

// llamaCppFirstToken delays the first content chunk, so that the derived
// queue has something to show (its value is checked against the events,
// not against this).
const llamaCppFirstToken = 150 * time.Millisecond

// newLlamaCppUpstream answers as llama.cpp v0.5.0 does: the usage chunk only
// for a request with include_usage, its timings on the last chunk.
func newLlamaCppUpstream(t *testing.T) *scriptedUpstream {
	chat, chatUsage, completions, _ := llamaCppStreams(t)
	return newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		events := chat
		u.mu.Lock()
		body := u.bodies[len(u.bodies)-1]
		u.mu.Unlock()
		switch {
		case r.URL.Path == "/v1/completions":
			events = completions
		case strings.Contains(body, `"include_usage":true`):
			events = chatUsage
		}
		replay(u, w, r, events, func(i int) time.Duration {
			if i == 1 {
				return llamaCppFirstToken
			}
			return time.Millisecond
		})
	})
}

// Transparency: through the proxy, a client gets what llama.cpp would have
// sent it, byte for byte, though the proxy asked for the usage: llama.cpp
// then moves its timings from the finish chunk to the usage chunk, and the
// proxy puts them back.
func TestProxyLlamaCppClientKeepsTimings(t *testing.T) {
	chat, chatUsage, _, _ := llamaCppStreams(t)
	up := newLlamaCppUpstream(t)
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)

	const noUsage = `{"model":"tiny-random-llama","messages":[{"role":"user","content":"Say hello"}],"stream":true,"max_tokens":4}`
	_, got := postChat(t, tr.proxyURL(), noUsage, nil)
	require.Contains(t, up.bodies[0], `"stream_options":{"include_usage":true}`, "the proxy asked for usage")
	require.Contains(t, chatUsage[len(chatUsage)-2], llamaCppUsage, "and llama.cpp answered with a usage chunk")
	assert.Equal(t, strings.Join(chat, ""), got, "the stream llama.cpp sends a request without include_usage")

	// A client that asked for usage gets llama.cpp's answer unchanged.
	_, got = postChat(t, tr.proxyURL(), `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, nil)
	assert.Equal(t, strings.Join(chatUsage, ""), got)

	evs := sessionEvents(t, sink, 2)
	end := evs[len(evs)/2-1]
	require.Equal(t, tokenevent.KindEnd, end.Kind)
	assert.Equal(t, int64(4), end.CompletionTokens)
	assert.Equal(t, int64(12), end.PromptTokens)
}

// llama.cpp's timings on the end event: prefill and decode as llama.cpp
// measured them, the queue derived from the proxy's own wait for the
// first token (llama.cpp has no queue figure), source llamacpp_timings.
func TestProxyLlamaCppTiming(t *testing.T) {
	up := newLlamaCppUpstream(t)
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	postChat(t, tr.proxyURL(), `{"model":"tiny-random-llama","stream":true}`, nil)
	evs := sessionEvents(t, sink, 1)
	require.Len(t, evs, 6, "start, 4 content chunks, end")
	start, first, end := evs[0], evs[1], evs[5]
	assert.Equal(t, tokenevent.TimingLlamaCpp, end.TimingSource)
	assert.Equal(t, int64(106_123_000), end.PrefillTimeNs, "prompt_ms")
	assert.Equal(t, int64(9_600_000), end.DecodeTimeNs, "predicted_ms")
	ttft := int64(first.TimeUnixNano - start.TimeUnixNano)
	assert.InDelta(t, max(ttft-end.PrefillTimeNs, 0), end.QueueTimeNs, 1000, "the proxy's TTFT less the prefill (TTFT %d ns)", ttft)
	assert.Equal(t, "tiny-random-llama", end.ResponseModel)
}

// A whole answer (stream off): llama.cpp's timings in it (the shape of
// to_json_oaicompat_chat, tools/server/server-task.cpp:414-460 at v0.5.0);
// the queue is the wait for the answer less prefill and decode.
func TestProxyLlamaCppWholeAnswer(t *testing.T) {
	const answer = `{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":" Hello there, friend"}}],"created":1790000000,"model":"tiny-random-llama","system_fingerprint":"b1-de3ff81","object":"chat.completion","usage":{"completion_tokens":4,"prompt_tokens":12,"total_tokens":16,"prompt_tokens_details":{"cached_tokens":0}},"id":"chatcmpl-Jx8f2LQ0pZk7TnVb3WcR9eYa1uMd6HsG","timings":{"cache_n":0,"prompt_n":12,"prompt_ms":106.123,"prompt_per_token_ms":8.843583333333333,"prompt_per_second":113.0763359497941,"predicted_n":4,"predicted_ms":9.6,"predicted_per_token_ms":3.1999999999999997,"predicted_per_second":312.5}}`
	up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
		time.Sleep(llamaCppFirstToken)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_, _ = io.WriteString(w, answer)
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	_, got := postChat(t, tr.proxyURL(), `{"model":"tiny-random-llama","messages":[{"role":"user","content":"Say hello"}],"max_tokens":4}`, nil)
	assert.Equal(t, answer, got)
	evs := sessionEvents(t, sink, 1)
	require.Len(t, evs, 3, "start, the answer, end")
	start, whole, end := evs[0], evs[1], evs[2]
	assert.Equal(t, tokenevent.TimingLlamaCpp, end.TimingSource)
	assert.Equal(t, int64(106_123_000), end.PrefillTimeNs)
	assert.Equal(t, int64(9_600_000), end.DecodeTimeNs)
	wait := int64(whole.TimeUnixNano - start.TimeUnixNano)
	assert.InDelta(t, max(wait-end.PrefillTimeNs-end.DecodeTimeNs, 0), end.QueueTimeNs, 1000, "the wait for the answer (%d ns) less prefill and decode", wait)
}

// A completions stream: llama.cpp's last chunk is a choice with usage and
// timings whatever the request asked, so the client gets it unchanged.
func TestProxyLlamaCppCompletions(t *testing.T) {
	_, _, completions, _ := llamaCppStreams(t)
	up := newLlamaCppUpstream(t)
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	resp, err := http.Post(tr.proxyURL()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"The capital of France is","stream":true,"max_tokens":3}`))
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, strings.Join(completions, ""), string(got))
	evs := sessionEvents(t, sink, 1)
	end := evs[len(evs)-1]
	assert.Equal(t, int64(3), end.CompletionTokens)
	assert.Equal(t, int64(12), end.PromptTokens, "9 cached and 3 processed")
	assert.Equal(t, tokenevent.TimingLlamaCpp, end.TimingSource)
	assert.Equal(t, int64(31_874_000), end.PrefillTimeNs)
	assert.Equal(t, int64(7_050_000), end.DecodeTimeNs)
}

// An older llama.cpp (b5440) puts usage and timings on the finish chunk,
// a choice: nothing is taken out.
func TestProxyLlamaCppOlderServer(t *testing.T) {
	_, _, _, older := llamaCppStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, older, func(int) time.Duration { return time.Millisecond })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	_, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
	assert.Equal(t, strings.Join(older, ""), got)
	evs := sessionEvents(t, sink, 1)
	end := evs[len(evs)-1]
	assert.Equal(t, int64(5), end.CompletionTokens)
	assert.Equal(t, int64(12), end.PromptTokens)
	assert.Equal(t, int64(98_412_000), end.PrefillTimeNs)
}

// A client that turned usage off itself is not asked for it: its counts
// come from llama.cpp's timings.
func TestProxyLlamaCppCountsFromTimings(t *testing.T) {
	chat, _, _, _ := llamaCppStreams(t)
	up := newLlamaCppUpstream(t)
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`
	_, got := postChat(t, tr.proxyURL(), body, nil)
	assert.Equal(t, body, up.bodies[0], "forwarded as it came")
	assert.Equal(t, strings.Join(chat, ""), got)
	evs := sessionEvents(t, sink, 1)
	end := evs[len(evs)-1]
	assert.Equal(t, int64(4), end.CompletionTokens, "predicted_n")
	assert.Equal(t, int64(12), end.PromptTokens, "prompt_n + cache_n")
}

// vLLM's per-request metrics ride on its usage chunk: a client that did not
// ask for usage gets them on the finish chunk, and no chunk with
// "choices":[]. The usage chunk that holds nothing else is left out.
func TestProxyStripsOnlyUsage(t *testing.T) {
	chat, _ := fixtureStreams(t)
	const metrics = `,"metrics":{"time_to_first_token_ms":48.5,"generation_time_ms":180.25,"queue_time_ms":912.0}`
	var events, want []string
	for _, ev := range chat {
		switch {
		case strings.Contains(ev, `"choices":[],"usage"`):
			ev = strings.Replace(ev, "}}\n\n", "}"+metrics+"}\n\n", 1)
			require.Contains(t, ev, metrics)
		case strings.Contains(ev, `"finish_reason":"stop"`):
			want = append(want, strings.Replace(ev, "}\n\n", metrics+"}\n\n", 1))
		default:
			want = append(want, ev)
		}
		events = append(events, ev)
	}
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, events, func(int) time.Duration { return time.Millisecond })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	_, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
	assert.Equal(t, strings.Join(want, ""), got)
	assert.NotContains(t, got, `"choices":[]`)
	evs := sessionEvents(t, sink, 1)
	end := evs[len(evs)-1]
	assert.Equal(t, int64(8), end.CompletionTokens, "usage read from the chunk all the same")
	assert.Equal(t, tokenevent.TimingResponse, end.TimingSource)
}

// withoutUsage keeps every byte of the event but the usage member; an
// event whose data spans lines goes whole.
func TestWithoutUsage(t *testing.T) {
	event := func(raw string) *sse.Event {
		var got *sse.Event
		require.NoError(t, sse.NewParser(0).Feed([]byte(raw), func(ev *sse.Event) error {
			c := *ev
			c.Raw, c.Data = []byte(string(ev.Raw)), []byte(string(ev.Data))
			got = &c
			return nil
		}))
		require.NotNil(t, got)
		return got
	}
	for _, tt := range []struct{ raw, want string }{
		{": ping\r\nid: 7\r\ndata:{\"choices\":[],\"usage\":{\"a\":1},\"timings\":{}}\r\n\r\n", ": ping\r\nid: 7\r\ndata:{\"choices\":[],\"timings\":{}}\r\n\r\n"},
		{"data: {\"choices\":[],\ndata: \"usage\":{},\"timings\":{}}\n\n", "data: {\"choices\":[],\ndata: \"usage\":{},\"timings\":{}}\n\n"},
		{"data: {\"choices\":[],\"usage\":{},\"usage\":{},\"x\":1}\n\n", "data: {\"choices\":[],\"usage\":{},\"usage\":{},\"x\":1}\n\n"},
	} {
		head, tail, keep := withoutUsage(event(tt.raw))
		assert.True(t, keep)
		assert.Equal(t, tt.want, string(head)+string(tail))
	}
	_, _, keep := withoutUsage(event("data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"a\":1}}\n\n"))
	assert.False(t, keep, "nothing but the usage")
}

// The derived queue: the proxy's wait less what llama.cpp says it spent.
func TestDerivedQueue(t *testing.T) {
	t0 := time.Unix(1790000000, 0)
	ms := func(v float64) time.Time { return t0.Add(time.Duration(v * float64(time.Millisecond))) }
	timing := func(prefill, decode float64) openaistream.RequestTiming {
		return openaistream.RequestTiming{QueueMs: -1, PrefillMs: prefill, DecodeMs: decode, Source: tokenevent.TimingLlamaCpp}
	}
	for _, tt := range []struct {
		name       string
		s          session
		end        time.Time
		t          openaistream.RequestTiming
		want       float64
		wantAbsent bool
	}{
		{"streamed: TTFT less prefill", session{started: t0, firstToken: ms(750)}, ms(900), timing(106.123, 9.6), 643.877, false},
		{"streamed: never below 0", session{started: t0, firstToken: ms(100)}, ms(200), timing(106.123, 9.6), 0, false},
		{"streamed, no token: unknown", session{started: t0}, ms(200), timing(106.123, 9.6), 0, true},
		{"whole: answer time less prefill and decode", session{started: t0, firstToken: ms(500), whole: true}, ms(500), timing(100, 150), 250, false},
		{"whole, no decode: unknown", session{started: t0, whole: true}, ms(500), timing(100, -1), 0, true},
		{"no prefill: unknown", session{started: t0, firstToken: ms(500)}, ms(600), timing(-1, 10), 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.s.derivedQueueMs(tt.end, tt.t)
			if tt.wantAbsent {
				assert.Equal(t, -1.0, got)
				return
			}
			assert.InDelta(t, tt.want, got, 1e-6)
			assert.False(t, math.IsNaN(got))
		})
	}
}

// The finish chunk held for the usage chunk goes as it came when the fold
// cannot be made (a member on both), and when no usage chunk follows: the
// stream cut right after it, the client still gets it before the cut.
func TestProxyHeldFinishChunk(t *testing.T) {
	const (
		first  = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n"
		finish = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"timings\":{\"a\":1}}\n\n"
		usage  = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"completion_tokens\":1},\"timings\":{\"a\":2}}\n\n"
		done   = "data: [DONE]\n\n"
	)
	for _, tt := range []struct {
		name   string
		events []string
		want   string
	}{
		{"both have timings", []string{first, finish, usage, done}, first + finish + strings.Replace(usage, ",\"usage\":{\"completion_tokens\":1}", "", 1) + done},
		{"cut after the finish chunk", []string{first, finish}, first + finish},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
				replay(u, w, r, tt.events, func(int) time.Duration { return time.Millisecond })
			})
			tr := startTestProxy(t, up.URL, new(consumertest.LogsSink))
			resp, err := http.Post(tr.proxyURL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body) // a cut stream ends in an error (see cut.go)
			resp.Body.Close()
			got := string(body)
			assert.True(t, strings.HasPrefix(got, tt.want), "got %q", got)
			if len(tt.events) == 2 {
				assert.Contains(t, got[len(tt.want):], `"error"`, "then the cut")
			} else {
				assert.Equal(t, tt.want, got)
			}
		})
	}
}
