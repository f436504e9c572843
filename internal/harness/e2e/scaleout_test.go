// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"sigs.k8s.io/yaml"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// The scale-out topology from the shipped configs: agents run
// deploy/agent-config.yaml + deploy/agent-lb.yaml, gateways
// deploy/gateway.yaml. The tests swap the k8s resolver for the static one
// and shorten the gateways' decision_wait; nothing else changes.

// gatewayDecisionWait is the gateways' decision_wait in TestScaleOut.
const gatewayDecisionWait = 3 * time.Second

// TestScaleOutGatewayLost's gateways wait longer: after a gateway's outage
// each agent reconnects to it on gRPC's own connection backoff (1 s growing
// 1.6× a try, jittered), which the exporter's retry settings do not reach.
// After the test's 5 s outage the agents' reconnections can be seconds
// apart, and a trace whose spans came through both agents is whole only if
// decision_wait covers that spread; at 3 s a quarter of such traces were
// decided on the part without their verdict and dropped.
const (
	gatewayLostDecisionWait = 15 * time.Second
	gatewayOutage           = 5 * time.Second
)

// rewriteConfig writes a copy of deploy/<name> with edit applied to it.
func rewriteConfig(t *testing.T, name string, edit func(cfg map[string]any)) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", name))
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal(data, &cfg))
	edit(cfg)
	out, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, out, 0o600))
	return path
}

func sub(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		m = m[k].(map[string]any)
	}
	return m
}

// scaleOut is two agents and two gateways on their own loopback addresses,
// each gateway exporting to a sink of its own.
type scaleOut struct {
	agents   [2]string // the agents' addresses (their MY_POD_IP)
	gateways [2]*sink
	// gatewayProcs are the gateways' processes; startGateway starts one
	// again.
	gatewayProcs [2]*testbin.Process
	startGateway func(i int)
}

func startScaleOut(t *testing.T, decisionWait time.Duration) *scaleOut {
	t.Helper()
	so := &scaleOut{agents: [2]string{"127.0.0.11", "127.0.0.12"}}
	gatewayIPs := [2]string{"127.0.0.21", "127.0.0.22"}
	gatewayCfg := rewriteConfig(t, "gateway.yaml", func(cfg map[string]any) {
		sub(cfg, "processors", "tail_sampling")["decision_wait"] = decisionWait.String()
	})
	var sinkAddrs [2]string
	so.startGateway = func(i int) {
		so.gatewayProcs[i] = testbin.StartCollector(t, []string{"--config", gatewayCfg},
			[]string{"MY_POD_IP=" + gatewayIPs[i], "OTLP_BACKEND=" + sinkAddrs[i], "OTLP_BACKEND_INSECURE=true"})
	}
	for i := range gatewayIPs {
		so.gateways[i], sinkAddrs[i] = startSink(t)
		so.startGateway(i)
	}
	lbCfg := rewriteConfig(t, "agent-lb.yaml", func(cfg map[string]any) {
		for _, exp := range []string{"load_balancing", "load_balancing/metrics"} {
			sub(cfg, "exporters", exp)["resolver"] = map[string]any{"static": map[string]any{
				"hostnames": []any{gatewayIPs[0] + ":4317", gatewayIPs[1] + ":4317"},
			}}
		}
		// Retries scaled down with decision_wait (60 s → 3 s): a trace's
		// spans come through both agents, each retrying on its own, and a
		// gateway back up must get all of them within decision_wait. At
		// the shipped 5 s the two agents' retries could land more than 3 s
		// apart on a loaded machine, and the trace was decided on half of
		// it.
		sub(cfg, "exporters", "load_balancing")["retry_on_failure"] = map[string]any{
			"enabled": true, "initial_interval": "100ms", "max_interval": "500ms",
		}
	})
	for _, ip := range so.agents {
		// The agent's hooks' Unix socket is a path of the node: each agent
		// here (and each test run at once elsewhere) gets its own, left in
		// the collector's group (giving it to the engines' socket_group
		// takes root or membership). The
		// agent expects its engines' spans (engine_timing::expect_spans),
		// so a kept session waits up to engine_timing::wait for one; the
		// sessions here have none, and that wait is scaled down with
		// decision_wait (6 s → 300 ms), as the shipped 60 s covers 6 s.
		// Its outputs also wait for its engine's steps to settle
		// (attribution::settle_after), scaled down likewise (2 s → 300 ms).
		dir := t.TempDir()
		agentCfg := filepath.Join(dir, "agent.yaml")
		require.NoError(t, os.WriteFile(agentCfg, []byte( //nolint:gosec // G703: the test's own temporary directory
			"receivers:\n  token_stream:\n    hooks:\n      unix:\n        endpoint: "+filepath.Join(dir, "hooks.sock")+"\n        socket_group: \"\"\n"+
				"processors:\n  token_session:\n    engine_timing:\n      wait: 300ms\n    attribution:\n      settle_after: 300ms\n"), 0o600))
		testbin.StartCollector(t, []string{
			"--config", filepath.Join("..", "..", "..", "deploy", "agent-config.yaml"),
			"--config", lbCfg,
			"--config", agentCfg,
		}, []string{
			"MY_POD_IP=" + ip, "K8S_NODE_NAME=node-" + ip, "K8S_POD_NAME=agent-" + ip,
			"K8S_NAMESPACE=observability", "OTLP_BACKEND=127.0.0.1:9", "OTELCOL_LLM_STORAGE_DIR=" + t.TempDir(),
			"GATEWAY_INSECURE=true",
		})
	}
	return so
}

