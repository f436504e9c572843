// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
	"sigs.k8s.io/yaml"

	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
)

// The llm-d router's endpoint picker (EPP) as it reads deploy/llm-d's feed,
// modeled from its source at llm-d/llm-d-router
// ebab687927f5331c1b39defcb579a07951bce56c (the commit deploy/llm-d cites;
// deploy/llm-d/eppcheck runs the router itself at that commit). Each step
// names the lines it models, in these files under pkg/epp/framework/plugins/:
// datalayer/source/http/datasource.go and client.go (the scrape),
// datalayer/source/metrics/datasource.go (the parser),
// datalayer/extractor/metrics/extractor.go and spec.go (the extractor),
// scheduling/filter/endpointattribute/filter.go (drop-ejected) and
// scheduling/scorer/endpointattribute/endpointattribute.go (stall-ratio).

// routerSpecOf is one customMetrics entry: the attribute and the series it
// reads.
type routerSpecOf struct {
	attribute string
	name      string
	labels    map[string]string
}

// routerModel is the EPP's reading of deploy/llm-d/epp-config.yaml: the
// engine-health-extractor's specs, drop-ejected and stall-ratio (with its
// weight in the profile).
type routerModel struct {
	specs                              []routerSpecOf
	filterAttr                         string
	passOnMissing, fallbackOnEmpty     bool
	below                              float64 // threshold LessThan
	scorerAttr                         string
	scorerMin, scorerMax, scorerWeight float64
}

// routerEndpoint is what one EPP holds of one pod: its attributes and the
// update time of its metrics.
type routerEndpoint struct {
	attrs   map[string]float64
	updated time.Time
}

func newRouterEndpoint() *routerEndpoint { return &routerEndpoint{attrs: map[string]float64{}} }

func loadRouterModel(t *testing.T) *routerModel {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "llm-d", "epp-config.yaml"))
	require.NoError(t, err)
	var cfg eppConfig
	require.NoError(t, yaml.Unmarshal(raw, &cfg))
	m := &routerModel{}
	for _, p := range cfg.Plugins {
		switch p.Type {
		case "core-metrics-extractor":
			for _, ec := range p.Parameters.EngineConfigs {
				for _, cm := range ec.CustomMetrics {
					s := eppSpecRE.FindStringSubmatch(cm.MetricSpec)
					require.NotNil(t, s, cm.MetricSpec)
					spec := routerSpecOf{attribute: cm.AttributeKey, name: s[1], labels: map[string]string{}}
					if block := strings.TrimSpace(s[2]); block != "" {
						for _, pair := range strings.Split(block, ",") {
							l := eppLabelRE.FindStringSubmatch(pair)
							require.NotNil(t, l, pair)
							spec.labels[l[1]] = l[2]
						}
					}
					m.specs = append(m.specs, spec)
				}
			}
		case "endpoint-attribute-filter":
			require.Equal(t, "threshold", p.Parameters.Algorithm.Type)
			require.Equal(t, "LessThan", p.Parameters.Algorithm.Threshold.Operator)
			m.filterAttr, m.below = p.Parameters.Attribute, p.Parameters.Algorithm.Threshold.Value
			// filter.go:107-109: onMissing defaults to Pass.
			m.passOnMissing = p.Parameters.OnMissing != "Fail"
			m.fallbackOnEmpty = p.Parameters.FallbackOnEmpty
		case "endpoint-attribute-scorer":
			require.Equal(t, "linear_lower_is_better", p.Parameters.Algorithm.Type)
			fixed := p.Parameters.Algorithm.Normalization.FixedRange
			require.NotNil(t, fixed, "stall-ratio: a fixed range")
			m.scorerAttr, m.scorerMin, m.scorerMax = p.Parameters.AttributeKey, fixed.Min, fixed.Max
			for _, sp := range cfg.SchedulingProfiles {
				for _, ref := range sp.Plugins {
					if ref.PluginRef == p.Name {
						m.scorerWeight = ref.Weight
					}
				}
			}
		}
	}
	require.NotEmpty(t, m.specs)
	require.NotEmpty(t, m.filterAttr)
	require.NotEmpty(t, m.scorerAttr)
	require.Positive(t, m.scorerWeight)
	return m
}

