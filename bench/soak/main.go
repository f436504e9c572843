// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

// Command soak runs the collector as an agent beside an engine for a long
// time under steady load and judges whether it holds: vllmsim, the
// collector (token_stream proxy in front of vllmsim and its /metrics
// scraped, token_session, batch, debug) and llmload at 200 concurrent
// streams with output lengths drawn from a range. Every -interval it samples
// the collector's RSS, CPU, goroutines and open files. At the end it writes
// report.md, soak.svg and soak.json to -out and prints the report's last
// line:
//
//	soak: <N> requests, <N> sessions counted, <N> lost, RSS <start> -> <end> MiB, goroutines <start> -> <end>
//
// It exits 1 when a request has no session or RSS or goroutines grew
// without bound (judge.go says how that is judged), 2 when it could not run.
//
// Run it with `make soak` (DURATION, default 15m).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/selfmetrics"
)

type options struct {
	collector    string
	out          string
	duration     time.Duration
	interval     time.Duration
	concurrency  int
	outputTokens string
	promptTokens string
	// churn is how many new engine, model and tenant names a second the
	// churner makes (0: none).
	churn int
}

func main() {
	var o options
	flag.StringVar(&o.collector, "collector", "bin/otelcol-llm", "the collector binary (make build)")
	flag.StringVar(&o.out, "out", "bench/results/soak", "folder for report.md, soak.svg, soak.json and, under run/, the processes' configs and logs")
	flag.DurationVar(&o.duration, "duration", 15*time.Minute, "how long llmload keeps 200 streams open")
	flag.DurationVar(&o.interval, "interval", 10*time.Second, "time between two samples of the collector")
	flag.IntVar(&o.concurrency, "concurrency", 200, "concurrent streams")
	flag.StringVar(&o.outputTokens, "output-tokens", "uniform:16-512", "output length distribution (llmload's -output-tokens): a range, so that streams do not end in waves")
	flag.StringVar(&o.promptTokens, "prompt-tokens", "uniform:32-1024", "prompt length distribution (llmload's -prompt-tokens)")
	flag.IntVar(&o.churn, "churn", 0, "new engine, model and tenant names a second, each ending a session through the HTTP hook beside the load, "+
		"with engine_health on the session metrics and the forgetting times compressed; at the end a failing engine must be ejected (0: off)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	failed, err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (failed bool, err error) {
	runDir := filepath.Join(o.out, "run")
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return false, err
	}
	collectorBin, err := filepath.Abs(o.collector)
	if err != nil {
		return false, err
	}
	if _, err := os.Stat(collectorBin); err != nil {
		return false, fmt.Errorf("collector: %w (make build)", err)
	}
	tools := map[string]string{}
	for _, cmd := range []string{"vllmsim", "llmload"} {
		tools[cmd] = filepath.Join(runDir, cmd)
		if b, err := exec.Command("go", "build", "-o", tools[cmd], "./cmd/"+cmd).CombinedOutput(); err != nil { //nolint:gosec // G204: go build of this repository's own commands
			return false, fmt.Errorf("go build ./cmd/%s: %w\n%s", cmd, err, b)
		}
	}
	var a addrs
	a.churn = o.churn > 0
	for _, p := range []*string{&a.sim, &a.proxy, &a.otlp, &a.pprof, &a.telemetry, &a.hooks, &a.health} {
		if *p, err = process.FreeAddr(); err != nil {
			return false, err
		}
	}

	sim, err := process.Start("vllmsim", tools["vllmsim"], []string{"-addr", a.sim, "-max-num-seqs", strconv.Itoa(o.concurrency + 56)},
		process.Options{Log: filepath.Join(runDir, "vllmsim.log")})
	if err != nil {
		return false, err
	}
	defer func() { _ = sim.Stop(10 * time.Second) }() // how it stopped is the collector's question, below
	if err := sim.WaitListening(a.sim, 30*time.Second); err != nil {
		return false, fmt.Errorf("vllmsim: %w", err)
	}
	cfgPath := filepath.Join(runDir, "collector.yaml")
	if err := os.WriteFile(cfgPath, []byte(collectorConfig(a)), 0o644); err != nil {
		return false, err
	}
	col, err := process.Start("collector", collectorBin, []string{"--config", cfgPath}, process.Options{Log: filepath.Join(runDir, "collector.log")})
	if err != nil {
		return false, err
	}
	defer func() { _ = col.Stop(30 * time.Second) }() // the clean stop is checked where it counts
	for _, addr := range []string{a.proxy, a.telemetry, a.pprof} {
		if err := col.WaitListening(addr, time.Minute); err != nil {
			return false, fmt.Errorf("collector: %w", err)
		}
	}

	s := &sampler{col: col, pprof: a.pprof}
	samplingDone := make(chan struct{})
	samplingCtx, stopSampling := context.WithCancel(ctx)
	go func() { s.run(samplingCtx, o.interval); close(samplingDone) }()
	defer func() { stopSampling(); <-samplingDone }()

	fmt.Fprintf(os.Stderr, "soak: %d streams for %s through the proxy at %s; samples every %s; logs in %s\n",
		o.concurrency, o.duration, a.proxy, o.interval, runDir)
	loadOut := filepath.Join(runDir, "llmload.json")
	loadStart := time.Since(col.Started)
	load, err := process.Start("llmload", tools["llmload"], []string{
		"-url", "http://" + a.proxy, "-model", "meta-llama/Llama-3.1-8B-Instruct", "-endpoint", "chat",
		"-concurrency", strconv.Itoa(o.concurrency), "-ramp-up", "10s", "-duration", o.duration.String(),
		"-prompt-tokens", o.promptTokens, "-output-tokens", o.outputTokens, "-timeout", "5m",
		"-quiet", "-out", loadOut,
	}, process.Options{Log: filepath.Join(runDir, "llmload.log")})
	if err != nil {
		return false, err
	}
	churn := &churner{url: "http://" + a.hooks + "/v1/token-events", rate: o.churn}
	churnCtx, stopChurn := context.WithCancel(ctx)
	churnDone := make(chan struct{})
	go func() {
		if a.churn {
			churn.run(churnCtx)
		}
		close(churnDone)
	}()
	select {
	case <-load.Exited():
	case <-ctx.Done():
		_ = load.Stop(10 * time.Second)
	}
	stopChurn()
	<-churnDone
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	loadEnd := time.Since(col.Started)
	if code := load.Cmd.ProcessState.ExitCode(); code != 0 {
		return false, fmt.Errorf("llmload exited %d (log: %s)", code, load.LogPath)
	}
	var lr loadResult
	if err := readJSON(loadOut, &lr); err != nil {
		return false, fmt.Errorf("llmload's result: %w", err)
	}
	var probe *ejectionProbe
	if a.churn {
		// Months of names are behind it: the judge must still take a
		// failing engine out.
		p := probeEjection(ctx, churn.url, a.health, time.Minute)
		probe = &p
	}
	requests := lr.Completed + lr.Failed + lr.WarmupRequests + churn.posted
	if probe != nil {
		requests += probe.Sessions
	}

	// Sessions end when their end event has passed the proxy's batcher and
	// token_session: wait until none is active and every request's session is
	// counted, or a minute.
	var tel map[string]float64
	settle := time.Now().Add(time.Minute)
	for {
		tel, err = selfmetrics.Values(a.telemetry)
		if err == nil && sumPrefix(tel, metricSessionsActive) == 0 && int(sumPrefix(tel, metricSessionsEnded)) >= requests {
			break
		}
		if time.Now().After(settle) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		return false, fmt.Errorf("collector's telemetry: %w", err)
	}
	s.sample()
	stopSampling()
	<-samplingDone
	cleanStop := !errors.Is(col.Stop(30*time.Second), process.ErrKilled)

	samples := s.all()
	if len(samples) == 0 {
		return false, errors.New("no sample of the collector was taken")
	}
	sessions := int(sumPrefix(tel, metricSessionsEnded))
	res := outcome{
		Requests: requests, Sessions: sessions, Lost: max(requests-sessions, 0),
		RSSStart: samples[0].RSSMiB, RSSEnd: samples[len(samples)-1].RSSMiB,
		GoroutineStart: samples[0].Goroutines, GoroutineEnd: samples[len(samples)-1].Goroutines,
	}
	growths := judge(samples, loadStart, loadEnd)
	fails := failures(res, growths)
	if !cleanStop {
		fails = append(fails, "the collector did not stop within 30 s of SIGTERM")
	}
	if probe != nil && !probe.Ejected {
		fails = append(fails, fmt.Sprintf("after the churn, a failing engine was not ejected within %.0f s (its state: %s)", probe.AfterS, probe.State))
	}
	if churn.failed > 0 {
		fails = append(fails, fmt.Sprintf("%d of the churner's batches were not taken", churn.failed))
	}
	r := report{
		Options: o, LoadStart: loadStart, LoadEnd: loadEnd, Outcome: res, Growth: growths, Failures: fails, Samples: samples,
		Load: lr, Telemetry: pick(tel), CleanStop: cleanStop, Churned: churn.posted, Ejection: probe,
	}
	if err := r.write(o.out); err != nil {
		return false, err
	}
	fmt.Println(res.lastLine())
	return len(fails) > 0, nil
}

