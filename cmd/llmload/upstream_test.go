// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// script describes how the fake upstream answers request number n (0-based).
type script struct {
	firstDelay time.Duration // role chunk at once, first content chunk after this
	gap        time.Duration // between content chunks
	chunks     int           // content chunks (the last one carries finish_reason)
	usageDelay time.Duration // extra delay before the usage chunk
	usage      int           // completion_tokens in the usage chunk; 0 = no usage chunk
	completion bool          // legacy completions shape (no role chunk)
	// failure mode by request number: "" ok, "500", "broken" (connection cut
	// mid-stream), "nodone" (clean end without [DONE]), "errorevent",
	// "stalled" (the collector proxy's stall breaker: an engine_stalled
	// error event after the first chunk, then [DONE])
	fail func(n int64) string
}

type upstream struct {
	*httptest.Server
	sc          script
	requests    atomic.Int64
	inflight    atomic.Int64
	maxInflight atomic.Int64
	mu          sync.Mutex
	bodies      []map[string]any
	traceparent []string // the traceparent header of each request, in arrival order
}

// newUpstream starts a scripted SSE server that the test's Cleanup stops.
func newUpstream(t *testing.T, sc script) *upstream {
	t.Helper()
	u := &upstream{sc: sc}
	u.Server = httptest.NewServer(http.HandlerFunc(u.handle))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) handle(w http.ResponseWriter, r *http.Request) {
	n := u.requests.Add(1) - 1
	cur := u.inflight.Add(1)
	// Leave the in-flight count just before the last bytes go out: the
	// client may start its next request as soon as it reads [DONE], before
	// this handler has returned.
	var left atomic.Bool
	leave := func() {
		if left.CompareAndSwap(false, true) {
			u.inflight.Add(-1)
		}
	}
	defer leave()
	for {
		m := u.maxInflight.Load()
		if cur <= m || u.maxInflight.CompareAndSwap(m, cur) {
			break
		}
	}
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	u.mu.Lock()
	if len(u.bodies) < 64 {
		u.bodies = append(u.bodies, body)
	}
	u.traceparent = append(u.traceparent, r.Header.Get("traceparent"))
	u.mu.Unlock()

	mode := ""
	if u.sc.fail != nil {
		mode = u.sc.fail(n)
	}
	if mode == "500" {
		leave()
		http.Error(w, `{"error":"boom"}`, http.StatusInternalServerError)
		return
	}
	start := time.Now()
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	send := func(s string) {
		fmt.Fprintf(w, "data: %s\n\n", s)
		fl.Flush()
	}
	sleepUntil := func(at time.Time) bool {
		d := time.Until(at)
		if d <= 0 {
			return r.Context().Err() == nil
		}
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	if !u.sc.completion {
		send(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`)
	}
	fmt.Fprint(w, ": keep-alive comment\n\n")
	fl.Flush()
	var last time.Time
	for i := 0; i < u.sc.chunks; i++ {
		last = start.Add(u.sc.firstDelay + time.Duration(i)*u.sc.gap)
		if !sleepUntil(last) {
			return
		}
		fin := "null"
		if i == u.sc.chunks-1 {
			fin = `"length"`
		}
		if u.sc.completion {
			send(fmt.Sprintf(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" w%d","logprobs":null,"finish_reason":%s,"stop_reason":null}],"usage":null}`, i, fin))
		} else {
			send(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" w%d"},"logprobs":null,"finish_reason":%s}]}`, i, fin))
		}
		if i == 0 {
			switch mode {
			case "broken":
				hj, ok := w.(http.Hijacker)
				if !ok {
					panic("no hijacker")
				}
				conn, _, err := hj.Hijack()
				leave()
				if err == nil {
					conn.Close()
				}
				return
			case "nodone":
				leave()
				return
			case "errorevent":
				leave()
				send(`{"error":{"object":"error","message":"engine died","type":"InternalServerError","code":500}}`)
				return
			case "stalled":
				leave()
				send(`{"error":{"message":"the engine sent no token for 2s","type":"engine_stalled","code":504}}`)
				send("[DONE]")
				return
			}
		}
	}
	if u.sc.usage > 0 {
		if !sleepUntil(last.Add(u.sc.usageDelay)) {
			return
		}
		send(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"total_tokens":%d,"completion_tokens":%d}}`, 7+u.sc.usage, u.sc.usage))
	}
	leave()
	send("[DONE]")
}

func (u *upstream) firstBody(t *testing.T) map[string]any {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		t.Fatal("upstream saw no request")
	}
	return u.bodies[0]
}

// baseConfig returns a valid config for u.
func baseConfig(u *upstream) Config {
	return Config{
		URL:          u.URL,
		Endpoint:     EndpointChat,
		Model:        "test-model",
		Concurrency:  1,
		Requests:     1,
		PromptTokens: Dist{Kind: "fixed", N: 16},
		OutputTokens: Dist{Kind: "fixed", N: 8},
		IgnoreEOS:    true,
		Timeout:      10 * time.Second,
	}
}

func wordCount(s string) int { return len(strings.Fields(s)) }