// scrape is one tick of the engine-health-source on e: GET /metrics, then
// the extractor over what it parsed.
func (m *routerModel) scrape(e *routerEndpoint, url string, now time.Time) {
	resp, err := http.Get(url) //nolint:gosec // a test server on loopback
	if err != nil {
		// client.go:78-80 fails the poll; datasource.go:254-258 returns
		// before any extractor runs: every attribute is kept as it was.
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		// client.go:86-88: a status but 200 fails the poll alike.
		return
	}
	// source/metrics/datasource.go:117-119: the Prometheus text parser.
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return
	}
	m.extract(e, families, now)
}

// extract is the core metrics extractor's customMetrics loop.
func (m *routerModel) extract(e *routerEndpoint, families map[string]*dto.MetricFamily, now time.Time) {
	updated := false
	for _, spec := range m.specs {
		v, ok := latestMatch(spec, families)
		if !ok {
			// extractor.go:198-203: an error, and continue: the attribute
			// keeps its last value.
			continue
		}
		e.attrs[spec.attribute] = v // extractor.go:204
		updated = true              // extractor.go:205
	}
	if updated {
		// extractor.go:208-209,220: any match stamps the endpoint's
		// metrics, every one of them, as updated now.
		e.updated = now
	}
}

// latestMatch is spec.go's getLatestMetric: the family by name (91-98), the
// series whose labels include the spec's with the latest timestamp
// (112-124), its gauge value (150-156).
func latestMatch(spec routerSpecOf, families map[string]*dto.MetricFamily) (float64, bool) {
	f, ok := families[spec.name]
	if !ok || len(f.GetMetric()) == 0 {
		return 0, false
	}
	var latest *dto.Metric
	recent := int64(-1)
	for _, s := range f.GetMetric() {
		match := true
		for name, value := range spec.labels {
			found := false
			for _, l := range s.GetLabel() {
				if l.GetName() == name {
					found = l.GetValue() == value
					break
				}
			}
			match = match && found
		}
		if match && s.GetTimestampMs() > recent {
			recent, latest = s.GetTimestampMs(), s
		}
	}
	if latest == nil {
		return 0, false
	}
	return latest.GetGauge().GetValue(), true
}

// kept is drop-ejected over the pool: filter.go:186-191 (a missing
// attribute is kept on Pass), 193 and 207-208 (LessThan), 198-200 (all
// dropped: all kept, with fallbackOnEmpty).
func (m *routerModel) kept(pool ...*routerEndpoint) []bool {
	out := make([]bool, len(pool))
	anyKept := false
	for i, e := range pool {
		v, ok := e.attrs[m.filterAttr]
		out[i] = (!ok && m.passOnMissing) || (ok && v < m.below)
		anyKept = anyKept || out[i]
	}
	if !anyKept && m.fallbackOnEmpty {
		for i := range out {
			out[i] = true
		}
	}
	return out
}

// score is stall-ratio's score of e: endpointattribute.go:178-181 (a missing
// attribute scores 0), 183-187 (normalized to the fixed range, clamped,
// lower is better).
func (m *routerModel) score(e *routerEndpoint) float64 {
	v, ok := e.attrs[m.scorerAttr]
	if !ok {
		return 0
	}
	n := math.Max(0, math.Min(1, (v-m.scorerMin)/(m.scorerMax-m.scorerMin)))
	return 1 - n
}

// shippedSidecar sets what deploy/llm-d/sidecar-config.yaml sets of
// engine_health, on loopback; the agent is off, as there.
func shippedSidecar(t *testing.T) func(*Config) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "llm-d", "sidecar-config.yaml"))
	require.NoError(t, err)
	var file struct {
		Exporters struct {
			EngineHealth map[string]any `json:"engine_health"`
		} `json:"exporters"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &file))
	return func(c *Config) {
		require.NoError(t, confmap.NewFromStringMap(file.Exporters.EngineHealth).Unmarshal(c))
		c.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
		c.Agent = createDefaultConfig().Agent
	}
}

// shippedSessionMetrics is token_session's metrics section in
// deploy/llm-d/sidecar-config.yaml, over its defaults.
func shippedSessionMetrics(t *testing.T) sessionmetrics.Config {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "llm-d", "sidecar-config.yaml"))
	require.NoError(t, err)
	var file struct {
		Processors struct {
			TokenSession struct {
				Metrics map[string]any `json:"metrics"`
			} `json:"token_session"`
		} `json:"processors"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &file))
	cfg := sessionmetrics.DefaultConfig()
	require.NoError(t, confmap.NewFromStringMap(file.Processors.TokenSession.Metrics).Unmarshal(&cfg))
	return cfg
}

