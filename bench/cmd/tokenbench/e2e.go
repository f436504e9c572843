// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
)

// e2eResult is the collector's cost at the demo's load: vllmsim behind the
// collector's proxy, its /metrics scraped, llmload at 200 concurrent streams.
type e2eResult struct {
	Concurrency     int     `json:"concurrency"`
	DurationSeconds float64 `json:"duration_seconds"`
	Completed       int     `json:"requests_completed"`
	Failed          int     `json:"requests_failed"`
	OutputTokens    int64   `json:"output_tokens"`
	TokensPerSecond float64 `json:"output_tokens_per_second"`
	CPUSeconds      float64 `json:"collector_cpu_seconds"`
	Cores           float64 `json:"collector_cores"`
	CPUPerMTokens   float64 `json:"collector_cpu_seconds_per_million_tokens"`
	IdleRSS         int64   `json:"collector_idle_rss_bytes"`
	RSSMedian       int64   `json:"collector_rss_median_bytes"`
	RSSMax          int64   `json:"collector_rss_max_bytes"`
	Sessions        float64 `json:"sessions_ended"`
	// Drops, from the collector's own telemetry; every one must be 0.
	Drops map[string]float64 `json:"drops"`
	// CountersExported are the event counters the collector exported (a
	// counter never incremented may be absent: zero).
	CountersExported []string `json:"counters_exported"`
	Accepted         float64  `json:"receiver_accepted_events"`
}

func (e *env) e2e(vllmsim, llmload string, concurrency int, dur time.Duration) (*e2eResult, error) {
	upstream := process.MustFreeAddr()
	// The demo's heaviest point (cmd/llmdemo: scenario b at 200, chunked
	// prefill off, prefill first, a KV pool that runs out): pre-emptions
	// and stalls.
	sim := exec.Command(vllmsim, "-addr", upstream, "-model", benchModel, "-profile", "fp16", "-kv-blocks", "4096",
		"-chunked-prefill=false", "-prefill-priority=true")
	simLog, err := os.Create(filepath.Join(e.out, "vllmsim.log"))
	if err != nil {
		return nil, err
	}
	defer simLog.Close()
	sim.Stdout, sim.Stderr = simLog, simLog
	sim.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := sim.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = sim.Process.Signal(syscall.SIGTERM); _ = sim.Wait() }()

	proxy := process.MustFreeAddr()
	extra := fmt.Sprintf(`    proxy:
      endpoint: %s
      upstream:
        endpoint: http://%s
        keepalive:
          max_idle_conns: 1024
          max_idle_conns_per_host: 1024
    vllm:
      targets: [http://%s/metrics]
      interval: 1s
`, proxy, upstream, upstream)
	a := newAddrs(e.sink.Addr())
	c, err := startCollector("e2e", e.ours, e.out, oursConfig(a, extra), a.pprof, a.telemetry, proxy, upstream)
	if err != nil {
		return nil, err
	}
	defer c.stop()
	time.Sleep(2 * time.Second)
	res := &e2eResult{Concurrency: concurrency, IdleRSS: c.rssBytes()}

	stopRSS := make(chan struct{})
	rssDone := make(chan []int64)
	go func() {
		var samples []int64
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopRSS:
				rssDone <- samples
				return
			case <-t.C:
				samples = append(samples, c.rssBytes())
			}
		}
	}()
	outFile := filepath.Join(e.out, "e2e-llmload.json")
	load := exec.CommandContext(e.ctx, llmload, "-url", "http://"+proxy, "-model", benchModel, //nolint:gosec // G204: runs the tool this program built or was pointed at by its own flag
		"-concurrency", fmt.Sprint(concurrency), "-duration", dur.String(), "-warmup", "0",
		"-ramp-up", "3s", "-prompt-tokens", "uniform:200-800", "-output-tokens", "128", "-long-share", "0.1", "-long-prompt-tokens", "3000",
		"-seed", "1", "-traceparent", "-quiet", "-out", outFile)
	load.Stdout, load.Stderr = simLog, simLog
	t0, w0 := c.cpuSeconds(), time.Now()
	if err := load.Run(); err != nil {
		close(stopRSS)
		<-rssDone
		return nil, fmt.Errorf("llmload: %w", err)
	}
	// The last sessions' outputs leave within the proxy's 20 ms batching.
	time.Sleep(500 * time.Millisecond)
	res.CPUSeconds = c.cpuSeconds() - t0
	wall := time.Since(w0).Seconds()
	close(stopRSS)
	samples := <-rssDone
	slices.Sort(samples)
	if len(samples) > 0 {
		res.RSSMedian, res.RSSMax = samples[len(samples)/2], samples[len(samples)-1]
	}
	res.Cores = res.CPUSeconds / wall
	var lr struct {
		Completed    int     `json:"completed"`
		Failed       int     `json:"failed"`
		OutputTokens int64   `json:"total_output_tokens"`
		Throughput   float64 `json:"output_throughput"`
		WindowS      float64 `json:"window_s"`
	}
	b, err := os.ReadFile(outFile)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &lr); err != nil {
		return nil, err
	}
	res.Completed, res.Failed, res.OutputTokens, res.TokensPerSecond, res.DurationSeconds =
		lr.Completed, lr.Failed, lr.OutputTokens, lr.Throughput, lr.WindowS
	if lr.OutputTokens > 0 {
		res.CPUPerMTokens = res.CPUSeconds / float64(lr.OutputTokens) * 1e6
	}
	// Exports are asynchronous: give the exporter queue a moment, then read
	// the counters.
	time.Sleep(time.Second)
	m, err := c.metrics()
	if err != nil {
		return nil, err
	}
	res.Sessions = m.sum("otelcol_processor_token_session_sessions_ended", nil)
	for _, n := range []string{
		"otelcol_receiver_token_stream_accepted_events", "otelcol_receiver_token_stream_refused_events",
		"otelcol_receiver_token_stream_rejected_events", "otelcol_processor_token_session_output_failures",
		"otelcol_processor_token_session_invalid_records", "otelcol_exporter_send_failed_log_records", "otelcol_exporter_sent_log_records",
	} {
		if m.has(n) {
			res.CountersExported = append(res.CountersExported, n)
		}
	}
	res.Accepted = m.sum("otelcol_receiver_token_stream_accepted_events", nil)
	res.Drops = map[string]float64{
		"receiver_refused_events":        m.sum("otelcol_receiver_token_stream_refused_events", nil),
		"receiver_rejected_events":       m.sum("otelcol_receiver_token_stream_rejected_events", nil),
		"receiver_refused_log_records":   m.sum("otelcol_receiver_refused_log_records", nil),
		"receiver_refused_metric_points": m.sum("otelcol_receiver_refused_metric_points", nil),
		"token_session_output_failures":  m.sum("otelcol_processor_token_session_output_failures", nil),
		"token_session_invalid_records":  m.sum("otelcol_processor_token_session_invalid_records", nil),
		"exporter_send_failed":           m.sumPrefix("otelcol_exporter_send_failed_"),
		"exporter_enqueue_failed":        m.sumPrefix("otelcol_exporter_enqueue_failed_"),
	}
	log.Printf("e2e: %d requests (%d failed), %d output tokens in %.1fs; collector %.2f CPU-s (%.2f cores, %.1f CPU-s per M tokens), RSS idle %d MB, median %d MB, max %d MB; drops %v",
		res.Completed, res.Failed, res.OutputTokens, res.DurationSeconds, res.CPUSeconds, res.Cores, res.CPUPerMTokens,
		res.IdleRSS>>20, res.RSSMedian>>20, res.RSSMax>>20, res.Drops)
	return res, nil
}
