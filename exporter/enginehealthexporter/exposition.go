// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

import (
	"bytes"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// The gauges of GET /metrics, one series of each per engine, the engine
// label its normalised name. They follow the Model Server Protocol's gauges (what
// the llm-d router's endpoint picker scrapes): the value now, no timestamp,
// no counter to rate.
const (
	metricEjected       = "llm_engine_health_ejected"
	metricStallRatio    = "llm_engine_health_stall_ratio"
	metricTTFTP99       = "llm_engine_health_ttft_p99_seconds"
	metricWindowSession = "llm_engine_health_window_sessions"
	metricErrorRatio    = "llm_engine_health_error_ratio"
	metricSaturated     = "llm_engine_health_saturated_ratio"
	labelEngine         = "engine"
)

// exposition is the gauges of the engines in list, in the order
// of their names, as Prometheus metric families. An engine without a TTFT in
// its window has no TTFT series: 0 would read as the fastest engine there is.
func exposition(list []engineStatus) []*dto.MetricFamily {
	gauge := dto.MetricType_GAUGE
	family := func(name, help string) *dto.MetricFamily {
		return &dto.MetricFamily{Name: &name, Help: &help, Type: &gauge, Metric: make([]*dto.Metric, 0, len(list))}
	}
	ejected := family(metricEjected, "1 while engine_health has the engine ejected, else 0.")
	stall := family(metricStallRatio, "The share of the sessions in the engine's window that stalled.")
	ttft := family(metricTTFTP99, "The p99 of the time to first token in the engine's window, in seconds.")
	sessions := family(metricWindowSession, "The sessions in the engine's window that it is judged on.")
	errorRatio := family(metricErrorRatio, "The share of the sessions in the engine's window that ended by a fault of the engine.")
	saturated := family(metricSaturated, "The share of the requests in the engine's window that it refused for load (429).")
	for i := range list {
		st := &list[i]
		labels := []*dto.LabelPair{{Name: new(labelEngine), Value: new(st.Engine)}}
		add := func(f *dto.MetricFamily, v float64) {
			f.Metric = append(f.Metric, &dto.Metric{Label: labels, Gauge: &dto.Gauge{Value: new(v)}})
		}
		out := 0.0
		if st.State == stateEjected {
			out = 1
		}
		add(ejected, out)
		add(stall, st.Window.StallRatio)
		if st.TTFTP99S != nil {
			add(ttft, *st.TTFTP99S)
		}
		add(sessions, st.Window.Sessions)
		add(errorRatio, st.Window.ErrorRatio)
		add(saturated, st.Window.SaturatedRatio)
	}
	return []*dto.MetricFamily{ejected, stall, ttft, sessions, errorRatio, saturated}
}

// serveMetrics answers the gauges of v in the Prometheus text format: of
// every engine, or of the one ?engine= names (none for an engine never
// seen, as a scrape of a pod whose engine has had no session yet).
func serveMetrics(w http.ResponseWriter, r *http.Request, v *verdicts) {
	list := v.list
	if raw, ok := r.URL.Query()["engine"]; ok {
		list = nil
		if name, tooLong := normalizeEngine(raw[0]); !tooLong {
			if st, ok := v.lookup(name); ok {
				list = []engineStatus{st}
			}
		}
	}
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	var body bytes.Buffer
	enc := expfmt.NewEncoder(&body, format)
	for _, f := range exposition(list) {
		if len(f.Metric) == 0 {
			continue
		}
		if err := enc.Encode(f); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", string(format))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body.Bytes())
}
