// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestPercentileMatchesNumpyLinear(t *testing.T) {
	// Values and expectations computed by hand with numpy's default
	// ("linear") rule: index = (n-1)*p/100, interpolate between neighbors.
	//
	// x = [1, 2, 3, 4] (n=4):
	//   p50: idx 1.5  -> 2 + 0.5*1          = 2.5
	//   p95: idx 2.85 -> 3 + 0.85*1         = 3.85
	//   p99: idx 2.97 -> 3 + 0.97*1         = 3.97
	//   np.percentile([1,2,3,4], [50,95,99]) -> [2.5, 3.85, 3.97]
	x := []float64{1, 2, 3, 4}
	assert.InDelta(t, 2.5, Percentile(x, 50), 1e-12)
	assert.InDelta(t, 3.85, Percentile(x, 95), 1e-12)
	assert.InDelta(t, 3.97, Percentile(x, 99), 1e-12)

	// x = [15, 20, 35, 40, 50] (n=5):
	//   p40: idx 1.6  -> 20 + 0.6*15  = 29
	//   p50: idx 2    -> 35
	//   p95: idx 3.8  -> 40 + 0.8*10  = 48
	//   p99: idx 3.96 -> 40 + 0.96*10 = 49.6
	y := []float64{15, 20, 35, 40, 50}
	assert.InDelta(t, 29, Percentile(y, 40), 1e-12)
	assert.InDelta(t, 35, Percentile(y, 50), 1e-12)
	assert.InDelta(t, 48, Percentile(y, 95), 1e-12)
	assert.InDelta(t, 49.6, Percentile(y, 99), 1e-12)

	// Ten latencies (ms), given unsorted; sorted:
	//   [10, 12, 13, 15, 18, 21, 25, 30, 45, 100] (n=10)
	//   mean = 289/10 = 28.9
	//   p50: idx 4.5  -> 18 + 0.5*3   = 19.5
	//   p95: idx 8.55 -> 45 + 0.55*55 = 75.25
	//   p99: idx 8.91 -> 45 + 0.91*55 = 95.05
	z := []float64{25, 10, 100, 13, 45, 12, 30, 18, 21, 15}
	s := Summarize(z)
	require.NotNil(t, s)
	assert.Equal(t, 10, s.Count)
	assert.InDelta(t, 28.9, s.Mean, 1e-9)
	assert.InDelta(t, 19.5, s.P50, 1e-9)
	assert.InDelta(t, 75.25, s.P95, 1e-9)
	assert.InDelta(t, 95.05, s.P99, 1e-9)
	assert.Equal(t, 10.0, s.Min)
	assert.Equal(t, 100.0, s.Max)

	// Edge cases: one value, p0/p100, empty.
	assert.Equal(t, 7.0, Percentile([]float64{7}, 99))
	assert.Equal(t, 15.0, Percentile(y, 0))
	assert.Equal(t, 50.0, Percentile(y, 100))
	assert.True(t, math.IsNaN(Percentile(nil, 50)))
	assert.Nil(t, Summarize(nil))
}