// addrs are the loopback addresses of one soak run, and whether it churns
// names (then the hooks and engine_health listen too).
type addrs struct {
	sim, proxy, otlp, pprof, telemetry, hooks, health string
	churn                                             bool
}

// collectorConfig is an agent's pipeline: the proxy in front of the engine
// and its /metrics scraped, memory_limiter, token_session (1 % of normal
// sessions kept, as in production), batch, and a debug exporter at basic
// verbosity standing for the backend. With churn, the HTTP hook takes the
// churner's sessions and engine_health judges the engines from the session
// metrics (flushed every second) and stall alerts, with the times
// compressed: token_session forgets a model, engine or tenant after 30 s
// where the default is an hour, engine_health an engine with nothing new
// after 10 s where the default is 300 s.
func collectorConfig(a addrs) string {
	_, telemetryPort, _ := strings.Cut(a.telemetry, ":")
	hooks, health, healthExporter, metrics := "", "", "", "{flush_interval: 10s}"
	if a.churn {
		hooks = fmt.Sprintf("\n    hooks:\n      http: {endpoint: %s}", a.hooks)
		health = fmt.Sprintf("\n  engine_health:\n    endpoint: %s\n    window: 1s\n    min_sessions: 5\n"+
			"    eject: {base_time: 2s, max_time: 4s, max_percent: 50}", a.health)
		healthExporter, metrics = ", engine_health", "{flush_interval: 1s, forget_after: 30s}"
	}
	return fmt.Sprintf(`receivers:
  token_stream:%[6]s
    proxy:
      endpoint: %[2]s
      upstream:
        endpoint: http://%[1]s
    vllm:
      targets: [http://%[1]s/metrics]
      interval: 1s
  otlp:
    protocols:
      grpc: {endpoint: %[3]s}
processors:
  memory_limiter: {check_interval: 1s, limit_mib: 1024, spike_limit_mib: 256}
  token_session:
    sampling: {normal_percent: 1}
    metrics: %[9]s
  batch:
exporters:
  debug: {verbosity: basic}%[7]s
extensions:
  pprof: {endpoint: %[4]s}
service:
  extensions: [pprof]
  telemetry:
    logs: {level: warn}
    metrics:
      level: normal
      readers:
        - pull: {exporter: {prometheus: {host: 127.0.0.1, port: %[5]s}}}
  pipelines:
    logs:
      receivers: [token_stream]
      processors: [memory_limiter, token_session, batch]
      exporters: [debug%[8]s]
    metrics:
      receivers: [token_stream]
      processors: [memory_limiter, token_session, batch]
      exporters: [debug%[8]s]
    traces:
      receivers: [otlp]
      processors: [memory_limiter, token_session, batch]
      exporters: [debug]
`, a.sim, a.proxy, a.otlp, a.pprof, telemetryPort, hooks, health, healthExporter, metrics)
}

