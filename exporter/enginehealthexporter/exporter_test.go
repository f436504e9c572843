// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadatatest"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
)

// fakeClock is the exporter's clock in tests.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// testHealth is a started engine_health with a fake clock, its endpoints on
// free loopback ports.
type testHealth struct {
	*engineHealth
	tel   *componenttest.Telemetry
	clock *fakeClock
}

func startHealth(t *testing.T, mutate func(*Config)) *testHealth {
	t.Helper()
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	cfg := createDefaultConfig()
	cfg.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	cfg.Agent = configoptional.Some(AgentConfig{Endpoint: "127.0.0.1:0"})
	if mutate != nil {
		mutate(cfg)
	}
	require.NoError(t, cfg.Validate())
	h, err := newEngineHealth(cfg, metadatatest.NewSettings(tel))
	require.NoError(t, err)
	clock := &fakeClock{now: t0}
	h.now, h.started = clock.Now, clock.Now()
	require.NoError(t, h.Start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, h.Shutdown(context.Background())) })
	return &testHealth{engineHealth: h, tel: tel, clock: clock}
}

func (th *testHealth) status(t *testing.T, engine string) engineStatus {
	t.Helper()
	st, ok := th.verdicts.Load().lookup(engine)
	require.True(t, ok, "engine %q judged", engine)
	return st
}

// traffic makes session metrics as token_session does: the real aggregator,
// flushed into a pmetric.Metrics.
type traffic struct {
	agg *sessionmetrics.Aggregator
}

func newTraffic(t *testing.T, temporality sessionmetrics.Temporality, kind sessionmetrics.HistogramKind, start time.Time) *traffic {
	t.Helper()
	cfg := sessionmetrics.DefaultConfig()
	cfg.Temporality, cfg.Histogram = temporality, kind
	agg, err := sessionmetrics.New(cfg, start)
	require.NoError(t, err)
	return &traffic{agg: agg}
}

// sessions ends n sessions of engine, the first stalled of them with a stall,
// each with the given TTFT and outcome.
func (tr *traffic) sessions(engine string, n, stalled int, ttft time.Duration, outcome string) {
	for i := range n {
		l := tr.agg.SessionStarted(sessionmetrics.Dims{Operation: "chat", Model: "m", Engine: engine})
		if i < stalled {
			tr.agg.Stall(l)
		}
		r := sessionmetrics.Result{Outcome: outcome, TTFT: ttft, HasTTFT: true, Duration: 2 * ttft}
		if outcome == "error" {
			r.ErrorType = "500"
		}
		tr.agg.SessionEnded(l, r)
	}
}

func (tr *traffic) healthy(engine string, n int) {
	tr.sessions(engine, n, 0, 100*time.Millisecond, "completed")
}

func (tr *traffic) flush(now time.Time) pmetric.Metrics {
	md := pmetric.NewMetrics()
	tr.agg.AppendTo(md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty(), now)
	return md
}

