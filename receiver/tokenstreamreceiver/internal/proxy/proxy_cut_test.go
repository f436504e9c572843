// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// postStream posts a streaming chat request with client and returns the
// body as far as it came and the error that ended the read (nil: the
// response ended whole, its chunked body's last chunk included).
func postStream(t *testing.T, client *http.Client, url string) (string, error) {
	t.Helper()
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(streamUsage))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got, err := io.ReadAll(resp.Body)
	return string(got), err
}

// cutEvent matches the error event that ends a stream the proxy could not
// relay whole, and nothing after it.
func cutEvent(errType string, code int) *regexp.Regexp {
	return regexp.MustCompile(fmt.Sprintf(`^data: \{"error":\{"message":"[^"]+","type":"%s","code":%d\}\}\n\n$`, errType, code))
}

// closingUpstream answers 200 text/event-stream with head, each a
// flushed HTTP chunk, then writes raw (unframed: a chunk's size line and
// part of its data, say) on the bare connection and closes it.
func closingUpstream(t *testing.T, head []string, raw string) *scriptedUpstream {
	return newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range head {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		_, _ = io.WriteString(conn, raw)
		conn.Close()
	})
}

// A stream the proxy could not relay whole ends, for its client, with an
// error event in OpenAI's shape and no last chunk (the read fails with an
// unexpected EOF), whatever cut it; an event the upstream left unfinished
// is not relayed, so the error event parses as an event of its own. The
// session ends in error, and the cut is counted by reason.
func TestProxyCutStreamEndsWithErrorEvent(t *testing.T) {
	chat, _ := fixtureStreams(t)
	require.Contains(t, chat[len(chat)-1], "[DONE]")
	wholeEvents := strings.Join(chat[:3], "")
	for name, tt := range map[string]struct {
		upstream func(t *testing.T) *scriptedUpstream
		// relayed is what the client gets before the error event.
		relayed, errType, reason string
		code                     int
	}{
		"closed mid-event": {
			upstream: func(t *testing.T) *scriptedUpstream {
				return closingUpstream(t, chat[:3], "")
			},
			relayed: wholeEvents, errType: errStreamBroken, reason: "broken", code: http.StatusBadGateway,
		},
		"closed mid-chunk": {
			upstream: func(t *testing.T) *scriptedUpstream {
				// A chunk holding the fourth event and half the fifth,
				// cut after the fourth.
				return closingUpstream(t, chat[:3], fmt.Sprintf("%x\r\n%s", len(chat[3])+len(chat[4]), chat[3]))
			},
			relayed: wholeEvents + chat[3], errType: errStreamBroken, reason: "broken", code: http.StatusBadGateway,
		},
		"closed mid-chunk, mid-event": {
			upstream: func(t *testing.T) *scriptedUpstream {
				return closingUpstream(t, chat[:3], fmt.Sprintf("%x\r\n%s", len(chat[3]), chat[3][:20]))
			},
			relayed: wholeEvents, errType: errStreamBroken, reason: "broken", code: http.StatusBadGateway,
		},
		"ended without [DONE]": {
			upstream: func(t *testing.T) *scriptedUpstream {
				return newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
					replay(u, w, r, chat[:len(chat)-1], func(int) time.Duration { return 0 })
				})
			},
			relayed: strings.Join(chat[:len(chat)-1], ""), errType: errStreamBroken, reason: "broken", code: http.StatusBadGateway,
		},
		"garbage": {
			upstream: func(t *testing.T) *scriptedUpstream {
				return newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "<html><body>502 Bad Gateway</body></html>\n")
				})
			},
			relayed: "", errType: errStreamMalformed, reason: "malformed", code: http.StatusBadGateway,
		},
		"events that are no chunks": {
			upstream: func(t *testing.T) *scriptedUpstream {
				return newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "data: {not json\n\n: comment\n\n")
				})
			},
			relayed: "data: {not json\n\n: comment\n\n", errType: errStreamMalformed, reason: "malformed", code: http.StatusBadGateway,
		},
	} {
		t.Run(name, func(t *testing.T) {
			up := tt.upstream(t)
			sink := new(consumertest.LogsSink)
			tp := startTestProxy(t, up.URL, sink)
			got, err := postStream(t, http.DefaultClient, tp.proxyURL())
			require.ErrorIs(t, err, io.ErrUnexpectedEOF, "no last chunk: the client's HTTP library raises")
			require.True(t, strings.HasPrefix(got, tt.relayed), "%q", got)
			assert.Regexp(t, cutEvent(tt.errType, tt.code), strings.TrimPrefix(got, tt.relayed))
			end := lastEnd(t, sessionEvents(t, sink, 1))
			assert.Equal(t, tt.errType, end.Error)
			assert.Equal(t, int64(1), reasonCounter(t, tp, "otelcol_receiver_token_stream_proxy_cut_streams", tt.reason))
		})
	}
}

