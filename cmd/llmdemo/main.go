// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Command llmdemo runs `make demo`: for every scenario point it starts
// vllmsim, the collector (token_stream proxy in front of the simulator, a
// scrape of its /metrics, token_session) and llmload through the proxy,
// collects what the collector exports in an OTLP sink of its own, and
// writes a report folder with client-side and collector-side figures side
// by side, and plots.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/otelcol-llm/otelcol-llm/cmd/llmdemo/internal/demo"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/llamacpp"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("llmdemo", flag.ContinueOnError)
	binDir := fs.String("bin", "bin", "folder with otelcol-llm, vllmsim and llmload")
	out := fs.String("out", "demo-report", "report folder (created; earlier contents of the same names are replaced)")
	duration := fs.Duration("duration", 10*time.Second, "load duration of each scenario point")
	only := fs.String("only", "", "run only the points whose name (e.g. b-c100) matches this regular expression")
	breaker := fs.Bool("breaker", false, "run the load-balancer story instead (make demo-breaker): HAProxy, two vllmsim replicas, "+
		"one of which freezes, engine_health ejecting it")
	haproxy := fs.String("haproxy", "haproxy", "the haproxy binary, for -breaker")
	stallMaxGap := fs.Duration("stall-max-gap", 500*time.Millisecond, "for -breaker: run the story a second time with the proxies' "+
		"stall breaker at this proxy::stall::max_gap, into OUT/stall-breaker, and compare the runs in OUT/comparison.md (0: one run, breaker off)")
	heal := fs.Bool("heal", true, "for -breaker with -stall-max-gap: run the story a third time with the proxies' proxy::migrate on as well, "+
		"into OUT/heal, and add it to OUT/comparison.md")
	live := fs.String("live", "localhost:8002", "where each point's collector serves token_session's live view (its URL is printed; "+
		"another free port if this one is taken; empty: off)")
	onLlamaCpp := fs.Bool("real", false, "run the story on a real engine instead (make demo-real): llama.cpp's llama-server built by "+
		"tools/llama-server.sh, the collector in front of it, llmload at 1, slots, 2×slots and 4×slots clients")
	llamaDir := fs.String("llama-dir", "", "for -real: the llama-server build (tools/llama-server.sh prints it; "+
		"default: LLAMA_CPP_DIR, else the script's cache)")
	slots := fs.Int("slots", 2, "for -real: llama-server's --parallel")
	threads := fs.Int("threads", 1, "for -real: llama-server's --threads")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var filter *regexp.Regexp
	if *only != "" {
		var err error
		if filter, err = regexp.Compile(*only); err != nil {
			fmt.Fprintln(os.Stderr, "llmdemo: -only:", err)
			return 2
		}
	}
	if *duration < time.Second {
		fmt.Fprintln(os.Stderr, "llmdemo: -duration must be at least 1s")
		return 2
	}
	bins := demo.Binaries{
		Collector: filepath.Join(*binDir, "otelcol-llm"),
		Sim:       filepath.Join(*binDir, "vllmsim"),
		Load:      filepath.Join(*binDir, "llmload"),
	}
	if *slots < 1 || *threads < 1 {
		fmt.Fprintln(os.Stderr, "llmdemo: -slots and -threads must be at least 1")
		return 2
	}
	for _, b := range []string{bins.Collector, bins.Sim, bins.Load} {
		if _, err := os.Stat(b); err != nil {
			fmt.Fprintf(os.Stderr, "llmdemo: %v (make demo builds it)\n", err)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Printf("[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	if *onLlamaCpp {
		dir := *llamaDir
		if dir == "" {
			var err error
			if dir, err = llamacpp.Find("."); err != nil {
				fmt.Fprintln(os.Stderr, "llmdemo:", err)
				return 2
			}
		}
		setup := demo.RealSetup{LlamaDir: dir, Slots: *slots, Threads: *threads, Context: 2048 * *slots}
		rep, err := demo.RunReal(ctx, bins, setup, demo.DefaultRealPoints(*slots, *duration), *out, logf)
		if err != nil {
			fmt.Fprintln(os.Stderr, "llmdemo:", err)
			return 1
		}
		logf("report: %s (%d points in %.0f s)", filepath.Join(*out, "report.md"), len(rep.Points), rep.WallS)
		return 0
	}
	if *breaker {
		bin, err := exec.LookPath(*haproxy)
		if err != nil {
			fmt.Fprintf(os.Stderr, "llmdemo: %v (Debian: apt-get install haproxy)\n", err)
			return 2
		}
		story := demo.DefaultBreakerStory()
		rep, err := demo.RunBreaker(ctx, bins, bin, story, *out, logf)
		if err != nil {
			fmt.Fprintln(os.Stderr, "llmdemo:", err)
			return 1
		}
		logf("report: %s (time to eject %.2f s)", filepath.Join(*out, "report.md"), rep.EjectedS-rep.DegradedS)
		if *stallMaxGap <= 0 {
			return 0
		}
		story.StallMaxGap = *stallMaxGap
		onOut := filepath.Join(*out, "stall-breaker")
		on, err := demo.RunBreaker(ctx, bins, bin, story, onOut, logf)
		if err != nil {
			fmt.Fprintln(os.Stderr, "llmdemo:", err)
			return 1
		}
		logf("report with the stall breaker on: %s (time to eject %.2f s)", filepath.Join(onOut, "report.md"), on.EjectedS-on.DegradedS)
		runs := []demo.BreakerRun{{Name: "off", Report: rep, Path: "report.md"}, {Name: "breaker", Report: on, Path: "stall-breaker/report.md"}}
		if *heal {
			story.Migrate = true
			healOut := filepath.Join(*out, "heal")
			healed, err := demo.RunBreaker(ctx, bins, bin, story, healOut, logf)
			if err != nil {
				fmt.Fprintln(os.Stderr, "llmdemo:", err)
				return 1
			}
			logf("report with proxy::migrate on: %s (%d requests failed)", filepath.Join(healOut, "report.md"), healed.Failed)
			runs = append(runs, demo.BreakerRun{Name: "heal", Report: healed, Path: "heal/report.md"})
		}
		cmp := filepath.Join(*out, "comparison.md")
		if err := os.WriteFile(cmp, []byte(demo.BreakerComparison(runs...)), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "llmdemo:", err)
			return 1
		}
		logf("comparison: %s", cmp)
		return 0
	}
	var points []demo.Point
	for _, p := range demo.DefaultPoints(*duration) {
		if filter == nil || filter.MatchString(p.Name()) {
			points = append(points, p)
		}
	}

	liveAddr, err := liveAddress(*live)
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmdemo: -live:", err)
		return 2
	}
	if liveAddr != "" {
		logf("live view: open http://%s/ to watch the streams in flight while the points run "+
			"(each point's collector serves it in turn; the page reconnects)", liveAddr)
	}
	rep, err := demo.Run(ctx, bins, points, *out, liveAddr, logf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmdemo:", err)
		return 1
	}
	logf("report: %s (%d points in %s)", filepath.Join(*out, "report.md"), len(rep.Points), time.Since(start).Round(time.Second))
	return 0
}

// liveAddress is the address the live view is served on: addr if it is
// free, else another free port on loopback; "" stays off. One address for
// the whole run, so that a page left open follows every point.
func liveAddress(addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return addr, ln.Close()
	}
	return process.FreeAddr()
}
