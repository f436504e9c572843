// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// Whether a session is streamed, as the engine decides it: vLLM reads the
// request's "stream" laxly (pydantic), and only an SSE answer is a stream.

// A "stream" value vLLM takes for true (a string, a number) streams, so the
// proxy asks for usage as for a literal true, strips the usage chunk from
// what the client gets and times the tokens; one it takes for false does
// not stream, and nothing is added.
func TestProxyStreamAsVLLMReadsIt(t *testing.T) {
	chat, _ := fixtureStreams(t)
	for _, tt := range []struct {
		stream   string
		streamed bool
	}{
		{`"true"`, true},
		{`"True"`, true},
		{`"yes"`, true},
		{`"1"`, true},
		{`1`, true},
		{`1.0`, true},
		{`"false"`, false},
		{`"0"`, false},
		{`0`, false},
		{`null`, false},
	} {
		t.Run(tt.stream, func(t *testing.T) {
			up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
				if !tt.streamed {
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":6,"completion_tokens":2}}`)
					return
				}
				replay(u, w, r, chat, func(int) time.Duration { return time.Millisecond })
			})
			sink := new(consumertest.LogsSink)
			tr := startTestProxy(t, up.URL, sink)
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":` + tt.stream + `}`
			_, got := postChat(t, tr.proxyURL(), body, nil)
			evs := sessionEvents(t, sink, 1)
			require.Equal(t, tokenevent.KindStart, evs[0].Kind)
			if !tt.streamed {
				assert.Equal(t, body, up.bodies[0], "forwarded as it came")
				assert.True(t, evs[0].NoStream)
				return
			}
			assert.JSONEq(t, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":`+tt.stream+`,"stream_options":{"include_usage":true}}`, up.bodies[0])
			assert.NotContains(t, got, `"choices":[],"usage"`, "the client gets the stream it asked for")
			assert.False(t, evs[0].NoStream)
			assert.Greater(t, len(evs), 3, "a token event per content chunk")
			assert.Equal(t, int64(8), evs[len(evs)-1].CompletionTokens, "usage read from the stripped chunk")
		})
	}
}

// An engine that answers a stream request with one JSON response (200,
// application/json) did not stream it: the session is not streamed, so
// token_session times no first token and no TPOT for it (a TPOT of 0 in the
// histogram, before), and its span says gen_ai.request.stream=false.
func TestProxyJSONAnswerToAStreamRequest(t *testing.T) {
	up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"Paris is the capital."},"finish_reason":"stop"}],"usage":{"prompt_tokens":6,"completion_tokens":5}}`)
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	resp, got := postChat(t, tr.proxyURL(), `{"model":"m","messages":[],"stream":true}`, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, got, `"completion_tokens":5`, "the client gets the answer unchanged")
	evs := sessionEvents(t, sink, 1)
	require.Len(t, evs, 3)
	assert.True(t, evs[0].NoStream, "answered whole")
	assert.Equal(t, int64(5), evs[1].Count, "one token event for the whole response")
	assert.Equal(t, int64(5), evs[2].CompletionTokens)
	assert.Empty(t, evs[2].Error)

	t.Run("an error answer keeps what the request asked", func(t *testing.T) {
		up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"bad","type":"BadRequestError","code":400}}`)
		})
		sink := new(consumertest.LogsSink)
		tr := startTestProxy(t, up.URL, sink)
		_, _ = postChat(t, tr.proxyURL(), `{"model":"m","messages":[],"stream":true}`, nil)
		evs := sessionEvents(t, sink, 1)
		require.Len(t, evs, 2)
		assert.False(t, evs[0].NoStream)
		assert.Equal(t, "400", evs[1].Error)
	})
}

// An engine that streams a request that did not ask for it (an SSE 200)
// streamed it: its tokens are timed.
func TestProxySSEAnswerToARequestWithoutStream(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return time.Millisecond })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	body := `{"model":"m","messages":[]}`
	_, got := postChat(t, tr.proxyURL(), body, nil)
	assert.Equal(t, strings.Join(chat, ""), got, "forwarded as it came")
	assert.Equal(t, body, up.bodies[0], "no usage asked for a request that did not stream")
	evs := sessionEvents(t, sink, 1)
	assert.False(t, evs[0].NoStream, "streamed")
	assert.Greater(t, len(evs), 3, "a token event per content chunk")
}