// hookURL is an agent's hook endpoint.
func (so *scaleOut) hookURL(agent int) string {
	return "http://" + net.JoinHostPort(so.agents[agent], "4320") + "/v1/token-events"
}

// otlpAddr is an agent's OTLP/gRPC endpoint.
// otlpAddr is the OTLP endpoint of the second agent, the one the tests send
// application spans to (the first sends the sessions).
func (so *scaleOut) otlpAddr() string { return net.JoinHostPort(so.agents[1], "4317") }

// appSpans are the spans an app and an API gateway make for a request
// whose model call is the session sessionSpan.
func appSpans(td ptrace.Traces, trace pcommon.TraceID) {
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "chat-app")
	ss := rs.ScopeSpans().AppendEmpty()
	root := pcommon.SpanID{0xa0, trace[0], trace[1], trace[2], trace[3], 1}
	gw := pcommon.SpanID{0xa0, trace[0], trace[1], trace[2], trace[3], 2}
	for _, s := range []struct {
		name         string
		id, parent   pcommon.SpanID
		kind         ptrace.SpanKind
		start, endAt time.Duration
	}{
		{"POST /chat", root, pcommon.SpanID{}, ptrace.SpanKindServer, 0, 2 * time.Second},
		{"api-gateway /v1/chat/completions", gw, root, ptrace.SpanKindClient, 10 * time.Millisecond, 2 * time.Second},
	} {
		span := ss.Spans().AppendEmpty()
		span.SetTraceID(trace)
		span.SetSpanID(s.id)
		span.SetParentSpanID(s.parent)
		span.SetName(s.name)
		span.SetKind(s.kind)
		now := time.Now()
		span.SetStartTimestamp(pcommon.NewTimestampFromTime(now.Add(s.start)))
		span.SetEndTimestamp(pcommon.NewTimestampFromTime(now.Add(s.endAt)))
	}
}

// sessionEvents are the hook lines of one session of trace, a child of its
// API gateway's span (appSpans): the first token after ttft, then tokens
// 20 ms apart, and the end.
func sessionEvents(id string, trace pcommon.TraceID, span pcommon.SpanID, start time.Time, ttft time.Duration, tokens int) []string {
	return testbin.HookSession{
		ID: id, TraceID: trace, SpanID: span, ParentSpanID: [8]byte{0xa0, trace[0], trace[1], trace[2], trace[3], 2},
		Start: start, TTFT: ttft, Tokens: tokens,
	}.Lines()
}

// tracesAt groups the spans each gateway exported, by trace.
func (so *scaleOut) tracesAt() [2]map[pcommon.TraceID][]ptrace.Span {
	var out [2]map[pcommon.TraceID][]ptrace.Span
	for i, s := range so.gateways {
		out[i] = map[pcommon.TraceID][]ptrace.Span{}
		for _, span := range s.Spans() {
			out[i][span.TraceID()] = append(out[i][span.TraceID()], span)
		}
	}
	return out
}

func spanNames(spans []ptrace.Span) []string {
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	return names
}

