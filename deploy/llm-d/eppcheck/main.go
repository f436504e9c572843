// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Command eppcheck runs the llm-d router's endpoint picker (EPP) on
// deploy/llm-d/epp-config.yaml against otelcol-llm sidecars running
// deploy/llm-d/sidecar-config.yaml, and drives the scenarios of issue 40
// through it as Envoy would: a stalling engine, a sidecar restart while its
// engine is ejected, a new pod, the engine killed behind the proxy, an idle
// pod. See README.md.
//
// `eppcheck epp ...` is the EPP itself: the router's cmd/epp main, verbatim,
// at the commit go.mod pins. The driver starts it so, with file discovery
// (the EPP's own way to run without Kubernetes).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/yaml"

	"github.com/llm-d/llm-d-router/cmd/epp/runner"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "epp" {
		os.Args = append(os.Args[:1:1], os.Args[2:]...)
		os.Exit(runEPP())
	}
	if err := drive(os.Args[1:]); errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "eppcheck:", err)
		os.Exit(1)
	}
}

// runEPP is the router's cmd/epp/main.go: its plugin registrations and
// config loader are the runner's.
func runEPP() int {
	ctx := ctrl.SetupSignalHandler()
	if err := runner.NewRunner().Run(ctx); err != nil {
		return 1
	}
	return 0
}

// options are the driver's flags.
type options struct {
	collector, vllmsim    string
	sidecarConfig, eppCfg string
	out                   string
	withoutEngines        bool
	rate                  float64
	maxTokens             int
	idle, observeRestart  time.Duration
	eppVerbosity          int
	scenarios             string
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("eppcheck", flag.ContinueOnError)
	fs.StringVar(&o.collector, "collector", "bin/otelcol-llm", "the otelcol-llm binary (make build)")
	fs.StringVar(&o.vllmsim, "vllmsim", "bin/vllmsim", "the vllmsim binary (make demo-tools)")
	fs.StringVar(&o.sidecarConfig, "sidecar-config", "deploy/llm-d/sidecar-config.yaml", "the sidecar's config, run as is")
	fs.StringVar(&o.eppCfg, "epp-config", "deploy/llm-d/epp-config.yaml", "the EPP's config; file discovery is added to it")
	fs.StringVar(&o.out, "out", "eppcheck-report", "the folder for the logs, the records and report.md")
	fs.BoolVar(&o.withoutEngines, "without-engines", false, "remove engine_health's engines: from the sidecar config (the behavior before issue 40)")
	fs.Float64Var(&o.rate, "rate", 4, "requests a second through the EPP")
	fs.IntVar(&o.maxTokens, "max-tokens", 32, "max_tokens of each request")
	fs.DurationVar(&o.idle, "idle", 320*time.Second, "how long no request is sent in the idle scenario (engine_health forgets an engine after 300 s by default)")
	fs.DurationVar(&o.observeRestart, "observe-restart", 75*time.Second, "how long the pod is watched after its sidecar restarts")
	fs.StringVar(&o.scenarios, "scenarios", "new-pod,stall,restart,killed,idle", "the scenarios to run, in this order")
	fs.IntVar(&o.eppVerbosity, "epp-v", 5, "the EPP's --v: 4 logs each scorer's score, 5 each extraction's metrics and update time")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return o, nil
}

// drive sets up the pods and the EPP, runs the scenarios and writes the
// report.
func drive(args []string) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	if err := isolate(); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	sidecar, err := writeSidecarConfig(o)
	if err != nil {
		return err
	}
	r, err := newRun(o, sidecar)
	if err != nil {
		return err
	}
	defer r.close()
	if err := r.start(ctx); err != nil {
		return err
	}
	r.scenarios(ctx)
	r.stopLoad()
	return r.report()
}

// isolate makes sure the driver runs as root in a network namespace of its
// own (run.sh: unshare --net), where only lo is: the pods' namespaces and
// links go with it.
func isolate() error {
	if os.Geteuid() != 0 {
		return errors.New("run as root, in a network namespace of its own: see run.sh")
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return err
	}
	if len(ifaces) != 1 || ifaces[0].Name != "lo" {
		return errors.New("not in a network namespace of its own (it has more than lo): run it with unshare --net (run.sh)")
	}
	return runCmd("ip", "link", "set", "lo", "up")
}

// engineLine is the sidecar config's engines: line (deploy/llm-d).
var engineLine = regexp.MustCompile(`(?m)^    engines: .*\n`)

// writeSidecarConfig copies the sidecar config into the run's folder, without
// its engines: line with -without-engines.
func writeSidecarConfig(o options) (string, error) {
	raw, err := os.ReadFile(o.sidecarConfig)
	if err != nil {
		return "", err
	}
	if o.withoutEngines {
		if !engineLine.Match(raw) {
			return "", fmt.Errorf("%s: no engines: line to remove", o.sidecarConfig)
		}
		raw = engineLine.ReplaceAll(raw, nil)
	}
	path, err := filepath.Abs(filepath.Join(o.out, "sidecar-config.yaml"))
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, raw, 0o644)
}

// writeEPPConfig is the shipped EPP config with a file-discovery plugin (the
// EPP's way to run without Kubernetes) reading endpoints.
func writeEPPConfig(o options, endpoints string) (string, error) {
	raw, err := os.ReadFile(o.eppCfg)
	if err != nil {
		return "", err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return "", fmt.Errorf("%s: %w", o.eppCfg, err)
	}
	plugins, _ := cfg["plugins"].([]any)
	cfg["plugins"] = append(plugins, map[string]any{
		"type": "file-discovery", "name": "eppcheck-discovery",
		"parameters": map[string]any{"path": endpoints, "watchFile": true},
	})
	dataLayer, _ := cfg["dataLayer"].(map[string]any)
	if dataLayer == nil {
		return "", fmt.Errorf("%s: no dataLayer", o.eppCfg)
	}
	dataLayer["discovery"] = map[string]any{"pluginRef": "eppcheck-discovery"}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(o.out, "epp-config.yaml")
	return path, os.WriteFile(path, out, 0o644)
}