// Each threshold ejects its engine from the metrics token_session emits,
// whatever their temporality and histogram kind; the window sums what each
// flush added (a cumulative series is not counted twice).
func TestMetricsEjectEachThreshold(t *testing.T) {
	for _, temporality := range []sessionmetrics.Temporality{sessionmetrics.Cumulative, sessionmetrics.Delta} {
		for _, kind := range []sessionmetrics.HistogramKind{sessionmetrics.Explicit, sessionmetrics.Exponential} {
			t.Run(fmt.Sprintf("%s %s", temporality, kind), func(t *testing.T) {
				th := startHealth(t, nil)
				tr := newTraffic(t, temporality, kind, t0)
				// Two flushes: what each adds makes the window.
				for range 2 {
					tr.healthy("a", 10)
					tr.healthy("d", 10)
					tr.healthy("e", 10)
					tr.sessions("stalls", 10, 3, 100*time.Millisecond, "completed")
					tr.sessions("errors", 7, 0, 100*time.Millisecond, "completed")
					tr.sessions("errors", 3, 0, 100*time.Millisecond, "error")
					tr.sessions("slow", 10, 0, 3*time.Second, "completed")
					th.clock.Advance(time.Second)
					th.consumeMetrics(tr.flush(th.clock.Now()))
				}
				for _, engine := range []string{"a", "d", "e"} {
					st := th.status(t, engine)
					assert.Equal(t, stateHealthy, st.State, engine)
					assert.Equal(t, 20.0, st.Window.Sessions, engine)
				}
				for engine, reason := range map[string]string{
					"stalls": reasonStallRatio, "errors": reasonErrorRatio, "slow": reasonTTFTP99,
				} {
					st := th.status(t, engine)
					assert.Equal(t, stateEjected, st.State, engine)
					assert.Equal(t, reason, st.Reason, engine)
					assert.Equal(t, 20.0, st.Window.Sessions, engine)
				}
				assert.InDelta(t, 0.3, th.status(t, "stalls").Window.StallRatio, 1e-9)
				assert.InDelta(t, 0.3, th.status(t, "errors").Window.ErrorRatio, 1e-9)
				slow := th.status(t, "slow")
				require.NotNil(t, slow.TTFTP99S)
				assert.Greater(t, *slow.TTFTP99S, 2.0, "3 s TTFTs: over the 2 s threshold")

				metadatatest.AssertEqualExporterEngineHealthEjections(t, th.tel, []metricdata.DataPoint[int64]{
					{Attributes: attribute.NewSet(attribute.String("engine", "errors"), attribute.String("reason", reasonErrorRatio)), Value: 1},
					{Attributes: attribute.NewSet(attribute.String("engine", "slow"), attribute.String("reason", reasonTTFTP99)), Value: 1},
					{Attributes: attribute.NewSet(attribute.String("engine", "stalls"), attribute.String("reason", reasonStallRatio)), Value: 1},
				}, metricdatatest.IgnoreTimestamp())
				metadatatest.AssertEqualExporterEngineHealthEnginesEjected(t, th.tel,
					[]metricdata.DataPoint[int64]{{Value: 3}}, metricdatatest.IgnoreTimestamp())
			})
		}
	}
}

// A cumulative series whose start is older than the window counts from its
// second point: its first is history (this collector started after the
// one upstream), not the window's sessions.
func TestCumulativeHistoryIsNotTheWindow(t *testing.T) {
	th := startHealth(t, nil)
	tr := newTraffic(t, sessionmetrics.Cumulative, sessionmetrics.Explicit, t0.Add(-time.Hour))
	tr.sessions("b", 50, 50, time.Second, "completed")
	tr.healthy("a", 10)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	assert.Equal(t, stateHealthy, th.status(t, "b").State)
	assert.Zero(t, th.status(t, "b").Window.Sessions)

	tr.healthy("b", 10)
	th.clock.Advance(time.Second)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	st := th.status(t, "b")
	assert.Equal(t, stateHealthy, st.State)
	assert.Equal(t, 10.0, st.Window.Sessions)
	assert.Zero(t, st.Window.StallRatio)
}

// Counters that go backwards (token_session restarted upstream) reset that
// engine's window, and the reset is counted.
func TestCumulativeCountersBackwardsResetTheWindow(t *testing.T) {
	th := startHealth(t, nil)
	before := newTraffic(t, sessionmetrics.Cumulative, sessionmetrics.Explicit, t0)
	before.sessions("b", 4, 1, 100*time.Millisecond, "completed")
	before.healthy("a", 10)
	th.clock.Advance(time.Second)
	th.consumeMetrics(before.flush(th.clock.Now()))
	assert.Equal(t, 4.0, th.status(t, "b").Window.Sessions)

	th.clock.Advance(time.Second)
	after := newTraffic(t, sessionmetrics.Cumulative, sessionmetrics.Explicit, th.clock.Now())
	after.healthy("b", 2)
	th.clock.Advance(time.Second)
	th.consumeMetrics(after.flush(th.clock.Now()))
	st := th.status(t, "b")
	assert.Equal(t, 2.0, st.Window.Sessions, "the window holds what the new counters counted")
	assert.Zero(t, st.Window.StallRatio)
	metadatatest.AssertEqualExporterEngineHealthWindowResets(t, th.tel,
		[]metricdata.DataPoint[int64]{{Value: 1}}, metricdatatest.IgnoreTimestamp())
}

