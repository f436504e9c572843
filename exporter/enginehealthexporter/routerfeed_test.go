// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadatatest"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
)

// An engine named in engines is served from the first scrape, healthy with
// an empty window (a router that kept ejected=1 from before a restart reads
// 0 again at once), and while it is idle for far longer than engines are
// remembered. Issue 40: after a sidecar restart /metrics answered an empty
// body and the llm-d router kept ejected=1 for good.
func TestNamedEnginesServedFromTheStart(t *testing.T) {
	// As deploy/llm-d's sidecar: it judges its own engine only.
	th := startHealth(t, func(c *Config) {
		c.Engines = []string{"LocalHost:8000"}
		c.Eject.KeepLast, c.Eject.MaxPercent = false, 100
	})
	want := map[string]map[string]float64{
		metricEjected: {"localhost:8000": 0}, metricStallRatio: {"localhost:8000": 0},
		metricWindowSession: {"localhost:8000": 0}, metricErrorRatio: {"localhost:8000": 0},
		metricSaturated: {"localhost:8000": 0},
	}
	assert.Equal(t, want, gauges(t, scrape(t, th, "")), "before any session; no TTFT series")

	// Ejected for its stalls, then idle for an hour: served throughout,
	// re-admitted after its time.
	th.consumeLogs(stallAlerts("localhost:8000", "s1", "s2", "s3", "s4", "s5"))
	assert.Equal(t, 1.0, gauges(t, scrape(t, th, ""))[metricEjected]["localhost:8000"])
	for range 60 {
		th.clock.Advance(time.Minute)
		th.evaluate()
	}
	assert.Equal(t, want, gauges(t, scrape(t, th, "")), "an hour idle: still served, healthy")
}

// With token_session's default cumulative metrics beside it, the first
// flush after a start counts: its series started with the collector, within
// a window of this exporter's start, though the flush (15 s) came later than
// the window (10 s). Issue 40: the first flush after start was thrown away.
func TestFirstFlushAfterStartCounts(t *testing.T) {
	th := startHealth(t, nil)
	tr := newTraffic(t, sessionmetrics.Cumulative, sessionmetrics.Explicit, th.clock.Now())
	tr.healthy("a", 10)
	tr.healthy("b", 7)
	th.clock.Advance(15 * time.Second)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	assert.Equal(t, 10.0, th.status(t, "a").Window.Sessions)
	assert.Equal(t, 7.0, th.status(t, "b").Window.Sessions)
}

// Session metrics flushed less often than half the window make the window
// empty between flushes: engine_health says so, once, with what it saw.
func TestFlushIntervalOverHalfTheWindowWarns(t *testing.T) {
	for _, tc := range []struct {
		temporality sessionmetrics.Temporality
		flush       time.Duration
		warns       int
	}{
		{sessionmetrics.Delta, 15 * time.Second, 1},
		{sessionmetrics.Cumulative, 15 * time.Second, 1},
		{sessionmetrics.Delta, time.Second, 0},
		{sessionmetrics.Cumulative, 5 * time.Second, 0},
	} {
		t.Run(string(tc.temporality)+"/"+tc.flush.String(), func(t *testing.T) {
			tel := componenttest.NewTelemetry()
			t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
			set := metadatatest.NewSettings(tel)
			core, logs := observer.New(zap.WarnLevel)
			set.Logger = zap.New(core)
			cfg := createDefaultConfig()
			h, err := newEngineHealth(cfg, set)
			require.NoError(t, err)
			clock := &fakeClock{now: t0}
			h.now, h.started = clock.Now, clock.Now()
			tr := newTraffic(t, tc.temporality, sessionmetrics.Explicit, t0)
			for range 4 {
				tr.healthy("a", 10)
				clock.Advance(tc.flush)
				h.consumeMetrics(tr.flush(clock.Now()))
			}
			require.Len(t, logs.All(), tc.warns)
			if tc.warns > 0 {
				assert.Contains(t, logs.All()[0].Message, "metrics::flush_interval")
				assert.Equal(t, int64(tc.flush), logs.All()[0].ContextMap()["flush_interval_seen"].(time.Duration).Nanoseconds())
			}
		})
	}
}

// Shutdown twice after Start, the agent-check endpoint on, as the collector
// may (the logs and metrics faces share the component): the second finds
// everything stopped and says nothing is wrong.
func TestShutdownTwiceWithTheAgent(t *testing.T) {
	th := startHealth(t, nil) // its cleanup shuts it down a second time
	require.NotNil(t, th.agent)
	require.NoError(t, th.Shutdown(context.Background()))
}
