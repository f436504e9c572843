// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package selfmetrics reads a collector's own telemetry from its Prometheus
// text endpoint (addr, /metrics), for the benchmarks and the tests.
package selfmetrics // import "github.com/otelcol-llm/otelcol-llm/internal/harness/selfmetrics"

import (
	"fmt"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Values reads every counter and gauge: each family's value summed over its
// series, by name.
func Values(addr string) (map[string]float64, error) {
	return values(addr, nil)
}

// Value is one family of Values, summed over the series whose labels
// include every one of labels.
func Value(addr, name string, labels map[string]string) (float64, error) {
	m, err := values(addr, func(family string, series *dto.Metric) bool {
		if family != name {
			return false
		}
		have := map[string]string{}
		for _, l := range series.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				return false
			}
		}
		return true
	})
	return m[name], err
}

func values(addr string, keep func(family string, series *dto.Metric) bool) (map[string]float64, error) {
	fams, err := Families(addr)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			if keep != nil && !keep(name, m) {
				continue
			}
			switch {
			case m.Gauge != nil:
				out[name] += m.Gauge.GetValue()
			case m.Counter != nil:
				out[name] += m.Counter.GetValue()
			}
		}
	}
	return out, nil
}

// Families reads the endpoint whole: its families by name, every series.
func Families(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}