// A data point or a stall alert without llm.engine is ignored and counted;
// the rest of the batch is judged.
func TestWithoutEngineIgnoredAndCounted(t *testing.T) {
	th := startHealth(t, nil)
	md := pmetric.NewMetrics()
	m := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName(metricSessions)
	sum := m.SetEmptySum()
	sum.SetAggregationTemporality(pmetric.AggregationTemporalityDelta)
	dp := sum.DataPoints().AppendEmpty()
	dp.SetIntValue(7)
	dp.Attributes().PutStr(attrOutcome, "completed")
	dp = sum.DataPoints().AppendEmpty()
	dp.SetIntValue(3)
	dp.Attributes().PutStr(attrEngine, "a")
	dp.Attributes().PutStr(attrOutcome, "completed")
	th.consumeMetrics(md)

	ld := plog.NewLogs()
	lr := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	lr.SetEventName(eventStall)
	lr.Attributes().PutStr(attrSessionID, "s1")
	th.consumeLogs(ld)

	assert.Equal(t, 3.0, th.status(t, "a").Window.Sessions)
	assert.Len(t, th.verdicts.Load().list, 1)
	metadatatest.AssertEqualExporterEngineHealthIgnored(t, th.tel, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(attribute.String("why", "no_engine")), Value: 2},
	}, metricdatatest.IgnoreTimestamp())
}

// stallAlerts is the logs token_session emits when sessions of engine stall:
// one llm.session.stall event each, beside a summary that is not an alert.
func stallAlerts(engine string, sessions ...string) plog.Logs {
	ld := plog.NewLogs()
	records := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords()
	for _, id := range sessions {
		lr := records.AppendEmpty()
		lr.SetEventName(eventStall)
		lr.SetSeverityNumber(plog.SeverityNumberWarn)
		lr.Attributes().PutStr(attrSessionID, id)
		lr.Attributes().PutStr(attrEngine, engine)
		lr.Attributes().PutInt("llm.session.stalls", 1)
	}
	summary := records.AppendEmpty()
	summary.SetEventName("llm.session.summary")
	summary.Attributes().PutStr(attrEngine, engine)
	return ld
}

// Stall alerts eject an engine as they come, before any metrics flush; the
// ejection ends after base_time, and the next lasts twice as long.
func TestStallAlertsEjectAtOnceThenReadmit(t *testing.T) {
	th := startHealth(t, nil)
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy("a", 10)
	th.consumeMetrics(tr.flush(th.clock.Now()))

	th.consumeLogs(stallAlerts("b", "s1", "s2", "s3", "s4"))
	assert.Equal(t, stateHealthy, th.status(t, "b").State, "4 sessions are fewer than min_sessions")
	th.consumeLogs(stallAlerts("b", "s4", "s5"))
	st := th.status(t, "b").at(th.clock.Now())
	assert.Equal(t, stateEjected, st.State, "the fifth stalled session ejects it")
	assert.Equal(t, reasonStallRatio, st.Reason)
	assert.Equal(t, 5.0, st.Window.Sessions, "a session alerted twice counts once")
	assert.Equal(t, 30.0, st.TimeLeftS)
	assert.Equal(t, "down #ejected: stall_ratio\n", agentReply(th.verdicts.Load(), "b"))

	th.clock.Advance(30 * time.Second)
	th.evaluate()
	assert.Equal(t, stateHealthy, th.status(t, "b").State, "re-admitted after base_time")
	assert.Equal(t, "up\n", agentReply(th.verdicts.Load(), "b"))
	metadatatest.AssertEqualExporterEngineHealthReadmissions(t, th.tel, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(attribute.String("engine", "b")), Value: 1},
	}, metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualExporterEngineHealthEnginesEjected(t, th.tel,
		[]metricdata.DataPoint[int64]{{Value: 0}}, metricdatatest.IgnoreTimestamp())

	// a carries traffic again (b is never ejected as the last engine that does).
	tr.healthy("a", 10)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	th.consumeLogs(stallAlerts("b", "t1", "t2", "t3", "t4", "t5"))
	st = th.status(t, "b").at(th.clock.Now())
	assert.Equal(t, stateEjected, st.State, "judged afresh, and ejected again")
	assert.Equal(t, 2, st.Ejections)
	assert.Equal(t, 60.0, st.TimeLeftS, "twice base_time")
}

