// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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

// scrape GETs /metrics (with query, if any) and parses it as Prometheus
// does, by name.
func scrape(t *testing.T, th *testHealth, query string) map[string]*dto.MetricFamily {
	t.Helper()
	code, hdr, body := get(t, "http://"+th.http.Addr.String()+"/metrics"+query)
	require.Equal(t, http.StatusOK, code, string(body))
	assert.Equal(t, expfmt.TypeTextPlain, expfmt.ResponseFormat(hdr).FormatType(), hdr.Get("Content-Type"))
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err, string(body))
	return families
}

// gauges is each family's gauge values, by engine label.
func gauges(t *testing.T, families map[string]*dto.MetricFamily) map[string]map[string]float64 {
	t.Helper()
	out := make(map[string]map[string]float64, len(families))
	for name, f := range families {
		require.Equal(t, dto.MetricType_GAUGE, f.GetType(), name)
		out[name] = make(map[string]float64)
		for _, m := range f.GetMetric() {
			require.Len(t, m.GetLabel(), 1, name)
			require.Equal(t, labelEngine, m.GetLabel()[0].GetName(), name)
			assert.Zero(t, m.GetTimestampMs(), "%s: no timestamp, as a model server's gauges", name)
			out[name][m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	return out
}

func TestMetricsEndpointServesTheWindow(t *testing.T) {
	th := startHealth(t, nil)
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy("a", 10)
	tr.sessions("c", 10, 1, 300*time.Millisecond, "completed")
	th.consumeMetrics(tr.flush(th.clock.Now()))
	th.consumeLogs(stallAlerts("b", "s1", "s2", "s3", "s4", "s5"))
	require.Equal(t, stateEjected, th.status(t, "b").State)

	got := gauges(t, scrape(t, th, ""))
	assert.Equal(t, map[string]float64{"a": 0, "b": 1, "c": 0}, got[metricEjected])
	assert.Equal(t, map[string]float64{"a": 0, "b": 1, "c": 0.1}, got[metricStallRatio])
	assert.Equal(t, map[string]float64{"a": 10, "b": 5, "c": 10}, got[metricWindowSession])
	assert.Equal(t, map[string]float64{"a": 0, "b": 0, "c": 0}, got[metricErrorRatio])
	assert.Equal(t, map[string]float64{"a": 0, "b": 0, "c": 0}, got[metricSaturated])
	// b has no TTFT in its window (stall alerts only): no series, not 0.
	require.Len(t, got[metricTTFTP99], 2)
	assert.InDelta(t, 0.1, got[metricTTFTP99]["a"], 0.002, "100 ms TTFTs: p99 within their bucket (0.08, 0.1]")
	for _, engine := range []string{"a", "c"} {
		assert.Equal(t, *th.status(t, engine).TTFTP99S, got[metricTTFTP99][engine], engine)
	}
	assert.Greater(t, got[metricTTFTP99]["c"], 0.25)

	// A pod's scrape names its engine, in any case; one never seen has no
	// series, an unknown name no error.
	got = gauges(t, scrape(t, th, "?engine="+url.QueryEscape(" C ")))
	assert.Equal(t, map[string]float64{"c": 0.1}, got[metricStallRatio])
	assert.Len(t, got, 6)
	assert.Empty(t, scrape(t, th, "?engine=nope"))
	assert.Empty(t, scrape(t, th, "?engine="+strings.Repeat("c", maxEngineName+1)))
}

func TestMetricsEjectedFlipsWithAnEjection(t *testing.T) {
	th := startHealth(t, nil)
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy("a", 10)
	tr.healthy("b", 10)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	before := gauges(t, scrape(t, th, "?engine=b"))
	assert.Equal(t, map[string]float64{"b": 0}, before[metricEjected])

	th.consumeLogs(stallAlerts("b", "s1", "s2", "s3", "s4", "s5"))
	require.Equal(t, stateEjected, th.status(t, "b").State)
	after := gauges(t, scrape(t, th, "?engine=b"))
	assert.Equal(t, map[string]float64{"b": 1}, after[metricEjected])
	assert.Equal(t, map[string]float64{"b": 0.5}, after[metricStallRatio], "5 stalled of 10")
}

// A sidecar judges its pod's engine alone. By default the last engine with
// traffic is never ejected, so its ejected gauge would stay 0; the shipped
// llm-d sidecar config (the picker keeps the last endpoint itself) lets a
// stalling pod's engine be ejected, and the gauge the picker filters on
// flips.
func TestSidecarEjectsItsOwnEngine(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "llm-d", "sidecar-config.yaml"))
	require.NoError(t, err)
	var file struct {
		Exporters struct {
			EngineHealth map[string]any `json:"engine_health"`
		} `json:"exporters"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &file))
	shipped := createDefaultConfig()
	require.NoError(t, confmap.NewFromStringMap(file.Exporters.EngineHealth).Unmarshal(shipped))
	require.False(t, shipped.Eject.KeepLast, "the shipped sidecar config lets its own engine be ejected")

	for name, mutate := range map[string]func(*Config){
		"default":       nil,
		"llm-d sidecar": func(c *Config) { c.Eject = shipped.Eject },
	} {
		t.Run(name, func(t *testing.T) {
			th := startHealth(t, mutate)
			tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
			tr.healthy("localhost:8000", 10)
			th.consumeMetrics(tr.flush(th.clock.Now()))
			th.consumeLogs(stallAlerts("localhost:8000", "s1", "s2", "s3", "s4", "s5"))
			want := map[string]float64{"localhost:8000": 1}
			if mutate == nil {
				want["localhost:8000"] = 0 // the last engine with traffic stays in
			}
			assert.Equal(t, want, gauges(t, scrape(t, th, ""))[metricEjected])
		})
	}
}

// The selector syntax of the llm-d router's metricSpec (its metrics
// extractor's spec.go): name{label=value,label="value"}, equality only.
var (
	eppSpecRE  = regexp.MustCompile(`^\s*(\S+?)\s*(?:\{([^}]*)\})?\s*$`)
	eppLabelRE = regexp.MustCompile(`^\s*(\S+?)\s*=\s*"?([^",]*)"?\s*$`)
)

