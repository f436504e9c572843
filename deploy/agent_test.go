// Package deploy holds the tests of the deploy kit (deploy/): the agent
// config run for real, the manifests decoded into Kubernetes' types, the
// Helm values against the chart's schema, the alert rules under promtool
// and the dashboard's queries against Prometheus. `make check-deploy` runs
// them.
package deploy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // the otlp_grpc exporter compresses

	"github.com/otelcol-llm/otelcol-llm/internal/testbin"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenevent"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// agentEnv is the environment the agent config reads, as the DaemonSet sets
// it, with the agent's listeners on ip: each test takes its own loopback
// address, so the config's fixed ports do not collide.
func agentEnv(ip, backend, storage string) []string {
	return []string{"MY_POD_IP=" + ip, "K8S_NODE_NAME=node-1", "K8S_POD_NAME=otelcol-llm-agent-x7k2p",
		"K8S_NAMESPACE=observability", "OTLP_BACKEND=" + backend, "OTLP_BACKEND_INSECURE=true",
		"OTELCOL_LLM_STORAGE_DIR=" + storage}
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// agent is a running collector.
type agent struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan error
}

// startAgent runs the distribution with configs and env, and returns once
// it is ready.
func startAgent(t *testing.T, env []string, configs ...string) *agent {
	t.Helper()
	var args []string
	for _, c := range configs {
		args = append(args, "--config", c)
	}
	a := &agent{cmd: exec.Command(testbin.Collector(t), args...), out: &syncBuffer{}, exited: make(chan error, 1)}
	a.cmd.Env = append(os.Environ(), env...)
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, a.cmd.Start())
	go func() { a.exited <- a.cmd.Wait() }()
	t.Cleanup(func() { a.stop(t) })
	require.Eventually(t, func() bool {
		select {
		case err := <-a.exited:
			a.exited <- err
			return true
		default:
		}
		return strings.Contains(a.out.String(), "Everything is ready")
	}, 60*time.Second, 20*time.Millisecond)
	require.Contains(t, a.out.String(), "Everything is ready", "the agent exited early")
	return a
}

// stop sends SIGTERM and waits for a clean exit; safe to call twice.
func (a *agent) stop(t *testing.T) {
	if a.cmd.ProcessState != nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.exited:
		assert.NoError(t, err, "agent exit\n%s", a.out)
		a.exited <- err
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		t.Errorf("the agent did not stop within 30 s of SIGTERM\n%s", a.out)
	}
}

// selfMetric reads a counter or gauge of the agent's own telemetry (:8888),
// summed over the series whose labels contain every one of match.
func selfMetric(t *testing.T, ip, name string, match ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + net.JoinHostPort(ip, "8888") + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(line, m) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(t, err, line)
		sum += v
	}
	return sum
}

// summarySink is an OTLP/gRPC logs backend that counts the session
// summaries it receives, by session ID.
type summarySink struct {
	plogotlp.UnimplementedGRPCServer
	mu        sync.Mutex
	summaries map[string]int
}

func (s *summarySink) Export(_ context.Context, req plogotlp.ExportRequest) (plogotlp.ExportResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ld := req.Logs()
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
	return plogotlp.NewExportResponse(), nil
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

type discardMetrics struct {
	pmetricotlp.UnimplementedGRPCServer
}

func (discardMetrics) Export(context.Context, pmetricotlp.ExportRequest) (pmetricotlp.ExportResponse, error) {
	return pmetricotlp.NewExportResponse(), nil
}

type discardTraces struct {
	ptraceotlp.UnimplementedGRPCServer
}

func (discardTraces) Export(context.Context, ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	return ptraceotlp.NewExportResponse(), nil
}

// startSummarySink serves the sink on addr until the test ends.
func startSummarySink(t *testing.T, addr string) *summarySink {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv := grpc.NewServer()
	s := &summarySink{summaries: map[string]int{}}
	plogotlp.RegisterGRPCServer(srv, s)
	// The agent sends metrics and traces too: taken, not kept.
	pmetricotlp.RegisterGRPCServer(srv, &discardMetrics{})
	ptraceotlp.RegisterGRPCServer(srv, &discardTraces{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return s
}

// sessionLines are the hook's NDJSON lines of one complete session whose
// first token comes after ttft.
func sessionLines(id string, start time.Time, ttft time.Duration) string {
	base := uint64(start.UnixNano())
	evs := []tokenevent.Event{
		{Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: base, Model: "llama-3.1-8b", Operation: tokenevent.OperationChat,
			Engine: "vllm-0", PromptTokens: 100, Count: 1, CompletionTokens: -1},
		{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: base + uint64(ttft), Count: 1, PromptTokens: -1, CompletionTokens: -1},
		{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: base + uint64(ttft) + 20e6, Count: 1, PromptTokens: -1, CompletionTokens: -1},
		{Kind: tokenevent.KindEnd, SessionID: id, TimeUnixNano: base + uint64(ttft) + 21e6, CompletionTokens: 2, FinishReason: "stop",
			PromptTokens: -1, Count: 1},
	}
	var b strings.Builder
	for i := range evs {
		b.Write(tokenevent.AppendJSON(nil, &evs[i]))
	}
	return b.String()
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
		body.WriteString(sessionLines(fmt.Sprintf("restart-%02d", i), start.Add(time.Duration(i)*time.Second), ttft))
	}
	resp, err := http.Post("http://"+net.JoinHostPort(ip, "4320")+"/v1/token-events", "application/x-ndjson",
		strings.NewReader(body.String()))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	var kept float64
	require.Eventually(t, func() bool {
		ended := selfMetric(t, ip, "otelcol_processor_token_session_sessions_ended")
		kept = selfMetric(t, ip, "otelcol_processor_token_session_sessions_ended", `sampled="true"`)
		return ended == 60
	}, 30*time.Second, 50*time.Millisecond, "the agent never ended the 60 sessions")
	require.GreaterOrEqual(t, kept, 30.0, "every slow session is kept")
	// The summaries are in the exporter's queue, the backend being down.
	require.Eventually(t, func() bool {
		return selfMetric(t, ip, "otelcol_exporter_queue_size", `data_type="logs"`) > 0
	}, 30*time.Second, 50*time.Millisecond, "the summaries never reached the persistent queue\n%s", first.out)
	first.stop(t)

	second := startAgent(t, env, "agent-config.yaml")
	sink := startSummarySink(t, backend)
	require.Eventually(t, func() bool { return float64(len(sink.counts())) >= kept }, 60*time.Second, 100*time.Millisecond,
		"the queued summaries did not all arrive: %d of %v\n%s", len(sink.counts()), kept, second.out)
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
	second.stop(t)
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
