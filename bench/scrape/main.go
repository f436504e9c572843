// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

// Command scrape measures the token_stream receiver's vllm source against
// contrib's prometheus receiver on the same engine: CPU
// per scrape, memory, first-scrape latency, and what each reads from the
// repository's vLLM expositions, down to the engine state token_session
// attaches to a session. bench/scrape/run.sh builds and runs it; README.md
// beside it has the method and the results.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
)

type options struct {
	bin, root, out, vllmsim string
	runs                    int
	cpuInterval, cpuFor     time.Duration
	warmup                  time.Duration
	latencyIntervals        []time.Duration
	latencyStarts           int
	parts                   map[string]bool
}

func main() {
	var o options
	var intervals, parts string
	flag.StringVar(&o.bin, "collector", "bin/otelcol-llm", "collector binary")
	flag.StringVar(&o.root, "root", ".", "repository root (for the expositions under testdata/ and the golden test)")
	flag.StringVar(&o.out, "out", "", "folder for configs, logs, outputs and results (required)")
	flag.StringVar(&o.vllmsim, "vllmsim", "", "vllmsim binary: also measure CPU against it as a live engine (empty: skip)")
	flag.IntVar(&o.runs, "runs", 3, "runs of the CPU/memory and latency measurements")
	flag.DurationVar(&o.cpuInterval, "cpu-interval", 250*time.Millisecond, "scrape interval of the CPU runs")
	flag.DurationVar(&o.cpuFor, "cpu-duration", 60*time.Second, "measured time of each CPU run")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Second, "time after start-up not measured")
	flag.StringVar(&intervals, "latency-intervals", "5s,15s", "scrape intervals of the first-scrape latency runs")
	flag.IntVar(&o.latencyStarts, "latency-starts", 3, "collector starts per source and interval in each run")
	flag.StringVar(&parts, "parts", "correctness,cpu,latency", "what to measure")
	flag.Parse()
	if o.out == "" {
		log.Fatal("-out is required")
	}
	for _, s := range strings.Split(intervals, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			log.Fatalf("-latency-intervals: %v", err)
		}
		o.latencyIntervals = append(o.latencyIntervals, d)
	}
	o.parts = map[string]bool{}
	for _, p := range strings.Split(parts, ",") {
		o.parts[strings.TrimSpace(p)] = true
	}
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

// results is everything measured, written as results.json.
type results struct {
	Machine     string          `json:"machine"`
	CPU         []cpuResult     `json:"cpu"`
	Latency     []latencyResult `json:"latency"`
	Correctness string          `json:"correctness_markdown"`
}

func run(o options) error {
	exps, err := loadExpositions(o.root)
	if err != nil {
		return err
	}
	var res results
	res.Machine = machine()
	if o.parts["correctness"] {
		res.Correctness = correctness(o, exps)
	}
	for r := 1; r <= o.runs; r++ {
		if o.parts["cpu"] {
			cr, err := cpuRun(o, r, exps[0])
			if err != nil {
				return err
			}
			res.CPU = append(res.CPU, cr...)
		}
		if o.parts["latency"] {
			lr, err := latencyRun(o, r, exps[0])
			if err != nil {
				return err
			}
			res.Latency = append(res.Latency, lr...)
		}
	}
	md := report(o, res)
	js, _ := json.MarshalIndent(res, "", "  ")
	if err := errors.Join(os.WriteFile(filepath.Join(o.out, "results.md"), []byte(md), 0o644),
		os.WriteFile(filepath.Join(o.out, "results.json"), js, 0o644)); err != nil {
		return err
	}
	fmt.Print(md)
	return nil
}

