package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// The attribution's power readings: the GPUs' power and energy read from
// the metrics pipeline, by pod, and set on the engines of those pods.

// maxPods bounds the pods whose power readings are held for engines not
// seen yet (a cluster-wide dcgm-exporter reports every GPU pod).
const maxPods = 4096

type powerReading struct {
	at    int64
	watts float64
	// seen is the collector's time of the reading, for forgetting.
	seen int64
}

// observePower reads the GPUs' power (power_metric) from a metrics batch
// and sets it on the engines of their pods: a pod's GPUs add up.
func (a *attributor) observePower(md pmetric.Metrics, now int64) {
	if !a.cfg.Enabled || (a.cfg.PowerMetric == "" && a.cfg.EnergyMetric == "") {
		return
	}
	var byPod, energyByPod map[string]powerReading
	for _, rm := range md.ResourceMetrics().All() {
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				var dps pmetric.NumberDataPointSlice
				dst := &byPod
				switch {
				case m.Name() == a.cfg.PowerMetric && m.Type() == pmetric.MetricTypeGauge:
					dps = m.Gauge().DataPoints()
				case m.Name() == a.cfg.EnergyMetric && m.Type() == pmetric.MetricTypeSum:
					dps, dst = m.Sum().DataPoints(), &energyByPod
				case m.Name() == a.cfg.EnergyMetric && m.Type() == pmetric.MetricTypeGauge:
					dps, dst = m.Gauge().DataPoints(), &energyByPod
				default:
					continue
				}
				for _, dp := range dps.All() {
					pod, ok := dp.Attributes().Get(a.cfg.PodAttribute)
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
	if byPod == nil && energyByPod == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for pod, r := range energyByPod {
		r.seen = now
		prev, ok := a.energy[pod]
		a.holdReading(a.energy, pod, r)
		if !ok || r.at <= prev.at || r.watts < prev.watts {
			continue // the first reading, or the counter was reset
		}
		if byPod == nil {
			byPod = map[string]powerReading{}
		}
		// The mean power since the last reading: exact over the interval,
		// where the gauge's is one instant's.
		byPod[pod] = powerReading{at: r.at, watts: (r.watts - prev.watts) / 1000 / (float64(r.at-prev.at) / 1e9)}
	}
	for pod, r := range byPod {
		r.seen = now
		a.holdReading(a.pods, pod, r)
	}
	// An engine's pod is its name, or the host of its host:port (the proxy
	// names an engine by its upstream address).
	for _, e := range a.engines {
		if r, ok := byPod[e.host]; ok && e.host != "" {
			e.m.SetPower(r.at, r.watts)
		}
		if r, ok := byPod[e.name]; ok {
			e.m.SetPower(r.at, r.watts)
		}
	}
}

// holdReading keeps pod's latest reading in m, for engines seen after it:
// a pod not held yet only while fewer than maxPods are.
func (a *attributor) holdReading(m map[string]powerReading, pod string, r powerReading) {
	if _, ok := m[pod]; !ok && len(m) >= maxPods {
		a.counts.pods++
		return
	}
	m[pod] = r
}