const (
	metricSessionsEnded  = "otelcol_processor_token_session_sessions_ended"
	metricSessionsActive = "otelcol_processor_token_session_sessions_active"
)

// sumPrefix sums the families whose name starts with prefix (the
// Prometheus exporter adds _total and unit suffixes).
func sumPrefix(m map[string]float64, prefix string) float64 {
	var v float64
	for name, x := range m {
		if strings.HasPrefix(name, prefix) {
			v += x
		}
	}
	return v
}

// pick keeps the collector's counters a reader of the report wants to see.
func pick(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, prefix := range []string{
		metricSessionsEnded, "otelcol_receiver_token_stream_", "otelcol_processor_token_session_output_failures",
		"otelcol_processor_token_session_disorder_events", "otelcol_processor_refused", "otelcol_exporter_send_failed",
		"otelcol_exporter_engine_health_",
	} {
		for name, v := range m {
			// What was bounded or forgotten, wherever it was kept.
			if strings.HasPrefix(name, prefix) || strings.Contains(name, "overflow") || strings.Contains(name, "forgotten") {
				out[name] = v
			}
		}
	}
	return out
}

// sampler reads the collector every interval.
type sampler struct {
	col   *process.Process
	pprof string

	mu       sync.Mutex
	samples  []sample
	lastCPU  time.Duration
	lastWall time.Time
}