// traceID makes a trace ID whose OTEP 235 randomness (its last 7 bytes) is
// r: 0 is never drawn at 1%, all ones always.
func traceID(seq uint32, r uint64) pcommon.TraceID {
	var id pcommon.TraceID
	id[0], id[1], id[2], id[3] = byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq)
	for i := 15; i >= 9; i-- {
		id[i] = byte(r)
		r >>= 8
	}
	return id
}

// TestScaleOut runs the topology through the binary: two agents, two
// gateways (static resolver), each gateway exporting to its own sink.
//   - A slow session on agent A whose trace's app and gateway spans enter
//     through agent B is kept whole, at one gateway.
//   - A normal session is dropped whole, or kept whole when the agents' 1%
//     draw keeps it: the gateways follow the agents' draw.
//   - 1000 sessions over both agents: the traces kept are exactly those the
//     rules and the 1% draw keep, each complete at exactly one gateway.
//   - A 30-second session (ten times decision_wait) whose verdict (TTFT) is
//     known at its first token: its app spans, which arrive 30 s before the
//     session span, are kept with it, because the verdict span reaches the
//     gateway at once.
func TestScaleOut(t *testing.T) {
	so := startScaleOut(t, gatewayDecisionWait)
	start := time.Now()

	// The long session first: its app spans now (through agent B), its
	// start and first token (TTFT 700 ms: kept by the TTFT rule) on agent
	// A, then a token every 100 ms for longFor.
	longTrace := traceID(0xfeed, 0)
	longSpan := pcommon.SpanID{0x10, 0xfe}
	td := ptrace.NewTraces()
	appSpans(td, longTrace)
	exportTraces(t, so.otlpAddr(), td)
	longStart := time.Now()
	postLines(t, so.hookURL(0), sessionEvents("long", longTrace, longSpan, longStart, 700*time.Millisecond, 0)[:1]...)
	const longFor = 30 * time.Second
	longDone := make(chan struct{})
	var longErr error
	var once sync.Once
	go func() {
		defer close(longDone)
		at := longStart.Add(700 * time.Millisecond)
		time.Sleep(time.Until(at))
		n := 0
		for time.Since(longStart) < longFor {
			line := strings.TrimSpace(string(tokenevent.AppendJSON(nil, &tokenevent.Event{
				Kind: tokenevent.KindToken, SessionID: "long",
				TimeUnixNano: uint64(time.Now().UnixNano()), Count: 1, PromptTokens: -1, CompletionTokens: -1,
			})))
			if err := postBatch(so.hookURL(0), line); err != nil {
				once.Do(func() { longErr = err })
				return
			}
			n++
			time.Sleep(100 * time.Millisecond)
		}
		end := strings.TrimSpace(string(tokenevent.AppendJSON(nil, &tokenevent.Event{
			Kind: tokenevent.KindEnd, SessionID: "long",
			TimeUnixNano: uint64(time.Now().UnixNano()), CompletionTokens: int64(n), FinishReason: "stop", PromptTokens: -1, Count: 1,
		})))
		if err := postBatch(so.hookURL(0), end); err != nil {
			once.Do(func() { longErr = err })
		}
	}()

	// Slow on A, app spans through B; a normal session never drawn; a
	// normal session always drawn.
	slowTrace, dropTrace, drawnTrace := traceID(1, 12345), traceID(2, 0), traceID(3, 1<<56-1)
	td = ptrace.NewTraces()
	for _, tr := range []pcommon.TraceID{slowTrace, dropTrace, drawnTrace} {
		appSpans(td, tr)
	}
	exportTraces(t, so.otlpAddr(), td)
	var lines []string
	lines = append(lines, sessionEvents("slow", slowTrace, pcommon.SpanID{0x11}, time.Now(), 600*time.Millisecond, 5)...)
	lines = append(lines, sessionEvents("dropped", dropTrace, pcommon.SpanID{0x12}, time.Now(), 50*time.Millisecond, 5)...)
	lines = append(lines, sessionEvents("drawn", drawnTrace, pcommon.SpanID{0x13}, time.Now(), 50*time.Millisecond, 5)...)
	postLines(t, so.hookURL(0), lines...)

	whole := func(trace pcommon.TraceID, want ...string) {
		t.Helper()
		var got [2]int
		require.Eventually(t, func() bool {
			at := so.tracesAt()
			got = [2]int{len(at[0][trace]), len(at[1][trace])}
			return got[0] >= len(want) || got[1] >= len(want)
		}, 30*time.Second, 100*time.Millisecond, "trace %s never complete: %v", trace, got)
		at := so.tracesAt()
		require.True(t, len(at[0][trace]) == 0 || len(at[1][trace]) == 0, "trace %s split across the gateways: %v / %v",
			trace, spanNames(at[0][trace]), spanNames(at[1][trace]))
		spans := slices.Concat(at[0][trace], at[1][trace])
		assert.ElementsMatch(t, want, spanNames(spans), "trace %s", trace)
	}
	// A kept session's span comes with its phases (traces::phase_spans,
	// on in the shipped agent config by default): without the engine's
	// split, the wait for the first token and the decode.
	whole(slowTrace, "POST /chat", "api-gateway /v1/chat/completions", "llm.session.verdict", "chat llama-3.1-8b",
		"llm.session.time_to_first_token", "llm.session.decode")
	whole(drawnTrace, "POST /chat", "api-gateway /v1/chat/completions", "chat llama-3.1-8b",
		"llm.session.time_to_first_token", "llm.session.decode")
	// The long session's app spans and its verdict span are kept at the
	// verdict, long before the session's end.
	whole(longTrace, "POST /chat", "api-gateway /v1/chat/completions", "llm.session.verdict")
	t.Logf("long session kept at its verdict, %s before its end", (longFor - time.Since(longStart)).Round(time.Second))
	time.Sleep(gatewayDecisionWait + 2*time.Second)
	at := so.tracesAt()
	assert.Empty(t, at[0][dropTrace], "a normal session not drawn is dropped whole")
	assert.Empty(t, at[1][dropTrace])

	// 1000 sessions over both agents, each trace's app spans through the
	// other agent; one in ten slow.
	rng := rand.New(rand.NewPCG(7, 11))
	onePercent, err := sampling.ProbabilityToThreshold(0.01)
	require.NoError(t, err)
	want := map[pcommon.TraceID]bool{}
	var perAgent [2][]string
	td = ptrace.NewTraces()
	for i := range 1000 {
		tr := traceID(uint32(1000+i), rng.Uint64()&(1<<56-1))
		appSpans(td, tr)
		ttft := 40 * time.Millisecond
		if i%10 == 0 {
			ttft = 600 * time.Millisecond
		}
		kept := i%10 == 0 || onePercent.ShouldSample(sampling.TraceIDToRandomness(tr))
		want[tr] = kept
		perAgent[i%2] = append(perAgent[i%2], sessionEvents(fmt.Sprintf("bulk-%d", i), tr, pcommon.SpanID{0x20, byte(i >> 8), byte(i)},
			time.Now(), ttft, 3)...)
	}
	exportTraces(t, so.otlpAddr(), td)
	for a := range 2 {
		postLines(t, so.hookURL(a), perAgent[a]...)
	}
	var kept int
	for _, k := range want {
		if k {
			kept++
		}
	}
	t.Logf("1000 sessions: %d kept (100 by TTFT, %d by the 1%% draw)", kept, kept-100)
	require.Eventually(t, func() bool {
		at := so.tracesAt()
		n := 0
		for tr, k := range want {
			if k && (len(at[0][tr]) >= 3 || len(at[1][tr]) >= 3) {
				n++
			}
		}
		return n == kept
	}, 60*time.Second, 200*time.Millisecond, "not every kept trace arrived")
	time.Sleep(gatewayDecisionWait + 2*time.Second)
	at = so.tracesAt()
	var perGateway [2]int
	for tr, k := range want {
		a, b := at[0][tr], at[1][tr]
		if !k {
			assert.Empty(t, append(a, b...), "trace %s was not kept", tr)
			continue
		}
		require.True(t, len(a) == 0 || len(b) == 0, "trace %s split: %v / %v", tr, spanNames(a), spanNames(b))
		spans := slices.Concat(a, b)
		names := spanNames(spans)
		assert.Contains(t, names, "POST /chat", "trace %s", tr)
		assert.Contains(t, names, "api-gateway /v1/chat/completions", "trace %s", tr)
		assert.Contains(t, names, "chat llama-3.1-8b", "trace %s", tr)
		if len(a) > 0 {
			perGateway[0]++
		} else {
			perGateway[1]++
		}
	}
	t.Logf("kept traces per gateway: %v", perGateway)
	assert.Positive(t, perGateway[0], "both gateways take traces")
	assert.Positive(t, perGateway[1], "both gateways take traces")

	// The long session's span, and its phases, join its kept trace at the
	// end.
	<-longDone
	require.NoError(t, longErr)
	whole(longTrace, "POST /chat", "api-gateway /v1/chat/completions", "llm.session.verdict", "chat llama-3.1-8b",
		"llm.session.time_to_first_token", "llm.session.decode")
	t.Logf("scale-out run: %s", time.Since(start).Round(time.Second))
}

