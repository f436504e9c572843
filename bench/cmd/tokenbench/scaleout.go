// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"bytes"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
)

// The scale-out topology's two costs (docs/scaling-out.md): the agent's
// CPU per token when it exports through the loadbalancing exporter rather
// than a plain otlp exporter, and the gateway's CPU per span with
// tail_sampling at the rate ten agents would send at the demo's heaviest
// point.

// scaleOutResult is the "scaleout" scenario.
type scaleOutResult struct {
	Workload  workload `json:"workload"`
	AgentOTLP cpuRun   `json:"agent_otlp"`
	AgentLB   cpuRun   `json:"agent_loadbalancing"`
	// LBCostRatio is the agent's CPU per token through loadbalancing over
	// through otlp.
	LBCostRatio float64    `json:"cpu_per_token_ratio_loadbalancing_vs_otlp"`
	Gateway     gatewayRun `json:"gateway"`
}

// gatewayRun is the gateway's CPU over a paced span load.
type gatewayRun struct {
	SpansPerSecond float64 `json:"spans_per_second_offered"`
	Seconds        float64 `json:"seconds"`
	Spans          int64   `json:"spans_sent"`
	SpansKept      int64   `json:"spans_kept"`
	// TracesKept and TracesDropped are the gateway's own count of its
	// decisions (half the traces hold a kept session).
	TracesKept     float64 `json:"traces_kept"`
	TracesDropped  float64 `json:"traces_dropped"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	IdleCPUSeconds float64 `json:"idle_cpu_seconds_subtracted"`
	MicrosPerSpan  float64 `json:"cpu_microseconds_per_span"`
	CoresAtRate    float64 `json:"cores_at_the_rate"`
}

// lbConfig is oursConfig exporting spans and logs through loadbalancing
// (by trace ID, to the driver's sink: one backend, as a static resolver of
// one), with verdict spans on, as deploy/agent-lb.yaml does; metrics stay
// on otlp.
func lbConfig(a addrs) string {
	cfg := oursConfig(a, "")
	cfg = strings.Replace(cfg, "exporters:\n", fmt.Sprintf(`exporters:
  load_balancing:
    routing_key: traceID
    protocol:
      otlp:
        tls: {insecure: true}
    resolver:
      static: {hostnames: [%s]}
`, a.sink), 1)
	cfg = strings.Replace(cfg, "    session: {max_active: 200000}\n", "    session: {max_active: 200000}\n    traces: {verdict_spans: true}\n", 1)
	cfg = strings.Replace(cfg, "logs: {receivers: [token_stream], processors: [token_session], exporters: [otlp_grpc]}",
		"logs: {receivers: [token_stream], processors: [token_session], exporters: [load_balancing]}", 1)
	return strings.Replace(cfg, "traces: {receivers: [otlp], processors: [token_session], exporters: [otlp_grpc]}",
		"traces: {receivers: [otlp], processors: [token_session], exporters: [load_balancing]}", 1)
}

// gatewayConfig is deploy/gateway.yaml's tail_sampling (decision_wait 5 s
// instead of 60 s, to keep the run short; the cost per span does not depend
// on it, the memory does) behind OTLP/HTTP, exporting to the sink.
func gatewayConfig(a addrs) string {
	return fmt.Sprintf(`receivers:
  otlp:
    protocols:
      http: {endpoint: %s}
processors:
  tail_sampling:
    decision_wait: 5s
    num_traces: 200000
    expected_new_traces_per_sec: 2000
    decision_cache: {sampled_cache_size: 200000, non_sampled_cache_size: 200000}
    policies:
      - name: session-kept-by-token-session
        type: string_attribute
        string_attribute: {key: llm.session.sampling.reason, values: [".+"], enabled_regex_matching: true}
  batch: {}
exporters:
  otlp_grpc:
    endpoint: %s
    tls: {insecure: true}
extensions:
  pprof: {endpoint: %s}
service:
  extensions: [pprof]
%s  pipelines:
    traces: {receivers: [otlp], processors: [tail_sampling, batch], exporters: [otlp_grpc]}
`, a.otlp, a.sink, a.pprof, telemetryYAML(a.telemetry))
}

// gatewaySpansPerSecond is what ten agents send at the demo's heaviest point
// (b-c200: about 10 requests/s per engine, 1 200–1 340 output tokens/s of
// 128-token requests; nearly every session kept there): per request the
// session span, its verdict span, vLLM's llm_request span and the app's and
// API gateway's spans, five spans.
const gatewaySpansPerSecond = 10 * 10 * 5

// scaleOut runs both measurements.
func (e *env) scaleOut(w workload, gatewayFor time.Duration) (*scaleOutResult, error) {
	res := &scaleOutResult{Workload: w}
	gen := func(prefix string) []batch {
		g := newGenerator(w, 1)
		evs := g.all()
		for i := range evs {
			evs[i].s.id = prefix + evs[i].s.id[1:]
		}
		return chunk(evs, w.BatchLines, ndjson)
	}
	for _, run := range []struct {
		name string
		cfg  func(addrs) string
		out  *cpuRun
	}{
		{"agent_otlp", func(a addrs) string { return oursConfig(a, "") }, &res.AgentOTLP},
		{"agent_loadbalancing", lbConfig, &res.AgentLB},
	} {
		a := newAddrs(e.sink.Addr())
		c, err := startCollector(run.name, e.ours, e.out, run.cfg(a), a.pprof, a.telemetry, a.hooksHTTP)
		if err != nil {
			return nil, err
		}
		hp := hookPoster(a, e.workers)
		nd := gen(run.name[6:7])
		*run.out, err = measureCPU(c, e.sink, run.name, hp.sendAll(e.ctx, nd, e.workers), settleHTTP(c))
		hp.close()
		c.stop()
		if err != nil {
			return nil, err
		}
	}
	if res.AgentOTLP.CPUSecPerMTokens > 0 {
		res.LBCostRatio = res.AgentLB.CPUSecPerMTokens / res.AgentOTLP.CPUSecPerMTokens
	}

	var err error
	res.Gateway, err = e.gateway(gatewayFor)
	return res, err
}

// gateway paces traces of five spans at gatewaySpansPerSecond into a
// gateway for d, half of them with a kept session, and charges it the CPU
// it used until every decision was made.
func (e *env) gateway(d time.Duration) (gatewayRun, error) {
	a := newAddrs(e.sink.Addr())
	c, err := startCollector("gateway", e.ours, e.out, gatewayConfig(a), a.pprof, a.telemetry, a.otlp)
	if err != nil {
		return gatewayRun{}, err
	}
	defer c.stop()
	// Idle over 3 s, once start-up is over: over one second, start-up's
	// tail is charged as idle and over-subtracted.
	c.waitIdle(10 * time.Second)
	time.Sleep(2 * time.Second)
	i0 := c.cpuSeconds()
	time.Sleep(3 * time.Second)
	idleRate := (c.cpuSeconds() - i0) / 3

	const tick = 100 * time.Millisecond
	tracesPerTick := gatewaySpansPerSecond / 5 / int(time.Second/tick)
	before := e.sink.Counts()
	t0, w0 := c.cpuSeconds(), time.Now()
	client := &http.Client{Timeout: 10 * time.Second}
	var sent int64
	seq := uint32(0)
	next := time.Now()
	for time.Since(w0) < d {
		td := ptrace.NewTraces()
		ss := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty()
		now := pcommon.NewTimestampFromTime(time.Now())
		for range tracesPerTick {
			seq++
			var trace pcommon.TraceID
			trace[0], trace[1], trace[2], trace[3] = byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq)
			trace[15] = 0x5a
			for i, name := range []string{"POST /chat", "api-gateway", "llm_request", "llm.session.verdict", "chat llama"} {
				span := ss.Spans().AppendEmpty()
				span.SetTraceID(trace)
				span.SetSpanID(pcommon.SpanID{byte(seq >> 8), byte(seq), byte(i + 1)})
				span.SetName(name)
				span.SetStartTimestamp(now)
				span.SetEndTimestamp(now)
				if seq%2 == 0 && i >= 3 {
					span.Attributes().PutStr("llm.session.sampling.reason", "ttft")
				}
				sent++
			}
		}
		body, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
		if err != nil {
			return gatewayRun{}, err
		}
		resp, err := client.Post("http://"+a.otlp+"/v1/traces", "application/x-protobuf", bytes.NewReader(body))
		if err != nil {
			return gatewayRun{}, err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return gatewayRun{}, fmt.Errorf("gateway answered %s", resp.Status)
		}
		next = next.Add(tick)
		time.Sleep(time.Until(next))
	}
	// Every trace decided (decision_wait 5 s after its first span) and sent.
	time.Sleep(7 * time.Second)
	c.waitIdle(10 * time.Second)
	wall := time.Since(w0).Seconds()
	cpu := c.cpuSeconds() - t0 - idleRate*wall
	after := e.sink.Counts()
	m, err := c.metrics()
	if err != nil {
		return gatewayRun{}, err
	}
	r := gatewayRun{
		TracesKept:    m.sum("otelcol_processor_tail_sampling_global_count_traces_sampled", map[string]string{"sampled": "true"}),
		TracesDropped: m.sum("otelcol_processor_tail_sampling_global_count_traces_sampled", map[string]string{"sampled": "false"}), SpansPerSecond: gatewaySpansPerSecond, Seconds: d.Seconds(), Spans: sent,
		SpansKept: after.Spans - before.Spans, CPUSeconds: cpu, IdleCPUSeconds: idleRate * wall,
	}
	if sent > 0 {
		r.MicrosPerSpan = cpu / float64(sent) * 1e6
		r.CoresAtRate = r.MicrosPerSpan * gatewaySpansPerSecond / 1e6
	}
	log.Printf("gateway: %d spans at %d/s, traces kept %.0f, dropped %.0f, %.2f CPU-s (idle %.2f subtracted): %.1f µs per span, %.3f cores",
		sent, gatewaySpansPerSecond, r.TracesKept, r.TracesDropped, cpu, r.IdleCPUSeconds, r.MicrosPerSpan, r.CoresAtRate)
	return r, nil
}
