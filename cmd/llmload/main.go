// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Command llmload is a load generator for OpenAI-compatible streaming LLM
// servers (vLLM, SGLang, TGI, llama.cpp, …), timed on the client side the way
// `vllm bench serve` times requests: TTFT, TPOT, ITL and E2E with
// mean/p50/p95/p99, throughput and goodput, as a table and a JSON file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, err := ParseFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmload:", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A second Ctrl-C kills the process the usual way.
	context.AfterFunc(ctx, stop)

	var progress *os.File
	if !cfg.Quiet && isTerminal(os.Stderr) {
		progress = os.Stderr
	}
	var rep *Report
	if progress != nil {
		rep, err = Run(ctx, cfg, progress)
	} else {
		rep, err = Run(ctx, cfg, nil)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmload:", err)
		return 1
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "llmload:", err)
		return 1
	}
	if cfg.Out != "" {
		if err := rep.WriteJSONFile(cfg.Out); err != nil {
			fmt.Fprintln(os.Stderr, "llmload:", err)
			return 1
		}
	}
	if rep.Completed == 0 {
		return 1
	}
	return 0
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