// Stall alerts and the stall counts of the metrics that follow are the same
// stalls: a session is not counted twice.
func TestStallAlertsAndMetricsCountOnce(t *testing.T) {
	th := startHealth(t, func(cfg *Config) { cfg.Eject.StallRatio = 0.5 })
	th.consumeLogs(stallAlerts("b", "s1", "s2", "s3", "s4"))
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.sessions("b", 10, 4, 100*time.Millisecond, "completed")
	tr.healthy("a", 10)
	th.clock.Advance(time.Second)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	st := th.status(t, "b")
	assert.Equal(t, stateHealthy, st.State)
	assert.InDelta(t, 0.4, st.Window.StallRatio, 1e-9)
}

// failed ends n sessions of engine with outcome error and errorType, as the
// token_stream proxy ends them (an upstream's non-200 status, an error in the
// stream, a timeout or a reset).
func (tr *traffic) failed(engine string, n int, errorType string) {
	for range n {
		l := tr.agg.SessionStarted(sessionmetrics.Dims{Operation: "chat", Model: "m", Engine: engine})
		tr.agg.SessionEnded(l, sessionmetrics.Result{Outcome: "error", ErrorType: errorType, Duration: time.Millisecond})
	}
}

// Only the engine's own faults count against it: 5xx, errors inside a 200
// stream, upstream timeouts and resets, streams the proxy's stall breaker
// cut, sessions that went silent. A client
// sending bad requests (400, 404, 422) or an engine refusing for load (429)
// ejects nothing.
func TestOnlyEngineFaultsEject(t *testing.T) {
	th := startHealth(t, nil)
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	for _, engine := range []string{"a", "b", "c", "d"} {
		tr.healthy(engine, 10)
	}
	tr.failed("saturated", 6, "429")
	for _, code := range []string{"400", "404", "422"} {
		tr.failed("bad-requests", 2, code)
	}
	tr.failed("5xx", 3, "500")
	tr.failed("5xx", 3, "503")
	// In a 200 stream: the proxy's name for an error object without a type,
	// and vLLM's type for an error while generating.
	tr.failed("mid-stream", 3, "engine_error")
	tr.failed("mid-stream", 3, "BadRequestError")
	tr.failed("timeouts", 2, "upstream_timeout")
	tr.failed("timeouts", 2, "upstream_idle_timeout")
	tr.sessions("timeouts", 2, 0, 100*time.Millisecond, "timeout")
	tr.failed("resets", 3, "upstream_unreachable")
	tr.failed("resets", 3, "upstream_stream_broken")
	// The proxy's stall breaker cut the streams of a freezing engine.
	tr.failed("stalled", 6, "engine_stalled")
	th.clock.Advance(time.Second)
	th.consumeMetrics(tr.flush(th.clock.Now()))

	for _, engine := range []string{"a", "b", "c", "d", "saturated", "bad-requests"} {
		assert.Equal(t, stateHealthy, th.status(t, engine).State, engine)
	}
	for _, engine := range []string{"5xx", "mid-stream", "timeouts", "resets", "stalled"} {
		st := th.status(t, engine)
		assert.Equal(t, stateEjected, st.State, engine)
		assert.Equal(t, reasonErrorRatio, st.Reason, engine)
	}
}

