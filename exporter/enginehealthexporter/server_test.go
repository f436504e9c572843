package enginehealthexporter

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/exporter/exportertest"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
)

var testClient = &http.Client{Timeout: 10 * time.Second}

func get(t *testing.T, u string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := testClient.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, body
}

// ejectB makes a healthy, "ns/pod" healthy and b ejected for its stalls.
func ejectB(t *testing.T, th *testHealth) {
	t.Helper()
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy("a", 10)
	tr.healthy("ns/pod", 10)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	th.consumeLogs(stallAlerts("b", "s1", "s2", "s3", "s4", "s5"))
	require.Equal(t, stateEjected, th.status(t, "b").State)
}

func TestHTTPEndpoints(t *testing.T) {
	th := startHealth(t, nil)
	ejectB(t, th)
	th.clock.Advance(10 * time.Second)
	base := "http://" + th.http.Addr.String()

	code, hdr, body := get(t, base+"/engines")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "application/json", hdr.Get("Content-Type"))
	assert.Equal(t, "no-store", hdr.Get("Cache-Control"))
	var list []map[string]any
	require.NoError(t, json.Unmarshal(body, &list), string(body))
	require.Len(t, list, 3)
	assert.Equal(t, []any{"a", "b", "ns/pod"}, []any{list[0]["engine"], list[1]["engine"], list[2]["engine"]})
	b := list[1]
	assert.Equal(t, "ejected", b["state"])
	assert.Equal(t, "stall_ratio", b["reason"])
	assert.Equal(t, 1.0, b["ejections"])
	assert.Equal(t, 20.0, b["time_left_s"], "30 s base_time, 10 s later")
	assert.Equal(t, map[string]any{"sessions": 5.0, "stall_ratio": 1.0, "error_ratio": 0.0}, b["window"])
	a := list[0]
	assert.Equal(t, "healthy", a["state"])
	assert.NotContains(t, a, "reason")
	assert.Equal(t, 0.0, a["time_left_s"])
	assert.InDelta(t, 0.1, a["ttft_p99_s"], 0.002, "100 ms TTFTs: p99 within their bucket (0.08, 0.1]")

	code, _, body = get(t, base+"/engines/b/health")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	var st map[string]any
	require.NoError(t, json.Unmarshal(body, &st))
	assert.Equal(t, "ejected", st["state"])
	assert.Equal(t, "stall_ratio", st["reason"])

	code, _, _ = get(t, base+"/engines/a/health")
	assert.Equal(t, http.StatusOK, code)
	// llm.engine URL-escaped: a "/" in the name is %2F in the path.
	code, _, body = get(t, base+"/engines/"+url.PathEscape("ns/pod")+"/health")
	assert.Equal(t, http.StatusOK, code, string(body))
	require.NoError(t, json.Unmarshal(body, &st))
	assert.Equal(t, "ns/pod", st["engine"])

	code, hdr, body = get(t, base+"/engines/nope/health")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, "application/json", hdr.Get("Content-Type"))
	var e map[string]string
	require.NoError(t, json.Unmarshal(body, &e))
	assert.Contains(t, e["error"], `unknown engine "nope"`)

	// The engine in the Host header, as Envoy's health checks send it.
	for engine, want := range map[string]int{"b": http.StatusServiceUnavailable, "a": http.StatusOK,
		"nope": http.StatusNotFound} {
		req, err := http.NewRequest(http.MethodGet, base+"/health", nil)
		require.NoError(t, err)
		req.Host = engine
		resp, err := testClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, "Host: %s", engine)
	}

	resp, err := testClient.Post(base+"/engines/a/health", "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// The health endpoint answers from the judge's last verdicts: a batch being
// folded (the exporter's lock held) does not hold up a health check.
func TestHealthNeverWaitsForThePipeline(t *testing.T) {
	th := startHealth(t, nil)
	ejectB(t, th)
	th.mu.Lock()
	defer th.mu.Unlock()
	code, _, _ := get(t, "http://"+th.http.Addr.String()+"/engines/b/health")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, "down #ejected: stall_ratio\n", agentCheck(t, th.agent.ln.Addr().String(), "b\n"))
}

// agentCheck does what HAProxy's agent-check does: connect, send the
// agent-send string (if any), read the one line the agent answers.
func agentCheck(t *testing.T, addr, send string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	if send != "" {
		_, err = io.WriteString(conn, send)
		require.NoError(t, err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	return line
}

func TestAgentCheckProtocol(t *testing.T) {
	th := startHealth(t, nil)
	ejectB(t, th)
	addr := th.agent.ln.Addr().String()
	for _, tc := range []struct{ send, want string }{
		{"b\n", "down #ejected: stall_ratio\n"},
		{"b\r\n", "down #ejected: stall_ratio\n"},
		{"a\n", "up\n"},
		{"ns/pod\n", "up\n"},
		{"unknown\n", "up\n"},                 // reachability is HAProxy's own check's job
		{"", "up\n"},                          // no agent-send: nothing names an engine
		{"b", "down #ejected: stall_ratio\n"}, // no newline: the read deadline ends the name
	} {
		assert.Equal(t, tc.want, agentCheck(t, addr, tc.send), "agent-send %q", tc.send)
	}
	// A name longer than the agent reads is not an engine.
	assert.Equal(t, "up\n", agentCheck(t, addr, strings.Repeat("b", 300)+"\n"))
}

// The metrics and logs exporters of one component ID share one judge and one
// pair of endpoints, started and stopped once.
func TestMetricsAndLogsShareOneJudge(t *testing.T) {
	factory := NewFactory()
	cfg := factory.CreateDefaultConfig().(*Config)
	cfg.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	cfg.Agent = configoptional.Some(AgentConfig{Endpoint: "127.0.0.1:0"})
	set := exportertest.NewNopSettings(metadata.Type)
	ctx := context.Background()
	me, err := factory.CreateMetrics(ctx, set, cfg)
	require.NoError(t, err)
	le, err := factory.CreateLogs(ctx, set, cfg)
	require.NoError(t, err)
	host := componenttest.NewNopHost()
	require.NoError(t, me.Start(ctx, host))
	require.NoError(t, le.Start(ctx, host))
	h := me.(*metricsExporter).Unwrap()
	require.Same(t, h, le.(*logsExporter).Unwrap())

	tr := newTraffic(t, sessionmetrics.Cumulative, sessionmetrics.Explicit, time.Now())
	tr.healthy("a", 10)
	require.NoError(t, me.ConsumeMetrics(ctx, tr.flush(time.Now())))
	require.NoError(t, le.ConsumeLogs(ctx, stallAlerts("b", "s1", "s2", "s3", "s4", "s5")))
	base := "http://" + h.http.Addr.String()
	code, _, _ := get(t, base+"/engines/b/health")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	code, _, _ = get(t, base+"/engines/a/health")
	assert.Equal(t, http.StatusOK, code)

	// The collector stops every component together: the first Shutdown
	// stops the shared one, the second finds it stopped.
	require.NoError(t, me.Shutdown(ctx))
	_, err = testClient.Get(base + "/engines")
	assert.Error(t, err, "stopped")
	require.NoError(t, le.Shutdown(ctx))
}
