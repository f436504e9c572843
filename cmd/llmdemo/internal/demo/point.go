// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
)

// collectorConfig is the collector's configuration for every point: the
// token_stream proxy in front of the simulator and a scrape of its
// /metrics, token_session with exponential histograms flushed every
// second, everything out over OTLP/HTTP to the demo's sink.
//
//go:embed collector.yaml
var collectorConfig []byte

// exactCollectorConfig is the second collector's, for the exact path of who
// used the GPU: vllmsim's hook sends it each request with the engine's own
// share.
//
//go:embed exact-collector.yaml
var exactCollectorConfig []byte

// Binaries are the programs a point runs.
type Binaries struct {
	Collector string // otelcol-llm
	Sim       string // vllmsim
	Load      string // llmload
}

// Model is the model name vllmsim serves and llmload asks for.
const Model = "meta-llama/Llama-3.1-8B-Instruct"

// Engine is the simulated engine of a point (vllmsim flags).
type Engine struct {
	Profile         string `json:"profile"`
	KVBlocks        int    `json:"kv_blocks"`
	ChunkedPrefill  bool   `json:"chunked_prefill"`
	PrefillPriority bool   `json:"prefill_priority"`
	// MaxNumBatchedTokens is the step's token budget with chunked prefill
	// (0: vllmsim's default).
	MaxNumBatchedTokens int `json:"max_num_batched_tokens,omitempty"`
}

func (e Engine) args(addr string) []string {
	args := []string{
		"-addr", addr, "-model", Model, "-profile", e.Profile,
		"-kv-blocks", strconv.Itoa(e.KVBlocks),
		"-chunked-prefill=" + strconv.FormatBool(e.ChunkedPrefill),
		"-prefill-priority=" + strconv.FormatBool(e.PrefillPriority),
	}
	if e.MaxNumBatchedTokens > 0 {
		args = append(args, "-max-num-batched-tokens", strconv.Itoa(e.MaxNumBatchedTokens))
	}
	return args
}

// stepTokens is the engine's step token budget as vllmsim sets it: the
// chunked budget, or without chunked prefill the longest model length.
func (e Engine) stepTokens() int {
	switch {
	case !e.ChunkedPrefill:
		return 4096 // vllmsim's -max-model-len
	case e.MaxNumBatchedTokens > 0:
		return e.MaxNumBatchedTokens
	}
	return 2048
}

// Load is the load of a point (llmload flags).
type Load struct {
	Concurrency      int           `json:"concurrency"`
	Duration         time.Duration `json:"duration_ns"`
	RampUp           time.Duration `json:"ramp_up_ns"`
	PromptTokens     string        `json:"prompt_tokens"`
	OutputTokens     string        `json:"output_tokens"`
	LongShare        float64       `json:"long_share"`
	LongPromptTokens int           `json:"long_prompt_tokens"`
	Seed             uint64        `json:"seed"`
}

func (l Load) args(url, dir string) []string {
	return []string{
		"-url", url, "-model", Model, "-quiet", "-traceparent",
		"-concurrency", strconv.Itoa(l.Concurrency), "-duration", l.Duration.String(), "-ramp-up", l.RampUp.String(),
		"-prompt-tokens", l.PromptTokens, "-output-tokens", l.OutputTokens,
		"-long-share", strconv.FormatFloat(l.LongShare, 'g', -1, 64),
		"-long-prompt-tokens", strconv.Itoa(l.LongPromptTokens),
		"-seed", strconv.FormatUint(l.Seed, 10),
		"-long-tenant", tenantRAG, "-short-tenant", tenantChat,
		"-out", filepath.Join(dir, "llmload.json"),
		"-requests-out", filepath.Join(dir, "requests.ndjson"),
	}
}

// Point is one run: a fresh simulator and collector under one load.
type Point struct {
	Scenario string `json:"scenario"` // "a", "b", "c"
	Label    string `json:"label"`
	Engine   Engine `json:"engine"`
	Load     Load   `json:"load"`
}

// Name is the point's folder name in the report.
func (p Point) Name() string { return p.Scenario + "-" + p.Label }

// ClientFigures are llmload's results (its -out JSON) for the point.
type ClientFigures struct {
	Completed         int       `json:"completed"`
	Failed            int       `json:"failed"`
	TTFT              Quantiles `json:"ttft"`
	TPOT              Quantiles `json:"tpot"`
	RequestThroughput float64   `json:"request_throughput"`
	OutputThroughput  float64   `json:"output_throughput"`
}