func TestParseDist(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	d, err := ParseDist("128")
	require.NoError(t, err)
	assert.Equal(t, 128, d.Sample(r))
	assert.Equal(t, "128", d.String())

	d, err = ParseDist("uniform:10-20")
	require.NoError(t, err)
	seen := map[int]bool{}
	for range 2000 {
		v := d.Sample(r)
		require.GreaterOrEqual(t, v, 10)
		require.LessOrEqual(t, v, 20)
		seen[v] = true
	}
	assert.Len(t, seen, 11, "both ends reachable")

	d, err = ParseDist("normal:500,50")
	require.NoError(t, err)
	var sum float64
	for range 4000 {
		sum += float64(d.Sample(r))
	}
	assert.InDelta(t, 500, sum/4000, 5)
	d, _ = ParseDist("normal:2,100")
	for range 200 {
		require.GreaterOrEqual(t, d.Sample(r), 1, "clamped to >= 1")
	}

	for _, bad := range []string{"", "0", "-3", "x", "uniform:5", "uniform:9-3", "normal:5", "normal:0,1", "normal:5,-1"} {
		_, err := ParseDist(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseFlags(t *testing.T) {
	var out strings.Builder
	c, err := ParseFlags([]string{
		"-url", "http://x:1", "-model", "m", "-rate", "5", "-duration", "10s",
		"-warmup", "3s", "-prompt-tokens", "uniform:100-200", "-output-tokens", "normal:64,8",
		"-long-share", "0.1", "-long-prompt-tokens", "4000", "-slo-ttft", "250", "-slo-tpot", "40.5",
	}, &out)
	require.NoError(t, err)
	assert.Equal(t, 5.0, c.Rate)
	assert.Equal(t, 0, c.Concurrency, "no cap in rate mode unless given")
	assert.Equal(t, 10*time.Second, c.Duration)
	assert.Equal(t, 0, c.Requests)
	assert.Equal(t, 3*time.Second, c.WarmupDuration)
	assert.Equal(t, Dist{Kind: "uniform", Min: 100, Max: 200}, c.PromptTokens)
	assert.Equal(t, Dist{Kind: "normal", Mean: 64, SD: 8}, c.OutputTokens)
	assert.Equal(t, 250*time.Millisecond, c.SLOTTFT)
	assert.Equal(t, 40500*time.Microsecond, c.SLOTPOT)

	c, err = ParseFlags([]string{"-model", "m", "-warmup", "5"}, &out)
	require.NoError(t, err)
	assert.Equal(t, 1, c.Concurrency, "default closed loop of 1")
	assert.Equal(t, 100, c.Requests, "default request count")
	assert.Equal(t, 5, c.WarmupRequests)

	for _, bad := range [][]string{
		{},                                // no model
		{"-model", "m", "-endpoint", "x"}, // bad endpoint
		{"-model", "m", "-long-share", "2"},
		{"-model", "m", "-warmup", "abc"},
		{"-model", "m", "extra"},
	} {
		_, err := ParseFlags(bad, &out)
		assert.Error(t, err, bad)
	}
}

func TestEndpointURL(t *testing.T) {
	assert.Equal(t, "http://h:1/v1/chat/completions", endpointURL("http://h:1", EndpointChat))
	assert.Equal(t, "http://h:1/v1/chat/completions", endpointURL("http://h:1/v1/", EndpointChat))
	assert.Equal(t, "http://h:1/v1/completions", endpointURL("http://h:1/", EndpointCompletions))
}

// recorder collects assertion failures so a wall-clock measurement can be
// retried on a loaded machine before it is reported.
type recorder struct{ msgs []string }

func (r *recorder) Errorf(format string, args ...any) {
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

// retryTiming runs check up to 3 times and fails t with the last attempt's
// failures if none passes. Wall-clock tests only; the logic they cover is
// deterministic.
func retryTiming(t *testing.T, check func(a *assert.Assertions)) {
	t.Helper()
	var last []string
	for attempt := 1; attempt <= 3; attempt++ {
		rec := &recorder{}
		check(assert.New(rec))
		if len(rec.msgs) == 0 {
			return
		}
		last = rec.msgs
		t.Logf("timing attempt %d off (machine load?), retrying", attempt)
	}
	for _, m := range last {
		t.Error(m)
	}
}

// Role chunk at once, first content at 50 ms, then one every 20 ms (6 chunks),
// usage chunk 100 ms after the last content chunk, [DONE].
// Expected: TTFT 50, ITL 20, E2E 50+5*20 = 150 (the usage chunk at 250 does
// not move it), output tokens 6 (from usage), TPOT (150-50)/5 = 20.
func TestTimingAgainstScriptedUpstream(t *testing.T) {
	for _, completion := range []bool{false, true} {
		name := "chat"
		if completion {
			name = "completions"
		}
		t.Run(name, func(t *testing.T) {
			u := newUpstream(t, script{
				firstDelay: 50 * time.Millisecond, gap: 20 * time.Millisecond,
				chunks: 6, usage: 6, usageDelay: 100 * time.Millisecond, completion: completion,
			})
			cfg := baseConfig(u)
			cfg.Requests = 3
			cfg.Concurrency = 3
			if completion {
				cfg.Endpoint = EndpointCompletions
			}
			rep, err := Run(context.Background(), cfg, nil)
			require.NoError(t, err)
			require.Equal(t, 3, rep.Completed)
			require.Equal(t, 0, rep.Failed)
			require.EqualValues(t, 18, rep.OutputTokens)
			require.EqualValues(t, 21, rep.InputTokens, "usage.prompt_tokens 7 x 3")
			require.Equal(t, 15, rep.ITL.Count, "5 gaps per request, pooled")
			require.Equal(t, 3, rep.TPOT.Count)
			require.EqualValues(t, 3, rep.MaxConcurrency)
			// Wall-clock figures on a shared machine are only bounded below:
			// the upstream waits before each chunk, and nothing arrives
			// earlier than it is sent. Upper bounds would test the machine's
			// load, not llmload.
			assert.GreaterOrEqual(t, rep.TTFT.P50, 50.0, "TTFT: the first content chunk at 50 ms")
			assert.GreaterOrEqual(t, rep.E2E.P50, 150.0, "E2E: the last content chunk at 150 ms")
			assert.LessOrEqual(t, rep.RequestThroughput, 3/0.25, "3 requests that last at least 250 ms (the usage chunk)")
			// What the formulas make of the measured times holds exactly,
			// whatever the times: a request's gaps add up to its time from
			// first to last content (E2E ends at the last content chunk, not
			// at the usage chunk after it), and its TPOT is that over its
			// output tokens - 1 (6 from usage).
			const eps = 1e-6
			assert.InEpsilon(t, (rep.E2E.Mean-rep.TTFT.Mean)*3, rep.ITL.Mean*15, eps, "the pooled gaps are the requests' first-to-last times")
			assert.InEpsilon(t, (rep.E2E.Mean-rep.TTFT.Mean)/5, rep.TPOT.Mean, eps, "TPOT = (E2E - TTFT) / (6 - 1)")

			body := u.firstBody(t)
			assert.Equal(t, true, body["stream"])
			assert.Equal(t, map[string]any{"include_usage": true}, body["stream_options"])
			assert.Equal(t, 8.0, body["max_tokens"])
			assert.Equal(t, true, body["ignore_eos"])
			assert.Equal(t, "test-model", body["model"])
			if completion {
				assert.Equal(t, 16, wordCount(body["prompt"].(string)))
			} else {
				msgs := body["messages"].([]any)
				require.Len(t, msgs, 1)
				assert.Equal(t, 16, wordCount(msgs[0].(map[string]any)["content"].(string)))
			}
		})
	}
}

// Without a usage chunk the output token count falls back to the number of
// content chunks with text.
func TestOutputTokensFallbackAndGoodput(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 30 * time.Millisecond, gap: 10 * time.Millisecond, chunks: 4})
	cfg := baseConfig(u)
	cfg.Requests = 2
	cfg.SLOTTFT = 5 * time.Millisecond // impossible
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Completed)
	assert.EqualValues(t, 8, rep.OutputTokens)
	require.NotNil(t, rep.Goodput)
	assert.Equal(t, 0, *rep.GoodRequests)
	assert.Equal(t, 0.0, *rep.Goodput)

	cfg.SLOTTFT = 2 * time.Second
	cfg.SLOE2E = 2 * time.Second
	cfg.SLOTPOT = time.Second
	rep, err = Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 2, *rep.GoodRequests)
	assert.InDelta(t, rep.RequestThroughput, *rep.Goodput, 1e-9)
}