// eppConfig is what deploy/llm-d/epp-config.yaml says of the metrics it
// reads, and of the filter and the scorer that read them.
type eppConfig struct {
	Plugins []struct {
		Type       string `json:"type"`
		Name       string `json:"name"`
		Parameters struct {
			Port          int `json:"port"`
			EngineConfigs []struct {
				CustomMetrics []struct {
					AttributeKey string `json:"attributeKey"`
					MetricSpec   string `json:"metricSpec"`
				} `json:"customMetrics"`
			} `json:"engineConfigs"`
			Attribute       string `json:"attribute"`
			AttributeKey    string `json:"attributeKey"`
			OnMissing       string `json:"onMissing"`
			FallbackOnEmpty bool   `json:"fallbackOnEmpty"`
			Algorithm       struct {
				Type      string `json:"type"`
				Threshold struct {
					Operator string  `json:"operator"`
					Value    float64 `json:"value"`
				} `json:"threshold"`
				Normalization struct {
					FixedRange *struct {
						Min float64 `json:"min"`
						Max float64 `json:"max"`
					} `json:"fixedRange"`
				} `json:"normalization"`
			} `json:"algorithm"`
		} `json:"parameters"`
	} `json:"plugins"`
	SchedulingProfiles []struct {
		Plugins []struct {
			PluginRef string  `json:"pluginRef"`
			Weight    float64 `json:"weight"`
		} `json:"plugins"`
	} `json:"schedulingProfiles"`
}

