// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/llamacpp"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
)

// realCollectorConfig is the collector of make demo-real: the proxy in
// front of llama-server, its /metrics scraped, every session kept.
//
//go:embed real-collector.yaml
var realCollectorConfig []byte

// RealSetup is the engine of make demo-real: llama.cpp's llama-server, as
// tools/llama-server.sh builds it, with the tiny random-weight model the
// tests use (its timing, protocol and scheduling are real; its text is
// not).
type RealSetup struct {
	LlamaDir string // the build (tools/llama-server.sh prints it)
	Slots    int    // --parallel: requests beyond it wait for a slot
	Threads  int
	Context  int // tokens, all slots together
}

// RealPoint is one load of the real story: Concurrency clients for
// Duration, chat requests of PromptWords words (uniform) and OutputTokens.
type RealPoint struct {
	Concurrency  int           `json:"concurrency"`
	Duration     time.Duration `json:"duration_ns"`
	PromptWords  string        `json:"prompt_words"`
	OutputTokens int           `json:"output_tokens"`
}

// DefaultRealPoints load a server of slots slots below, at and beyond its
// slots, so that requests wait for one.
func DefaultRealPoints(slots int, duration time.Duration) []RealPoint {
	var pts []RealPoint
	for _, c := range []int{1, slots, 2 * slots, 4 * slots} {
		pts = append(pts, RealPoint{Concurrency: c, Duration: duration, PromptWords: "uniform:50-400", OutputTokens: 32})
	}
	return pts
}

// Spread is a distribution of differences, in ms: the median, the 90th
// percentile and the largest, of absolute values.
type Spread struct {
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	Max float64 `json:"max_ms"`
}

// MarshalJSON writes NaN (nothing measured) as null, as Quantiles does.
func (s Spread) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"p50_ms": orNull(s.P50), "p90_ms": orNull(s.P90), "max_ms": orNull(s.Max)})
}

// orNull is v, or nil (JSON's null) when v is NaN or infinite.
func orNull(v float64) any {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return v
}

func spreadOf(diffs []float64) Spread {
	if len(diffs) == 0 {
		return Spread{math.NaN(), math.NaN(), math.NaN()}
	}
	slices.Sort(diffs)
	at := func(q float64) float64 { return diffs[int(math.Ceil(q*float64(len(diffs))))-1] }
	return Spread{P50: at(0.5), P90: at(0.9), Max: diffs[len(diffs)-1]}
}

// RealResult is one point of the real story: the client's figures, the
// collector's, and llama.cpp's own, request by request (by trace ID).
type RealResult struct {
	Point RealPoint `json:"point"`
	// Requests the client made (warm-up none), Failed those that failed,
	// Unreachable those the proxy answered 502 (an engine that answered).
	Requests    int `json:"requests"`
	Failed      int `json:"failed"`
	Unreachable int `json:"unreachable"`
	// Matched: completed requests with a session span of the same trace.
	Matched int `json:"matched"`
	// By timing source of the matched sessions ("none": without).
	BySource map[string]int `json:"by_source"`
	// TTFT and TPOT, client and collector, p50 and p99.
	ClientTTFT    Quantiles `json:"client_ttft"`
	CollectorTTFT Quantiles `json:"collector_ttft"`
	ClientTPOT    Quantiles `json:"client_tpot"`
	CollectorTPOT Quantiles `json:"collector_tpot"`
	// The collector against the client, session by session; Within is the
	// share within 1 ms or 2%.
	TTFTDiff   Spread  `json:"ttft_collector_vs_client"`
	TPOTDiff   Spread  `json:"tpot_collector_vs_client"`
	TTFTWithin float64 `json:"ttft_within_1ms_or_2pct"` // 0 when none was measured
	TPOTWithin float64 `json:"tpot_within_1ms_or_2pct"`
	// The collector's TPOT against llama.cpp's (predicted_ms over
	// predicted_n − 1), session by session.
	EngineTPOT     Quantiles `json:"llamacpp_tpot"`
	EngineTPOTDiff Spread    `json:"tpot_collector_vs_llamacpp"`
	// llama.cpp's prefill (prompt_ms) and the queue derived from it.
	Prefill Quantiles `json:"llamacpp_prefill"`
	Queue   Quantiles `json:"derived_queue"`
	// WaitingMax is the most requests llama.cpp's /metrics said were
	// waiting for a slot when a session started; -1 when none said.
	WaitingMax float64 `json:"waiting_max"`
}

// RealReport is make demo-real's report.json.
type RealReport struct {
	StartedAt time.Time     `json:"started_at"`
	Release   string        `json:"llamacpp_release"`
	Setup     RealSetup     `json:"setup"`
	Points    []*RealResult `json:"points"`
	WallS     float64       `json:"wall_s"`
	LoadAvg   [2]float64    `json:"load_avg"`
}

