// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// truthRecord is a line of vllmsim's -attribution-out.
type truthRecord struct {
	Kind        string  `json:"kind"`
	ID          string  `json:"id"`
	TraceID     string  `json:"trace_id"`
	Tenant      string  `json:"tenant"`
	EngineTimeS float64 `json:"engine_time_s"`
	EnergyJ     float64 `json:"energy_j"`
	BusyS       float64 `json:"busy_s"`
	IdleS       float64 `json:"idle_s"`
	WallS       float64 `json:"wall_s"`
}

// attributionSim runs vllmsim with fast costs, writing its truth to a
// file; stop it to have the file.
type attributionSim struct {
	addr, truth string
	p           *process.Process
}

func startAttributionSim(t *testing.T, bin string, args ...string) *attributionSim {
	t.Helper()
	s := &attributionSim{addr: freePort(t, "tcp"), truth: filepath.Join(t.TempDir(), "truth.ndjson")}
	out := &testbin.SyncBuffer{}
	if slices.Contains(args, "-dcgm") {
		// The GPU's pod is named as the engine is (the proxy's upstream).
		args = append(args, "-gpu-pod", s.addr)
	}
	p, err := process.Start("vllmsim", bin, append([]string{
		"-addr", s.addr, "-model", "sim", "-attribution-out", s.truth,
		"-decode-base", "2ms", "-decode-per-seq", "40us", "-prefill-per-token", "10us", "-step-overhead", "100us",
	}, args...), process.Options{Output: out})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	require.NoError(t, p.WaitListening(s.addr, 30*time.Second), "vllmsim\n%s", out)
	s.p = p
	return s
}

func (s *attributionSim) stop(t *testing.T) (reqs []truthRecord, engine truthRecord) {
	t.Helper()
	require.NoError(t, s.p.Stop(10*time.Second))
	f, err := os.Open(s.truth)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r truthRecord
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		if r.Kind == "engine" {
			engine = r
		} else {
			reqs = append(reqs, r)
		}
	}
	return reqs, engine
}

