// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// startVLLMSim runs the simulator on addr with args, until the test ends.
func startVLLMSim(t *testing.T, addr string, args ...string) {
	t.Helper()
	out := testbin.StartProcess(t, testbin.Build(t, "./cmd/vllmsim"), append([]string{"-addr", addr}, args...)...)
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "vllmsim did not listen\n%s", out)
}

// quantile is the q-quantile of xs (nearest rank).
func quantile(xs []float64, q float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// TestEngineTimingEndToEnd: vllmsim behind the collector's proxy sends its
// llm_request spans (its true queue, prefill and decode times) to the
// collector's otlp receiver a second after each request, as vLLM's batch
// exporter does. Every session comes out with the engine's split joined to
// it: per session exactly the engine's figures, and so queue and prefill
// p50/p99 within 2% or 2 ms of the simulator's truth.
func TestEngineTimingEndToEnd(t *testing.T) {
	s, sinkAddr := startSink(t)
	otlpHTTP, simAddr := freePort(t, "tcp"), freePort(t, "tcp")
	col := startCollector(t, "timing.yaml", sinkAddr, "UPSTREAM_URL=http://"+simAddr, "OTLP_HTTP_ENDPOINT="+otlpHTTP)
	// Four sequences at a time and slow steps: most requests queue.
	startVLLMSim(t, simAddr, "-model", "sim", "-max-num-seqs", "4", "-decode-base", "4ms", "-prefill-per-token", "20us",
		"-otlp-traces-endpoint", "http://"+otlpHTTP+"/v1/traces", "-otlp-traces-delay", "1s")

	post := func(body string) {
		resp, err := http.Post("http://"+col.proxyAddr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if assert.NoError(t, err) {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	// Sessions wait for their engine span once engine spans are seen to
	// flow: a first request's span shows them.
	post(`{"model":"sim","messages":[{"role":"user","content":"warm up"}],"max_tokens":2,"stream":true}`)
	require.Eventually(t, func() bool {
		for _, span := range s.Spans() {
			if span.Name() == "llm_request" {
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "the first engine span")

	const requests, concurrency = 40, 10
	var wg sync.WaitGroup
	work := make(chan int)
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				post(fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"stream":true}`,
					strings.Repeat("word ", 50+i*7), 8+i%5))
			}
		}()
	}
	for i := range requests {
		work <- i
	}
	close(work)
	wg.Wait()

	type split struct{ queue, prefill float64 }
	sessions := func() (joined map[string]split, engine map[string]split) {
		joined, engine = map[string]split{}, map[string]split{}
		for _, span := range s.Spans() {
			a := span.Attributes().AsRaw()
			switch {
			case span.Name() == "llm_request" && !span.ParentSpanID().IsEmpty() && a["gen_ai.usage.completion_tokens"] != int64(2):
				engine[span.ParentSpanID().String()] = split{a["gen_ai.latency.time_in_queue"].(float64), a["gen_ai.latency.time_in_model_prefill"].(float64)}
			case a["llm.session.timing_source"] == "engine_span" && a["llm.session.id"] != nil: // a session span, not a phase
				joined[span.SpanID().String()] = split{a["llm.session.queue_time"].(float64), a["llm.session.prefill_time"].(float64)}
			}
		}
		return joined, engine
	}
	if !assert.Eventually(t, func() bool {
		joined, engine := sessions()
		return len(joined) == requests && len(engine) == requests
	}, 60*time.Second, 50*time.Millisecond, "every session joined to its engine span") {
		joined, engine := sessions()
		sources := map[any]int{}
		for _, span := range s.Spans() {
			sources[span.Attributes().AsRaw()["llm.session.timing_source"]]++
		}
		t.Fatalf("%d spans, %d joined, %d engine spans, timing sources %v\n%s", len(s.Spans()), len(joined), len(engine), sources, col.Output)
	}

	joined, engine := sessions()
	var q, p, trueQ, trueP []float64
	for id, got := range joined {
		want, ok := engine[id]
		require.True(t, ok, "session %s has an engine span", id)
		assert.InDelta(t, want.queue, got.queue, 1e-6, "session %s: the engine's queue time", id)
		assert.InDelta(t, want.prefill, got.prefill, 1e-6, "session %s: the engine's prefill time", id)
		q, p, trueQ, trueP = append(q, got.queue), append(p, got.prefill), append(trueQ, want.queue), append(trueP, want.prefill)
	}
	assert.Greater(t, quantile(trueQ, 0.99), 0.01, "the load queued requests")
	for _, c := range []struct {
		name      string
		got, want []float64
	}{{"queue", q, trueQ}, {"prefill", p, trueP}} {
		for _, qq := range []float64{0.5, 0.99} {
			g, w := quantile(c.got, qq), quantile(c.want, qq)
			assert.InDelta(t, w, g, max(0.02*w, 0.002), "%s p%v: collector %.4f s, simulator %.4f s", c.name, qq*100, g, w)
			t.Logf("%s p%v: collector %.4f s, simulator %.4f s", c.name, qq*100, g, w)
		}
	}
}
