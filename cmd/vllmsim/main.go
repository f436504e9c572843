// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Command vllmsim simulates a vLLM engine behind its OpenAI-compatible API
// (/v1/chat/completions, /v1/completions with SSE streaming, /v1/models,
// /health, /metrics) so the collector can be run and tested without a GPU.
//
// Inside, a continuous-batching scheduler steps in real time. A step lasts
// as long as the slower of its arithmetic and its memory reads (a
// roofline):
//
//	step-overhead + max((P+D)·prefill-per-token, decode-base + D·decode-per-seq)
//
// for P prompt tokens and D decoding sequences, so a decode step is
// bandwidth-bound and prompt tokens ride along on it almost for free up to
// the crossover, while a long prefill is compute-bound and stretches the
// step for every decode in it. A KV block pool (16 tokens per block) whose
// exhaustion pre-empts the newest running request; chunked prefill and
// prefill-priority switches; fp16 and fp8 speed profiles. Prompt length is
// the number of words of the prompt; every request produces exactly
// max_tokens tokens (the last is EOS, finish reason "stop", unless
// ignore_eos is set: then "length").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/otelcol-llm/otelcol-llm/cmd/vllmsim/internal/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "vllmsim:", err)
		os.Exit(1)
	}
}

// options are the parsed flags.
type options struct {
	addr             string
	defaultMaxTokens int
	hook             string
	hookEngine       string
	hookEngineShare  bool
	// otlpTraces, traceDelay and perRequestMetrics are vLLM's
	// --otlp-traces-endpoint (its batch delay) and
	// --enable-per-request-metrics.
	otlpTraces        string
	traceDelay        time.Duration
	perRequestMetrics bool
	// timingsOut is where every request's true split is written at exit.
	timingsOut string
	// attributionOut is where every request's true share of engine time
	// and energy is written at exit.
	attributionOut string
	// tenantHeader is the request header whose value labels a request's
	// tenant in the attribution truth.
	tenantHeader string
	// dcgm adds the GPU's DCGM-shaped power series to /metrics; gpu names it.
	dcgm bool
	gpu  sim.GPU
	cfg  sim.Config
}

func parseFlags(args []string, out io.Writer) (options, error) {
	o := options{cfg: sim.DefaultConfig()}
	c := &o.cfg
	fs := flag.NewFlagSet("vllmsim", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, `Usage of vllmsim: a vLLM engine simulator (OpenAI-compatible API, /metrics).

A step computing P prompt tokens and D decode tokens (one per decoding
sequence) lasts, as a roofline (arithmetic and memory reads overlap):

  step-overhead + max((P+D) * prefill-per-token * pf,
                      (decode-base + D * decode-per-seq) * df)

with pf, df = 1 for fp16 and the -fp8-*-factor flags for fp8.

`)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8000", "listen address")
	fs.StringVar(&c.Model, "model", c.Model, "served model name")
	fs.StringVar(&c.Profile, "profile", c.Profile, "speed profile: fp16 or fp8 (fp8 scales the memory term by -fp8-decode-factor, the arithmetic by -fp8-prefill-factor)")
	fs.IntVar(&c.KVBlocks, "kv-blocks", c.KVBlocks, "KV cache blocks of 16 tokens")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "most sequences in one batch")
	fs.IntVar(&c.MaxModelLen, "max-model-len", c.MaxModelLen, "longest prompt+output in tokens")
	fs.BoolVar(&c.ChunkedPrefill, "chunked-prefill", c.ChunkedPrefill, "split long prefills across steps within the token budget")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "token budget of one step (without chunked prefill raised to -max-model-len)")
	fs.BoolVar(&c.PrefillPriority, "prefill-priority", c.PrefillPriority, "admit waiting prompts first and run no decodes in their steps (vLLM V0 without chunked prefill); default decodes first, prompts fill the rest of the budget (V0 with chunked prefill, V1)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the token text generator")
	fs.IntVar(&o.defaultMaxTokens, "default-max-tokens", 128, "max_tokens when a request gives none")
	fs.DurationVar(&c.Cost.StepOverhead, "step-overhead", c.Cost.StepOverhead, "fixed cost of every step")
	fs.DurationVar(&c.Cost.PrefillPerToken, "prefill-per-token", c.Cost.PrefillPerToken, "arithmetic per token of a step, prompt or decode (compute-bound, fp16)")
	fs.DurationVar(&c.Cost.DecodeBase, "decode-base", c.Cost.DecodeBase, "memory reads of every step: the weights (bandwidth-bound, fp16)")
	fs.DurationVar(&c.Cost.DecodePerSeq, "decode-per-seq", c.Cost.DecodePerSeq, "memory reads per decoding sequence in a step: its KV cache (fp16)")
	fs.Float64Var(&c.Cost.FP8DecodeFactor, "fp8-decode-factor", c.Cost.FP8DecodeFactor, "factor of the fp8 profile on the memory term (weights and KV reads)")
	fs.Float64Var(&c.Cost.FP8PrefillFactor, "fp8-prefill-factor", c.Cost.FP8PrefillFactor, "factor of the fp8 profile on the arithmetic term")
	fs.StringVar(&o.hook, "hook", "", "send token events with pkg/tokenhook to this endpoint, e.g. udp://127.0.0.1:4321 (empty: off)")
	fs.StringVar(&o.hookEngine, "hook-engine", "vllmsim", "the engine name the hook sends (llm.engine of its sessions)")
	fs.BoolVar(&o.hookEngineShare, "hook-engine-share", true, "the hook's end events carry each request's exact share of engine time and energy (wire fields engine_time_prefill_ns, engine_time_decode_ns, energy_mj); false: the collector computes it")
	fs.StringVar(&o.otlpTraces, "otlp-traces-endpoint", "", "send vLLM's llm_request span of every request over OTLP/HTTP to this URL, e.g. http://127.0.0.1:4318/v1/traces (empty: off)")
	fs.DurationVar(&o.traceDelay, "otlp-traces-delay", 5*time.Second, "how often spans are sent in a batch (vLLM's BatchSpanProcessor: 5s)")
	fs.StringVar(&o.timingsOut, "timings-out", "", "write every finished request's true queue, prefill and decode time (NDJSON) to this file when stopping (empty: off)")
	fs.StringVar(&o.attributionOut, "attribution-out", "", "write every finished request's true share of engine time (prefill, decode) and energy, and the engine's busy, idle and wall time (NDJSON) to this file when stopping (empty: off)")
	fs.StringVar(&o.tenantHeader, "tenant-header", "X-Tenant-ID", "request header whose value is the request's tenant in -attribution-out")
	fs.Float64Var(&c.Power.IdleWatts, "power-idle-watts", c.Power.IdleWatts, "power model: the GPU's draw between steps (W)")
	fs.Float64Var(&c.Power.MaxWatts, "power-max-watts", c.Power.MaxWatts, "power model: the draw of a step of -power-saturation-tokens tokens or more (W)")
	fs.IntVar(&c.Power.SaturationTokens, "power-saturation-tokens", c.Power.SaturationTokens, "power model: a step's draw rises linearly from idle to max with its tokens up to this many")
	fs.BoolVar(&o.dcgm, "dcgm", false, "serve the GPU's power as NVIDIA's dcgm-exporter does (DCGM_FI_DEV_POWER_USAGE, DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION) on /metrics")
	fs.StringVar(&o.gpu.Pod, "gpu-pod", "vllmsim-0", "the pod label of the DCGM series (the engine's pod)")
	fs.StringVar(&o.gpu.Namespace, "gpu-namespace", "default", "the namespace label of the DCGM series")
	fs.StringVar(&o.gpu.Container, "gpu-container", "vllm", "the container label of the DCGM series")
	fs.StringVar(&o.gpu.UUID, "gpu-uuid", "GPU-00000000-0000-0000-0000-000000000000", "the UUID label of the DCGM series")
	fs.BoolVar(&o.perRequestMetrics, "enable-per-request-metrics", false, "add vLLM's per-request timing object (queue, prefill, decode in ms) to the final usage chunk and to whole responses")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if !c.ChunkedPrefill && c.MaxNumBatchedTokens < c.MaxModelLen {
		c.MaxNumBatchedTokens = c.MaxModelLen
	}
	return o, nil
}

