// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sim

import (
	"bufio"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Bucket boundaries of vLLM V1 (vllm/v1/metrics/loggers.py, buckets.py).
var (
	TTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	ITLBuckets  = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	// LatencyBuckets are the "request_latency" family: e2e, queue,
	// inference, prefill, decode.
	LatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// Build125Buckets is vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, …
// up to upTo.
func Build125Buckets(upTo int) []float64 {
	var out []float64
	for exp := 1; ; exp *= 10 {
		for _, m := range []int{1, 2, 5} {
			v := m * exp
			if v > upTo {
				return out
			}
			out = append(out, float64(v))
		}
	}
}

type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	n      uint64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // first bound >= v: le is inclusive
	h.counts[i]++
	h.sum += v
	h.n++
}

// Metrics are the engine's Prometheus series; guarded by the engine lock.
type Metrics struct {
	model   string
	created float64

	running, waiting int
	kvUsage          float64
	preemptions      int
	prompt           int
	generation       int
	success          map[string]int

	promptTokens, genTokens                  *histogram
	ttft, itl, tpot                          *histogram
	e2e, queue, inference, prefill, decodeTm *histogram

	cacheInfo [][2]string
}

func newMetrics(cfg Config, now time.Time) *Metrics {
	tokenBuckets := Build125Buckets(cfg.MaxModelLen)
	return &Metrics{
		model:        cfg.Model,
		created:      float64(now.UnixNano()/1e6) / 1e3,
		success:      map[string]int{},
		promptTokens: newHistogram(tokenBuckets),
		genTokens:    newHistogram(tokenBuckets),
		ttft:         newHistogram(TTFTBuckets),
		itl:          newHistogram(ITLBuckets),
		tpot:         newHistogram(ITLBuckets),
		e2e:          newHistogram(LatencyBuckets),
		queue:        newHistogram(LatencyBuckets),
		inference:    newHistogram(LatencyBuckets),
		prefill:      newHistogram(LatencyBuckets),
		decodeTm:     newHistogram(LatencyBuckets),
		cacheInfo: [][2]string{
			{"block_size", strconv.Itoa(BlockSize)},
			{"cache_dtype", map[bool]string{true: "fp8", false: "auto"}[cfg.Profile == ProfileFP8]},
			{"enable_prefix_caching", "False"},
			{"num_gpu_blocks", strconv.Itoa(cfg.KVBlocks)},
		},
	}
}

func (m *Metrics) setQueues(running, waiting int, usage float64) {
	m.running, m.waiting, m.kvUsage = running, waiting, usage
}

// token records an output token of r produced at t (before r's fields for
// it are updated).
func (m *Metrics) token(r *Request, t time.Time) {
	m.generation++
	if r.firstToken.IsZero() {
		m.prompt += r.Params.PromptTokens
		m.ttft.observe(t.Sub(r.Arrival).Seconds())
	} else {
		m.itl.observe(t.Sub(r.lastToken).Seconds())
	}
}

func (m *Metrics) finished(r *Request, reason string, t time.Time) {
	m.success[reason]++
	m.promptTokens.observe(float64(r.Params.PromptTokens))
	m.genTokens.observe(float64(r.generated))
	m.e2e.observe(t.Sub(r.Arrival).Seconds())
	if !r.scheduled.IsZero() {
		m.queue.observe(r.scheduled.Sub(r.Arrival).Seconds())
	} else {
		m.queue.observe(t.Sub(r.Arrival).Seconds())
	}
	if !r.firstToken.IsZero() {
		m.prefill.observe(r.firstToken.Sub(r.scheduled).Seconds())
		decode := r.lastToken.Sub(r.firstToken).Seconds()
		m.decodeTm.observe(decode)
		m.inference.observe(r.lastToken.Sub(r.scheduled).Seconds())
		tpot := 0.0
		if r.generated > 1 {
			tpot = decode / float64(r.generated-1)
		}
		m.tpot.observe(tpot)
	}
}

// FormatFloat prints v like Python's repr of a float, as prometheus_client
// does: "12.0", "0.4178", "+Inf".
func FormatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	a := math.Abs(v)
	if a != 0 && (a < 1e-4 || a >= 1e16) {
		return strconv.FormatFloat(v, 'e', -1, 64)
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// WriteMetrics writes the Prometheus text exposition (format 0.0.4) in the
// layout of vLLM's prometheus_client output.
func (e *Engine) WriteMetrics(w io.Writer) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.m
	bw := bufio.NewWriter(w)
	// bufio.Writer keeps its first error and Flush returns it.
	write := func(s string) { _, _ = bw.WriteString(s) }
	lbl := `engine="0",model_name="` + escape(m.model) + `"`
	created := FormatFloat(m.created)
	meta := func(name, help, typ string) {
		write("# HELP " + name + " " + help + "\n# TYPE " + name + " " + typ + "\n")
	}
	gauge := func(name, help string, v float64) {
		meta(name, help, "gauge")
		write(name + "{" + lbl + "} " + FormatFloat(v) + "\n")
	}
	counter := func(base, help string, v float64) {
		meta(base+"_total", help, "counter")
		write(base + "_total{" + lbl + "} " + FormatFloat(v) + "\n")
		gauge(base+"_created", help, m.created)
	}
	hist := func(name, help string, h *histogram) {
		meta(name, help, "histogram")
		var cum uint64
		for i, c := range h.counts {
			cum += c
			le := "+Inf"
			if i < len(h.bounds) {
				le = FormatFloat(h.bounds[i])
			}
			write(name + `_bucket{engine="0",le="` + le + `",model_name="` + escape(m.model) + `"} ` + FormatFloat(float64(cum)) + "\n")
		}
		write(name + "_count{" + lbl + "} " + FormatFloat(float64(h.n)) + "\n")
		write(name + "_sum{" + lbl + "} " + FormatFloat(h.sum) + "\n")
		gauge(name+"_created", help, m.created)
	}

	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(m.running))
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(m.waiting))
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", m.kvUsage)
	counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", float64(m.prompt))
	counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", 0)
	counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", float64(m.preemptions))
	counter("vllm:prompt_tokens", "Number of prefill tokens processed.", float64(m.prompt))
	counter("vllm:generation_tokens", "Number of generation tokens processed.", float64(m.generation))

	const successHelp = "Count of successfully processed requests."
	reasons := []string{FinishStop, FinishLength, FinishAbort, FinishError}
	meta("vllm:request_success_total", successHelp, "counter")
	for _, r := range reasons {
		write(`vllm:request_success_total{engine="0",finished_reason="` + r + `",model_name="` + escape(m.model) + `"} ` + FormatFloat(float64(m.success[r])) + "\n")
	}
	meta("vllm:request_success_created", successHelp, "gauge")
	for _, r := range reasons {
		write(`vllm:request_success_created{engine="0",finished_reason="` + r + `",model_name="` + escape(m.model) + `"} ` + created + "\n")
	}

	hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", m.promptTokens)
	hist("vllm:request_generation_tokens", "Number of generation tokens processed.", m.genTokens)
	hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", m.ttft)
	hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", m.itl)
	hist("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", m.tpot)
	hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", m.e2e)
	hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", m.queue)
	hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", m.inference)
	hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", m.prefill)
	hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", m.decodeTm)

	meta("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge")
	var kv []string
	for _, p := range append(append([][2]string{}, m.cacheInfo...), [2]string{"engine", "0"}) {
		kv = append(kv, p[0]+`="`+escape(p[1])+`"`)
	}
	sort.Strings(kv)
	write("vllm:cache_config_info{" + strings.Join(kv, ",") + "} 1.0\n")
	return bw.Flush()
}

func escape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(s)
}