func (s *sampler) run(ctx context.Context, interval time.Duration) {
	s.sample()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.sample()
		}
	}
}

func (s *sampler) sample() {
	now := time.Now()
	rss, err1 := s.col.RSS()
	cpu, err2 := s.col.CPU()
	fds, err3 := s.col.OpenFiles()
	gor, err4 := goroutines(s.pprof)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		fmt.Fprintln(os.Stderr, "soak: sample:", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	at := now.Sub(s.col.Started)
	smp := sample{At: at, AtSeconds: at.Seconds(), RSSMiB: float64(rss) / (1 << 20), Goroutines: gor, OpenFiles: fds}
	if !s.lastWall.IsZero() {
		smp.CPUPercent = 100 * (cpu - s.lastCPU).Seconds() / now.Sub(s.lastWall).Seconds()
	}
	s.lastCPU, s.lastWall = cpu, now
	s.samples = append(s.samples, smp)
}

func (s *sampler) all() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...)
}

// goroutines reads the goroutine count from the pprof extension: the first
// line of /debug/pprof/goroutine?debug=1 is "goroutine profile: total N".
func goroutines(pprofAddr string) (int, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + pprofAddr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, ok := strings.CutPrefix(strings.TrimSpace(line), "goroutine profile: total ")
	if !ok {
		return 0, fmt.Errorf("goroutine profile: unexpected first line %q", line)
	}
	return strconv.Atoi(n)
}

// loadResult is the part of llmload's -out JSON the soak reads.
type loadResult struct {
	Completed      int            `json:"completed"`
	Failed         int            `json:"failed"`
	WarmupRequests int            `json:"warmup_requests"`
	Errors         map[string]int `json:"errors"`
	WindowS        float64        `json:"window_s"`
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// report is what a soak run writes.
type report struct {
	Options   options            `json:"-"`
	LoadStart time.Duration      `json:"-"`
	LoadEnd   time.Duration      `json:"-"`
	Outcome   outcome            `json:"outcome"`
	Growth    []growth           `json:"growth"`
	Failures  []string           `json:"failures"`
	CleanStop bool               `json:"clean_stop"`
	Load      loadResult         `json:"llmload"`
	Telemetry map[string]float64 `json:"collector_telemetry"`
	// Churned are the churner's sessions, each with new names; Ejection
	// what the probe after them saw (nil without -churn).
	Churned  int            `json:"churned_sessions"`
	Ejection *ejectionProbe `json:"ejection_after_churn,omitempty"`
	Samples  []sample       `json:"samples"`
}

func (r report) write(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "soak.json"), b, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "soak.svg"), []byte(plotSVG(r.Samples, r.LoadStart, r.LoadEnd)), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(r.markdown()), 0o644)
}

