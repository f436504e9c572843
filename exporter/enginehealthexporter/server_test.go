// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/exporter/exportertest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadatatest"
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
	assert.Equal(t, map[string]any{
		"sessions": 5.0, "stall_ratio": 1.0, "error_ratio": 0.0, "saturated": 0.0,
		"saturated_ratio": 0.0, "client_errors": 0.0,
	}, b["window"])
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
	for engine, want := range map[string]int{
		"b": http.StatusServiceUnavailable, "a": http.StatusOK,
		"nope": http.StatusNotFound,
	} {
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

// One normalisation of an engine name on every path: llm.engine, the path of
// /engines/{engine}/health, the Host header of /health and the agent's line
// agree on which engine a name is, or that it is none.
func TestEngineNamesOneNormalisation(t *testing.T) {
	th := startHealth(t, nil)
	long256 := strings.Repeat("x", 256)
	long300 := strings.Repeat("y", 300)
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	for _, engine := range []string{"a", "b", "c", "d"} {
		tr.healthy(engine, 10)
	}
	th.consumeMetrics(tr.flush(th.clock.Now()))
	for _, engine := range []string{"lower.example.com", "..", "Mixed-Case", long256, long300} {
		th.consumeLogs(stallAlerts(engine, "s1", "s2", "s3", "s4", "s5"))
	}
	base := "http://" + th.http.Addr.String()
	agent := th.agent.ln.Addr().String()
	const down = "down #ejected: stall_ratio\n"

	health := func(path, host string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		resp, err := testClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, body
	}
	for _, tc := range []struct{ path, host string }{
		{"/engines/lower.example.com/health", ""},
		{"/engines/LOWER.Example.COM/health", ""},
		{"/health", "LOWER.example.com"},
		{"/health", "lower.example.com:80"},
		{"/health", "lower.example.com.:8000"},
		{"/engines/mixed-case/health", ""},
		{"/health", "MIXED-CASE"},
		{"/engines/%2E%2E/health", ""},
		{"/engines/../health", ""},
		{"/engines/" + long256 + "/health", ""},
		{"/health", long256},
	} {
		code, body := health(tc.path, tc.host)
		assert.Equal(t, http.StatusServiceUnavailable, code, "%.40s Host %.40s: %s", tc.path, tc.host, body)
	}
	for _, send := range []string{"LOWER.example.com\n", " lower.example.com \r\n", "..\n", "mixed-case\n", long256 + "\n"} {
		assert.Equal(t, down, agentCheck(t, agent, send), "agent-send %.40q", send)
	}

	// Over 256 bytes, a name is no engine's, on every path: not judged
	// (and counted), unknown to HTTP, "up" from the agent.
	assert.NotContains(t, th.verdicts.Load().byName, long300)
	code, body := health("/engines/"+long300+"/health", "")
	assert.Equal(t, http.StatusNotFound, code, string(body))
	assert.Equal(t, "up\n", agentCheck(t, agent, long300+"\n"))
	assert.Equal(t, "up\n", agentCheck(t, agent, long256+"x\n"), "not the 256-byte engine, truncated")
	metadatatest.AssertEqualExporterEngineHealthIgnored(t, th.tel, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(attribute.String("why", "engine_name_too_long")), Value: 5},
	}, metricdatatest.IgnoreTimestamp())

	// A name asked for is not echoed whole.
	code, body = health("/engines/"+strings.Repeat("z", 200<<10)+"/health", "")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Less(t, len(body), 1024)
	code, body = health("/engines/nope/health", "")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, string(body), `unknown engine \"nope\"`)
}

