// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"sort"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/otelcol-llm/otelcol-llm/internal/attribution"
)

// The attribution's counters, llm.engine.time and llm.engine.energy, and
// its totals for the self-telemetry.

// Names of the counters and their attributes.
const (
	metricEngineTime   = "llm.engine.time"
	metricEngineEnergy = "llm.engine.energy"
	attrMetricEngine   = "llm.engine"
	attrMetricModel    = "gen_ai.request.model"
	attrMetricTenant   = "llm.tenant"
	attrMetricState    = "state"
	stateIdle          = "idle"
	statePrefill       = "prefill"
	stateDecode        = "decode"
	attrMetricOverflow = "otel.metric.overflow"
)

// appendTo writes the llm.engine.time and llm.engine.energy counters
// (cumulative): each engine, model and tenant's prefill and decode, and
// each engine's idle time, as settled (attribution::settle_after behind
// each engine's clock); what overflowed
// the cardinality limit in one point with only otel.metric.overflow=true.
// What has had no session for forget_after is forgotten first, and no
// longer sent.
func (a *attributor) appendTo(sm pmetric.ScopeMetrics, now time.Time) {
	if !a.cfg.Enabled {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	ts := pcommon.NewTimestampFromTime(now)
	defer func() { a.lastFlush = ts }()
	a.forget(now.UnixNano())
	if len(a.engines) == 0 && len(a.series) == 0 && a.overflow == nil {
		return
	}
	// The engines' idle time, to now; that of the engines without a point
	// of their own goes to the overflow series.
	type idlePoint struct {
		e         *engineAccount
		tot       attribution.Totals
		hasEnergy bool
	}
	idle := make([]idlePoint, 0, len(a.engines))
	for _, e := range a.engines {
		if e.folded {
			continue
		}
		// Up to the last step settled (attribution::settle_after behind the
		// engine's clock).
		tot := e.m.Totals()
		if !e.idlePoint {
			if d := tot.Idle - e.idleFolded; d > 0 {
				o := a.overflowSeries()
				o.idle += d
				o.idleEnergy += tot.IdleEnergy - e.idleEnergyFolded
				o.activity.Touch()
				e.idleFolded, e.idleEnergyFolded = tot.Idle, tot.IdleEnergy
			}
			continue
		}
		hasEnergy := e.m.HasPower() || tot.IdleEnergy > 0
		e.energyPoint = e.energyPoint || hasEnergy
		idle = append(idle, idlePoint{e: e, tot: tot, hasEnergy: hasEnergy})
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].e.name < idle[j].e.name })

	timeM := sm.Metrics().AppendEmpty()
	timeM.SetName(metricEngineTime)
	timeM.SetUnit("s")
	timeM.SetDescription("Engine time: each session's share of its engine's busy time by model and tenant (state prefill or decode), and the engine's idle time (state idle).")
	td := timeM.SetEmptySum()
	td.SetIsMonotonic(true)
	td.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	energyM := pmetric.NewMetric()
	energyM.SetName(metricEngineEnergy)
	energyM.SetUnit("J")
	energyM.SetDescription("GPU energy: each session's share of its engine's energy by model and tenant (state prefill or decode), and the engine's idle energy (state idle); engines with a power reading only.")
	ed := energyM.SetEmptySum()
	ed.SetIsMonotonic(true)
	ed.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)

	point := func(dps pmetric.NumberDataPointSlice, v float64, start pcommon.Timestamp) pcommon.Map {
		dp := dps.AppendEmpty()
		dp.SetStartTimestamp(start)
		dp.SetTimestamp(ts)
		dp.SetDoubleValue(v)
		return dp.Attributes()
	}
	seriesPoint := func(dps pmetric.NumberDataPointSlice, v float64, start pcommon.Timestamp, k seriesKey, state string) {
		m := point(dps, v, start)
		m.PutStr(attrMetricEngine, k.engine)
		putStr(m, attrMetricModel, k.model)
		putStr(m, attrMetricTenant, k.tenant)
		m.PutStr(attrMetricState, state)
	}
	keys := make([]seriesKey, 0, len(a.series))
	for k := range a.series {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		x, y := keys[i], keys[j]
		if x.engine != y.engine {
			return x.engine < y.engine
		}
		if x.model != y.model {
			return x.model < y.model
		}
		return x.tenant < y.tenant
	})
	for _, k := range keys {
		sr := a.series[k]
		seriesPoint(td.DataPoints(), sr.prefill, sr.start, k, statePrefill)
		seriesPoint(td.DataPoints(), sr.decode, sr.start, k, stateDecode)
		if sr.hasEnergy {
			seriesPoint(ed.DataPoints(), sr.prefillEnergy, sr.start, k, statePrefill)
			seriesPoint(ed.DataPoints(), sr.decodeEnergy, sr.start, k, stateDecode)
		}
	}
	for _, p := range idle {
		seriesPoint(td.DataPoints(), p.tot.Idle, p.e.start, seriesKey{engine: p.e.name}, stateIdle)
		if p.hasEnergy {
			seriesPoint(ed.DataPoints(), p.tot.IdleEnergy, p.e.start, seriesKey{engine: p.e.name}, stateIdle)
		}
	}
	if o := a.overflow; o != nil {
		point(td.DataPoints(), o.prefill+o.decode+o.idle, o.start).PutBool(attrMetricOverflow, true)
		if o.hasEnergy || o.idleEnergy > 0 {
			point(ed.DataPoints(), o.prefillEnergy+o.decodeEnergy+o.idleEnergy, o.start).PutBool(attrMetricOverflow, true)
		}
	}
	if ed.DataPoints().Len() > 0 {
		energyM.MoveTo(sm.Metrics().AppendEmpty())
	}
}

// takeCounts returns the attributor's totals for the self-telemetry.
func (a *attributor) takeCounts() attributionCounts {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.counts
	c.tenants = a.tenants.Overflowed()
	return c
}
