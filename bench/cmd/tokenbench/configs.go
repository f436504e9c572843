// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
)

// telemetryYAML is the service::telemetry block both collectors get: warnings
// only in the log, self-telemetry on a Prometheus endpoint for the drop
// counters.
func telemetryYAML(addr string) string {
	return fmt.Sprintf(`  telemetry:
    logs: {level: warn}
    metrics:
      level: normal
      readers:
        - pull: {exporter: {prometheus: {host: 127.0.0.1, port: %s}}}
`, portOf(addr))
}

// exporterBatchYAML batches the exporter's requests (the exporter helper's
// batcher, in both distributions), as a deployment does (the batch
// processor of deploy/ and otelcol-config.yaml): without it each pipeline
// call is a gRPC request of its own, and token_session's outputs come a
// few at a time, once per hook batch. Both sides get the same.
const exporterBatchYAML = `    sending_queue:
      batch: {flush_timeout: 200ms, sizer: items, min_size: 8192}
`

// addrs are the listening addresses of one collector under test.
type addrs struct {
	hooksHTTP, hooksUDP, otlp, pprof, telemetry, sink string
	// hooksUnix is the Unix socket hook's path.
	hooksUnix       string
	proxy, upstream string
}

func newAddrs(sink string) addrs {
	free := process.MustFreeAddr
	return addrs{hooksHTTP: free(), hooksUDP: free(), otlp: free(), pprof: free(), telemetry: free(), sink: sink, hooksUnix: socketPath()}
}

// socketPath is a fresh path for a collector's Unix socket hook, short
// enough for a socket (the -out directory may not be).
func socketPath() string {
	socketSeq++
	return filepath.Join(socketDir, fmt.Sprintf("h%d.sock", socketSeq))
}

// socketDir holds the collectors' sockets: made by main, removed at its end.
var (
	socketDir string
	socketSeq int
)

// oursConfig is the token path under test: hooks (HTTP, UDP and Unix) →
// token_session (logs, traces and metrics instances, one session table) →
// otlp exporter to the driver's sink, with token_session's defaults (sampling
// TTFT 500 ms, TPOT 80 ms, 1% of the rest) except a session table large enough
// for the 100k-session step and the stall gap (stallYAML). extra is YAML added under token_stream (proxy,
// vllm).
func oursConfig(a addrs, extra string) string {
	return fmt.Sprintf(`receivers:
  token_stream:
    hooks:
      http: {endpoint: %s}
      udp: {endpoint: %s, socket_buffer_size: 4194304}
      unix: {endpoint: %s}
%s  otlp:
    protocols:
      grpc: {endpoint: %s}
processors:
  token_session:
    session: {max_active: 200000}
%s
exporters:
  otlp_grpc:
    endpoint: %s
    tls: {insecure: true}
%sextensions:
  pprof: {endpoint: %s}
service:
  extensions: [pprof]
%s  pipelines:
    logs: {receivers: [token_stream], processors: [token_session], exporters: [otlp_grpc]}
    traces: {receivers: [otlp], processors: [token_session], exporters: [otlp_grpc]}
    metrics: {receivers: [otlp%s], processors: [token_session], exporters: [otlp_grpc]}
`, a.hooksHTTP, a.hooksUDP, a.hooksUnix, extra, a.otlp, stallYAML(extra), a.sink, exporterBatchYAML, a.pprof, telemetryYAML(a.telemetry), metricsReceivers(extra))
}

// withoutAttribution turns token_session's GPU-time attribution off in a
// config of oursConfig.
func withoutAttribution(cfg string) string {
	const session = "    session: {max_active: 200000}\n"
	if !strings.Contains(cfg, session) {
		panic("oursConfig's token_session has no session line to add attribution after")
	}
	return strings.Replace(cfg, session, session+"    attribution: {enabled: false}\n", 1)
}

// stallYAML: freeze detection runs on the collector's clock (no token for
// stall::consecutive × stall::gap since the last one arrived), while the
// driver replays engine-time streams faster than real time for few sessions
// and slower for 100k (a round of one token per session then takes longer
// than the 450 ms default). So the driver's pacing is not read as freezes,
// runs fed by the driver use a 2 s gap; the e2e run (real time) keeps the
// defaults. The workload's engine-time gaps are far below either.
func stallYAML(extra string) string {
	if extra != "" {
		return ""
	}
	return "    stall: {gap: 2s}"
}

func metricsReceivers(extra string) string {
	if extra != "" {
		return ", token_stream"
	}
	return ""
}

// stockConfig is the baseline: each token a span over OTLP/HTTP; every span
// goes to span_metrics (metrics over all requests, as token_session's are) and
// through tail_sampling (latency + probabilistic, decision_wait 5 s) to the
// sink. num_traces is raised from 50 000 so that no trace is dropped for
// room at the largest in-flight count the driver produces.
func stockConfig(a addrs) string {
	return fmt.Sprintf(`receivers:
  otlp:
    protocols:
      http: {endpoint: %s}
processors:
  tail_sampling:
    decision_wait: 5s
    num_traces: 200000
    policies:
      - name: slow
        type: latency
        latency: {threshold_ms: %d}
      - name: baseline
        type: probabilistic
        probabilistic: {sampling_percentage: 1}
connectors:
  span_metrics:
    dimensions:
      - name: gen_ai.request.model
    metrics_flush_interval: 15s
exporters:
  otlp_grpc:
    endpoint: %s
    tls: {insecure: true}
%sextensions:
  pprof: {endpoint: %s}
service:
  extensions: [pprof]
%s  pipelines:
    traces/in: {receivers: [otlp], exporters: [span_metrics]}
    traces/sampled: {receivers: [otlp], processors: [tail_sampling], exporters: [otlp_grpc]}
    metrics: {receivers: [span_metrics], exporters: [otlp_grpc]}
`, a.otlp, stockLatencyThreshold.Milliseconds(), a.sink, exporterBatchYAML, a.pprof, telemetryYAML(a.telemetry))
}
