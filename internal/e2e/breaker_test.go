package e2e

import (
	"bufio"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// requireTool returns the path of a Debian-packaged tool, installing its
// package when it is missing and this runs as root (as CI does); elsewhere
// the test is skipped without it.
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("apt-get"); err == nil {
			install := exec.Command("sh", "-c", "apt-get install -y -qq "+pkg+" || (apt-get update -qq && apt-get install -y -qq "+pkg+")")
			install.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			out, err := install.CombinedOutput()
			t.Logf("apt-get install %s: %v\n%s", pkg, err, out)
		}
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is missing and could not be installed (apt-get install %s)", name, pkg)
	}
	t.Skipf("%s is missing: apt-get install %s", name, pkg)
	return ""
}

// haproxyConfig balances the two collector proxies, each checked by
// engine_health's agent-check under its engine's name.
const haproxyConfig = `global
  maxconn 256

defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s

frontend llm
  bind {{frontend}}
  default_backend engines

backend engines
  balance roundrobin
  server a {{proxy_a}} check inter 1s agent-check agent-addr {{agent_host}} agent-port {{agent_port}} agent-send "{{engine_a}}\n" agent-inter 500ms
  server b {{proxy_b}} check inter 1s agent-check agent-addr {{agent_host}} agent-port {{agent_port}} agent-send "{{engine_b}}\n" agent-inter 500ms

listen stats
  bind {{stats}}
  stats enable
  stats uri /stats
`

// startHAProxy runs haproxy with config (the {{key}}s replaced from vars)
// in the foreground until the test ends.
func startHAProxy(t *testing.T, bin, config string, vars map[string]string) {
	t.Helper()
	for k, v := range vars {
		config = strings.ReplaceAll(config, "{{"+k+"}}", v)
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	require.NoError(t, os.WriteFile(path, []byte(config), 0o600))
	check, err := exec.Command(bin, "-c", "-f", path).CombinedOutput()
	require.NoError(t, err, "haproxy -c:\n%s\n%s", check, config)
	cmd := exec.Command(bin, "-db", "-f", path)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("haproxy output:\n%s", out)
		}
	})
}

// haproxyServer is a server's line of HAProxy's CSV statistics.
type haproxyServer struct {
	status   string // UP, DOWN, …
	sessions int    // stot: requests sent to it so far
}

// haproxyStats reads the servers of backend from HAProxy's stats page.
func haproxyStats(statsURL, backend string) (map[string]haproxyServer, error) {
	resp, err := http.Get(statsURL + ";csv")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := csv.NewReader(resp.Body)
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("stats csv: %v", err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[strings.TrimPrefix(name, "# ")] = i
	}
	out := map[string]haproxyServer{}
	for _, row := range rows[1:] {
		if row[col["pxname"]] != backend || row[col["svname"]] == "BACKEND" {
			continue
		}
		n, _ := strconv.Atoi(row[col["stot"]])
		out[row[col["svname"]]] = haproxyServer{status: row[col["status"]], sessions: n}
	}
	return out, nil
}

// streamLoad keeps workers streaming chat completions through url until
// stopped; it counts the requests that saw a gap of at least stallGap
// between two chunks.
type streamLoad struct {
	stop     context.CancelFunc
	done     sync.WaitGroup
	mu       sync.Mutex
	requests int
	stalled  int
	failed   int
}

func startStreamLoad(t *testing.T, url string, workers int, stallGap time.Duration) *streamLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &streamLoad{stop: cancel}
	client := &http.Client{Timeout: 30 * time.Second}
	body := `{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"max_tokens":48,"ignore_eos":true,` +
		`"messages":[{"role":"user","content":"tell me about load balancers"}]}`
	for range workers {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			for ctx.Err() == nil {
				gap, err := streamOnce(ctx, client, url, body)
				if ctx.Err() != nil {
					return
				}
				l.mu.Lock()
				l.requests++
				switch {
				case err != nil:
					l.failed++
				case gap >= stallGap:
					l.stalled++
				}
				l.mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	t.Cleanup(l.close)
	return l
}

func (l *streamLoad) close() { l.stop(); l.done.Wait() }

// counts returns the requests done, stalled and failed so far.
func (l *streamLoad) counts() (requests, stalled, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.requests, l.stalled, l.failed
}

// streamOnce streams one completion and returns its longest gap between
// two data lines.
func streamOnce(ctx context.Context, client *http.Client, url, body string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	var last time.Time
	var gap time.Duration
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			return gap, nil
		}
		if err != nil {
			return gap, err
		}
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		now := time.Now()
		if !last.IsZero() {
			gap = max(gap, now.Sub(last))
		}
		last = now
	}
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func postOK(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url, "text/plain", nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, body)
}