func TestConcurrencyRespected(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 20 * time.Millisecond, gap: 5 * time.Millisecond, chunks: 3, usage: 3})
	cfg := baseConfig(u)
	cfg.Concurrency = 3
	cfg.Requests = 15
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 15, rep.Completed)
	assert.EqualValues(t, 15, u.requests.Load())
	assert.EqualValues(t, 3, u.maxInflight.Load(), "upstream saw exactly the configured concurrency")
	assert.EqualValues(t, 3, rep.MaxConcurrency)
}

func TestRequestCountAndWarmupExclusion(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 5 * time.Millisecond, gap: 2 * time.Millisecond, chunks: 2, usage: 2})
	cfg := baseConfig(u)
	cfg.Concurrency = 2
	cfg.Requests = 5
	cfg.WarmupRequests = 3
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.EqualValues(t, 8, u.requests.Load(), "warm-up + measured requests sent")
	assert.Equal(t, 5, rep.Completed)
	assert.Equal(t, 3, rep.WarmupRequests)
	assert.Equal(t, 5, rep.TTFT.Count, "warm-up requests are not in the statistics")
	assert.EqualValues(t, 10, rep.OutputTokens)

	// Duration warm-up: requests issued in the first 100 ms are excluded.
	u2 := newUpstream(t, script{firstDelay: 10 * time.Millisecond, gap: 2 * time.Millisecond, chunks: 2, usage: 2})
	cfg = baseConfig(u2)
	cfg.Requests = 3
	cfg.WarmupDuration = 100 * time.Millisecond
	rep, err = Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 3, rep.Completed)
	assert.GreaterOrEqual(t, rep.WarmupRequests, 3, "~7 sequential 13 ms requests fit in 100 ms")
	assert.EqualValues(t, rep.WarmupRequests+3, u2.requests.Load())
}

