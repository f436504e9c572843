// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// TestPhaseSpansEndToEnd: vllmsim behind the collector's proxy sends its
// llm_request spans a second after each request, and nothing else of its
// timing (no per-request metrics on the final chunk). With
// engine_timing::expect_spans the very first sessions wait for their
// engine span (no warm-up request shows spans flowing first), and every
// kept session comes with three phase spans under its session span: queue
// and prefill exactly as long as the engine's own figures, the prefill
// ending at the session's first token, the decode starting there.
func TestPhaseSpansEndToEnd(t *testing.T) {
	s, sinkAddr := startSink(t)
	otlpHTTP, simAddr := freePort(t, "tcp"), freePort(t, "tcp")
	col := startCollector(t, "phases.yaml", sinkAddr, "UPSTREAM_URL=http://"+simAddr, "OTLP_HTTP_ENDPOINT="+otlpHTTP)
	// One sequence at a time and slow steps: the later requests queue.
	startVLLMSim(t, simAddr, "-model", "sim", "-max-num-seqs", "1", "-decode-base", "4ms", "-prefill-per-token", "20us",
		"-otlp-traces-endpoint", "http://"+otlpHTTP+"/v1/traces", "-otlp-traces-delay", "1s")

	const requests = 3
	done := make(chan struct{}, requests)
	for range requests {
		go func() {
			defer func() { done <- struct{}{} }()
			resp, err := http.Post("http://"+col.proxyAddr+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"sim","messages":[{"role":"user","content":"`+strings.Repeat("word ", 200)+`"}],"max_tokens":6,"stream":true}`))
			if assert.NoError(t, err) {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for range requests {
		<-done
	}

	type tree struct {
		session ptrace.Span
		engine  *ptrace.Span
		phases  map[string]ptrace.Span
	}
	trees := func() map[string]*tree {
		out := map[string]*tree{}
		at := func(id string) *tree {
			if out[id] == nil {
				out[id] = &tree{phases: map[string]ptrace.Span{}}
			}
			return out[id]
		}
		for _, span := range s.Spans() {
			switch span.Name() {
			case "llm_request":
				at(span.ParentSpanID().String()).engine = &span
			case "llm.session.queue", "llm.session.prefill", "llm.session.decode", "llm.session.time_to_first_token":
				at(span.ParentSpanID().String()).phases[span.Name()] = span
			default:
				if _, ok := span.Attributes().Get("llm.session.id"); ok {
					at(span.SpanID().String()).session = span
				}
			}
		}
		return out
	}
	complete := func() bool {
		n := 0
		for _, tr := range trees() {
			if tr.engine != nil && len(tr.phases) == 3 && tr.session.Name() != "" {
				n++
			}
		}
		return n == requests
	}
	if !assert.Eventually(t, complete, 60*time.Second, 50*time.Millisecond, "every session with its engine span and three phases") {
		t.Fatalf("%d spans\n%s", len(s.Spans()), col.Output)
	}

	seconds := func(d time.Duration) float64 { return d.Seconds() }
	for id, tr := range trees() {
		a := tr.session.Attributes().AsRaw()
		assert.Equal(t, "engine_span", a["llm.session.timing_source"], "session span %s: joined, the first ones too", id)
		e := tr.engine.Attributes().AsRaw()
		queue, prefill, decode := tr.phases["llm.session.queue"], tr.phases["llm.session.prefill"], tr.phases["llm.session.decode"]
		for name, ph := range tr.phases {
			assert.Equal(t, tr.session.TraceID(), ph.TraceID(), name)
			assert.Equal(t, "engine_span", ph.Attributes().AsRaw()["llm.session.timing_source"], name)
			assert.False(t, ph.StartTimestamp() < tr.session.StartTimestamp() || ph.EndTimestamp() > tr.session.EndTimestamp(),
				"%s within the session span", name)
		}
		dur := func(sp ptrace.Span) time.Duration {
			return sp.EndTimestamp().AsTime().Sub(sp.StartTimestamp().AsTime())
		}
		assert.InDelta(t, e["gen_ai.latency.time_in_queue"], seconds(dur(queue)), 1e-6, "queue span of %s", id)
		assert.InDelta(t, e["gen_ai.latency.time_in_model_prefill"], seconds(dur(prefill)), 1e-6, "prefill span of %s", id)
		assert.Equal(t, queue.EndTimestamp(), prefill.StartTimestamp())
		assert.Equal(t, prefill.EndTimestamp(), decode.StartTimestamp())
		firstToken := tr.session.Events().At(0)
		require.Equal(t, "llm.first_token", firstToken.Name())
		assert.Equal(t, firstToken.Timestamp(), prefill.EndTimestamp(), "the prefill ends at the first token")
	}
	// One sequence at a time: a later request queued behind the first.
	var maxQueue float64
	for _, tr := range trees() {
		maxQueue = max(maxQueue, tr.engine.Attributes().AsRaw()["gen_ai.latency.time_in_queue"].(float64))
	}
	assert.Greater(t, maxQueue, 0.01, "a request queued")
}