// correctness reads every exposition with both sources, answered as
// text only and as vLLM answers (OpenMetrics when asked for it).
func correctness(o options, exps []exposition) string {
	var b strings.Builder
	for _, exp := range exps {
		for _, negotiate := range []bool{true, false} {
			how := "served as vLLM serves it (OpenMetrics when the Accept header lists it)"
			if !negotiate {
				how = "served as text 0.0.4 whatever the Accept header"
			}
			log.Printf("correctness: %s, %s", exp.name, how)
			v := readEngine(o.bin, o.out, srcVLLM, exp, negotiate)
			p := readEngine(o.bin, o.out, srcProm, exp, negotiate)
			fmt.Fprintf(&b, "\n#### %s, %s\n\n", exp.name, how)
			compare(&b, exp, v, p)
		}
	}
	return b.String()
}

// cpuResult is one collector's CPU run.
type cpuResult struct {
	Run      int           `json:"run"`
	Case     string        `json:"case"`
	Source   source        `json:"source"`
	CPU      time.Duration `json:"cpu_ns"`
	Wall     time.Duration `json:"wall_ns"`
	Scrapes  int64         `json:"scrapes"`
	Points   float64       `json:"accepted_points"`
	RSS      int64         `json:"rss_bytes"`
	Heap     float64       `json:"heap_alloc_bytes"`
	LoadFrom float64       `json:"load1_start"`
	LoadTo   float64       `json:"load1_end"`
}

// cpuCase is an engine the CPU runs scrape.
type cpuCase struct {
	name      string
	negotiate bool
	upstream  string
}

func cpuRun(o options, r int, fixture exposition) ([]cpuResult, error) {
	cases := []cpuCase{
		{name: "fixture, as vLLM answers", negotiate: true},
		{name: "fixture, text 0.0.4 only", negotiate: false},
	}
	if o.vllmsim != "" {
		sim, err := startSim(o)
		if err != nil {
			return nil, err
		}
		defer sim.stop()
		cases = append(cases, cpuCase{name: "vllmsim (live)", upstream: "http://" + sim.addr + "/metrics"})
	}
	idle, err := cpuOne(o, r, "idle", srcIdle, exposition{})
	if err != nil {
		return nil, err
	}
	out := []cpuResult{idle}
	srcs := []source{srcVLLM, srcProm}
	if r%2 == 0 { // alternate which goes first
		slices.Reverse(srcs)
	}
	for _, c := range cases {
		for _, src := range srcs {
			e, err := startEngine(fixture, c.negotiate, c.upstream)
			if err != nil {
				return nil, err
			}
			res, err := cpuOneOn(o, r, c.name, src, e)
			e.close()
			if err != nil {
				return nil, err
			}
			out = append(out, res)
		}
	}
	return out, nil
}

func cpuOne(o options, r int, name string, src source, exp exposition) (cpuResult, error) {
	e, err := startEngine(exp, false, "")
	if err != nil {
		return cpuResult{}, err
	}
	defer e.close()
	return cpuOneOn(o, r, name, src, e)
}

// cpuOneOn runs src against e for the warm-up and the measured time, and
// reads the collector's CPU time, and its RSS and Go heap every
// memEvery (their medians are reported: a single reading depends on when
// the last GC ran).
func cpuOneOn(o options, r int, name string, src source, e *fakeEngine) (cpuResult, error) {
	log.Printf("run %d: cpu %s, %s", r, name, src)
	s := setup{src: src, targets: []string{e.addr()}, interval: o.cpuInterval, telemetry: process.MustFreeAddr(), otlp: process.MustFreeAddr()}
	c, err := startCollector(o.bin, o.out, fmt.Sprintf("cpu-%d-%s-%s", r, slug(name), slug(string(src))), config(s), s.telemetry)
	if err != nil {
		return cpuResult{}, err
	}
	defer c.stop()
	if _, err := c.waitReady(60 * time.Second); err != nil {
		return cpuResult{}, err
	}
	if src != srcIdle {
		// The prometheus receiver scrapes first seconds after start-up.
		if err := waitScrapes(e, 1, 60*time.Second); err != nil {
			return cpuResult{}, err
		}
	}
	time.Sleep(o.warmup)
	res := cpuResult{Run: r, Case: name, Source: src, LoadFrom: loadAvg()}
	self0, err := c.selfMetrics()
	if err != nil {
		return res, err
	}
	cpu0, err := c.cpu()
	if err != nil {
		return res, err
	}
	n0, t0 := e.scrapes.Load(), time.Now()
	var rss, heap []float64
	for time.Since(t0) < o.cpuFor {
		time.Sleep(min(memEvery, o.cpuFor-time.Since(t0)))
		v, err := c.rss()
		if err != nil {
			return res, err
		}
		rss = append(rss, float64(v))
		if self, err := c.selfMetrics(); err == nil {
			heap = append(heap, self["otelcol_process_runtime_heap_alloc_bytes"])
		}
	}
	cpu1, err := c.cpu()
	if err != nil {
		return res, err
	}
	res.Scrapes, res.Wall, res.CPU = e.scrapes.Load()-n0, time.Since(t0), cpu1-cpu0
	res.LoadTo = loadAvg()
	res.RSS, res.Heap = int64(median(rss)), median(heap)
	self1, err := c.selfMetrics()
	for k, v := range self1 {
		if strings.HasPrefix(k, "otelcol_receiver_accepted_metric_points") {
			res.Points += v - self0[k]
		}
	}
	return res, err
}