// llmloadResult is the part of llmload's -out JSON the demo reads.
type llmloadResult struct {
	Completed         int     `json:"completed"`
	Failed            int     `json:"failed"`
	RequestThroughput float64 `json:"request_throughput"`
	OutputThroughput  float64 `json:"output_throughput"`
	TTFT              *struct {
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
	} `json:"ttft_ms"`
	TPOT *struct {
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
	} `json:"tpot_ms"`
}

// requestRecord is the part of an llmload -requests-out line the demo
// reads.
type requestRecord struct {
	Index         int     `json:"index"`
	Warmup        bool    `json:"warmup"`
	StartUnixNano int64   `json:"start_unix_nano"`
	OK            bool    `json:"ok"`
	Interrupted   bool    `json:"interrupted"`
	TTFTms        float64 `json:"ttft_ms"`
	TPOTms        float64 `json:"tpot_ms"`
	OutputTokens  int     `json:"output_tokens"`
	TraceID       string  `json:"trace_id"`
	// Error is the failure's class; a stream cut by the proxy's stall
	// breaker is engine_stalled, its ITLms the gaps the client waited
	// through (the last ending at the error event). Retried: llmload sent
	// the request again (-retry-stalled).
	Error   string `json:"error"`
	Retried bool   `json:"retried"`
	// ITLms are the request's gaps between chunks, in order (llmload
	// -requests-itl; make demo-breaker).
	ITLms []float64 `json:"itl_ms"`
}

// Slow sessions are those the collector's sampling rules must keep: TTFT
// above 500 ms or TPOT above 80 ms (the token_session defaults in
// collector.yaml). A session counts as slow on the client side only when it
// is beyond the threshold by slowMargin, so timing noise between the client
// and the proxy cannot make a borderline session look missed.
const (
	slowTTFTms = 500
	slowTPOTms = 80
	slowMargin = 0.05
)

// SlowCheck compares the client's slow sessions with the collector's spans.
type SlowCheck struct {
	Slow     int      `json:"slow"`      // client-side slow sessions
	WithSpan int      `json:"with_span"` // of those, present as a span with the client's trace ID
	Missing  []string `json:"missing,omitempty"`
}

// Truth is the simulator's own figures of a point: the true split of every
// request's time (vllmsim -timings-out), p50 and p99 in ms.
type Truth struct {
	Queue   Quantiles `json:"queue"`
	Prefill Quantiles `json:"prefill"`
	// Requests are the finished requests counted.
	Requests int `json:"requests"`
	// byTrace is each traced request's split, to check the kept sessions'
	// against.
	byTrace map[string]truthSplit
}

// truthSplit is one request's true queue and prefill, in ms.
type truthSplit struct{ queueMs, prefillMs float64 }

// SplitCheck is what the kept sessions' spans say of the engine's split,
// against the simulator's truth of the same request (by trace ID).
type SplitCheck struct {
	Kept int `json:"kept"` // session spans
	// BySource counts the kept spans by llm.session.timing_source ("none":
	// without the split).
	BySource map[string]int `json:"by_source"`
	// Checked are the kept spans with the split and a truth record;
	// Differ those whose queue or prefill is off the truth by more than
	// splitTolerance (their trace IDs, the first ten, in DifferIDs).
	Checked   int      `json:"checked"`
	Differ    int      `json:"differ"`
	DifferIDs []string `json:"differ_ids,omitempty"`
}

// splitTolerance: the engine's split travels as ms with decimals (the
// final chunk) or seconds as a double (its span); either is far finer.
const splitTolerance = 0.01 // ms

// checkSplit compares each kept session's split with the truth.
func checkSplit(spans []Span, truth map[string]truthSplit) SplitCheck {
	c := SplitCheck{Kept: len(spans), BySource: map[string]int{}}
	for _, sp := range spans {
		src := sp.TimingSource
		if src == "" {
			src = "none"
		}
		c.BySource[src]++
		want, ok := truth[sp.TraceID]
		if sp.TimingSource == "" || !ok {
			continue
		}
		c.Checked++
		if math.Abs(sp.QueueMs-want.queueMs) > splitTolerance || math.Abs(sp.PrefillMs-want.prefillMs) > splitTolerance {
			if c.Differ++; len(c.DifferIDs) < 10 {
				c.DifferIDs = append(c.DifferIDs, sp.TraceID)
			}
		}
	}
	return c
}