// A check is answered within its slot even beside 200 connections, from
// another address, that open, send nothing and are re-opened every 0.45 s:
// they cannot hold the places of real checks (HAProxy keeps its last agent
// state when a check is turned away, so an ejection would never be applied
// or never lifted).
func TestAgentChecksBesideIdleConnections(t *testing.T) {
	th := startHealth(t, nil)
	ejectB(t, th)
	addr := th.agent.ln.Addr().String()
	hostile := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	probe, err := hostile.Dial("tcp", addr)
	if err != nil {
		t.Skipf("no second loopback address to open the idle connections from: %v", err)
	}
	probe.Close()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var opened sync.WaitGroup
	opened.Add(200)
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			for {
				next := time.NewTimer(450 * time.Millisecond)
				conn, err := hostile.Dial("tcp", addr)
				if first {
					opened.Done()
					first = false
				}
				if err == nil {
					// Held until the agent answers or closes it, or the next
					// opening.
					_ = conn.SetReadDeadline(time.Now().Add(450 * time.Millisecond))
					_, _ = io.Copy(io.Discard, conn)
					conn.Close()
				}
				select {
				case <-stop:
					next.Stop()
					return
				case <-next.C:
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	opened.Wait()
	for i := range 8 {
		assert.Equal(t, "down #ejected: stall_ratio\n", agentCheck(t, addr, "b\n"), "check %d", i)
		assert.Equal(t, "up\n", agentCheck(t, addr, "a\n"), "check %d", i)
	}
}

// Every connection accepted is answered, the idle ones beyond the bounds
// at once: none is closed unanswered, which HAProxy would not count.
func TestAgentAnswersEveryConnection(t *testing.T) {
	th := startHealth(t, nil)
	ejectB(t, th)
	addr := th.agent.ln.Addr().String()
	conns := make([]net.Conn, 70)
	for i := range conns {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		defer conn.Close()
		conns[i] = conn
	}
	for i, conn := range conns {
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
		line, err := bufio.NewReader(conn).ReadString('\n')
		assert.NoError(t, err, "connection %d", i)
		assert.Equal(t, "up\n", line, "connection %d", i)
	}
	// And the checks that name an engine.
	assert.Equal(t, "down #ejected: stall_ratio\n", agentCheck(t, addr, "b\n"))
	// The 62 over the source's 8 were cut short, less any whose wait ended
	// while the 70 were being opened.
	m, err := th.tel.GetMetric("otelcol_exporter_engine_health_agent_cut_short")
	require.NoError(t, err)
	points := m.Data.(metricdata.Sum[int64]).DataPoints
	require.Len(t, points, 1)
	assert.Equal(t, attribute.NewSet(attribute.String("limit", limitPerSource)), points[0].Attributes)
	assert.GreaterOrEqual(t, points[0].Value, int64(1))
	assert.LessOrEqual(t, points[0].Value, int64(62))
}

// The queue of connections waiting for their line: a source over its bound
// has its own oldest answered, and the whole over its bound the oldest of
// all; other sources keep their places.
func TestAgentQueueBounds(t *testing.T) {
	q := newAgentQueue(4, 2)
	conn := func(ip string) *fakeConn { return &fakeConn{remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}} }
	a1, a2, a3 := conn("10.0.0.1"), conn("10.0.0.1"), conn("10.0.0.1")
	b1 := conn("10.0.0.2")
	add := func(c *fakeConn, wantCut string) *agentWaiter {
		t.Helper()
		w, cut := q.add(c)
		assert.Equal(t, wantCut, cut)
		return w
	}
	wa1, wa2 := add(a1, ""), add(a2, "")
	wb1 := add(b1, "")
	assert.False(t, a1.cut || a2.cut || b1.cut)
	add(a3, limitPerSource)
	assert.True(t, a1.cut, "the oldest of its source")
	assert.False(t, a2.cut || b1.cut)
	assert.Zero(t, wa1.seq, "out of the queue")
	q.remove(wa2)
	c1, c2, c3 := conn("10.0.0.3"), conn("10.0.0.4"), conn("10.0.0.5")
	add(c1, "")
	add(c2, "")
	assert.False(t, b1.cut, "four waiting: within the bound")
	add(c3, limitWaiting)
	assert.True(t, b1.cut, "a fifth: the oldest of all")
	assert.Zero(t, wb1.seq)
	assert.False(t, a3.cut || c1.cut || c2.cut || c3.cut)
	assert.Len(t, q.waiting, 4)
	assert.Equal(t, map[string]int{"10.0.0.1": 1, "10.0.0.3": 1, "10.0.0.4": 1, "10.0.0.5": 1}, q.perSource)
}

// fakeConn records whether it was cut short (its read deadline moved to now).
type fakeConn struct {
	net.Conn
	remote net.Addr
	cut    bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) SetReadDeadline(time.Time) error {
	c.cut = true
	return nil
}

// An engine name normalises once and for all, and the HTTP endpoint and the
// agent agree on every name: the engine's state, or unknown ("up", 404).
func FuzzEngineName(f *testing.F) {
	for _, s := range []string{
		"lower.example.com", " LOWER.example.com\r\n", "..", "ns/Pod", "", " ",
		strings.Repeat("x", 256), strings.Repeat("x", 257), "\u00c9TAT", "a\x00b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		name, tooLong := normalizeEngine(raw)
		if tooLong {
			require.Empty(t, name)
			require.Greater(t, len(strings.TrimSpace(raw)), maxEngineName)
		} else {
			require.LessOrEqual(t, len(name), maxEngineName)
			again, long := normalizeEngine(name)
			require.False(t, long)
			require.Equal(t, name, again, "normalised once and for all")
			require.Equal(t, strings.TrimSpace(name), name)
			require.NotContains(t, name, "A", "no ASCII capital")
		}
		h := &engineHealth{now: func() time.Time { return t0 }}
		var list []engineStatus
		if name != "" { // no engine is named "": it is no llm.engine
			list = append(list, engineStatus{Engine: name, State: stateEjected, Reason: reasonStallRatio})
		}
		h.verdicts.Store(newVerdicts(list))
		rec := httptest.NewRecorder()
		h.endpoints().serveHealth(rec, raw)
		if name != "" && !strings.Contains(raw, "\n") {
			require.Equal(t, http.StatusServiceUnavailable, rec.Code)
			require.Equal(t, "down #ejected: stall_ratio\n", agentReply(h.verdicts.Load(), raw))
		} else if name == "" {
			require.Equal(t, http.StatusNotFound, rec.Code)
			require.Equal(t, "up\n", agentReply(h.verdicts.Load(), raw))
		}
		// JSON escapes a byte in at most 6 (\u0026), after %q's 4 (\x88).
		require.LessOrEqual(t, rec.Body.Len(), 8*maxEngineName+300, "a name is not echoed past its bound")
	})
}

// The agent reads a check's line up to its newline, and never past
// agentMaxLine bytes.
func FuzzReadAgentLine(f *testing.F) {
	for _, s := range []string{
		"b\n", "b\r\n", "b", "", "\n", "a\nb\n", strings.Repeat("x", 1023) + "\n",
		strings.Repeat("x", 1024) + "\n", strings.Repeat("x", 3000),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		server, client := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = client.Write(data)
			client.Close()
		}()
		line, complete := readAgentLine(server, func() {})
		server.Close()
		<-done
		if i := bytes.IndexByte(data, '\n'); i >= 0 && i < agentMaxLine {
			require.True(t, complete)
			require.Equal(t, string(data[:i]), line)
			return
		}
		require.False(t, complete)
		require.Equal(t, string(data[:min(len(data), agentMaxLine)]), line)
	})
}