// bulkSessions sends n slow sessions (kept by the TTFT rule) over both
// agents, each trace's app spans through the other agent, and returns their
// traces.
func (so *scaleOut) bulkSessions(t *testing.T, first, n int) []pcommon.TraceID {
	t.Helper()
	var traces []pcommon.TraceID
	var perAgent [2][]string
	td := ptrace.NewTraces()
	for i := first; i < first+n; i++ {
		tr := traceID(uint32(i), uint64(i)*7919)
		traces = append(traces, tr)
		appSpans(td, tr)
		perAgent[i%2] = append(perAgent[i%2], sessionEvents(fmt.Sprintf("s-%d", i), tr, pcommon.SpanID{0x30, byte(i >> 8), byte(i)},
			time.Now(), 600*time.Millisecond, 3)...)
	}
	exportTraces(t, so.otlpAddr(), td)
	for a := range 2 {
		postLines(t, so.hookURL(a), perAgent[a]...)
	}
	return traces
}

// outcome is where each of traces is: complete at one gateway (6 spans: the
// app's two, the verdict, the session and its two phases), absent, or else
// (split or partial).
func (so *scaleOut) outcome(traces []pcommon.TraceID) (complete, absent int, bad []string) {
	at := so.tracesAt()
	for _, tr := range traces {
		a, b := at[0][tr], at[1][tr]
		switch {
		case len(a) == 0 && len(b) == 0:
			absent++
		case (len(a) == 6 && len(b) == 0) || (len(b) == 6 && len(a) == 0):
			complete++
		default:
			bad = append(bad, fmt.Sprintf("%s: %v / %v", tr, spanNames(a), spanNames(b)))
		}
	}
	return complete, absent, bad
}