// PointResult is everything measured at one point.
type PointResult struct {
	Point     Point            `json:"point"`
	Client    ClientFigures    `json:"client"`
	Collector CollectorFigures `json:"collector"`
	Truth     Truth            `json:"simulator"`
	Slow      SlowCheck        `json:"slow_sessions"`
	Split     SplitCheck       `json:"split"`
	// Attribution is who used the GPU, the collector's estimate through the
	// proxy vs the simulator; ExactAttribution the same for the engine's
	// own shares, through the hook to a second collector.
	Attribution      *AttributionFigures `json:"attribution,omitempty"`
	ExactAttribution *AttributionFigures `json:"exact_attribution,omitempty"`
	CPUSeconds       map[string]float64  `json:"cpu_seconds"` // per process, user+system
	WallS            float64             `json:"wall_s"`      // the load's span, first request to last answer
	Dir              string              `json:"dir"`
	requests         []requestRecord
}

// CPUCores is the mean number of cores the three processes used while the
// load ran (their whole lives' CPU time over the load's wall time: an upper
// bound).
func (r *PointResult) CPUCores() float64 {
	if r.WallS <= 0 {
		return 0
	}
	var s float64
	for _, v := range r.CPUSeconds {
		s += v
	}
	return s / r.WallS
}

// Progress receives one line per step.
type Progress func(format string, args ...any)