func TestDurationStopsRun(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 10 * time.Millisecond, gap: 5 * time.Millisecond, chunks: 2, usage: 2})
	cfg := baseConfig(u)
	cfg.Requests = 0
	cfg.Duration = 300 * time.Millisecond
	cfg.Concurrency = 2
	start := time.Now()
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Greater(t, rep.Completed, 3)
	assert.GreaterOrEqual(t, rep.WindowS, 0.3, "window covers the duration")
	assert.Less(t, rep.WindowS, 1.5, "plus the drain of in-flight requests")

	// Both given: the request count is reached first.
	cfg.Requests = 4
	cfg.Duration = 10 * time.Second
	start = time.Now()
	rep, err = Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 4, rep.Completed)
	assert.Less(t, time.Since(start), 2*time.Second)
}

func TestFailuresCountedNotTimed(t *testing.T) {
	modes := []string{"", "500", "broken", "nodone", "errorevent", ""}
	u := newUpstream(t, script{
		firstDelay: 5 * time.Millisecond, gap: 5 * time.Millisecond, chunks: 3, usage: 3,
		fail: func(n int64) string { return modes[n%int64(len(modes))] },
	})
	cfg := baseConfig(u)
	cfg.Requests = 12
	cfg.Concurrency = 2
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 4, rep.Completed)
	assert.Equal(t, 8, rep.Failed)
	assert.Equal(t, 4, rep.TTFT.Count, "failed requests are not timed")
	assert.Equal(t, 8, rep.ITL.Count)
	assert.Equal(t, 2, rep.Errors["http 500"])
	assert.Equal(t, 2, rep.Errors["stream ended without [DONE]"])
	assert.Equal(t, 2, rep.Errors["error event in stream"])
	broken := 0
	for k, v := range rep.Errors {
		if k != "http 500" && k != "stream ended without [DONE]" && k != "error event in stream" {
			broken += v
		}
	}
	assert.Equal(t, 2, broken, "connection cut mid-stream: %v", rep.Errors)
}

func TestConnectionRefusedCountsAsFailed(t *testing.T) {
	u := newUpstream(t, script{})
	cfg := baseConfig(u)
	u.Close() // nothing listens any more
	cfg.Requests = 2
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 0, rep.Completed)
	assert.Equal(t, 2, rep.Failed)
	assert.Nil(t, rep.TTFT)
}

func TestPoissonRateMode(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 5 * time.Millisecond, gap: 2 * time.Millisecond, chunks: 2, usage: 2})
	cfg := baseConfig(u)
	cfg.Concurrency = 0
	cfg.Rate = 100
	cfg.Requests = 0
	cfg.Duration = 600 * time.Millisecond
	cfg.Seed = 42
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	// Expect ~60 arrivals (Poisson, sd ~8); loose bounds.
	assert.Greater(t, rep.Completed, 30)
	assert.Less(t, rep.Completed, 95)
	assert.Equal(t, 0, rep.Failed)
	assert.EqualValues(t, rep.Completed, u.requests.Load())
	// Loose: the window also includes the drain, which a loaded machine stretches.
	assert.Greater(t, rep.RequestThroughput, 20.0)
	assert.Less(t, rep.RequestThroughput, 200.0)

	// Rate with a concurrency cap: arrivals wait for a slot.
	u2 := newUpstream(t, script{firstDelay: 40 * time.Millisecond, gap: 5 * time.Millisecond, chunks: 2, usage: 2})
	cfg = baseConfig(u2)
	cfg.Concurrency = 2
	cfg.Rate = 200
	cfg.Requests = 10
	rep, err = Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 10, rep.Completed)
	assert.LessOrEqual(t, u2.maxInflight.Load(), int64(2))
}