// TestScaleOutGatewayLost loses a gateway mid-run (SIGKILL, as a node that
// goes away). The traces it held undecided (those whose first span reached
// it within decision_wait before it went) are lost, whole; every other trace
// is whole at one gateway. While it is down the static resolver keeps its
// routes, and the agents' loadbalancing queues hold what goes to it until it
// is back (the k8s resolver would move them to the other gateway instead).
func TestScaleOutGatewayLost(t *testing.T) {
	so := startScaleOut(t, gatewayLostDecisionWait)
	before := so.bulkSessions(t, 5000, 100)
	require.Eventually(t, func() bool { c, _, _ := so.outcome(before); return c == len(before) }, gatewayLostDecisionWait+60*time.Second,
		200*time.Millisecond, "the first 100 traces were not all kept whole")

	inFlight := so.bulkSessions(t, 6000, 100)
	// At both gateways, undecided: the agents send a session's spans once
	// its engine's steps settled, stall::delivery_slack and settle_after
	// after its last event (about a second).
	time.Sleep(3 * time.Second)
	so.gatewayProcs[1].Crash()
	during := so.bulkSessions(t, 7000, 100)
	time.Sleep(gatewayOutage)
	so.startGateway(1)

	if !assert.Eventually(t, func() bool { c, _, _ := so.outcome(during); return c == len(during) }, gatewayLostDecisionWait+60*time.Second,
		200*time.Millisecond, "the traces sent while a gateway was down were not all delivered once it was back") {
		c, absent, bad := so.outcome(during)
		t.Fatalf("of %d: %d whole, %d absent, split or partial: %v", len(during), c, absent, bad)
	}
	time.Sleep(gatewayLostDecisionWait + 2*time.Second)
	complete, lost, bad := so.outcome(inFlight)
	t.Logf("traces in flight when gateway 2 was lost: %d whole, %d lost whole", complete, lost)
	assert.Empty(t, bad, "no trace split or partial")
	assert.Positive(t, lost, "the stopped gateway's undecided traces are lost")
	assert.Positive(t, complete, "the other gateway's are whole")
	for _, batch := range [][]pcommon.TraceID{before, during} {
		c, a, bad := so.outcome(batch)
		assert.Equal(t, len(batch), c, "whole: %d absent, %v", a, bad)
	}
}
