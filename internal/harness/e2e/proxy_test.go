// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chatFixture is the vLLM chat stream of the project's copy of
// shared/fixtures/vllm/sse-streams.txt, one string per event.
func chatFixture(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "..", "testdata", "fixtures", "vllm", "sse-streams.txt"))
	require.NoError(t, err)
	defer f.Close()
	var events []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "data: ") {
			events = append(events, line+"\n\n")
			if line == "data: [DONE]" {
				break
			}
		}
	}
	require.NotEmpty(t, events)
	return events
}

// streamEvents answers a completions request with events as an SSE
// stream, waiting pause(i) before event i (nil: no pauses).
func streamEvents(events []string, pause func(i int) time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		for i, ev := range events {
			if pause != nil {
				time.Sleep(pause(i))
			}
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}
}

// TestProxyEndToEnd: a client streams a chat completion through the
// collector's proxy from an upstream that is slow to the first token. The
// client gets the upstream's stream byte for byte; token_session makes a
// session of it and, the TTFT being slow, sends its span.
func TestProxyEndToEnd(t *testing.T) {
	events := chatFixture(t)
	upstream := httptest.NewServer(streamEvents(events, func(i int) time.Duration {
		if i == 1 {
			return 600 * time.Millisecond // prefill
		}
		return 0
	}))
	defer upstream.Close()
	s, sinkAddr := startSink(t)
	col := startCollector(t, "proxy.yaml", sinkAddr, "UPSTREAM_URL="+upstream.URL)

	body := `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"What is the capital of France?"}],"stream":true,"stream_options":{"include_usage":true}}`
	req, err := http.NewRequest(http.MethodPost, "http://"+col.proxyAddr+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, strings.Join(events, ""), string(got))

	require.Eventually(t, func() bool { return len(s.Spans()) == 1 }, 30*time.Second, 10*time.Millisecond)
	span := s.Spans()[0]
	assert.Equal(t, "chat meta-llama/Llama-3.1-8B-Instruct", span.Name())
	assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", span.TraceID().String())
	assert.Equal(t, "b7ad6b7169203331", span.ParentSpanID().String())
	attrs := span.Attributes().AsRaw()
	assert.InDelta(t, 0.6, attrs["llm.session.ttft"], 0.1)
	assert.Equal(t, int64(8), attrs["gen_ai.usage.output_tokens"])
	assert.Equal(t, "ttft", attrs["llm.session.sampling.reason"])
	assert.Equal(t, strings.TrimPrefix(upstream.URL, "http://"), attrs["llm.engine"])
}