// shippedTraffic is token_session's aggregator with the shipped sidecar's
// metrics settings.
func shippedTraffic(t *testing.T, cfg sessionmetrics.Config, start time.Time) *traffic {
	t.Helper()
	agg, err := sessionmetrics.New(cfg, start)
	require.NoError(t, err)
	return &traffic{agg: agg}
}

// podEngine is how every pod's proxy names its engine (its upstream).
const podEngine = "localhost:8000"

func metricsURL(th *testHealth) string { return "http://" + th.http.Addr.String() + "/metrics" }

// A pod whose engine was ejected is kept out while ejected (the EPP holds
// ejected=1), and comes back at the first scrape after its sidecar restarts,
// though an ejected pod gets no traffic and so no session: the restarted
// sidecar serves ejected 0 for its engine. Issue 40, finding 1: the restarted
// sidecar served no series, and the EPP kept ejected=1 for good.
func TestLLMDRouterRestartedSidecarReadmitsItsPod(t *testing.T) {
	router := loadRouterModel(t)
	pod, peer := newRouterEndpoint(), newRouterEndpoint()
	first := startHealth(t, shippedSidecar(t))
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy(podEngine, 10)
	first.consumeMetrics(tr.flush(first.clock.Now()))
	peer.attrs[router.filterAttr], peer.attrs[router.scorerAttr] = 0, 0
	router.scrape(pod, metricsURL(first), first.clock.Now())
	require.Equal(t, []bool{true, true}, router.kept(pod, peer))

	first.consumeLogs(stallAlerts(podEngine, "s1", "s2", "s3", "s4", "s5"))
	router.scrape(pod, metricsURL(first), first.clock.Now())
	require.Equal(t, []bool{false, true}, router.kept(pod, peer), "ejected: filtered out")

	// The sidecar stops: the scrape fails, no extractor runs, the EPP keeps
	// ejected=1.
	url := metricsURL(first)
	require.NoError(t, first.Shutdown(context.Background()))
	router.scrape(pod, url, first.clock.Now())
	assert.Equal(t, []bool{false, true}, router.kept(pod, peer), "while the sidecar is down")

	// It starts again, and gets no traffic: the pod is filtered out.
	second := startHealth(t, shippedSidecar(t))
	for i := range 600 {
		router.scrape(pod, metricsURL(second), second.clock.Now())
		require.Equal(t, []bool{true, true}, router.kept(pod, peer), "%d s after the restart", i)
		second.clock.Advance(time.Second)
		second.evaluate()
	}
	assert.Equal(t, 1.0, router.score(pod), "its stall-ratio score: a pod that never stalls")
}

// A new pod scores on stall-ratio as a healthy pod with traffic does, from
// its sidecar's first scrape. Issue 40, finding 4: without the gauge it
// scored 0 (weight 2) and got traffic only once the others were loaded.
func TestLLMDRouterNewPodScoresAsAHealthyOne(t *testing.T) {
	router := loadRouterModel(t)
	busy := startHealth(t, shippedSidecar(t))
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy(podEngine, 20)
	busy.consumeMetrics(tr.flush(busy.clock.Now()))
	fresh := startHealth(t, shippedSidecar(t))

	old, added := newRouterEndpoint(), newRouterEndpoint()
	router.scrape(old, metricsURL(busy), busy.clock.Now())
	router.scrape(added, metricsURL(fresh), fresh.clock.Now())
	assert.Equal(t, []bool{true, true}, router.kept(old, added))
	assert.Equal(t, 1.0, router.score(old))
	assert.Equal(t, router.score(old), router.score(added), "the new pod, before any session")
}