// run serves until ctx is done. ready, if not nil, receives the bound
// address once listening.
func run(ctx context.Context, args []string, logOut io.Writer, ready chan<- string) error {
	o, err := parseFlags(args, logOut)
	if err != nil {
		return err
	}
	eng, err := sim.New(o.cfg)
	if err != nil {
		return err
	}
	logger := log.New(logOut, "vllmsim: ", log.LstdFlags)
	var obs observers
	var closers []func()
	if o.hook != "" {
		h, err := newHook(o.hook, o.hookEngine, o.cfg, logger)
		if err != nil {
			return err
		}
		h.engineShare = o.hookEngineShare
		obs = append(obs, h)
		closers = append(closers, h.close)
	}
	if o.otlpTraces != "" {
		e, err := newSpanExporter(o.otlpTraces, o.cfg.Model, o.traceDelay, logger)
		if err != nil {
			return err
		}
		obs = append(obs, e)
		closers = append(closers, e.close)
	}
	var timings *timingLog
	if o.timingsOut != "" {
		timings = &timingLog{path: o.timingsOut}
		obs = append(obs, timings)
	}
	var attribution *attributionLog
	if o.attributionOut != "" {
		attribution = &attributionLog{path: o.attributionOut, eng: eng}
		obs = append(obs, attribution)
	}
	if len(obs) > 0 {
		eng.SetObserver(obs)
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	api := newServer(eng, o.defaultMaxTokens)
	api.perRequestMetrics = o.perRequestMetrics
	api.tenantHeader = o.tenantHeader
	if o.dcgm {
		g := o.gpu
		g.ModelName, g.Hostname = "vllmsim simulated GPU", "vllmsim"
		api.gpu = &g
	}
	srv := &http.Server{Handler: api.handler(), ReadHeaderTimeout: 10 * time.Second}

	engCtx, stopEngine := context.WithCancel(context.Background())
	engDone := make(chan struct{})
	go func() {
		defer close(engDone)
		eng.Run(engCtx, sim.RealClock)
	}()
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()
	logger.Printf("serving %s on http://%s (profile %s, kv-blocks %d, chunked-prefill %v, prefill-priority %v)",
		o.cfg.Model, ln.Addr(), o.cfg.Profile, o.cfg.KVBlocks, o.cfg.ChunkedPrefill, o.cfg.PrefillPriority)
	if ready != nil {
		ready <- ln.Addr().String()
	}

	select {
	case <-ctx.Done():
	case err = <-srvErr:
	}
	// Stop the engine first: open streams end, so Shutdown does not wait
	// for them.
	stopEngine()
	<-engDone
	shCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if shErr := srv.Shutdown(shCtx); shErr != nil && err == nil {
		err = shErr
	}
	for _, c := range closers {
		c()
	}
	if timings != nil {
		if werr := timings.close(); werr != nil && err == nil {
			err = werr
		}
	}
	if attribution != nil {
		if werr := attribution.close(time.Now()); werr != nil && err == nil {
			err = werr
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
