// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package deploy holds the tests of the deploy kit (deploy/): the agent
// config run for real, the manifests decoded into Kubernetes' types, the
// Helm values against the chart's schema, the alert rules under promtool
// and the dashboard's queries against Prometheus. `make check-deploy` runs
// them.
package deploy

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.uber.org/goleak"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/otlpsink"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/selfmetrics"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// agentEnv is the environment the agent config reads, as the DaemonSet sets
// it, with the agent's listeners on ip: each test takes its own loopback
// address, so the config's fixed ports do not collide.
func agentEnv(ip, backend, storage string) []string {
	return []string{
		"MY_POD_IP=" + ip, "K8S_NODE_NAME=node-1", "K8S_POD_NAME=otelcol-llm-agent-x7k2p",
		"K8S_NAMESPACE=observability", "OTLP_BACKEND=" + backend, "OTLP_BACKEND_INSECURE=true",
		"OTELCOL_LLM_STORAGE_DIR=" + storage,
	}
}

// startAgent runs the distribution with configs and env, and returns once
// it is ready.
func startAgent(t *testing.T, env []string, configs ...string) *testbin.Process {
	t.Helper()
	var args []string
	for _, c := range configs {
		args = append(args, "--config", withPrivateSocket(t, c))
	}
	return testbin.StartCollector(t, args, env)
}

// agentSocket is the hooks' Unix socket in the agent's config: a path of
// the node, which the tests (several at once, in several worktrees) must
// not share.
const agentSocket = "/run/otelcol-llm/hooks.sock"

// withPrivateSocket returns config, or a copy of it with its hooks' socket
// in a directory of the test's own.
func withPrivateSocket(t *testing.T, config string) string {
	t.Helper()
	text, err := os.ReadFile(config)
	require.NoError(t, err)
	if !strings.Contains(string(text), agentSocket) {
		return config
	}
	dir := t.TempDir()
	copied := filepath.Join(dir, filepath.Base(config))
	private := strings.ReplaceAll(string(text), agentSocket, filepath.Join(dir, "hooks.sock"))
	// The socket's group is the engines' on a node; here the test's own,
	// which it may give its files to without being root.
	private = strings.ReplaceAll(private, `socket_group: "10001"`, fmt.Sprintf("socket_group: %q", strconv.Itoa(os.Getegid())))
	require.NoError(t, os.WriteFile(copied, []byte(private), 0o600)) //nolint:gosec // G703: the test's own temporary directory
	return copied
}

// selfMetric reads a counter or gauge of the agent's own telemetry (:8888),
// summed over the series with every one of labels; -1 when it does not
// answer.
func selfMetric(ip, name string, labels map[string]string) float64 {
	v, err := selfmetrics.Value(net.JoinHostPort(ip, "8888"), name, labels)
	if err != nil {
		return -1
	}
	return v
}

// summarySink counts the session summaries an OTLP/gRPC backend receives,
// by session ID; the agent's metrics and traces are taken, not kept.
type summarySink struct {
	mu        sync.Mutex
	summaries map[string]int
}

func (s *summarySink) logs(ld plog.Logs) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rl := range ld.ResourceLogs().All() {
		for _, sl := range rl.ScopeLogs().All() {
			for _, lr := range sl.LogRecords().All() {
				if lr.EventName() != "llm.session.summary" {
					continue
				}
				id, _ := lr.Attributes().Get("llm.session.id")
				s.summaries[id.Str()]++
			}
		}
	}
}

func (s *summarySink) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.summaries))
	for k, v := range s.summaries {
		out[k] = v
	}
	return out
}

// startSummarySink serves the sink on addr until the test ends.
func startSummarySink(t *testing.T, addr string) *summarySink {
	t.Helper()
	s := &summarySink{summaries: map[string]int{}}
	otlp, err := otlpsink.Start(addr, otlpsink.Options{OnLogs: s.logs})
	require.NoError(t, err)
	t.Cleanup(otlp.Close)
	return s
}

// TestAgentLosesNothingAcrossRestarts runs deploy/agent-config.yaml with its
// backend down, sends sessions to its hooks, restarts it, and only then
// brings the backend up: every session the agent kept arrives, exactly once,
// from the queue it persisted in file_storage.
func TestAgentLosesNothingAcrossRestarts(t *testing.T) {
	const ip = "127.0.0.2"
	storage := t.TempDir()
	backend := net.JoinHostPort(ip, freePort(t, ip))
	env := agentEnv(ip, backend, storage)
	first := startAgent(t, env, "agent-config.yaml")

	// 30 slow sessions (TTFT 600 ms: kept by the TTFT rule) and 30 fast ones
	// (kept only by the 1% rule), all ended.
	var body strings.Builder
	start := time.Now().Add(-time.Minute)
	for i := range 60 {
		ttft := 600 * time.Millisecond
		if i%2 == 1 {
			ttft = 30 * time.Millisecond
		}
		lines := testbin.HookSession{
			ID: fmt.Sprintf("restart-%02d", i), Start: start.Add(time.Duration(i) * time.Second),
			TTFT: ttft, Tokens: 2,
		}.Lines()
		body.WriteString(strings.Join(lines, "\n") + "\n")
	}
	resp, err := http.Post("http://"+net.JoinHostPort(ip, "4320")+"/v1/token-events", "application/x-ndjson",
		strings.NewReader(body.String()))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	var kept float64
	require.Eventually(t, func() bool {
		ended := selfMetric(ip, "otelcol_processor_token_session_sessions_ended", nil)
		kept = selfMetric(ip, "otelcol_processor_token_session_sessions_ended", map[string]string{"sampled": "true"})
		return ended == 60
	}, 30*time.Second, 50*time.Millisecond, "the agent never ended the 60 sessions")
	require.GreaterOrEqual(t, kept, 30.0, "every slow session is kept")
	// The summaries are in the exporter's queue, the backend being down.
	require.Eventually(t, func() bool {
		return selfMetric(ip, "otelcol_exporter_queue_size", map[string]string{"data_type": "logs"}) > 0
	}, 30*time.Second, 50*time.Millisecond, "the summaries never reached the persistent queue\n%s", first.Output)
	first.Stop()

	second := startAgent(t, env, "agent-config.yaml")
	sink := startSummarySink(t, backend)
	require.Eventually(t, func() bool { return float64(len(sink.counts())) >= kept }, 60*time.Second, 100*time.Millisecond,
		"the queued summaries did not all arrive: %d of %v\n%s", len(sink.counts()), kept, second.Output)
	// Anything sent twice would come right behind.
	time.Sleep(2 * time.Second)
	got := sink.counts()
	assert.Len(t, got, int(kept), "every kept session, and no other")
	for id, n := range got {
		assert.Equal(t, 1, n, "session %s arrived %d times", id, n)
	}
	for i := 0; i < 60; i += 2 {
		assert.Contains(t, got, fmt.Sprintf("restart-%02d", i), "slow sessions are kept")
	}
	second.Stop()
}

// freePort returns a TCP port free on ip a moment ago.
func freePort(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	require.NoError(t, err)
	defer ln.Close()
	_, port, err := net.SplitHostPort(ln.Addr().String())
	require.NoError(t, err)
	return port
}
