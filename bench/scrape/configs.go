// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"fmt"
	"strings"
	"time"
)

// source is what reads the engine's /metrics in a collector under test.
type source string

const (
	srcIdle   source = "idle"       // no scraper: an otlp receiver nothing sends to
	srcVLLM   source = "vllm"       // the token_stream receiver's vllm source
	srcProm   source = "prometheus" // contrib's prometheus receiver, as configured by default
	srcReload source = "prometheus, discovery_reload_on_startup"
)

// setup is one collector under test.
type setup struct {
	src       source
	targets   []string // host:port of the engines' /metrics
	interval  time.Duration
	telemetry string // host:port of the collector's own metrics
	otlp      string // host:port of the idle collector's otlp receiver
	// Correctness runs only: the HTTP hook endpoint and the files the
	// metrics and logs pipelines write.
	hooks, metricsFile, logsFile string
}

// config is the collector configuration of s. Measurement runs: the source
// → token_session → filter (drops every metric) → debug, so what is
// measured is the scrape and token_session's reading of the engine state,
// not an exporter. Correctness runs: the source → token_session → file,
// and the hooks → token_session → file, so the sessions' engine context
// can be read back.
func config(s setup) string {
	var b strings.Builder
	metricsRecv := "token_stream"
	b.WriteString("receivers:\n")
	switch s.src {
	case srcIdle:
		metricsRecv = "otlp"
		fmt.Fprintf(&b, "  otlp:\n    protocols: {http: {endpoint: %s}}\n", s.otlp)
	case srcProm, srcReload:
		metricsRecv = "prometheus"
		timeout := min(s.interval, 10*time.Second)
		fmt.Fprintf(&b, "  prometheus:\n")
		if s.src == srcReload {
			b.WriteString("    discovery_reload_on_startup: true\n")
		}
		fmt.Fprintf(&b, "    config:\n      scrape_configs:\n        - job_name: vllm\n"+
			"          scrape_interval: %s\n          scrape_timeout: %s\n          static_configs: [{targets: [%s]}]\n",
			s.interval, timeout, quoted(s.targets, ""))
	}
	if s.src == srcVLLM || s.hooks != "" {
		b.WriteString("  token_stream:\n")
		if s.hooks != "" {
			fmt.Fprintf(&b, "    hooks: {http: {endpoint: %s}}\n", s.hooks)
		}
		if s.src == srcVLLM {
			fmt.Fprintf(&b, "    vllm: {targets: [%s], interval: %s}\n", quoted(s.targets, "http://%s/metrics"), s.interval)
		}
	}
	b.WriteString("processors:\n")
	if s.hooks == "" {
		b.WriteString("  token_session: {}\n  filter/drop:\n    metrics:\n      metric: ['true']\n")
		b.WriteString("exporters:\n  debug: {verbosity: basic}\n")
	} else {
		b.WriteString("  token_session: {sampling: {normal_percent: 100}}\n")
		fmt.Fprintf(&b, "exporters:\n  file/metrics: {path: %s}\n  file/logs: {path: %s}\n", s.metricsFile, s.logsFile)
	}
	host, port, _ := strings.Cut(s.telemetry, ":")
	fmt.Fprintf(&b, "service:\n  telemetry:\n    metrics:\n      level: normal\n"+
		"      readers:\n        - pull: {exporter: {prometheus: {host: %s, port: %s}}}\n  pipelines:\n", host, port)
	if s.hooks == "" {
		fmt.Fprintf(&b, "    metrics: {receivers: [%s], processors: [token_session, filter/drop], exporters: [debug]}\n", metricsRecv)
	} else {
		fmt.Fprintf(&b, "    metrics: {receivers: [%s], processors: [token_session], exporters: [file/metrics]}\n", metricsRecv)
		b.WriteString("    logs: {receivers: [token_stream], processors: [token_session], exporters: [file/logs]}\n")
	}
	return b.String()
}

// quoted lists the targets as quoted YAML flow items, each formatted with
// format when it is not empty.
func quoted(targets []string, format string) string {
	q := make([]string, len(targets))
	for i, t := range targets {
		if format != "" {
			t = fmt.Sprintf(format, t)
		}
		q[i] = "'" + t + "'"
	}
	return strings.Join(q, ", ")
}