// twoTenants drives url with a closed loop of clients: a RAG tenant (3000-word
// prompts, 32 tokens out) and a chat tenant (200-word prompts, 128 out),
// alternating, with the tenant in X-Tenant-ID.
func twoTenants(t *testing.T, url string, clients, requests int) {
	t.Helper()
	rag, chat := strings.Repeat("context ", 3000), strings.Repeat("hello ", 200)
	work := make(chan int)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				tenant, prompt, out := "rag", rag, 32
				if i%2 == 1 {
					tenant, prompt, out = "chat", chat, 128
				}
				body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"stream":true}`, prompt, out)
				req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
				if !assert.NoError(t, err) {
					continue
				}
				req.Header.Set("X-Tenant-ID", tenant)
				resp, err := http.DefaultClient.Do(req)
				if assert.NoError(t, err) {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}
	for i := range requests {
		work <- i
	}
	close(work)
	wg.Wait()
}

// attributed is a session's share as the collector reported it on its span.
type attributed struct {
	engineTime float64
	source     string
}

// compare matches the collector's sessions to the truth by key and reports
// the per-session error quantiles and each tenant's totals.
func compare(t *testing.T, name string, truth []truthRecord, got map[string]attributed, key func(truthRecord) string) (p90 float64, tenants map[string][2]float64) {
	t.Helper()
	var errs []float64
	tenants = map[string][2]float64{}
	for _, r := range truth {
		c, ok := got[key(r)]
		if !assert.True(t, ok, "%s: session %s (%s) has its share", name, key(r), r.Tenant) {
			continue
		}
		errs = append(errs, math.Abs(c.engineTime-r.EngineTimeS)/r.EngineTimeS)
		tt := tenants[r.Tenant]
		tenants[r.Tenant] = [2]float64{tt[0] + c.engineTime, tt[1] + r.EngineTimeS}
	}
	require.NotEmpty(t, errs)
	p50, p90, worst := quantile(errs, 0.5), quantile(errs, 0.9), quantile(errs, 1)
	t.Logf("%s: %d sessions, per-session engine time error p50 %.1f%% p90 %.1f%% max %.1f%%", name, len(errs), 100*p50, 100*p90, 100*worst)
	for tenant, v := range tenants {
		t.Logf("%s: tenant %s: collector %.4f s, simulator %.4f s (%+.2f%%)", name, tenant, v[0], v[1], 100*(v[0]-v[1])/v[1])
	}
	return p90, tenants
}

// sessionShares are the shares on the session spans, by session ID and by
// trace ID.
func sessionShares(s *sink) (byID, byTrace map[string]attributed) {
	byID, byTrace = map[string]attributed{}, map[string]attributed{}
	for _, span := range s.Spans() {
		a := span.Attributes().AsRaw()
		et, ok := a["llm.session.engine_time"].(float64)
		if !ok {
			continue
		}
		v := attributed{engineTime: et, source: fmt.Sprint(a["llm.session.attribution_source"])}
		byID[fmt.Sprint(a["llm.session.id"])] = v
		byTrace[span.TraceID().String()] = v
	}
	return byID, byTrace
}

// TestAttributionEndToEnd: who used the GPU, through the binary, against
// vllmsim's truth (each step's time split among its requests by tokens).
// Two tenants with different prompt and output lengths, through the hooks
// (the collector's own estimate, and the engine's exact share) and through
// the proxy (tenant from a request header). The engine's own share comes
// out exactly; the collector's estimate is held to the bounds below.
func TestAttributionEndToEnd(t *testing.T) {
	s, sinkAddr := startSink(t)
	bin := testbin.Build(t, "./cmd/vllmsim")
	upstream := startAttributionSim(t, bin, "-dcgm")
	col := startCollector(t, "attribution.yaml", sinkAddr, "UPSTREAM_URL=http://"+upstream.addr)
	hooked := startAttributionSim(t, bin, "-hook", "http://"+col.httpAddr+"/v1/token-events", "-hook-engine", "sim-hooks",
		"-hook-engine-share=false")
	exact := startAttributionSim(t, bin, "-hook", "http://"+col.httpAddr+"/v1/token-events", "-hook-engine", "sim-exact")
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + col.proxyAddr + "/v1/models")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "the proxy\n%s", col.Output)

	const clients, requests = 8, 96
	twoTenants(t, "http://"+hooked.addr, clients, requests)
	// Through the proxy a start does not give the prompt's length (the
	// usage at the end does): the model estimates it by the tenant's mean
	// on the engine, learned at the ends. One request of each tenant first,
	// as a running deployment has had, left out of the comparison.
	twoTenants(t, "http://"+col.proxyAddr, 1, 2)
	twoTenants(t, "http://"+col.proxyAddr, clients, requests)
	twoTenants(t, "http://"+exact.addr, 4, 8)
	hookTruth, _ := hooked.stop(t)
	proxyTruth, proxyEngine := upstream.stop(t)
	exactTruth, _ := exact.stop(t)
	require.Len(t, hookTruth, requests)
	require.Len(t, proxyTruth, requests+2)
	proxyAll := proxyTruth
	proxyTruth = proxyTruth[2:] // in finish order: the two sent first, one at a time

	require.Eventually(t, func() bool {
		byID, byTrace := sessionShares(s)
		for _, r := range append(slices.Clone(hookTruth), exactTruth...) {
			if _, ok := byID[r.ID]; !ok {
				return false
			}
		}
		for _, r := range proxyAll {
			if _, ok := byTrace[r.TraceID]; !ok {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "every session's share\n%s", col.Output)
	byID, byTrace := sessionShares(s)

	for _, r := range exactTruth {
		got := byID[r.ID]
		assert.Equal(t, "engine", got.source, r.ID)
		assert.InDelta(t, r.EngineTimeS, got.engineTime, 2e-9, "the engine's own share, to the ns")
	}

	// The estimate against the simulator's truth is a measurement, not a
	// verdict: both run in real time, so a busy machine (the simulator's
	// steps overrun, the collector sees tokens late) moves it. Quiet, the
	// tenants come out 2-3.5% off through the hooks and 2.5-5% through the
	// proxy, a per-session p90 of 6-9% and 10-19% (the README's figures);
	// one run of a clean clone on a loaded machine read 5.10% for a tenant.
	// The bounds are what a busy machine cannot break and a wrong model
	// cannot meet: shares by tokens alone put the long-prompt tenant 30-50%
	// off (it has 34% of the tokens and 22-26% of the time in make demo).
	p90, tenants := compare(t, "hooks", hookTruth, byID, func(r truthRecord) string { return r.ID })
	assert.Less(t, p90, 0.40, "hooks: per-session p90")
	for tenant, v := range tenants {
		assert.InEpsilon(t, v[1], v[0], 0.15, "hooks: tenant %s", tenant)
	}
	p90, tenants = compare(t, "proxy", proxyTruth, byTrace, func(r truthRecord) string { return r.TraceID })
	assert.Less(t, p90, 0.60, "proxy: per-session p90")
	for tenant, v := range tenants {
		assert.InEpsilon(t, v[1], v[0], 0.20, "proxy: tenant %s", tenant)
	}
	counted := map[string]float64{}
	for _, r := range proxyAll {
		counted[r.Tenant] += byTrace[r.TraceID].engineTime
	}

	// The counters: the proxied engine's busy time by tenant, and its energy
	// from the DCGM series, beside the simulator's.
	busyOf := func() map[string]float64 {
		m, _ := s.Metric("llm.engine.time")
		busy := map[string]float64{}
		for _, dp := range m.Sum().DataPoints().All() {
			engine, _ := dp.Attributes().Get("llm.engine")
			state, _ := dp.Attributes().Get("state")
			if engine.Str() == upstream.addr && state.Str() != "idle" {
				tenant, _ := dp.Attributes().Get("llm.tenant")
				busy[tenant.Str()] += dp.DoubleValue()
			}
		}
		return busy
	}
	// A flush after the last session's end.
	require.Eventually(t, func() bool {
		_, ok := s.Metric("llm.engine.energy")
		return ok && math.Abs(busyOf()["chat"]-counted["chat"]) < 1e-6
	}, 30*time.Second, 50*time.Millisecond, "llm.engine.time and llm.engine.energy after the last session")
	busy := busyOf()
	t.Logf("proxy engine: collector busy %v s; simulator busy %.3f s, idle %.3f s, wall %.3f s", busy, proxyEngine.BusyS, proxyEngine.IdleS, proxyEngine.WallS)
	for tenant, v := range counted {
		assert.InDelta(t, v, busy[tenant], 1e-6, "the counters are the sessions' shares: %s", tenant)
	}
}
