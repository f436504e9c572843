// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// dcgmPower is a dcgm-exporter scrape: one GPU of pod drawing watts at at.
func dcgmPower(pod string, at int64, watts float64) pmetric.Metrics {
	md := pmetric.NewMetrics()
	m := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("DCGM_FI_DEV_POWER_USAGE")
	dp := m.SetEmptyGauge().DataPoints().AppendEmpty()
	dp.SetTimestamp(pcommon.Timestamp(at))
	dp.SetDoubleValue(watts)
	dp.Attributes().PutStr("gpu", "0")
	dp.Attributes().PutStr("pod", pod)
	return md
}

func tenantStart(id, tenant string, at, prompt int64) tokenevent.Event {
	ev := start(id, pcommon.TraceID{0xcc, byte(len(id))}, at)
	ev.PromptTokens = prompt
	ev.Attributes = []tokenevent.Attribute{{Key: "tenant.id", Value: tenant}}
	return ev
}

// engineCounters returns the llm.engine.time (or energy) points of the last
// metrics flush by "tenant/state".
func engineCounters(t *testing.T, p *pipelines, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, md := range p.metSink.AllMetrics() {
		for _, rm := range md.ResourceMetrics().All() {
			for _, sm := range rm.ScopeMetrics().All() {
				for _, m := range sm.Metrics().All() {
					if m.Name() != name {
						continue
					}
					for _, dp := range m.Sum().DataPoints().All() {
						tenant, _ := dp.Attributes().Get("llm.tenant")
						state, _ := dp.Attributes().Get("state")
						out[tenant.Str()+"/"+state.Str()] = dp.DoubleValue()
					}
				}
			}
		}
	}
	return out
}

// Two tenants on one engine with a power reading: each session's share is
// on its summary; the counters split the engine's busy time by tenant and
// phase, and its idle time apart; together they are the wall time.
func TestAttributionOutputsAndCounters(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	ctx := context.Background()
	require.NoError(t, p.metrics.ConsumeMetrics(ctx, dcgmPower("vllm-0", base, 200)))
	// rag: a 3000-token prompt prefilling 0-300 ms alone, decoding to 400.
	// chat: arrives at 300, 200 tokens, prefills beside rag's decode to
	// 320, both decode to 400, chat alone to 600; idle 600-1000. A token
	// every 20 ms step.
	evs := []tokenevent.Event{tenantStart("rag", "acme", base, 3000), tenantStart("chat", "globex", base+300*ms, 200)}
	for at := 300 * ms; at <= 600*ms; at += 20 * ms {
		if at <= 400*ms {
			evs = append(evs, tok("rag", base+at, 1))
		}
		if at >= 320*ms {
			evs = append(evs, tok("chat", base+at, 1))
		}
	}
	evs = append(evs, end("rag", base+400*ms), end("chat", base+600*ms),
		tenantStart("late", "acme", base+1000*ms, 10), tok("late", base+1010*ms, 1), end("late", base+1010*ms))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(evs...)))
	p.shutdown(t)

	summaries := recordsNamed(p.logSink.AllLogs(), eventNameSummary)
	require.Len(t, summaries, 3)
	byID := summariesByID(summaries)
	rag, chat := byID["rag"], byID["chat"]
	assert.Equal(t, "collector", rag["llm.session.attribution_source"])
	assert.InDelta(t, 0.3, rag["llm.session.engine_time.prefill"], 1e-9, "alone")
	// 300-320 ms: chat's 200-token prefill beside rag's one decode.
	assert.InDelta(t, 0.02*200/201, chat["llm.session.engine_time.prefill"], 1e-9)
	assert.InDelta(t, 0.02/201+0.04, rag["llm.session.engine_time.decode"], 1e-9)
	assert.InDelta(t, 0.04+0.2, chat["llm.session.engine_time.decode"], 1e-9)
	assert.InDelta(t, 200*(0.3+0.02/201+0.04), rag["llm.session.energy"], 1e-6, "200 W times its share")

	c := engineCounters(t, p, "llm.engine.time")
	assert.InDelta(t, 0.3+0.01, c["acme/prefill"], 1e-9, "rag's and late's prefill")
	assert.InDelta(t, 0.02*200/201, c["globex/prefill"], 1e-9)
	assert.InDelta(t, 0.4, c["/idle"], 1e-9, "600 ms to 1 s")
	sum := 0.0
	for _, v := range c {
		sum += v
	}
	assert.InDelta(t, 1.01, sum, 1e-9, "busy + idle = wall")
	e := engineCounters(t, p, "llm.engine.energy")
	assert.InDelta(t, 200*0.4, e["/idle"], 1e-6)
}