// An event over the parser's bound is relayed in pieces as it comes: cut
// within it, the proxy ends it with a blank line before the error event,
// so that the error event is an event of its own for an SSE client.
func TestProxyCutWithinAnOversizedEvent(t *testing.T) {
	chat, _ := fixtureStreams(t)
	piece := "data: {\"x\":\"" + strings.Repeat("a", 1<<20+100)
	up := closingUpstream(t, chat[:2], fmt.Sprintf("%x\r\n%s\r\n", len(piece), piece))
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, up.URL, sink)
	got, err := postStream(t, http.DefaultClient, tp.proxyURL())
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	relayed := strings.Join(chat[:2], "") + piece + "\n\n"
	require.True(t, strings.HasPrefix(got, relayed), "the event's piece, then a blank line")
	assert.Regexp(t, cutEvent(errStreamBroken, http.StatusBadGateway), got[len(relayed):])
}

// A stream that stays on net/http (TLS on the proxy's endpoint, HTTP/2)
// ends the same way: the error event, then no end of the response (the
// handler aborts it), which the client's HTTP library reports.
func TestProxyCutStreamOnNetHTTP(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := closingUpstream(t, chat[:3], "")
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, up.URL, sink)
	for name, http2 := range map[string]bool{"tls http/1.1": false, "http/2": true} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(tp.p)
			srv.EnableHTTP2 = http2
			srv.StartTLS()
			defer srv.Close()
			got, err := postStream(t, srv.Client(), srv.URL)
			require.Error(t, err, "the response is not ended cleanly")
			if !http2 {
				require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			}
			require.True(t, strings.HasPrefix(got, strings.Join(chat[:3], "")), "%q", got)
			assert.Regexp(t, cutEvent(errStreamBroken, http.StatusBadGateway), strings.TrimPrefix(got, strings.Join(chat[:3], "")))
		})
	}
}

// A non-streaming answer cut short is not ended cleanly either: its
// client's HTTP library reports the truncated body.
func TestProxyCutResponseNotEndedCleanly(t *testing.T) {
	up := newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"The capital`)
		w.(http.Flusher).Flush()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	})
	sink := new(consumertest.LogsSink)
	tp := startTestProxy(t, up.URL, sink)
	resp, err := http.Post(tp.proxyURL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, errStreamBroken, lastEnd(t, sessionEvents(t, sink, 1)).Error)
}

// The official OpenAI JS client (openai on npm, as the e2e tests install
// it: make js-client) iterating a stream the proxy could not relay whole
// raises the proxy's error, instead of returning a truncated answer as a
// whole one; a whole stream still completes.
func TestProxyCutStreamOpenAIJSClient(t *testing.T) {
	node := testbin.Tool(t, "node", "nodejs")
	dir, err := filepath.Abs("../../../../internal/harness/e2e/testdata/openai-js")
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("the OpenAI JS client is not installed: make js-client")
		}
		t.Skip("the OpenAI JS client is not installed: make js-client (npm ci in internal/harness/e2e/testdata/openai-js)")
	}
	chat, _ := fixtureStreams(t)
	type outcome struct {
		Outcome string `json:"outcome"`
		Error   string `json:"error"`
		Type    string `json:"type"`
		Text    string `json:"text"`
	}
	hang := func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat[:4], func(int) time.Duration { return 0 })
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}
	for name, tt := range map[string]struct {
		upstream func(t *testing.T) *scriptedUpstream
		opt      func(*Config)
		want     outcome
	}{
		"whole": {
			upstream: func(t *testing.T) *scriptedUpstream {
				return newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
					replay(u, w, r, chat, func(int) time.Duration { return 0 })
				})
			},
			want: outcome{Outcome: "completed", Text: "The capital of France is Paris."},
		},
		"closed mid-event": {
			upstream: func(t *testing.T) *scriptedUpstream {
				return closingUpstream(t, chat[:4], fmt.Sprintf("%x\r\n%s", len(chat[4]), chat[4][:30]))
			},
			want: outcome{Outcome: "threw", Error: "APIError", Type: errStreamBroken, Text: "The capital of"},
		},
		"ended without [DONE]": {
			upstream: func(t *testing.T) *scriptedUpstream {
				return newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
					replay(u, w, r, chat[:4], func(int) time.Duration { return 0 })
				})
			},
			want: outcome{Outcome: "threw", Error: "APIError", Type: errStreamBroken, Text: "The capital of"},
		},
		"idle timeout": {
			upstream: func(t *testing.T) *scriptedUpstream { return newScriptedUpstream(t, hang) },
			opt:      func(c *Config) { c.StreamIdleTimeout = 100 * time.Millisecond },
			want:     outcome{Outcome: "threw", Error: "APIError", Type: errUpstreamIdleTimeout, Text: "The capital of"},
		},
		"garbage": {
			upstream: func(t *testing.T) *scriptedUpstream {
				return newScriptedUpstream(t, func(_ *scriptedUpstream, w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "<html><body>502 Bad Gateway</body></html>\n")
				})
			},
			want: outcome{Outcome: "threw", Error: "APIError", Type: errStreamMalformed},
		},
	} {
		t.Run(name, func(t *testing.T) {
			opts := []func(*Config){}
			if tt.opt != nil {
				opts = append(opts, tt.opt)
			}
			tp := startTestProxy(t, tt.upstream(t).URL, new(consumertest.LogsSink), opts...)
			cmd := exec.Command(node, "stream.mjs")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "BASE_URL="+tp.proxyURL()+"/v1")
			out, err := cmd.Output()
			require.NoError(t, err, "node stream.mjs: %s", out)
			var got outcome
			require.NoError(t, json.Unmarshal(out, &got), "%s", out)
			assert.Equal(t, tt.want, got)
		})
	}
}