// within: the collector's figure is the client's within 1 ms or 2%, the
// end-to-end tests' bar.
func within(collectorMs, clientMs float64) bool {
	return math.Abs(collectorMs-clientMs) <= max(1, 0.02*clientMs)
}

// RunReal runs make demo-real: one llama-server, the collector in front of
// it, and llmload through the proxy at each point in turn; then writes
// out/report.md and out/report.json. Every process it started is stopped
// when it returns.
func RunReal(ctx context.Context, bins Binaries, setup RealSetup, points []RealPoint, out string, progress Progress) (rep *RealReport, err error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	rep = &RealReport{StartedAt: time.Now().UTC(), Setup: setup}
	rep.LoadAvg[0] = loadAvg()
	if rep.Release, err = llamacpp.ReleaseOf(setup.LlamaDir); err != nil {
		return nil, err
	}
	progress("llama.cpp %s: making the tiny random-weight model", rep.Release)
	model, err := llamacpp.MakeModel(setup.LlamaDir, out)
	if err != nil {
		return nil, err
	}
	defer os.Remove(model)
	engine, err := llamacpp.Run(ctx, setup.LlamaDir, model, llamacpp.Options{
		Parallel: setup.Slots, Context: setup.Context, Threads: setup.Threads, Log: filepath.Join(out, "llama-server.log"),
	})
	if err != nil {
		return nil, err
	}
	var col *process.Process
	var snk *sink
	defer func() {
		// The collector first, so that it flushes; the sink last.
		if col != nil {
			err = errors.Join(err, col.Stop(stopGrace))
		}
		err = errors.Join(err, engine.Stop())
		if snk != nil {
			snk.close()
		}
	}()
	progress("llama-server on %s: --parallel %d, --threads %d, --ctx-size %d", engine.URL, setup.Slots, setup.Threads, setup.Context)

	cfgPath := filepath.Join(out, "collector.yaml")
	if err := os.WriteFile(cfgPath, realCollectorConfig, 0o644); err != nil {
		return nil, err
	}
	proxyAddr, err := process.FreeAddr()
	if err != nil {
		return nil, err
	}
	healthAddr, err := process.FreeAddr()
	if err != nil {
		return nil, err
	}
	otlpAddr, err := process.FreeAddr()
	if err != nil {
		return nil, err
	}
	if snk, err = startSink(); err != nil {
		return nil, err
	}
	col, err = startProcess("otelcol-llm", filepath.Join(out, "otelcol.log"), bins.Collector, []string{"--config", cfgPath}, []string{
		"PROXY_ENDPOINT=" + proxyAddr, "UPSTREAM_URL=" + engine.URL, "HEALTH_ENDPOINT=" + healthAddr, "SINK_URL=" + snk.url(),
		"OTLP_ENDPOINT=" + otlpAddr,
	})
	if err != nil {
		return nil, err
	}
	if err := col.WaitHTTP(ctx, "http://"+healthAddr+"/", 60*time.Second); err != nil {
		return nil, err
	}

	sessions := 0.0
	for i, p := range points {
		dir := filepath.Join(out, "points", "c"+strconv.Itoa(p.Concurrency))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return rep, err
		}
		progress("[%d/%d] %d concurrent chat requests for %s (%s prompt words, %d output tokens)", i+1, len(points),
			p.Concurrency, p.Duration, p.PromptWords, p.OutputTokens)
		load, err := startProcess("llmload", filepath.Join(dir, "llmload.log"), bins.Load, []string{
			"-url", "http://" + proxyAddr, "-model", "tiny", "-quiet", "-traceparent",
			"-concurrency", strconv.Itoa(p.Concurrency), "-duration", p.Duration.String(),
			"-prompt-tokens", p.PromptWords, "-output-tokens", strconv.Itoa(p.OutputTokens),
			"-out", filepath.Join(dir, "llmload.json"), "-requests-out", filepath.Join(dir, "requests.ndjson"),
		}, nil)
		if err != nil {
			return rep, err
		}
		if err := load.Wait(ctx, stopGrace); err != nil {
			return rep, err
		}
		reqs, err := readRequests(filepath.Join(dir, "requests.ndjson"))
		if err != nil {
			return rep, err
		}
		for _, r := range reqs {
			if !r.Interrupted {
				sessions++
			}
		}
		if err := snk.waitSessions(ctx, sessions, 15*time.Second); err != nil {
			progress("warning: %v", err)
		}
		spans, err := waitSpans(ctx, snk, reqs, 15*time.Second)
		if err != nil {
			progress("warning: %v", err)
		}
		res := matchRequests(p, reqs, spans)
		rep.Points = append(rep.Points, res)
		progress("done: %d requests, %d failed (%d the proxy's 502); TTFT p50 client %s / collector %s ms, %.0f%% within 1 ms or 2%%; "+
			"TPOT p50 client %s / collector %s / llama.cpp %s ms; queue p99 %s ms; waiting at most %g",
			res.Requests, res.Failed, res.Unreachable, f1(res.ClientTTFT.P50), f1(res.CollectorTTFT.P50), 100*res.TTFTWithin,
			f1(res.ClientTPOT.P50), f1(res.CollectorTPOT.P50), f1(res.EngineTPOT.P50), f1(res.Queue.P99), res.WaitingMax)
	}
	rep.WallS = time.Since(rep.StartedAt).Seconds()
	rep.LoadAvg[1] = loadAvg()
	if err := writeJSON(rep, filepath.Join(out, "report.json")); err != nil {
		return rep, err
	}
	return rep, os.WriteFile(filepath.Join(out, "report.md"), []byte(realMarkdown(rep)), 0o644)
}

