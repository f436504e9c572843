// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

// Command tokenbench measures the collector's token path side by side with the
// stock alternative (each token a span → tail_sampling → span_metrics), its
// cost as sessions and event rates grow, and its overhead at the demo's load.
// It starts every process it measures (on 127.0.0.1, with bounded loads) and
// stops them; CPU is the collector's utime+stime from /proc, so that other
// work on the machine does not count. `make bench` runs it through
// bench/run.sh; `tokenbench -report` merges its result with the proxy
// benchmark's into bench/results/results.{md,json}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/otlpsink"
)

// result is tokenbench.json.
type result struct {
	TokenPath  *tokenPathResult `json:"token_path,omitempty"`
	Scale      []scaleStep      `json:"scale,omitempty"`
	Saturation *saturation      `json:"saturation,omitempty"`
	E2E        *e2eResult       `json:"e2e,omitempty"`
	ScaleOut   *scaleOutResult  `json:"scale_out,omitempty"`
	Shapes     *shapesResult    `json:"shapes,omitempty"`
	// ShapesHTTP are the shapes -http-shapes picks, our side over the HTTP
	// hook, when -hook-transport is unix.
	ShapesHTTP *shapesResult   `json:"shapes_http,omitempty"`
	BusyNode   *busyNodeResult `json:"busy_node,omitempty"`
}