func TestInterruptReportsWhatWasMeasured(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 10 * time.Millisecond, gap: 50 * time.Millisecond, chunks: 4, usage: 4})
	cfg := baseConfig(u)
	cfg.Concurrency = 2
	cfg.Requests = 1000
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	start := time.Now()
	rep, err := Run(ctx, cfg, nil)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 1500*time.Millisecond, "in-flight requests are aborted promptly")
	assert.True(t, rep.Interrupted)
	assert.Greater(t, rep.Completed, 2)
	assert.Equal(t, 0, rep.Failed, "aborted requests are not failures")
	assert.Equal(t, 2, rep.Aborted)
	assert.InDelta(t, 0.5, rep.WindowS, 0.1)
}

func TestJSONOutputAndTable(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 10 * time.Millisecond, gap: 5 * time.Millisecond, chunks: 3, usage: 3})
	cfg := baseConfig(u)
	cfg.Requests = 4
	cfg.Concurrency = 2
	cfg.WarmupRequests = 1
	cfg.SLOTTFT = time.Second
	cfg.LongShare = 0.5
	cfg.LongPromptTokens = 100
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "result.json")
	require.NoError(t, rep.WriteJSONFile(path))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(data, &got))
	for _, k := range []string{
		"tool", "params", "started_at", "interrupted", "window_s", "completed", "failed",
		"aborted", "warmup_requests", "errors", "total_input_tokens", "total_output_tokens", "request_throughput",
		"output_throughput", "total_token_throughput", "good_requests", "goodput", "max_concurrency",
		"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
	} {
		assert.Contains(t, got, k)
	}
	for _, k := range []string{"count", "mean", "std", "min", "p50", "p90", "p95", "p99", "max"} {
		assert.Contains(t, got["ttft_ms"], k)
	}
	params := got["params"].(map[string]any)
	for _, k := range []string{
		"url", "endpoint", "model", "concurrency", "request_rate", "duration_s", "requests",
		"warmup_requests", "warmup_duration_s", "prompt_tokens", "output_tokens", "long_share",
		"long_prompt_tokens", "seed", "ignore_eos", "slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms",
	} {
		assert.Contains(t, params, k)
	}
	assert.Equal(t, "16", params["prompt_tokens"])
	assert.Equal(t, 4.0, got["completed"])
	assert.Equal(t, 1.0, got["warmup_requests"])
	assert.Equal(t, 1000.0, params["slo_ttft_ms"])

	var sb strings.Builder
	require.NoError(t, rep.WriteTable(&sb))
	table := sb.String()
	for _, s := range []string{"Successful requests:", "Request throughput", "Request goodput", "TTFT", "TPOT", "ITL", "E2E", "P99"} {
		assert.Contains(t, table, s)
	}
}

func TestLongShareAndDeterministicSpecs(t *testing.T) {
	u := newUpstream(t, script{chunks: 1, usage: 1})
	cfg := baseConfig(u)
	cfg.LongShare = 0.3
	cfg.LongPromptTokens = 200
	cfg.Seed = 7
	cfg.Requests = 400
	r1, r2 := newRunner(cfg), newRunner(cfg)
	long := 0
	for range 400 {
		a, ok := r1.next(context.Background())
		require.True(t, ok)
		b, _ := r2.next(context.Background())
		require.Equal(t, a.Prompt, b.Prompt, "same seed, same prompts")
		if a.Long {
			long++
			require.Equal(t, 200, wordCount(a.Prompt))
		} else {
			require.Equal(t, 16, wordCount(a.Prompt))
		}
	}
	r1.client.CloseIdleConnections()
	r2.client.CloseIdleConnections()
	assert.InDelta(t, 120, long, 35)
}

// The chat stream of testdata/fixtures/vllm/sse-streams.txt (vLLM shape:
// role chunk, 7 text chunks, empty-delta finish chunk, usage chunk, [DONE]),
// served at once: checks the parsing rules independent of timing.
const fixtureChat = `: comment lines are skipped
data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":"The"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" capital"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" of"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" France"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" is"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" Paris"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":"."},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}

`