// Beyond attribution::max_tenants a tenant counts as _OTHER, and the
// sessions so counted are in the self-telemetry.
func TestAttributionTenantOverflow(t *testing.T) {
	p, tel := newPipelinesWithTelemetry(t, func(c *Config) { c.Attribution.MaxTenants = 1 })
	ctx := context.Background()
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(
		tenantStart("a", "acme", base, 10), tok("a", base+10*ms, 1), end("a", base+20*ms),
		tenantStart("b", "globex", base+30*ms, 10), tok("b", base+40*ms, 1), end("b", base+50*ms),
		tenantStart("c", "initech", base+60*ms, 10), tok("c", base+70*ms, 1), end("c", base+80*ms),
	)))
	p.shutdown(t)
	c := engineCounters(t, p, "llm.engine.time")
	assert.Contains(t, c, "acme/prefill")
	assert.Contains(t, c, "_OTHER/prefill")
	assert.NotContains(t, c, "globex/prefill")
	assert.Equal(t, map[string]int64{"tenant": 2}, keysOverflowed(t, tel))
}

func TestAttributionDisabled(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Attribution.Enabled = false; c.Sampling.NormalPercent = 100 })
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(fastSession("f")...)))
	p.shutdown(t)
	for _, lr := range recordsNamed(p.logSink.AllLogs(), eventNameSummary) {
		_, ok := lr.Attributes().Get("llm.session.engine_time")
		assert.False(t, ok)
	}
	assert.Empty(t, engineCounters(t, p, "llm.engine.time"))
}

// An end event that brings the engine's own share wins over the
// collector's: attribution_source says which, and the counters take it.
func TestAttributionEngineShareWins(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	e := end("x", base+100*ms)
	e.HasEngineTime, e.EngineTimePrefillNs, e.EngineTimeDecodeNs = true, 7*ms, 30*ms
	e.HasEnergy, e.EnergyMilliJ = true, 4200
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(
		tenantStart("x", "acme", base, 100), tok("x", base+50*ms, 1), e)))
	p.shutdown(t)
	summaries := recordsNamed(p.logSink.AllLogs(), eventNameSummary)
	require.Len(t, summaries, 1)
	a := summaries[0].Attributes().AsRaw()
	assert.Equal(t, "engine", a["llm.session.attribution_source"])
	assert.InDelta(t, 0.007, a["llm.session.engine_time.prefill"], 1e-12)
	assert.InDelta(t, 0.030, a["llm.session.engine_time.decode"], 1e-12)
	assert.InDelta(t, 4.2, a["llm.session.energy"], 1e-12)
	c := engineCounters(t, p, "llm.engine.time")
	assert.InDelta(t, 0.007, c["acme/prefill"], 1e-12)
	// Its energy too, split between the phases as its time is: the engine
	// had no power reading here, so the collector had none to give.
	j := engineCounters(t, p, "llm.engine.energy")
	assert.InDelta(t, 4.2*7/37, j["acme/prefill"], 1e-12)
	assert.InDelta(t, 4.2*30/37, j["acme/decode"], 1e-12)
}

// dcgmEnergy is a dcgm-exporter scrape of the energy counter (mJ).
func dcgmEnergy(pod string, at int64, mj float64) pmetric.Metrics {
	md := pmetric.NewMetrics()
	m := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
	sum := m.SetEmptySum()
	sum.SetIsMonotonic(true)
	sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	dp := sum.DataPoints().AppendEmpty()
	dp.SetTimestamp(pcommon.Timestamp(at))
	dp.SetDoubleValue(mj)
	dp.Attributes().PutStr("pod", pod)
	return md
}

// With the energy counter, the power is its mean between two readings,
// not the gauge's instant.
func TestAttributionEnergyCounter(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	ctx := context.Background()
	gauge := dcgmPower("vllm-0", base, 700) // an instant of a heavy step
	require.NoError(t, p.metrics.ConsumeMetrics(ctx, gauge))
	require.NoError(t, p.metrics.ConsumeMetrics(ctx, dcgmEnergy("vllm-0", base-1000*ms, 1e6)))
	both := dcgmPower("vllm-0", base, 700)
	dcgmEnergy("vllm-0", base, 1e6+150_000).ResourceMetrics().MoveAndAppendTo(both.ResourceMetrics()) // 150 W over the second
	require.NoError(t, p.metrics.ConsumeMetrics(ctx, both))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tenantStart("x", "acme", base, 10), tok("x", base+100*ms, 1), end("x", base+100*ms))))
	p.shutdown(t)
	summaries := recordsNamed(p.logSink.AllLogs(), eventNameSummary)
	require.Len(t, summaries, 1)
	assert.InDelta(t, 150*0.1, summaries[0].Attributes().AsRaw()["llm.session.energy"], 1e-6)
}

// A session opened by a token (its start overtaken on UDP) arrives on the
// engine it has then, none, and ends there, whatever engine its start
// names: the start's engine's integral never takes out a share it never
// took in, and the next session's there is exact.
func TestAttributionTokenBeforeStart(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	ctx := context.Background()
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tok("o", base, 1))))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tenantStart("o", "acme", base-10*ms, 100), end("o", base+10*ms))))
	// Alone on vllm-0: 30 ms of prefill, 10 of decode.
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(
		tenantStart("n", "acme", base+20*ms, 100), tok("n", base+50*ms, 1), tok("n", base+60*ms, 1), end("n", base+60*ms))))
	p.shutdown(t)
	n := summariesByID(recordsNamed(p.logSink.AllLogs(), eventNameSummary))["n"]
	require.NotNil(t, n)
	assert.InDelta(t, 0.030, n["llm.session.engine_time.prefill"], 1e-9)
	assert.InDelta(t, 0.010, n["llm.session.engine_time.decode"], 1e-9)
}