func (r report) markdown() string {
	var b strings.Builder
	o := r.Options
	verdict := "**passed**"
	if len(r.Failures) > 0 {
		verdict = "**failed**: " + strings.Join(r.Failures, "; ")
	}
	fmt.Fprintf(&b, "# Soak: the collector under %d concurrent streams for %s\n\n", o.concurrency, o.duration)
	fmt.Fprintf(&b, "%s, %s/%s, %d CPUs. Verdict: %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), verdict)
	fmt.Fprintf(&b, "`vllmsim` → the collector's `token_stream` proxy (and its `/metrics` scraped every second) → `memory_limiter`, "+
		"`token_session` (1 %% of normal sessions kept), `batch` → `debug`; `llmload` keeps %d chat streams open, prompts `%s` "+
		"and outputs `%s` tokens. The collector is sampled every %s: RSS and open files from `/proc`, CPU as utime+stime over "+
		"the interval, goroutines from the `pprof` extension.\n\n", o.concurrency, o.promptTokens, o.outputTokens, o.interval)
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| requests (llmload: completed %d, failed %d) | %d |\n", r.Load.Completed, r.Load.Failed, r.Outcome.Requests)
	fmt.Fprintf(&b, "| sessions counted (`token_session` sessions ended, all outcomes) | %d |\n", r.Outcome.Sessions)
	fmt.Fprintf(&b, "| lost (requests without a session) | %d |\n", r.Outcome.Lost)
	fmt.Fprintf(&b, "| RSS first → last sample | %.1f → %.1f MiB |\n", r.Outcome.RSSStart, r.Outcome.RSSEnd)
	fmt.Fprintf(&b, "| goroutines first → last sample | %d → %d |\n", r.Outcome.GoroutineStart, r.Outcome.GoroutineEnd)
	fmt.Fprintf(&b, "| collector stopped cleanly on SIGTERM | %t |\n", r.CleanStop)
	if len(r.Load.Errors) > 0 {
		fmt.Fprintf(&b, "| llmload errors | %v |\n", r.Load.Errors)
	}
	if o.churn > 0 {
		fmt.Fprintf(&b, "| churned sessions (a new engine, model and tenant each, %d a second, through the HTTP hook) | %d |\n", o.churn, r.Churned)
	}
	if p := r.Ejection; p != nil {
		fmt.Fprintf(&b, "| after the churn, a failing engine ejected by `engine_health` | %t, after %.1f s (last state %s) |\n", p.Ejected, p.AfterS, p.State)
	}
	fmt.Fprintf(&b, "\n## Growth\n\nThe load ran from %.0f s to %.0f s of the collector's life. Its samples after the first %s "+
		"(warm-up) are cut into thirds, and a series grew without bound when the median of the last third exceeds the middle "+
		"third's by more than the allowance (RSS: 5 %% or 8 MiB; goroutines: 10 %% or 20). After the load, the goroutines must "+
		"come back to within 20 of the idle collector's. See `bench/soak/judge.go`.\n\n",
		r.LoadStart.Seconds(), r.LoadEnd.Seconds(), warmup(r.LoadEnd-r.LoadStart))
	fmt.Fprintf(&b, "| series | middle third (median) | last third (median) | allowed growth | unbounded |\n|---|---|---|---|---|\n")
	for _, g := range r.Growth {
		if g.Note != "" {
			fmt.Fprintf(&b, "| %s | | | | %s |\n", g.Series, g.Note)
			continue
		}
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %t |\n", g.Series, g.Middle, g.Last, g.Allowed, g.Unbounded)
	}
	fmt.Fprintf(&b, "\n![RSS, CPU, goroutines and open files over the run](soak.svg)\n\n## The collector's counters at the end\n\n| metric | value |\n|---|---|\n")
	for _, name := range sortedKeys(r.Telemetry) {
		fmt.Fprintf(&b, "| `%s` | %.0f |\n", name, r.Telemetry[name])
	}
	fmt.Fprintf(&b, "\n## Samples\n\n| t (s) | RSS (MiB) | CPU (%% of a core) | goroutines | open files |\n|---|---|---|---|---|\n")
	for _, s := range r.Samples {
		fmt.Fprintf(&b, "| %.0f | %.1f | %.1f | %d | %d |\n", s.AtSeconds, s.RSSMiB, s.CPUPercent, s.Goroutines, s.OpenFiles)
	}
	fmt.Fprintf(&b, "\n%s\n", r.Outcome.lastLine())
	return b.String()
}

func sortedKeys(m map[string]float64) []string { return slices.Sorted(maps.Keys(m)) }
