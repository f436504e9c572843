// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProxyDrainKeepsSessions: a stream running when the collector is
// stopped finishes during the proxy's drain, and token_session makes a
// completed session of it: summary, span and llm.sessions. The service shuts
// its pipelines down in an order of its own (random between pipelines), so
// the collector is stopped several times.
func TestProxyDrainKeepsSessions(t *testing.T) {
	events := chatFixture(t)
	upstream := httptest.NewServer(streamEvents(events, func(i int) time.Duration {
		if i > 0 {
			return 150 * time.Millisecond
		}
		return 0
	}))
	defer upstream.Close()
	const restarts = 6
	for i := range restarts {
		s, sinkAddr := startSink(t)
		col := startCollector(t, "drain.yaml", sinkAddr, "UPSTREAM_URL="+upstream.URL)
		body := `{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`
		resp, err := http.Post("http://"+col.proxyAddr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		rd := bufio.NewReader(resp.Body)
		first, err := rd.ReadString('\n')
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(first, "data: "), first)
		stopped := make(chan struct{})
		go func() { defer close(stopped); col.Stop() }()
		rest, err := io.ReadAll(rd)
		resp.Body.Close()
		require.NoError(t, err)
		assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"), "the stream finished during the drain")
		<-stopped

		// The collector has exited: what it sent is in the sink.
		sums := recordNamed(s, "llm.session.summary")
		require.Len(t, sums, 1, "stop %d: one summary", i)
		assert.Equal(t, "completed", sums[0].Attributes().AsRaw()["llm.session.outcome"], "stop %d", i)
		assert.Len(t, s.Spans(), 1, "stop %d: the session's span", i)
		m, ok := s.Metric("llm.sessions")
		require.True(t, ok, "stop %d: llm.sessions was sent", i)
		byOutcome := map[string]int64{}
		for _, dp := range m.Sum().DataPoints().All() {
			outcome, _ := dp.Attributes().Get("llm.session.outcome")
			byOutcome[outcome.Str()] += dp.IntValue()
		}
		assert.Equal(t, map[string]int64{"completed": 1}, byOutcome, "stop %d", i)
	}
}