// TestEjectStallingEngineWithHAProxy is the load-balancer story in short
// form. HAProxy balances two vllmsim replicas, each behind a token_stream
// proxy of one collector, and checks each server with engine_health's
// agent-check. Replica B starts freezing mid-decode: engine_health ejects it
// within its window, HAProxy marks B down and sends every new request to A.
// B is healed, and after its ejection time engine_health re-admits it and
// HAProxy routes to it again.
func TestEjectStallingEngineWithHAProxy(t *testing.T) {
	haproxy := requireTool(t, "haproxy", "haproxy")
	simA, simB := freePort(t, "tcp"), freePort(t, "tcp")
	proxyA, proxyB := freePort(t, "tcp"), freePort(t, "tcp")
	healthAddr, agentAddr := freePort(t, "tcp"), freePort(t, "tcp")
	frontend, stats := freePort(t, "tcp"), freePort(t, "tcp")
	startVLLMSim(t, simA)
	startVLLMSim(t, simB)
	startCollector(t, "breaker.yaml", freePort(t, "tcp"),
		"PROXY_A="+proxyA, "PROXY_B="+proxyB, "UPSTREAM_A=http://"+simA, "UPSTREAM_B=http://"+simB,
		"HEALTH_ENDPOINT="+healthAddr, "AGENT_ENDPOINT="+agentAddr)
	// The engine of a proxy's sessions is its upstream's host:port.
	engineA, engineB := simA, simB
	agentHost, agentPort, _ := strings.Cut(agentAddr, ":")
	startHAProxy(t, haproxy, haproxyConfig, map[string]string{
		"frontend": frontend, "stats": stats, "proxy_a": proxyA, "proxy_b": proxyB,
		"agent_host": agentHost, "agent_port": agentPort, "engine_a": engineA, "engine_b": engineB,
	})
	statsURL := "http://" + stats + "/stats"
	servers := func() map[string]haproxyServer {
		s, err := haproxyStats(statsURL, "engines")
		require.NoError(t, err)
		return s
	}
	require.Eventually(t, func() bool {
		s, err := haproxyStats(statsURL, "engines")
		return err == nil && strings.HasPrefix(s["a"].status, "UP") && strings.HasPrefix(s["b"].status, "UP")
	}, 30*time.Second, 100*time.Millisecond, "HAProxy never saw both servers up")

	load := startStreamLoad(t, "http://"+frontend, 6, 450*time.Millisecond)
	health := "http://" + healthAddr + "/engines/"
	require.Eventually(t, func() bool {
		return httpStatus(t, health+engineA+"/health") == http.StatusOK && httpStatus(t, health+engineB+"/health") == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "engine_health never judged both engines")
	before := servers()
	require.Positive(t, before["b"].sessions, "B got requests while healthy")

	// Every 8th decoding step of B lasts 1.5 s longer: its streams freeze,
	// which token_session reports as stalls (450 ms without a token, plus
	// stall::delivery_slack when the whole engine is silent).
	postOK(t, "http://"+simB+"/admin/degrade?freeze=1500ms&every=8")
	degraded := time.Now()
	require.Eventually(t, func() bool { return httpStatus(t, health+engineB+"/health") == http.StatusServiceUnavailable },
		30*time.Second, 50*time.Millisecond, "engine_health did not eject B")
	ejected := time.Now()
	require.Eventually(t, func() bool { return strings.HasPrefix(servers()["b"].status, "DOWN") },
		10*time.Second, 50*time.Millisecond, "HAProxy did not take B out")
	down := time.Now()
	require.Equal(t, http.StatusOK, httpStatus(t, health+engineA+"/health"), "A stays in")
	t.Logf("B degraded; ejected after %s, down at HAProxy %s later", ejected.Sub(degraded), down.Sub(ejected))

	// While B is out, every new request goes to A.
	out := servers()
	reqs0, _, _ := load.counts()
	time.Sleep(3 * time.Second)
	during := servers()
	reqs1, _, _ := load.counts()
	require.Greater(t, reqs1, reqs0, "the load went on")
	require.Equal(t, out["b"].sessions, during["b"].sessions, "no request went to B while it was out")
	require.Greater(t, during["a"].sessions, out["a"].sessions)

	postOK(t, "http://"+simB+"/admin/heal")
	require.Eventually(t, func() bool { return httpStatus(t, health+engineB+"/health") == http.StatusOK },
		30*time.Second, 100*time.Millisecond, "B was not re-admitted after its ejection time")
	readmitted := time.Now()
	require.Eventually(t, func() bool {
		s := servers()
		return strings.HasPrefix(s["b"].status, "UP") && s["b"].sessions > during["b"].sessions
	}, 15*time.Second, 100*time.Millisecond, "HAProxy did not route to B again")
	t.Logf("B re-admitted %s after its ejection (base_time 10s)", readmitted.Sub(ejected))
	requests, stalled, failed := load.counts()
	t.Logf("client: %d requests, %d with a gap of 450 ms or more, %d failed", requests, stalled, failed)
	require.Zero(t, failed, "no request failed through the ejection and re-admission")
}