func main() {
	var (
		out        = flag.String("out", "bench/results", "directory for results, logs and profiles")
		ours       = flag.String("collector", "bin/otelcol-llm", "the otelcol-llm binary")
		stock      = flag.String("stock", "bin/otelcol-stock", "the stock baseline collector")
		vllmsim    = flag.String("vllmsim", "bin/vllmsim", "the engine simulator")
		llmload    = flag.String("llmload", "bin/llmload", "the load generator")
		only       = flag.String("run", "tokenpath,shapes,busynode,scale,saturation,e2e,scaleout", "scenarios to run, comma-separated")
		transport  = flag.String("hook-transport", "unix", "shapes and busynode: our side's hook transport, unix (the clients' default where the node offers the socket) or http")
		repeat     = flag.Int("repeat", 3, "shapes and busynode: runs of each side, alternating ours and stock, each ratio the median pair's; token path: runs of our memory per session, each on a fresh collector, the figure the median run's")
		engines    = flag.Int("busy-engines", 8, "busynode: engines on the node")
		engineRate = flag.Float64("busy-rate", 5000, "busynode: tokens/s per engine")
		busyFor    = flag.Duration("busy-duration", 60*time.Second, "busynode: how long the node is busy")
		sessions   = flag.Int("sessions", 256, "token path: concurrent sessions per wave")
		tokens     = flag.Int("tokens", 256, "token path: tokens per session")
		waves      = flag.Int("waves", 16, "token path: waves of sessions")
		batchLines = flag.Int("batch", 1024, "token path: events per hook batch / spans per OTLP request")
		workers    = flag.Int("workers", 4, "concurrent HTTP requests")
		udpRate    = flag.Float64("udp-rate", 500000, "token path: UDP events/s offered (UDP has no back-pressure; half the HTTP path's rate here, and no datagram is lost at it)")
		udpBytes   = flag.Int("udp-bytes", 8192, "token path: UDP datagram size (the Go hook client's default)")
		memK       = flag.Int("mem-sessions", 1000, "memory: sessions in flight")
		memTokens  = flag.Int("mem-tokens", 143, "memory: tokens per session in flight (5 s decision_wait at 35 ms)")
		scaleKs    = flag.String("scale", "1000,10000,100000", "scale: concurrent sessions per step")
		scaleToks  = flag.Int("scale-tokens", 1000000, "scale: token events per step, in sessions of this over the largest step tokens each (at least 10)")
		rates      = flag.String("rates", "10000,30000,100000,200000,400000,700000,1000000,1500000,2000000,3000000", "saturation: offered events/s")
		satSess    = flag.Int("sat-sessions", 1000, "saturation: concurrent sessions")
		stepDur    = flag.Duration("step", 3*time.Second, "saturation: time per offered rate")
		e2eConc    = flag.Int("e2e-concurrency", 200, "e2e: llmload concurrency")
		e2eDur     = flag.Duration("e2e-duration", 30*time.Second, "e2e: llmload duration")
		gatewayFor = flag.Duration("gateway-duration", 20*time.Second, "scaleout: how long spans are paced into the gateway")
		shapeSel   = flag.String("shapes", "", "shapes: which of the eight to run, by index from 0 (default all)")
		shapeToks  = flag.Int("shape-tokens", shapeTokens, "shapes: about how many tokens each shape sends (but the 100 000-session one)")
		httpShapes = flag.String("http-shapes", "1,2", "shapes: which of them to run again with our side over the HTTP hook, when -hook-transport is unix, by index (default: 1 session and 50 sessions per batch; empty: all eight; none: skip)")
		profile    = flag.Duration("profile", 0, "token path, shapes and scale: CPU-profile our collector for this long from the start of each run's load (<run>.cpu.pprof)")
		report     = flag.Bool("report", false, "merge -out/tokenbench.json, proxy.json and gobench.txt into results.md and results.json")
	)
	flag.Parse()
	log.SetFlags(log.Ltime)
	if *transport != "unix" && *transport != "http" {
		log.Fatalf("-hook-transport: want unix or http, got %q", *transport)
	}
	var err error
	if err := os.MkdirAll(*out, 0o755); err != nil {
		log.Fatal(err)
	}
	if *report {
		if err := writeReport(*out); err != nil {
			log.Fatal(err)
		}
		return
	}
	socketDir, err = os.MkdirTemp("", "tokenbench")
	if err != nil {
		log.Fatal(err)
	}
	sk, err := otlpsink.Start("127.0.0.1:0", otlpsink.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer sk.Close()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	// Every load below is bounded in count or time; this bounds them all.
	ctx, cancelAll := context.WithTimeout(ctx, 40*time.Minute)
	defer cancelAll()

	e := &env{
		out: *out, ours: abs(*ours), stock: abs(*stock), workers: *workers, udpRate: *udpRate, udpBytes: *udpBytes,
		memK: *memK, memToks: *memTokens, ctx: ctx, sink: sk, profile: *profile,
		hookTransport: *transport, repeat: max(1, *repeat), shapeTokens: *shapeToks,
	}

	var res result
	run := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		run[strings.TrimSpace(s)] = true
	}
	fail := func(what string, err error) {
		if err != nil {
			log.Printf("%s: %v", what, err)
			_ = os.RemoveAll(socketDir)
			cancel()
			sk.Close()
			os.Exit(1)
		}
	}
	if run["tokenpath"] {
		w := workload{Sessions: *sessions, Tokens: *tokens, Waves: *waves, BatchLines: *batchLines, SlowShare: 0.02}
		res.TokenPath, err = e.tokenPath(w)
		fail("token path", err)
	}
	if run["shapes"] {
		list, err := pickShapes(defaultShapes(), *shapeSel)
		fail("shapes", err)
		res.Shapes, err = e.shapes(list, *transport)
		fail("shapes", err)
		if *transport != "http" && *httpShapes != "none" {
			list, err := pickShapes(defaultShapes(), *httpShapes)
			fail("shapes over HTTP", err)
			res.ShapesHTTP, err = e.shapes(list, "http")
			fail("shapes over HTTP", err)
		}
	}
	if run["busynode"] {
		res.BusyNode, err = e.busyNode(*engines, *engineRate, *busyFor)
		fail("busy node", err)
	}
	if run["scale"] {
		res.Scale, err = e.scale(ints(*scaleKs), *scaleToks)
		fail("scale", err)
	}
	if run["saturation"] {
		res.Saturation, err = e.saturate(floats(*rates), *satSess, *stepDur)
		fail("saturation", err)
	}
	if run["e2e"] {
		res.E2E, err = e.e2e(abs(*vllmsim), abs(*llmload), *e2eConc, *e2eDur)
		fail("e2e", err)
	}
	if run["scaleout"] {
		w := workload{Sessions: *sessions, Tokens: *tokens, Waves: *waves, BatchLines: *batchLines, SlowShare: 0.02}
		res.ScaleOut, err = e.scaleOut(w, *gatewayFor)
		fail("scale-out", err)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	fail("write", os.WriteFile(filepath.Join(*out, "tokenbench.json"), b, 0o644))
	_ = os.RemoveAll(socketDir)
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			log.Fatalf("%q: %v", s, err)
		}
		out = append(out, n)
	}
	return out
}

func floats(s string) []float64 {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			log.Fatalf("%q: %v", s, err)
		}
		out = append(out, n)
	}
	return out
}