// Every metricSpec the shipped EPP config reads matches exactly one series
// that engine_health serves to a pod's scrape, by name and labels; the
// filter and scorer read attributes those specs produce, and every
// attribute extracted is read (an attribute nothing reads costs a scrape's
// extraction, and its errors in the EPP's log while the series is absent).
func TestLLMDConfigSelectsServedSeries(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "llm-d", "epp-config.yaml"))
	require.NoError(t, err)
	var cfg eppConfig
	require.NoError(t, yaml.Unmarshal(raw, &cfg))

	// The sidecar's proxy names its engine by its upstream, localhost:8000,
	// with a TTFT in the window so that every gauge has its series.
	th := startHealth(t, nil)
	tr := newTraffic(t, sessionmetrics.Delta, sessionmetrics.Explicit, t0)
	tr.healthy("localhost:8000", 10)
	th.consumeMetrics(tr.flush(th.clock.Now()))
	served := scrape(t, th, "")

	attributes := map[string]bool{}
	for _, p := range cfg.Plugins {
		for _, ec := range p.Parameters.EngineConfigs {
			for _, cm := range ec.CustomMetrics {
				m := eppSpecRE.FindStringSubmatch(cm.MetricSpec)
				require.NotNil(t, m, cm.MetricSpec)
				want := map[string]string{}
				if block := strings.TrimSpace(m[2]); block != "" {
					for _, pair := range strings.Split(block, ",") {
						lm := eppLabelRE.FindStringSubmatch(pair)
						require.NotNil(t, lm, "%s: %s", cm.MetricSpec, pair)
						want[lm[1]] = lm[2]
					}
				}
				f, ok := served[m[1]]
				require.True(t, ok, "%s: no such metric served", cm.MetricSpec)
				matches := 0
				for _, s := range f.GetMetric() {
					labels := map[string]string{}
					for _, l := range s.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					if assert.ObjectsAreEqual(want, labels) {
						matches++
					}
				}
				assert.Equal(t, 1, matches, "%s: the series it selects, labels and all", cm.MetricSpec)
				attributes[cm.AttributeKey] = true
			}
		}
	}
	read := 0
	used := map[string]bool{}
	for _, p := range cfg.Plugins {
		switch p.Type {
		case "endpoint-attribute-filter":
			assert.True(t, attributes[p.Parameters.Attribute], "%s reads %q", p.Name, p.Parameters.Attribute)
			used[p.Parameters.Attribute] = true
			read++
		case "endpoint-attribute-scorer":
			assert.True(t, attributes[p.Parameters.AttributeKey], "%s reads %q", p.Name, p.Parameters.AttributeKey)
			used[p.Parameters.AttributeKey] = true
			read++
		case "metrics-data-source":
			if p.Parameters.Port != 0 {
				assert.Equal(t, sidecarPort(t), strconv.Itoa(p.Parameters.Port), "engine_health's endpoint in deploy/llm-d/sidecar-config.yaml")
			}
		}
	}
	assert.Equal(t, 2, read, "a filter and a scorer")
	for attr := range attributes {
		assert.True(t, used[attr], "%s extracted but read by no filter or scorer", attr)
	}
}

// sidecarPort is the port of engine_health's endpoint in deploy/llm-d's
// sidecar config.
func sidecarPort(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "llm-d", "sidecar-config.yaml"))
	require.NoError(t, err)
	var cfg struct {
		Exporters struct {
			EngineHealth struct {
				Endpoint string `json:"endpoint"`
			} `json:"engine_health"`
		} `json:"exporters"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &cfg))
	_, port, err := net.SplitHostPort(cfg.Exporters.EngineHealth.Endpoint)
	require.NoError(t, err)
	return port
}

// A pod's scrape, every 50 ms from the EPP: one engine of many known.
func BenchmarkServeMetrics(b *testing.B) {
	list := make([]engineStatus, 64)
	for i := range list {
		ttft := 0.1
		list[i] = engineStatus{
			Engine: fmt.Sprintf("10.0.0.%d:8000", i), State: stateHealthy,
			Window: windowFigures{Sessions: 40, StallRatio: 0.05}, TTFTP99S: &ttft,
		}
	}
	h := &engineHealth{}
	h.verdicts.Store(newVerdicts(list))
	for _, query := range []string{"", "?engine=10.0.0.1:8000"} {
		b.Run("query="+query, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/metrics"+query, http.NoBody)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				serveMetrics(w, req, h.verdicts.Load())
			}
		})
	}
}