const fixtureUsage = `data: {"id":"chatcmpl-3f2b","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":42,"total_tokens":50,"completion_tokens":8}}

`

func TestFixtureStreamParsing(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		ok         bool
		tokens     int
	}{
		{"with usage", fixtureChat + fixtureUsage + "data: [DONE]\n\n", true, 8},
		{"no usage: count text chunks", fixtureChat + "data: [DONE]\n\n", true, 7},
		{"CRLF framing", strings.ReplaceAll(fixtureChat+fixtureUsage+"data: [DONE]\n\n", "\n", "\r\n"), true, 8},
		{"[DONE] without trailing blank line", fixtureChat + fixtureUsage + "data: [DONE]", true, 8},
		{"truncated", fixtureChat, false, 0},
		{"role chunk only", "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: [DONE]\n\n", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			cfg := Config{Model: "m", Endpoint: EndpointChat}
			res := doRequest(context.Background(), client, &cfg, srv.URL+"/v1/chat/completions", &RequestSpec{Prompt: "hi", MaxTokens: 8})
			require.Equal(t, tc.ok, res.OK, res.Err)
			if !tc.ok {
				return
			}
			assert.Equal(t, tc.tokens, res.OutputTokens)
			assert.Len(t, res.ITLs, 7, "8 content chunks after the skipped role chunk (incl. the empty finish chunk)")
			assert.Equal(t, 8, res.ContentCount)
			assert.Positive(t, res.TTFT)
			assert.GreaterOrEqual(t, res.E2E, res.TTFT)
			if tc.tokens == 8 {
				assert.Equal(t, 42, res.PromptTokens)
			}
		})
	}
}

// -retry-stalled: a request whose stream a stall breaker cut is sent again;
// the cut attempt is its own -requests-out line, with the gaps the client
// waited through (the last ending at the error event), and the report
// counts it as a retry, not a failure. Without retries, it is a failure of
// its own class.
func TestRetryStalled(t *testing.T) {
	u := newUpstream(t, script{
		firstDelay: 5 * time.Millisecond, gap: 5 * time.Millisecond, chunks: 3, usage: 3,
		fail: func(n int64) string {
			if n < 3 {
				return "stalled"
			}
			return ""
		},
	})
	cfg := baseConfig(u)
	cfg.Requests = 2
	cfg.RetryStalled = 2
	cfg.RequestsOut = filepath.Join(t.TempDir(), "requests.ndjson")
	cfg.RequestsITL = true
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Completed)
	assert.Equal(t, 1, rep.Failed, "the first request: cut three times, retried twice (the limit)")
	assert.Equal(t, 1, rep.Errors["engine_stalled"])
	assert.Equal(t, 2, rep.Retried)
	assert.Equal(t, int64(4), u.requests.Load())

	data, err := os.ReadFile(cfg.RequestsOut)
	require.NoError(t, err)
	var recs []RequestRecord
	for line := range strings.Lines(string(data)) {
		var rec RequestRecord
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		recs = append(recs, rec)
	}
	require.Len(t, recs, 4)
	for i, want := range []struct {
		index, attempt int
		retried, ok    bool
	}{{0, 0, true, false}, {0, 1, true, false}, {0, 2, false, false}, {1, 0, false, true}} {
		r := recs[i]
		assert.Equal(t, want.index, r.Index, i)
		assert.Equal(t, want.attempt, r.Attempt, i)
		assert.Equal(t, want.retried, r.Retried, i)
		assert.Equal(t, want.ok, r.OK, i)
		if !want.ok {
			assert.Equal(t, "engine_stalled", r.Error, i)
			assert.Len(t, r.ITLms, 1, "%d: the wait from the only token to the error event", i)
			assert.Positive(t, r.TTFTms, i)
		}
	}

	cfg.RetryStalled = 0
	u.requests.Store(1)
	cfg.RequestsOut = ""
	rep, err = Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Failed, "both cut, neither retried")
	assert.Equal(t, 2, rep.Errors["engine_stalled"])
	assert.Equal(t, int64(3), u.requests.Load())
	assert.Equal(t, 0, rep.Retried)
}
