// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// dashboard is what the test reads of deploy/grafana/otelcol-llm.json.
type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
			// Definition is the query of a query variable, as Grafana shows it.
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// promQuery runs an instant query through Prometheus's HTTP API and returns
// how many series it gave.
func promQuery(promURL, query string) (int, error) {
	resp, err := http.Get(promURL + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s", r.Error)
	}
	return len(r.Data.Result), nil
}

// labelValues does what Grafana's label_values(metric{selector}, label)
// does: Prometheus's label values API, matched by the selector.
func labelValues(t *testing.T, promURL, query string) []string {
	t.Helper()
	m := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`).FindStringSubmatch(query)
	require.NotNil(t, m, "a label_values query: %s", query)
	resp, err := http.Get(promURL + "/api/v1/label/" + m[2] + "/values?match[]=" + url.QueryEscape(m[1]))
	require.NoError(t, err)
	defer resp.Body.Close()
	var r struct {
		Data []string `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	return r.Data
}

// TestDashboardQueriesReturnData does what Grafana would do with
// deploy/grafana/otelcol-llm.json: the agent (deploy/agent-config.yaml with
// the fixed-target overlay) takes vllmsim's hook events and /metrics under
// llmload; Debian's Prometheus scrapes the agent's :8889 and :8888 as
// deploy/README.md says; then every panel's every query runs through
// Prometheus's HTTP API, with the variables at All and at each value their
// own queries give, and each must return data.
func TestDashboardQueriesReturnData(t *testing.T) {
	prometheus := testbin.Tool(t, "prometheus", "prometheus")
	const ip = "127.0.0.3"
	sim, load := testbin.Build(t, "./cmd/vllmsim"), testbin.Build(t, "./cmd/llmload")

	data, err := os.ReadFile(filepath.Join("grafana", "otelcol-llm.json"))
	require.NoError(t, err)
	var dash dashboard
	require.NoError(t, json.Unmarshal(data, &dash))

	backend := net.JoinHostPort(ip, freePort(t, ip))
	startSummarySink(t, backend)
	simAddr := net.JoinHostPort(ip, freePort(t, ip))
	// The engine's name is its instance, as the agent's pod discovery names
	// it, so that the engine variable selects its vllm: metrics too.
	testbin.StartProcess(t, sim, "-addr", simAddr, "-model", "llama-3.1-8b", "-kv-blocks", "256",
		"-hook", "http://"+net.JoinHostPort(ip, "4320")+"/v1/token-events", "-hook-engine", simAddr,
		// Its GPU's power as dcgm-exporter serves it, the pod named as the
		// engine, for the energy by tenant.
		"-dcgm", "-gpu-pod", simAddr)
	env := append(agentEnv(ip, backend, t.TempDir()), "VLLM_METRICS_URL=http://"+simAddr+"/metrics")
	agentProc := startAgent(t, env, "agent-config.yaml", "agent-config-fixed-target.yaml")

	promAddr := net.JoinHostPort(ip, freePort(t, ip))
	promCfg := filepath.Join(t.TempDir(), "prometheus.yml")
	require.NoError(t, os.WriteFile(promCfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: otelcol-llm-sessions
    honor_labels: true
    static_configs:
      - targets: ['%s:8889']
  - job_name: otelcol-llm-self
    static_configs:
      - targets: ['%s:8888']
rule_files:
  - %s
`, ip, ip, filepath.Join(mustAbs(t, "prometheus"), "rules.yaml"))), 0o600))
	promOut := testbin.StartProcess(t, prometheus, "--config.file="+promCfg, "--storage.tsdb.path="+t.TempDir(),
		"--web.listen-address="+promAddr, "--log.level=warn")
	promURL := "http://" + promAddr
	require.Eventually(t, func() bool {
		resp, err := http.Get(promURL + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 100*time.Millisecond, "prometheus did not start\n%s", promOut)

	// Load with long prompts on a small KV pool: queueing, pre-emptions and
	// slow sessions, so that every panel has something to show.
	loadOut := testbin.StartProcess(t, load, "-url", "http://"+simAddr, "-model", "llama-3.1-8b", "-concurrency", "24",
		"-duration", "40s", "-prompt-tokens", "uniform:200-1500", "-output-tokens", "64", "-quiet")

	// Rates need two scrapes of the session metrics, which token_session
	// flushes every 15 s.
	subst := func(expr, model, engine string) string {
		r := strings.NewReplacer("$__rate_interval", "1m", "$model", model, "$engine", engine, "${model}", model, "${engine}", engine)
		return r.Replace(expr)
	}
	check := func(model, engine string) []string {
		var empty []string
		for _, p := range dash.Panels {
			for _, tg := range p.Targets {
				n, err := promQuery(promURL, subst(tg.Expr, model, engine))
				if err != nil || n == 0 {
					empty = append(empty, fmt.Sprintf("%q %s (%v): %s", p.Title, tg.RefID, err, subst(tg.Expr, model, engine)))
				}
			}
		}
		return empty
	}
	var empty []string
	require.Eventually(t, func() bool {
		empty = check(".*", ".*")
		return len(empty) == 0
	}, 90*time.Second, 2*time.Second, "panels without data (variables at All):\n%s\nagent:\n%s\nllmload:\n%s",
		strings.Join(empty, "\n"), agentProc.Output, loadOut)

	// Each variable, at each value its query gives.
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		if v.Type == "query" {
			vars[v.Name] = v.Definition
		}
	}
	require.Contains(t, vars, "model")
	require.Contains(t, vars, "engine")
	models := labelValues(t, promURL, subst(vars["model"], ".*", ".*"))
	require.Equal(t, []string{"llama-3.1-8b"}, models)
	for _, model := range models {
		engines := labelValues(t, promURL, subst(vars["engine"], promRegexp(model), ".*"))
		require.Equal(t, []string{simAddr}, engines)
		for _, engine := range engines {
			empty := check(promRegexp(model), promRegexp(engine))
			require.Empty(t, empty, "panels without data for model %s, engine %s", model, engine)
		}
	}
	// And a value that is not there selects nothing: the variables filter.
	n, err := promQuery(promURL, subst(dash.Panels[1].Targets[0].Expr, "no-such-model", ".*"))
	require.NoError(t, err)
	require.Zero(t, n)

	// The rules load in the same Prometheus, and evaluate without error.
	resp, err := http.Get(promURL + "/api/v1/rules")
	require.NoError(t, err)
	defer resp.Body.Close()
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rules))
	var count int
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			count++
			require.NotEqual(t, "err", r.Health, "rule %s: %s", r.Name, r.LastError)
		}
	}
	require.Positive(t, count)
}

// promRegexp is value as Grafana puts a variable's value into a PromQL
// regexp match: regexp-quoted, inside a PromQL string.
func promRegexp(value string) string {
	return strings.ReplaceAll(regexp.QuoteMeta(value), `\`, `\\`)
}

func mustAbs(t *testing.T, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	require.NoError(t, err)
	return abs
}