// Through the proxy a prompt's tokens come with the usage at the end, and
// its start gives its size in bytes (llm.request.prompt_bytes): the
// estimate until the end is the size times its engine's tokens per byte,
// learned from the sessions that ended (a quarter before any). Here the
// first session teaches 500 tokens for 4 000 bytes, so the next one's
// 8 000 bytes weigh 1 000 tokens beside a decode, which then has 1/1001 of
// the step (its tenant's mean prompt would say 500, a quarter 2 000).
func TestAttributionPromptFromItsSize(t *testing.T) {
	p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	ctx := context.Background()
	proxied := func(id string, at, size int64) tokenevent.Event {
		ev := tenantStart(id, "acme", at, -1)
		ev.PromptBytes = size
		return ev
	}
	teach := end("a", base+100*ms)
	teach.PromptTokens = 500
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(proxied("a", base, 4000), tok("a", base+100*ms, 1), teach)))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(
		proxied("b", base+200*ms, 8000), tenantStart("c", "acme", base+200*ms, 1),
		tok("c", base+210*ms, 1), tok("c", base+220*ms, 1), tok("c", base+230*ms, 1), tok("b", base+230*ms, 1),
		end("c", base+230*ms), end("b", base+230*ms),
	)))
	p.shutdown(t)
	byID := summariesByID(recordsNamed(p.logSink.AllLogs(), eventNameSummary))
	require.Len(t, byID, 3)
	assert.InDelta(t, 0.010+0.010/1001, byID["c"]["llm.session.engine_time.decode"], 1e-9, "b's prompt estimated at 1 000 tokens")
	assert.InDelta(t, 0.010*1000/1001, byID["b"]["llm.session.engine_time.prefill"], 1e-9)
}

// A token that comes after its engine step was settled (here, the next
// batch, with settle_after 0) loses its weight in the step to the others,
// and is counted.
func TestAttributionLateTokenCounted(t *testing.T) {
	p, tel := newPipelinesWithTelemetry(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	ctx := context.Background()
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(
		tenantStart("a", "acme", base, 10), tenantStart("b", "acme", base, 10), tok("a", base+10*ms, 1), end("a", base+10*ms))))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tok("b", base+10*ms, 1), end("b", base+10*ms))))
	p.shutdown(t)
	byID := summariesByID(recordsNamed(p.logSink.AllLogs(), eventNameSummary))
	assert.InDelta(t, 0.010, byID["a"]["llm.session.engine_time"], 1e-12, "the step alone")
	assert.InDelta(t, 0.0, byID["b"]["llm.session.engine_time"], 1e-12)
	assert.Equal(t, int64(1), counterSum(t, tel, "otelcol_processor_token_session_late_step_tokens"))
}

// A session whose times run 30 s ahead of its engine's others (its
// sender's clock gone wrong) does not move the engine's clock ahead with
// it: the other sessions' steps are not settled before their tokens came.
func TestAttributionClockAheadDoesNotSettleEarly(t *testing.T) {
	p, tel := newPipelinesWithTelemetry(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
	ctx := context.Background()
	ahead := base + 30*time.Second.Nanoseconds()
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tenantStart("a", "acme", base, 10), tok("a", base+10*ms, 1))))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tenantStart("x", "acme", ahead, 10), tok("x", ahead+10*ms, 1), end("x", ahead+10*ms))))
	require.NoError(t, p.logs.ConsumeLogs(ctx, events(tok("a", base+20*ms, 1), end("a", base+20*ms))))
	p.shutdown(t)
	a := summariesByID(recordsNamed(p.logSink.AllLogs(), eventNameSummary))["a"]
	require.NotNil(t, a)
	assert.InDelta(t, 0.010, a["llm.session.engine_time.decode"], 1e-12, "its decode step counted")
	_, err := tel.GetMetric("otelcol_processor_token_session_late_step_tokens")
	assert.Error(t, err, "no token late")
}

// summariesByID are the summaries' attributes by session ID.
func summariesByID(summaries []plog.LogRecord) map[string]map[string]any {
	byID := map[string]map[string]any{}
	for _, lr := range summaries {
		a := lr.Attributes().AsRaw()
		byID[a["llm.session.id"].(string)] = a
	}
	return byID
}

// newPipelinesWithTelemetry is newPipelines whose self-telemetry a test
// reads.
func newPipelinesWithTelemetry(t *testing.T, mutate func(*Config)) (*pipelines, *componenttest.Telemetry) {
	t.Helper()
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	return newPipelinesWith(t, set, mutate), tel
}
