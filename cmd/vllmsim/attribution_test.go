// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// -attribution-out writes each request's true share with its tenant and
// the engine's totals, which add up; /metrics serves the GPU's power as
// dcgm-exporter does, with the engine's pod.
func TestAttributionOutAndDCGM(t *testing.T) {
	out := filepath.Join(t.TempDir(), "attribution.ndjson")
	args := []string{
		"-addr", "127.0.0.1:0", "-model", model, "-attribution-out", out, "-dcgm", "-gpu-pod", "engine-a",
		"-decode-base", "1ms", "-decode-per-seq", "10us", "-prefill-per-token", "5us", "-step-overhead", "100us",
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, io.Discard, ready) }()
	base := "http://" + <-ready

	for i, tenant := range []string{"rag", "chat", "chat"} {
		prompt := strings.Repeat("w ", 20+500*(1-min(i, 1)))
		req, err := http.NewRequest(http.MethodPost, base+"/v1/completions",
			strings.NewReader(`{"prompt":"`+prompt+`","max_tokens":8,"stream":true}`))
		require.NoError(t, err)
		req.Header.Set("X-Tenant-ID", tenant)
		req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	fams := decodeExposition(t, resp.Body)
	resp.Body.Close()
	power := fams["DCGM_FI_DEV_POWER_USAGE"]
	require.NotNil(t, power)
	labels := map[string]string{}
	for _, l := range power.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	assert.Equal(t, "engine-a", labels["pod"])
	assert.Equal(t, "0", labels["gpu"])
	assert.GreaterOrEqual(t, power.GetMetric()[0].GetGauge().GetValue(), 80.0)
	assert.Positive(t, fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].GetMetric()[0].GetCounter().GetValue())

	cancel()
	require.NoError(t, <-done)
	http.DefaultClient.CloseIdleConnections()

	f, err := os.Open(out)
	require.NoError(t, err)
	defer f.Close()
	var reqs []attributionRecord
	var eng engineRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kind struct{ Kind string }
		require.NoError(t, json.Unmarshal(sc.Bytes(), &kind))
		switch kind.Kind {
		case "request":
			var r attributionRecord
			require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
			reqs = append(reqs, r)
		case "engine":
			require.NoError(t, json.Unmarshal(sc.Bytes(), &eng))
		default:
			t.Fatalf("line kind %q", kind.Kind)
		}
	}
	require.Len(t, reqs, 3)
	sum, energy := 0.0, 0.0
	for _, r := range reqs {
		assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", r.TraceID)
		assert.InDelta(t, r.EngineTimeS, r.PrefillS+r.DecodeS, 1e-9)
		sum += r.EngineTimeS
		energy += r.EnergyJ
	}
	assert.Equal(t, "rag", reqs[0].Tenant)
	assert.Equal(t, "chat", reqs[1].Tenant)
	// The shares are of steps timed on the wall clock, which a busy machine
	// stretches at random: that a longer prompt's prefill costs more is the
	// step model's (internal/sim's tests); here each request has its prompt
	// and a prefill share.
	assert.Greater(t, reqs[0].PromptTokens, reqs[1].PromptTokens)
	for _, r := range reqs {
		assert.Positive(t, r.PrefillS, r.Tenant)
	}
	assert.InDelta(t, eng.BusyS, sum+eng.OrphanedS, 1e-6)
	assert.InDelta(t, eng.WallS, eng.BusyS+eng.IdleS, 1e-6)
	assert.InDelta(t, eng.BusyEnergyJ, energy+eng.OrphanedEnergyJ, 1e-6)
	assert.Positive(t, eng.IdleS)
}