// memEvery is how often RSS and heap are read during a CPU run.
const memEvery = 5 * time.Second

// latencyResult is one collector start: when its first scrape came.
type latencyResult struct {
	Run       int           `json:"run"`
	Source    source        `json:"source"`
	Interval  time.Duration `json:"interval_ns"`
	FromStart time.Duration `json:"from_start_ns"`
	FromReady time.Duration `json:"from_ready_ns"`
	Load      float64       `json:"load1"`
}

func latencyRun(o options, r int, fixture exposition) ([]latencyResult, error) {
	var out []latencyResult
	for _, iv := range o.latencyIntervals {
		for _, src := range []source{srcVLLM, srcProm, srcReload} {
			for k := range o.latencyStarts {
				log.Printf("run %d: first scrape, %s every %s (%d/%d)", r, src, iv, k+1, o.latencyStarts)
				res, err := latencyOne(o, r, src, iv, fixture)
				if err != nil {
					return nil, err
				}
				out = append(out, res)
			}
		}
	}
	return out, nil
}

func latencyOne(o options, r int, src source, iv time.Duration, fixture exposition) (latencyResult, error) {
	e, err := startEngine(fixture, true, "")
	if err != nil {
		return latencyResult{}, err
	}
	defer e.close()
	s := setup{src: src, targets: []string{e.addr()}, interval: iv, telemetry: process.MustFreeAddr()}
	c, err := startCollector(o.bin, o.out, fmt.Sprintf("latency-%d-%s-%s", r, slug(string(src)), iv), config(s), s.telemetry)
	if err != nil {
		return latencyResult{}, err
	}
	defer c.stop()
	ready, err := c.waitReady(60 * time.Second)
	if err != nil {
		return latencyResult{}, err
	}
	if err := waitScrapes(e, 1, iv+30*time.Second); err != nil {
		return latencyResult{}, err
	}
	first := e.firstScrape()
	return latencyResult{Run: r, Source: src, Interval: iv, FromStart: first.Sub(c.Started), FromReady: first.Sub(ready), Load: loadAvg()}, nil
}

// sim is a vllmsim process.
type sim struct {
	c    *collector
	addr string
}

func startSim(o options) (*sim, error) {
	addr := process.MustFreeAddr()
	c, err := startProcess(o.vllmsim, o.out, "vllmsim", "-addr", addr)
	if err != nil {
		return nil, err
	}
	s := &sim{c: c, addr: addr}
	if err := c.WaitListening(addr, 30*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

func (s *sim) stop() { s.c.stop() }

func machine() string {
	host, _ := os.Hostname()
	b, _ := os.ReadFile("/proc/cpuinfo")
	model, cores := "", 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			model = strings.TrimLeft(v, "\t :")
			cores++
		}
	}
	return fmt.Sprintf("%s, %d× %s, %s", host, cores, model, time.Now().UTC().Format("2006-01-02"))
}