// RunPoint runs one point with its files in dir, the collector's live
// view on live ("" for none): the simulator, the
// collector in front of it, the load through the collector's proxy; then it
// waits for the collector to have counted every session, stops the
// collector (which flushes) and the simulator, and reads the figures.
// Every process it started is stopped when it returns, error or not.
func RunPoint(ctx context.Context, bins Binaries, p Point, dir, live string, progress Progress) (res *PointResult, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfgPath, exactCfgPath := filepath.Join(dir, "collector.yaml"), filepath.Join(dir, "exact-collector.yaml")
	if err := os.WriteFile(cfgPath, collectorConfig, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(exactCfgPath, exactCollectorConfig, 0o644); err != nil {
		return nil, err
	}
	var started []*process.Process
	var snk, exactSnk *sink
	defer func() {
		// Reverse order: the load, then the collector, then the engine;
		// the sink last, so that the collector's last flush finds it.
		for i := len(started) - 1; i >= 0; i-- {
			if stopErr := started[i].Stop(stopGrace); stopErr != nil && err == nil {
				err = stopErr
			}
		}
		if snk != nil {
			snk.close()
		}
		if exactSnk != nil {
			exactSnk.close()
		}
	}()

	var addrs [6]string
	for i := range addrs {
		if addrs[i], err = process.FreeAddr(); err != nil {
			return nil, err
		}
	}
	simAddr, proxyAddr, otlpAddr, healthAddr := addrs[0], addrs[1], addrs[2], addrs[3]
	exactOTLPAddr, exactHealthAddr := addrs[4], addrs[5]

	// The exact path first, so that vllmsim's hook finds its socket: a
	// collector of its own, whose work is not the point's collector's.
	if exactSnk, err = startSink(); err != nil {
		return nil, err
	}
	hookSocket := filepath.Join(dir, "hooks.sock")
	exactCol, err := startProcess("otelcol-llm-exact", filepath.Join(dir, "otelcol-exact.log"), bins.Collector, []string{"--config", exactCfgPath}, []string{
		"HOOK_SOCKET=" + hookSocket, "OTLP_ENDPOINT=" + exactOTLPAddr, "HEALTH_ENDPOINT=" + exactHealthAddr, "SINK_URL=" + exactSnk.url(),
	})
	if err != nil {
		return nil, err
	}
	started = append(started, exactCol)
	if err := exactCol.WaitHTTP(ctx, "http://"+exactHealthAddr+"/", 60*time.Second); err != nil {
		return nil, err
	}
	timingsPath := filepath.Join(dir, "timings.ndjson")
	// The engine reports its own split of each request's time as vLLM does:
	// its llm_request spans to the collector's otlp receiver (every second,
	// not vLLM's 5 s, to keep the points short) and per-request metrics on
	// the final chunk; and it writes the truth for the report.
	attributionPath := filepath.Join(dir, "attribution.ndjson")
	simArgs := append(p.Engine.args(simAddr), "-otlp-traces-endpoint", "http://"+otlpAddr+"/v1/traces",
		"-otlp-traces-delay", "1s", "-enable-per-request-metrics", "-timings-out", timingsPath,
		// Who used the GPU: the exact shares, and the GPU's power as
		// dcgm-exporter serves it, its pod named as the proxy names the engine.
		"-attribution-out", attributionPath, "-dcgm", "-gpu-pod", simAddr,
		// The exact path: each request's events and share, to the second
		// collector, under the engine name the proxy gives it.
		"-hook", "unix://"+hookSocket, "-hook-engine", simAddr)
	sim, err := startProcess("vllmsim", filepath.Join(dir, "vllmsim.log"), bins.Sim, simArgs, nil)
	if err != nil {
		return nil, err
	}
	started = append(started, sim)
	if err := sim.WaitHTTP(ctx, "http://"+simAddr+"/health", 30*time.Second); err != nil {
		return nil, err
	}

	if snk, err = startSink(); err != nil {
		return nil, err
	}
	col, err := startProcess("otelcol-llm", filepath.Join(dir, "otelcol.log"), bins.Collector, []string{"--config", cfgPath}, []string{
		"PROXY_ENDPOINT=" + proxyAddr, "UPSTREAM_URL=http://" + simAddr, "METRICS_URL=http://" + simAddr + "/metrics",
		"OTLP_ENDPOINT=" + otlpAddr, "HEALTH_ENDPOINT=" + healthAddr, "SINK_URL=" + snk.url(), "LIVE_ENDPOINT=" + live,
		"STEP_TOKENS=" + strconv.Itoa(p.Engine.stepTokens()), "KV_CACHE_TOKENS=" + strconv.Itoa(16*p.Engine.KVBlocks),
		"PREFILL_FIRST=" + strconv.FormatBool(p.Engine.PrefillPriority),
	})
	if err != nil {
		return nil, err
	}
	started = append(started, col)
	if err := col.WaitHTTP(ctx, "http://"+healthAddr+"/", 60*time.Second); err != nil {
		return nil, err
	}

	progress("load: %d concurrent requests for %s", p.Load.Concurrency, p.Load.Duration)
	load, err := startProcess("llmload", filepath.Join(dir, "llmload.log"), bins.Load, p.Load.args("http://"+proxyAddr, dir), nil)
	if err != nil {
		return nil, err
	}
	started = append(started, load)
	if err := load.Wait(ctx, stopGrace); err != nil {
		return nil, err
	}

	res = &PointResult{Point: p, Dir: dir, CPUSeconds: map[string]float64{}}
	if res.requests, err = readRequests(filepath.Join(dir, "requests.ndjson")); err != nil {
		return nil, err
	}
	var finished float64
	first, last := int64(0), int64(0)
	for _, r := range res.requests {
		if !r.Interrupted {
			finished++
		}
		if r.StartUnixNano > 0 && (first == 0 || r.StartUnixNano < first) {
			first = r.StartUnixNano
		}
		last = max(last, r.StartUnixNano)
	}
	if err := snk.waitSessions(ctx, finished, 15*time.Second); err != nil {
		progress("warning: %v", err)
	}
	// The collector flushes its metrics once more as it stops; the exact
	// path's collector after the engine, whose hook sends to it.
	if err := col.Stop(stopGrace); err != nil {
		return nil, err
	}
	if err := sim.Stop(stopGrace); err != nil {
		return nil, err
	}
	if err := exactCol.Stop(stopGrace); err != nil {
		return nil, err
	}
	for _, pr := range started {
		if pr != exactCol {
			res.CPUSeconds[pr.Name] = pr.UsedCPU().Seconds()
		}
	}
	if res.Client, err = readClient(filepath.Join(dir, "llmload.json")); err != nil {
		return nil, err
	}
	startAt := time.Unix(0, first)
	res.Collector = snk.figures(startAt)
	if res.Client.RequestThroughput > 0 {
		res.WallS = float64(res.Client.Completed) / res.Client.RequestThroughput
	}
	res.Slow = checkSlow(res.requests, res.Collector.Spans)
	if res.Truth, err = readTruth(timingsPath); err != nil {
		return nil, err
	}
	res.Split = checkSplit(res.Collector.Spans, res.Truth.byTrace)
	engineTime, engineEnergy := snk.engineShares()
	if res.Attribution, err = attributionFigures(attributionPath, res.Collector.Spans, engineTime, engineEnergy); err != nil {
		return nil, err
	}
	exactTime, exactEnergy := exactSnk.engineShares()
	if res.ExactAttribution, err = attributionFigures(attributionPath, exactSnk.figures(startAt).Spans, exactTime, exactEnergy); err != nil {
		return nil, err
	}
	return res, nil
}

// readTruth reads vllmsim's -timings-out file: the queue and prefill p50
// and p99, in ms, of the requests that finished (those aborted when the
// load stopped are left out: the collector is stopped before their engine
// spans, the only timing an aborted stream has, would come), and each
// traced request's split.
func readTruth(path string) (Truth, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Truth{}, err
	}
	var queue, prefill []float64
	byTrace := map[string]truthSplit{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		var r struct {
			TraceID  string  `json:"trace_id"`
			Finish   string  `json:"finish"`
			QueueS   float64 `json:"queue_s"`
			PrefillS float64 `json:"prefill_s"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return Truth{}, fmt.Errorf("%s: %w", path, err)
		}
		if r.TraceID != "" {
			byTrace[r.TraceID] = truthSplit{queueMs: r.QueueS * 1000, prefillMs: r.PrefillS * 1000}
		}
		if r.Finish == "abort" {
			continue
		}
		if r.QueueS >= 0 {
			queue = append(queue, r.QueueS*1000)
		}
		if r.PrefillS >= 0 {
			prefill = append(prefill, r.PrefillS*1000)
		}
	}
	return Truth{Queue: exactQuantiles(queue), Prefill: exactQuantiles(prefill), Requests: len(queue), byTrace: byTrace}, nil
}

// exactQuantiles are the p50 and p99 of xs, NaN when empty, by linear
// interpolation between the closest ranks (numpy's default): the estimator
// of llmload's client figures and of the collector's, whose histograms'
// quantiles (exphist.Quantile) interpolate the same way. A point has 100
// to 300 requests, and its p99 falls between its two or three slowest,
// which can lie far apart (one long prompt): the nearest rank this once
// was took the slowest where the collector's side interpolated, and a
// c-c25 queue p99 read 60.6 ms for the truth and 41.2 ms for the collector
// on the very same 87 values.
func exactQuantiles(xs []float64) Quantiles {
	if len(xs) == 0 {
		return Quantiles{P50: math.NaN(), P99: math.NaN()}
	}
	slices.Sort(xs)
	at := func(q float64) float64 {
		rank := q * float64(len(xs)-1)
		lo := int(rank)
		if lo+1 >= len(xs) {
			return xs[len(xs)-1]
		}
		return xs[lo] + (xs[lo+1]-xs[lo])*(rank-float64(lo))
	}
	return Quantiles{P50: at(0.5), P99: at(0.99)}
}

func readRequests(path string) ([]requestRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []requestRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r requestRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

func readClient(path string) (ClientFigures, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return ClientFigures{}, err
	}
	var r llmloadResult
	if err := json.Unmarshal(data, &r); err != nil {
		return ClientFigures{}, fmt.Errorf("%s: %w", path, err)
	}
	if r.TTFT == nil || r.TPOT == nil {
		return ClientFigures{}, errors.New(path + ": no request completed")
	}
	return ClientFigures{
		Completed: r.Completed, Failed: r.Failed,
		TTFT:              Quantiles{P50: r.TTFT.P50, P99: r.TTFT.P99},
		TPOT:              Quantiles{P50: r.TPOT.P50, P99: r.TPOT.P99},
		RequestThroughput: r.RequestThroughput, OutputThroughput: r.OutputThroughput,
	}, nil
}

// checkSlow finds, for every session the client saw as slow, the span with
// its trace ID.
func checkSlow(reqs []requestRecord, spans []Span) SlowCheck {
	have := make(map[string]bool, len(spans))
	for _, s := range spans {
		have[s.TraceID] = true
	}
	var c SlowCheck
	for _, r := range reqs {
		if !r.OK || !(r.TTFTms > slowTTFTms*(1+slowMargin) || (r.OutputTokens > 1 && r.TPOTms > slowTPOTms*(1+slowMargin))) {
			continue
		}
		c.Slow++
		if have[r.TraceID] {
			c.WithSpan++
		} else if len(c.Missing) < 10 {
			c.Missing = append(c.Missing, r.TraceID)
		}
	}
	return c
}