// A pod idle for longer than its sidecar keeps an engine it has no news of
// still scores neutral in an EPP that starts then (a restart, a second
// replica): its sidecar still serves the engine's gauges. Before issue 40,
// once token_session had dropped the idle engine's series (forget_after, 1 h)
// and engine_health had forgotten it (300 s later), the series were gone, and
// such an EPP scored the pod 0 on stall-ratio, below the busy pods, which
// then took all the traffic. (Until then token_session re-sends the
// cumulative series at each flush, and an engine forgotten is known again at
// the next one.)
func TestLLMDRouterIdlePodScoresNeutralInANewRouter(t *testing.T) {
	router := loadRouterModel(t)
	metrics := shippedSessionMetrics(t)
	th := startHealth(t, shippedSidecar(t))
	tr := shippedTraffic(t, metrics, t0)
	tr.healthy(podEngine, 10)

	running := newRouterEndpoint()
	idle := metrics.ForgetAfter + th.judge.forgetAfter() + time.Minute
	for elapsed := time.Duration(0); elapsed <= idle; elapsed += metrics.FlushInterval {
		th.clock.Advance(metrics.FlushInterval)
		th.consumeMetrics(tr.flush(th.clock.Now()))
		th.evaluate()
		if elapsed%(10*time.Second) == 0 {
			router.scrape(running, metricsURL(th), th.clock.Now())
			require.Equal(t, []bool{true}, router.kept(running))
			require.Equal(t, 1.0, router.score(running), "the running EPP, %s idle", elapsed)
		}
	}
	started := newRouterEndpoint()
	router.scrape(started, metricsURL(th), th.clock.Now())
	assert.Equal(t, []bool{true}, router.kept(started))
	assert.Equal(t, 1.0, router.score(started), "an EPP started after %s idle", idle)
}

// Under steady traffic with a steady share of stalls, the stall ratio the
// EPP reads each second holds steady. Issue 40, finding 2: with token_session
// flushing every 15 s against engine_health's 10 s window the window was
// empty 5 s in every 15, and the pod read as one that never stalls.
func TestLLMDRouterStallRatioSteadyUnderSteadyTraffic(t *testing.T) {
	router := loadRouterModel(t)
	metrics := shippedSessionMetrics(t)
	th := startHealth(t, shippedSidecar(t))
	tr := shippedTraffic(t, metrics, t0)
	pod := newRouterEndpoint()
	lastFlush := th.clock.Now()
	var scores []float64
	for second := range 90 {
		// Two sessions a second; one in ten stalls (below eject::stall_ratio).
		stalled := 0
		if second%5 == 0 {
			stalled = 1
		}
		tr.sessions(podEngine, 2, stalled, 100*time.Millisecond, "completed")
		th.clock.Advance(time.Second)
		if th.clock.Now().Sub(lastFlush) >= metrics.FlushInterval {
			th.consumeMetrics(tr.flush(th.clock.Now()))
			lastFlush = th.clock.Now()
		}
		th.evaluate()
		router.scrape(pod, metricsURL(th), th.clock.Now())
		if second >= 30 {
			scores = append(scores, router.score(pod))
		}
	}
	for i, s := range scores {
		assert.Less(t, s, 1.0, "second %d: the stalls of the last window are seen (flush every %s)", 30+i, metrics.FlushInterval)
		assert.Greater(t, s, 0.8, "second %d", 30+i)
	}
	assert.Equal(t, []bool{true}, router.kept(pod), "a tenth stalled: not ejected")
}

// When the engine behind the proxy dies, the EPP's vLLM scrape through the
// proxy fails and its queue and KV figures stop changing, yet each scrape
// of engine_health's gauges stamps them as updated now (the router's
// behavior, issue 40 finding 3; deploy/llm-d/README.md): they never look
// older than a scrape interval. engine_health takes the pod out instead: the
// sessions the dead engine fails are engine faults.
func TestLLMDRouterDeadEngineFilteredThoughItsMetricsLookFresh(t *testing.T) {
	router := loadRouterModel(t)
	th := startHealth(t, shippedSidecar(t))
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy(podEngine, 10)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	pod := newRouterEndpoint()
	router.scrape(pod, metricsURL(th), th.clock.Now())
	lastEngineScrape := th.clock.Now()

	// The engine dies: every vLLM scrape (through the proxy: 502) fails from
	// here on, and the requests still sent to the pod fail.
	var filteredAfter time.Duration
	for second := 1; second <= 10; second++ {
		th.clock.Advance(time.Second)
		tr.failed(podEngine, 2, "upstream_unreachable")
		th.consumeMetrics(tr.flush(th.clock.Now()))
		th.evaluate()
		router.scrape(pod, metricsURL(th), th.clock.Now())
		age := th.clock.Now().Sub(pod.updated)
		assert.Zero(t, age, "extractor.go:208-209: the metrics look fresh, %s after the last vLLM scrape",
			th.clock.Now().Sub(lastEngineScrape))
		if filteredAfter == 0 && !router.kept(pod, newRouterEndpoint())[0] {
			filteredAfter = time.Duration(second) * time.Second
		}
	}
	require.NotZero(t, filteredAfter, "the pod is filtered out within 10 s")
	assert.LessOrEqual(t, filteredAfter, 3*time.Second, "5 failed sessions (min_sessions) and it is out")
}
