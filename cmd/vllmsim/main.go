// Command vllmsim simulates a vLLM engine behind its OpenAI-compatible API
// (/v1/chat/completions, /v1/completions with SSE streaming, /v1/models,
// /health, /metrics) so the collector can be run and tested without a GPU.
//
// Inside, a continuous-batching scheduler steps in real time: prefill cost
// grows with prompt tokens, a decode step's cost with the batch size; a KV
// block pool (16 tokens per block) whose exhaustion pre-empts the newest
// running request; chunked prefill and prefill-priority switches; fp16 and
// fp8 speed profiles. Prompt length is the number of words of the prompt;
// every request produces exactly max_tokens tokens (the last is EOS, finish
// reason "stop", unless ignore_eos is set: then "length").
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
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
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
	cfg              sim.Config
}

func parseFlags(args []string, out io.Writer) (options, error) {
	o := options{cfg: sim.DefaultConfig()}
	c := &o.cfg
	fs := flag.NewFlagSet("vllmsim", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8000", "listen address")
	fs.StringVar(&c.Model, "model", c.Model, "served model name")
	fs.StringVar(&c.Profile, "profile", c.Profile, "speed profile: fp16 or fp8 (fp8 scales decode steps by -fp8-decode-factor, prefill by -fp8-prefill-factor)")
	fs.IntVar(&c.KVBlocks, "kv-blocks", c.KVBlocks, "KV cache blocks of 16 tokens")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "most sequences in one batch")
	fs.IntVar(&c.MaxModelLen, "max-model-len", c.MaxModelLen, "longest prompt+output in tokens")
	fs.BoolVar(&c.ChunkedPrefill, "chunked-prefill", c.ChunkedPrefill, "split long prefills across steps within the token budget")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "token budget of one step (without chunked prefill raised to -max-model-len)")
	fs.BoolVar(&c.PrefillPriority, "prefill-priority", c.PrefillPriority, "admit waiting prefills first and run no decodes in their steps (vLLM V0); default decode first (V1)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the token text generator")
	fs.IntVar(&o.defaultMaxTokens, "default-max-tokens", 128, "max_tokens when a request gives none")
	fs.DurationVar(&c.Cost.StepOverhead, "step-overhead", c.Cost.StepOverhead, "fixed cost of every step")
	fs.DurationVar(&c.Cost.PrefillPerToken, "prefill-per-token", c.Cost.PrefillPerToken, "prefill cost per prompt token (fp16)")
	fs.DurationVar(&c.Cost.DecodeBase, "decode-base", c.Cost.DecodeBase, "decode step cost independent of batch size (weights read, fp16)")
	fs.DurationVar(&c.Cost.DecodePerSeq, "decode-per-seq", c.Cost.DecodePerSeq, "decode step cost per sequence in the batch (KV read, fp16)")
	fs.Float64Var(&c.Cost.FP8DecodeFactor, "fp8-decode-factor", c.Cost.FP8DecodeFactor, "decode cost factor of the fp8 profile")
	fs.Float64Var(&c.Cost.FP8PrefillFactor, "fp8-prefill-factor", c.Cost.FP8PrefillFactor, "prefill cost factor of the fp8 profile")
	fs.StringVar(&o.hook, "hook", "", "send token events with pkg/tokenhook to this endpoint, e.g. udp://127.0.0.1:4321 (empty: off)")
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
	var closeHook func()
	if o.hook != "" {
		h, err := newHook(o.hook, o.cfg)
		if err != nil {
			return err
		}
		eng.SetObserver(h)
		closeHook = h.close
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: newServer(eng, o.defaultMaxTokens).handler(), ReadHeaderTimeout: 10 * time.Second}

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
	if closeHook != nil {
		closeHook()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
