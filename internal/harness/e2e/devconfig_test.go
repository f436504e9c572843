// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// startDevCollector runs otelcol-dev.yaml, the config of `make run`, as it
// is but for its listeners: every one moves to a free loopback port (with
// --set, so the file stays what a newcomer reads), and the engine is
// engineURL.
func startDevCollector(t *testing.T, engineURL string) *collector {
	t.Helper()
	c := newCollector(t)
	c.liveAddr = freePort(t, "tcp")
	set := []string{
		"receivers::token_stream::hooks::http::endpoint=" + c.httpAddr,
		"receivers::token_stream::hooks::udp::endpoint=" + c.udpAddr,
		"receivers::token_stream::proxy::endpoint=" + c.proxyAddr,
		"receivers::token_stream::proxy::upstream::endpoint=" + engineURL,
		"receivers::token_stream::vllm::targets=[" + engineURL + "/metrics]",
		"receivers::otlp::protocols::grpc::endpoint=" + c.otlpAddr,
		"receivers::otlp::protocols::http::endpoint=" + freePort(t, "tcp"),
		"extensions::health_check::endpoint=" + freePort(t, "tcp"),
		"processors::token_session::live::endpoint=" + c.liveAddr,
		// The collector's own metrics listen on :8888 by default.
		"service::telemetry::metrics::level=none",
	}
	args := []string{"--config", filepath.Join("..", "..", "..", "otelcol-dev.yaml")}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	c.Process = testbin.StartCollector(t, args, nil)
	return c
}

// debugBlocks returns the debug exporter's printed items that begin with
// header (e.g. "LogRecord #", "Span #", "Metric #") and contain every
// pattern. An item ends at the next item or at the end of its batch (the
// log entry's fields, on a line that starts with a tab).
func debugBlocks(out, header string, patterns ...string) []string {
	var found []string
	parts := strings.Split(out, header)
	for _, p := range parts[1:] {
		p, _, _ = strings.Cut(p, "\n\t{")
		ok := true
		for _, pat := range patterns {
			if !regexp.MustCompile(pat).MatchString(p) {
				ok = false
				break
			}
		}
		if ok {
			found = append(found, p)
		}
	}
	return found
}

// TestDevConfig is a newcomer's first `make run`: a normal session, with
// nothing slow about it, sent to the HTTP hook, and a normal chat request
// through the proxy, each show on the terminal as a span and a summary, and
// the session metrics follow in full. With the production-shaped config
// both would be 99 in 100 times unsampled.
func TestDevConfig(t *testing.T) {
	events := chatFixture(t)
	var scrapes atomic.Int32
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = io.WriteString(w, engineExposition)
			scrapes.Add(1)
			return
		}
		streamEvents(events, nil)(w, r)
	}))
	defer engine.Close()
	col := startDevCollector(t, engine.URL)
	// The scraper asks again only once the previous page went down the
	// pipeline: after two scrapes token_session knows the engine's state.
	require.Eventually(t, func() bool { return scrapes.Load() >= 2 }, 30*time.Second, 20*time.Millisecond, "the engine was not scraped")

	// Hooked: tokens 20 ms apart, TTFT 100 ms.
	const hookTrace = "5b8efff798038103d269b633813fc60c"
	base := time.Now().UnixNano()
	lines := []string{fmt.Sprintf(`{"event":"start","session_id":"dev-hook-1","time_unix_nano":%d,"trace_id":%q,"model":"llama-3.1-8b","operation":"chat","prompt_tokens":12}`, base, hookTrace)}
	for i := range 4 {
		lines = append(lines, fmt.Sprintf(`{"event":"token","session_id":"dev-hook-1","time_unix_nano":%d}`, base+int64(100+20*i)*int64(time.Millisecond)))
	}
	lines = append(lines, fmt.Sprintf(`{"event":"end","session_id":"dev-hook-1","time_unix_nano":%d,"completion_tokens":4,"finish_reason":"stop"}`, base+161*int64(time.Millisecond)))
	postLines(t, "http://"+col.httpAddr+"/v1/token-events", lines...)

	// Proxied: the upstream answers at once.
	const proxyTrace = "0af7651916cd43dd8448eb211c80319c"
	body := `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"What is the capital of France?"}],"stream":true}`
	req, err := http.NewRequest(http.MethodPost, "http://"+col.proxyAddr+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("traceparent", "00-"+proxyTrace+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	for _, trace := range []string{hookTrace, proxyTrace} {
		require.Eventually(t, func() bool {
			return len(debugBlocks(col.Output.String(), "LogRecord #", `EventName: llm.session.summary`, `Trace ID: `+trace)) > 0
		}, 30*time.Second, 20*time.Millisecond, "no session summary for trace %s on the debug output:\n%s", trace, col.Output)
		summary := debugBlocks(col.Output.String(), "LogRecord #", `EventName: llm.session.summary`, `Trace ID: `+trace)[0]
		assert.Contains(t, summary, "-> llm.session.sampling.reason: Str(probabilistic)", "a normal session, kept by normal_percent: 100")
		assert.Contains(t, summary, "-> llm.session.outcome: Str(completed)")
		// The span goes down the traces pipeline, after the summary went
		// down the logs pipeline: it may print a moment later.
		var spans []string
		require.Eventually(t, func() bool {
			spans = debugBlocks(col.Output.String(), "Span #", `Trace ID\s+: `+trace, `Name\s+: chat `)
			return len(spans) > 0
		}, 30*time.Second, 20*time.Millisecond, "no session span for trace %s on the debug output:\n%s", trace, col.Output)
		require.Len(t, spans, 1, "the session's span, once")
		assert.Contains(t, spans[0], "-> vllm.kv_cache_usage.start: Double(0.42)", "engine context, from the metrics the filter then drops")
	}
	assert.Contains(t, debugBlocks(col.Output.String(), "LogRecord #", `Trace ID: `+hookTrace)[0], "-> llm.session.id: Str(dev-hook-1)")

	// The live view of `make run` (http://localhost:8002/) lists both
	// sessions among the ended ones.
	live, err := http.Get("http://" + col.liveAddr + "/sessions") //nolint:gosec // the test's own collector
	require.NoError(t, err)
	var snap struct {
		Recent []struct {
			ID string `json:"id"`
		} `json:"recent"`
	}
	require.NoError(t, json.NewDecoder(live.Body).Decode(&snap))
	live.Body.Close()
	require.Len(t, snap.Recent, 2)
	assert.Contains(t, []string{snap.Recent[0].ID, snap.Recent[1].ID}, "dev-hook-1")

	// Session metrics every 5 s, each point printed.
	require.Eventually(t, func() bool {
		return len(debugBlocks(col.Output.String(), "Metric #", `Name: llm\.sessions\n`, `llm\.session\.outcome: Str\(completed\)`)) > 0
	}, 30*time.Second, 50*time.Millisecond, "no llm.sessions on the debug output:\n%s", col.Output)
	assert.Empty(t, debugBlocks(col.Output.String(), "Metric #", `Name: vllm:`), "the engine's own metrics stop at the filter, after token_session")
}
