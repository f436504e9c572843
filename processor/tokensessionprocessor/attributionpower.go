// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// The attribution's power readings: the GPUs' power and energy read from
// the metrics pipeline, by pod (the attributor sets them on the engines of
// those pods).

// maxPods bounds the pods whose power readings are held for engines not
// seen yet (a cluster-wide dcgm-exporter reports every GPU pod).
const maxPods = 4096

type powerReading struct {
	at    int64
	watts float64
	// seen is the collector's time of the reading, for forgetting.
	seen int64
}

// readPower reads the GPUs' power (power_metric, W) and energy
// (energy_metric, mJ) from a metrics batch at collector time now, summed by
// pod: a pod's GPUs add up. Nil maps where the batch has none.
func readPower(md pmetric.Metrics, cfg *AttributionConfig, now int64) (byPod, energyByPod map[string]powerReading) {
	for _, rm := range md.ResourceMetrics().All() {
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				var dps pmetric.NumberDataPointSlice
				dst := &byPod
				switch {
				case m.Name() == cfg.PowerMetric && m.Type() == pmetric.MetricTypeGauge:
					dps = m.Gauge().DataPoints()
				case m.Name() == cfg.EnergyMetric && m.Type() == pmetric.MetricTypeSum:
					dps, dst = m.Sum().DataPoints(), &energyByPod
				case m.Name() == cfg.EnergyMetric && m.Type() == pmetric.MetricTypeGauge:
					dps, dst = m.Gauge().DataPoints(), &energyByPod
				default:
					continue
				}
				for _, dp := range dps.All() {
					pod, ok := dp.Attributes().Get(cfg.PodAttribute)
					if !ok || pod.Str() == "" {
						continue
					}
					v := dp.DoubleValue()
					if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
						v = float64(dp.IntValue())
					}
					at := int64(dp.Timestamp())
					if at == 0 {
						at = now
					}
					if *dst == nil {
						*dst = map[string]powerReading{}
					}
					r := (*dst)[pod.Str()]
					r.watts += v // W, or mJ for the energy counter
					r.at = max(r.at, at)
					(*dst)[pod.Str()] = r
				}
			}
		}
	}
	return byPod, energyByPod
}