// waitSpans waits until the sink has a session span for every request that
// completed (the collector exports a span in its next batch after the
// session's end), or the timeout passes, and returns the spans.
func waitSpans(ctx context.Context, snk *sink, reqs []requestRecord, timeout time.Duration) (map[string]Span, error) {
	deadline := time.Now().Add(timeout)
	for {
		spans, missing := snk.spansByTrace(), 0
		for _, q := range reqs {
			if _, ok := spans[q.TraceID]; q.OK && !q.Interrupted && !ok {
				missing++
			}
		}
		if missing == 0 {
			return spans, nil
		}
		if time.Now().After(deadline) {
			return spans, fmt.Errorf("%d completed requests without a session span after %s", missing, timeout)
		}
		select {
		case <-ctx.Done():
			return spans, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// matchRequests sets each completed request beside its session span.
func matchRequests(p RealPoint, reqs []requestRecord, spans map[string]Span) *RealResult {
	r := &RealResult{Point: p, BySource: map[string]int{}, WaitingMax: -1}
	var clientTTFT, colTTFT, clientTPOT, colTPOT, engineTPOT, prefill, queue []float64
	var ttftDiff, tpotDiff, engineDiff []float64
	ttftIn, tpotIn := 0, 0
	for _, q := range reqs {
		if q.Warmup || q.Interrupted {
			continue
		}
		r.Requests++
		if !q.OK {
			r.Failed++
			if q.Error == "http 502" { // llmload's class of a 502 answer
				r.Unreachable++
			}
			continue
		}
		sp, ok := spans[q.TraceID]
		if !ok {
			continue
		}
		r.Matched++
		src := sp.TimingSource
		if src == "" {
			src = "none"
		}
		r.BySource[src]++
		r.WaitingMax = max(r.WaitingMax, sp.WaitingStart)
		clientTTFT, colTTFT = append(clientTTFT, q.TTFTms), append(colTTFT, sp.TTFTms)
		ttftDiff = append(ttftDiff, math.Abs(sp.TTFTms-q.TTFTms))
		if within(sp.TTFTms, q.TTFTms) {
			ttftIn++
		}
		if q.OutputTokens > 1 {
			clientTPOT, colTPOT = append(clientTPOT, q.TPOTms), append(colTPOT, sp.TPOTms)
			tpotDiff = append(tpotDiff, math.Abs(sp.TPOTms-q.TPOTms))
			if within(sp.TPOTms, q.TPOTms) {
				tpotIn++
			}
		}
		if sp.TimingSource != "" {
			prefill, queue = append(prefill, sp.PrefillMs), append(queue, sp.QueueMs)
			if sp.OutputTokens > 1 {
				e := sp.DecodeMs / float64(sp.OutputTokens-1)
				engineTPOT, engineDiff = append(engineTPOT, e), append(engineDiff, math.Abs(sp.TPOTms-e))
			}
		}
	}
	r.ClientTTFT, r.CollectorTTFT = exactQuantiles(clientTTFT), exactQuantiles(colTTFT)
	r.ClientTPOT, r.CollectorTPOT, r.EngineTPOT = exactQuantiles(clientTPOT), exactQuantiles(colTPOT), exactQuantiles(engineTPOT)
	r.TTFTDiff, r.TPOTDiff, r.EngineTPOTDiff = spreadOf(ttftDiff), spreadOf(tpotDiff), spreadOf(engineDiff)
	r.TTFTWithin, r.TPOTWithin = share(ttftIn, len(ttftDiff)), share(tpotIn, len(tpotDiff))
	r.Prefill, r.Queue = exactQuantiles(prefill), exactQuantiles(queue)
	return r
}

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

func f3(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return fmt.Sprintf("%.3f", v)
}

func realMarkdown(rep *RealReport) string {
	var b strings.Builder
	s := rep.Setup
	fmt.Fprintf(&b, "# make demo-real report\n\n")
	fmt.Fprintf(&b, "Started %s on %d CPUs (load average %.2f → %.2f), %d points in %.0f s.\n\n", rep.StartedAt.Format("2006-01-02 15:04:05 UTC"),
		runtime.NumCPU(), rep.LoadAvg[0], rep.LoadAvg[1], len(rep.Points), rep.WallS)
	fmt.Fprintf(&b, "The engine is real: llama.cpp's `llama-server` (%s, built by `tools/llama-server.sh`), `--parallel %d --threads %d "+
		"--ctx-size %d`, continuous batching, `/metrics` scraped every second. Its model is a tiny random-weight llama "+
		"(`internal/harness/llamacpp/make_model.py`): the text is nonsense, the timing, protocol and scheduling are llama.cpp's. "+
		"The collector's `token_stream` proxy is in front of it and `token_session` keeps every session; `llmload` sends "+
		"streamed chat requests through the proxy and records what it measured of each, by trace ID.\n\n",
		rep.Release, s.Slots, s.Threads, s.Context)
	b.WriteString("## The collector against the client\n\n")
	b.WriteString("Every completed request's session span beside the client's own measurement of the same request. " +
		"*Within* is the share within 1 ms or 2% (the end-to-end tests' bar).\n\n")
	b.WriteString("| clients | requests | failed (502) | sessions | TTFT p50 / p99 client | collector | \\|Δ\\| p50 / p90 / max | within | TPOT p50 / p99 client | collector | \\|Δ\\| p50 / p90 / max | within |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Points {
		fmt.Fprintf(&b, "| %d | %d | %d (%d) | %d | %s / %s | %s / %s | %s / %s / %s | %.0f%% | %s / %s | %s / %s | %s / %s / %s | %.0f%% |\n",
			r.Point.Concurrency, r.Requests, r.Failed, r.Unreachable, r.Matched,
			f1(r.ClientTTFT.P50), f1(r.ClientTTFT.P99), f1(r.CollectorTTFT.P50), f1(r.CollectorTTFT.P99),
			f3(r.TTFTDiff.P50), f3(r.TTFTDiff.P90), f3(r.TTFTDiff.Max), 100*r.TTFTWithin,
			f1(r.ClientTPOT.P50), f1(r.ClientTPOT.P99), f1(r.CollectorTPOT.P50), f1(r.CollectorTPOT.P99),
			f3(r.TPOTDiff.P50), f3(r.TPOTDiff.P90), f3(r.TPOTDiff.Max), 100*r.TPOTWithin)
	}
	b.WriteString("\n## The collector against llama.cpp's own timings\n\n")
	b.WriteString("llama.cpp puts `timings` on each answer's last chunk: `prompt_ms` (prefill, once the request has a slot) and " +
		"`predicted_ms` over `predicted_n` tokens. The sessions carry them (`llm.session.timing_source` `llamacpp_timings`); " +
		"llama.cpp has no queue figure, so the collector derives it as its TTFT less `prompt_ms`. *Waiting* is the most requests " +
		"llama.cpp's `/metrics` (`llamacpp:requests_deferred`) said were waiting for a slot when a session started.\n\n")
	b.WriteString("| clients | timing source | prefill p50 / p99 | derived queue p50 / p99 | TPOT p50 collector | llama.cpp | \\|Δ\\| p50 / p90 / max | waiting |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Points {
		var src []string
		for k, n := range r.BySource {
			src = append(src, fmt.Sprintf("%s %d", k, n))
		}
		slices.Sort(src)
		waiting := "–"
		if r.WaitingMax >= 0 {
			waiting = strconv.FormatFloat(r.WaitingMax, 'g', -1, 64)
		}
		fmt.Fprintf(&b, "| %d | %s | %s / %s | %s / %s | %s | %s | %s / %s / %s | %s |\n", r.Point.Concurrency, strings.Join(src, ", "),
			f1(r.Prefill.P50), f1(r.Prefill.P99), f1(r.Queue.P50), f1(r.Queue.P99), f3(r.CollectorTPOT.P50), f3(r.EngineTPOT.P50),
			f3(r.EngineTPOTDiff.P50), f3(r.EngineTPOTDiff.P90), f3(r.EngineTPOTDiff.Max), waiting)
	}
	b.WriteString("\nAll times in ms. Beyond the slots the queue grows and the prefill does not: that is the wait for a slot, " +
		"which the client only sees as a long TTFT. The collector's TPOT is the proxy's (first to last token over n − 1), " +
		"llama.cpp's is its own decode clock; they differ by the relay's jitter.\n")
	return b.String()
}
