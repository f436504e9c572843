// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// breakerMaxGap is proxy::stall::max_gap in testdata/breaker.yaml.
const breakerMaxGap = 300 * time.Millisecond

// freezeHeader asks the test's upstream to freeze after the first tokens.
const freezeHeader = "X-Test-Freeze"

// freezingEngine serves the chat fixture; a request with freezeHeader gets
// the role chunk and three tokens, then nothing until it is cancelled (or
// 30 s). It counts the requests cancelled while frozen.
type freezingEngine struct {
	*httptest.Server
	mu        sync.Mutex
	cancelled int
}

func startFreezingEngine(t *testing.T, events []string) *freezingEngine {
	e := &freezingEngine{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		if r.Header.Get(freezeHeader) == "" {
			for _, ev := range events {
				_, _ = io.WriteString(w, ev)
				w.(http.Flusher).Flush()
			}
			return
		}
		for _, ev := range events[:4] {
			_, _ = io.WriteString(w, ev)
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			e.mu.Lock()
			e.cancelled++
			e.mu.Unlock()
		case <-time.After(30 * time.Second):
		}
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *freezingEngine) cancelCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cancelled
}

// openAIJSClient returns node and the folder of the official OpenAI JS
// client's script (testdata/openai-js/stream.mjs). make go-test installs
// the client (make js-client: npm ci); without it the test skips, or fails
// under CI.
func openAIJSClient(t *testing.T) (node, dir string) {
	node = testbin.Tool(t, "node", "nodejs")
	dir, err := filepath.Abs(filepath.Join("testdata", "openai-js"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("the OpenAI JS client is not installed: make js-client")
		}
		t.Skip("the OpenAI JS client is not installed: make js-client (npm ci in testdata/openai-js)")
	}
	return node, dir
}

// openAIJS returns the command that streams one chat completion with the
// official OpenAI JS client (see openAIJSClient).
func openAIJS(t *testing.T) func(baseURL string, freeze bool) jsOutcome {
	node, dir := openAIJSClient(t)
	return func(baseURL string, freeze bool) jsOutcome {
		t.Helper()
		cmd := exec.Command(node, "stream.mjs")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "BASE_URL="+baseURL)
		if freeze {
			cmd.Env = append(cmd.Env, "FREEZE=1")
		}
		out, err := cmd.Output()
		require.NoError(t, err, "node stream.mjs: %s", out)
		var o jsOutcome
		require.NoError(t, json.Unmarshal(out, &o), "%s", out)
		return o
	}
}

// jsOutcome is what stream.mjs prints.
type jsOutcome struct {
	Outcome string `json:"outcome"`
	Error   string `json:"error"`
	Type    string `json:"type"`
	Text    string `json:"text"`
	IDs     int    `json:"ids"`
}

// TestStallBreakerEndToEnd: the collector's proxy, its stall breaker on,
// in front of an engine that freezes mid-stream. The client gets the tokens
// that came and an engine_stalled error event, then no [DONE] and no end of
// the response; the engine sees its request cancelled; the OpenAI JS client
// raises the error instead of returning a truncated answer; token_session
// ends the sessions in error with error.type engine_stalled, and
// engine_health counts them as the engine's faults.
func TestStallBreakerEndToEnd(t *testing.T) {
	events := chatFixture(t)
	engine := startFreezingEngine(t, events)
	s, sinkAddr := startSink(t)
	healthAddr := freePort(t, "tcp")
	col := startCollector(t, "breaker.yaml", sinkAddr, "UPSTREAM_URL="+engine.URL, "HEALTH_ENDPOINT="+healthAddr)
	proxyURL := "http://" + col.proxyAddr

	// A plain HTTP client sees the stream as it went on the wire.
	req, err := http.NewRequest(http.MethodPost, proxyURL+"/v1/chat/completions",
		strings.NewReader(`{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`))
	require.NoError(t, err)
	req.Header.Set(freezeHeader, "1")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "the response does not end: the stream is not whole")
	// A sanity bound only: the engine would hold the stream for 30 s.
	assert.Less(t, time.Since(t0), breakerMaxGap+2*time.Second)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, strings.HasPrefix(string(got), strings.Join(events[:4], "")), "%s", got)
	rest := strings.TrimPrefix(string(got), strings.Join(events[:4], ""))
	assert.Regexp(t, `^data: \{"error":\{"message":"[^"]*","type":"engine_stalled","code":504\}\}\n\n$`, rest)
	require.Eventually(t, func() bool { return engine.cancelCount() == 1 }, 10*time.Second, 10*time.Millisecond,
		"the engine sees its request cancelled")

	// The official OpenAI JS client raises the error; on a whole stream it
	// returns the whole answer.
	stalled, completed := 1, 0
	t.Run("openai-js", func(t *testing.T) {
		run := openAIJS(t)
		o := run(proxyURL+"/v1", true)
		stalled++
		assert.Equal(t, jsOutcome{Outcome: "threw", Error: "APIError", Type: "engine_stalled", Text: "The capital of", IDs: 1}, o)
		o = run(proxyURL+"/v1", false)
		completed++
		assert.Equal(t, jsOutcome{Outcome: "completed", Text: "The capital of France is Paris.", IDs: 1}, o)
		require.Eventually(t, func() bool { return engine.cancelCount() == 2 }, 10*time.Second, 10*time.Millisecond)
	})

	// token_session: the sessions the breaker cut end in error, the others
	// complete.
	require.Eventually(t, func() bool { return len(recordNamed(s, "llm.session.summary")) == stalled+completed },
		30*time.Second, 10*time.Millisecond)
	ends := map[string]int{}
	for _, lr := range recordNamed(s, "llm.session.summary") {
		attrs := lr.Attributes().AsRaw()
		et, _ := attrs["error.type"].(string)
		ends[attrs["llm.session.outcome"].(string)+"/"+et]++
	}
	want := map[string]int{"error/engine_stalled": stalled}
	if completed > 0 {
		want["completed/"] = completed
	}
	assert.Equal(t, want, ends)

	// engine_health: the cut sessions are the engine's faults.
	engineName := strings.TrimPrefix(engine.URL, "http://")
	var window struct {
		Sessions   float64 `json:"sessions"`
		ErrorRatio float64 `json:"error_ratio"`
	}
	require.Eventually(t, func() bool {
		r, err := http.Get("http://" + healthAddr + "/engines/" + engineName + "/health")
		if err != nil {
			return false
		}
		defer r.Body.Close()
		var st struct {
			Window json.RawMessage `json:"window"`
		}
		if json.NewDecoder(r.Body).Decode(&st) != nil || json.Unmarshal(st.Window, &window) != nil {
			return false
		}
		return window.Sessions == float64(stalled+completed)
	}, 30*time.Second, 50*time.Millisecond, "engine_health sees every session")
	assert.InDelta(t, float64(stalled)/float64(stalled+completed), window.ErrorRatio, 1e-9)
}