// The sessions refused for load and the client errors are reported apart,
// in the window's figures, and are not among the sessions the stall and
// error ratios are of: bad requests do not dilute an engine's faults.
func TestSaturatedAndClientErrorsReported(t *testing.T) {
	th := startHealth(t, nil)
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy("a", 10)
	tr.healthy("b", 10)
	tr.healthy("busy", 6)
	tr.failed("busy", 2, "429")
	tr.failed("busy", 1, "404")
	tr.healthy("broken", 8)
	tr.failed("broken", 2, "502")
	tr.failed("broken", 90, "400")
	th.clock.Advance(time.Second)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	base := "http://" + th.http.Addr.String()

	code, _, body := get(t, base+"/engines/busy/health")
	assert.Equal(t, http.StatusOK, code, "refused for load: reported, not ejected")
	var st map[string]any
	require.NoError(t, json.Unmarshal(body, &st), string(body))
	assert.Equal(t, map[string]any{
		"sessions": 6.0, "stall_ratio": 0.0, "error_ratio": 0.0, "saturated": 2.0,
		"saturated_ratio": 0.25, "client_errors": 1.0,
	}, st["window"])

	code, _, body = get(t, base+"/engines/broken/health")
	assert.Equal(t, http.StatusServiceUnavailable, code, "2 faults in the 10 sessions it took on, whatever the 90 bad requests")
	require.NoError(t, json.Unmarshal(body, &st), string(body))
	assert.Equal(t, map[string]any{
		"sessions": 10.0, "stall_ratio": 0.0, "error_ratio": 0.2, "saturated": 0.0,
		"saturated_ratio": 0.0, "client_errors": 90.0,
	}, st["window"])
}

// eject::saturated_ratio, when set, ejects an engine that refuses too many
// requests for load.
func TestSaturatedRatioEjectsWhenSet(t *testing.T) {
	th := startHealth(t, func(cfg *Config) { cfg.Eject.SaturatedRatio = 0.5 })
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy("a", 10)
	tr.healthy("b", 10)
	tr.healthy("less", 5)
	tr.failed("less", 4, "429")
	tr.healthy("busy", 2)
	tr.failed("busy", 4, "429")
	th.clock.Advance(time.Second)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	assert.Equal(t, stateHealthy, th.status(t, "less").State, "4 of 9 refused")
	st := th.status(t, "busy")
	assert.Equal(t, stateEjected, st.State, "4 of 6 refused")
	assert.Equal(t, reasonSaturatedRatio, st.Reason)
	metadatatest.AssertEqualExporterEngineHealthEjections(t, th.tel, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(attribute.String("engine", "busy"), attribute.String("reason", reasonSaturatedRatio)), Value: 1},
	}, metricdatatest.IgnoreTimestamp())
}

// An engine whose sessions are all still streaming carries traffic: it
// counts among the engines in play, and is not the last with traffic.
func TestSessionsInFlightAreTraffic(t *testing.T) {
	th := startHealth(t, nil)
	tr := newTraffic(t, sessionmetrics.Cumulative, sessionmetrics.Explicit, t0)
	for range 3 {
		tr.agg.SessionStarted(sessionmetrics.Dims{Operation: "chat", Model: "m", Engine: "long"})
	}
	tr.failed("bad", 6, "500")
	th.clock.Advance(time.Second)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	assert.Equal(t, stateEjected, th.status(t, "bad").State, "long still carries traffic")
}
