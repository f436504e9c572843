package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"fmt"
	"math"
	"net"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/otelcol-llm/otelcol-llm/internal/attribution"
	"github.com/otelcol-llm/otelcol-llm/internal/session"
)

// AttributionConfig configures who used the GPU: each engine's busy time
// and energy divided among its sessions (internal/attribution states the
// model), on the session outputs and as the llm.engine.time and
// llm.engine.energy counters.
type AttributionConfig struct {
	// Enabled: on by default; it costs three O(1) steps per session, none
	// per token.
	Enabled bool `mapstructure:"enabled"`
	// TenantAttribute is the start attribute whose value is the session's
	// tenant on the counters (llm.tenant).
	TenantAttribute string `mapstructure:"tenant_attribute"`
	// MaxTenants bounds the distinct tenants on the counters; the sessions
	// of the others count as _OTHER.
	MaxTenants int `mapstructure:"max_tenants"`
	// StepTokens, KVCacheTokens and MaxNumSeqs are the engine scheduler's
	// limits (vLLM's max_num_batched_tokens, its KV cache in tokens,
	// max_num_seqs; 0: unlimited) by which the model admits prompts.
	StepTokens    int `mapstructure:"step_tokens"`
	KVCacheTokens int `mapstructure:"kv_cache_tokens"`
	MaxNumSeqs    int `mapstructure:"max_num_seqs"`
	// PrefillFirst: the engine runs no decodes in a step that computes
	// prompts (vLLM V0 without chunked prefill).
	PrefillFirst bool `mapstructure:"prefill_first"`
	// DefaultPromptTokens is the prompt length assumed for a session whose
	// start did not give one (the proxy learns it at the end) before any
	// session of its tenant, or of its engine, ended with one.
	DefaultPromptTokens int `mapstructure:"default_prompt_tokens"`
	// PowerMetric is the GPU power gauge (W) read from the metrics
	// pipeline; PodAttribute its attribute naming the engine's pod.
	PowerMetric  string `mapstructure:"power_metric"`
	PodAttribute string `mapstructure:"pod_attribute"`
	// EnergyMetric is the GPU energy counter (mJ): where a pod has it, the
	// mean power between its last two readings is used instead of the
	// gauge, which samples one instant.
	EnergyMetric string `mapstructure:"energy_metric"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func defaultAttributionConfig() AttributionConfig {
	return AttributionConfig{
		Enabled: true, TenantAttribute: "tenant.id", MaxTenants: 100,
		StepTokens: attribution.DefaultBudget, MaxNumSeqs: 256, DefaultPromptTokens: 512,
		PowerMetric: "DCGM_FI_DEV_POWER_USAGE", PodAttribute: "pod",
		EnergyMetric: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
	}
}

// Validate names each bad setting within the section.
func (c AttributionConfig) Validate() []error {
	var errs []error
	if c.MaxTenants < 1 {
		errs = append(errs, fmt.Errorf("max_tenants: must be at least 1, got %d", c.MaxTenants))
	}
	if c.StepTokens < 1 {
		errs = append(errs, fmt.Errorf("step_tokens: must be at least 1, got %d", c.StepTokens))
	}
	if c.KVCacheTokens < 0 {
		errs = append(errs, fmt.Errorf("kv_cache_tokens: must not be negative, got %d", c.KVCacheTokens))
	}
	if c.DefaultPromptTokens < 1 {
		errs = append(errs, fmt.Errorf("default_prompt_tokens: must be at least 1, got %d", c.DefaultPromptTokens))
	}
	if c.MaxNumSeqs < 0 {
		errs = append(errs, fmt.Errorf("max_num_seqs: must not be negative, got %d", c.MaxNumSeqs))
	}
	return errs
}

// Names of the attribution's outputs.
const (
	attrEngineTime        = "llm.session.engine_time"
	attrEngineTimePrefill = "llm.session.engine_time.prefill"
	attrEngineTimeDecode  = "llm.session.engine_time.decode"
	attrEnergy            = "llm.session.energy"
	attrAttributionSource = "llm.session.attribution_source"

	metricEngineTime   = "llm.engine.time"
	metricEngineEnergy = "llm.engine.energy"
	attrMetricEngine   = "llm.engine"
	attrMetricModel    = "gen_ai.request.model"
	attrMetricTenant   = "llm.tenant"
	attrMetricState    = "state"
	stateIdle          = "idle"
	statePrefill       = "prefill"
	stateDecode        = "decode"
	tenantOverflow     = "_OTHER"
)

// attributionLag is how far behind the collector's clock the counters
// close an engine's integral: events come in up to this late (the hooks'
// batching, a UDP queue) and an integral cannot run backwards.
const attributionLag = int64(time.Second)

// attributor is the part of the core that divides each engine's time and
// energy among its sessions. mu is a leaf: the sessions part calls it with
// its own lock held (session events), the metrics path alone (power).
type attributor struct {
	cfg AttributionConfig

	mu      sync.Mutex
	engines map[string]*engineAccount
	last    *engineAccount
	// pods holds the latest power reading of each pod, for engines seen
	// after it; energy the latest energy counter reading (mJ) of each pod
	// that has one.
	pods   map[string]powerReading
	energy map[string]powerReading

	series  map[seriesKey]*shareSeries
	tenants map[string]struct{}
	// prompts are the mean prompt lengths by engine and tenant, learned at
	// the sessions' ends: the estimate for a session whose start did not
	// give its prompt (the proxy learns it from the usage at the end). Each
	// series points at its engine and tenant's, so that a session's end
	// looks up no map for it.
	prompts map[promptKey]*promptMean
	// tenantOverflows counts the sessions counted as _OTHER.
	tenantOverflows uint64
	created         pcommon.Timestamp
}

type engineAccount struct {
	name string
	m    *attribution.Engine
	// seenAt is the collector's time of the engine's latest session event:
	// the counters advance the engine's integral by the collector time
	// since, on the engine's own clock (the two may differ).
	seenAt int64
	// prompts is the engine's mean prompt over all its tenants: the
	// estimate for a tenant none of whose sessions ended yet.
	prompts promptMean
}

// shareAccount is a session's account, kept beside it (sessionState): its
// share of the engine while open, and the counters' series it will count
// in, resolved once at its start (nil for a session opened by a token,
// which got no start: at its end).
type shareAccount struct {
	attribution.Share
	series *shareSeries
	open   bool
}

type powerReading struct {
	at    int64
	watts float64
}

type seriesKey struct{ engine, model, tenant string }

type promptKey struct{ engine, tenant string }

type promptMean struct{ sum, n float64 }

func (m *promptMean) add(tokens int64) {
	m.sum += float64(tokens)
	m.n++
}

// mean is the rounded mean, false before any.
func (m *promptMean) mean() (int64, bool) {
	if m.n == 0 {
		return 0, false
	}
	return int64(m.sum/m.n + 0.5), true
}

type shareSeries struct {
	key seriesKey
	// prompts is the mean prompt of the series' engine and tenant (shared
	// by the series of its models).
	prompts                     *promptMean
	prefill, decode             float64
	prefillEnergy, decodeEnergy float64
	hasEnergy                   bool
}

func newAttributor(cfg AttributionConfig, now time.Time) *attributor {
	return &attributor{
		cfg: cfg, engines: map[string]*engineAccount{},
		pods: map[string]powerReading{}, energy: map[string]powerReading{}, series: map[seriesKey]*shareSeries{}, tenants: map[string]struct{}{},
		prompts: map[promptKey]*promptMean{},
		created: pcommon.NewTimestampFromTime(now),
	}
}

// engine returns the account of the named engine, made on first sight
// with the power of its pod if one was read.
func (a *attributor) engine(name string) *engineAccount {
	if e := a.last; e != nil && e.name == name {
		return e // most events are of the engine of the event before
	}
	if e, ok := a.engines[name]; ok {
		a.last = e
		return e
	}
	e := &engineAccount{name: name, m: attribution.NewEngine(attribution.Limits{
		StepTokens: a.cfg.StepTokens, KVTokens: a.cfg.KVCacheTokens, MaxSeqs: a.cfg.MaxNumSeqs,
		PrefillFirst: a.cfg.PrefillFirst,
	})}
	a.engines[name] = e
	a.last = e
	for pod, r := range a.pods {
		if podOf(name, pod) {
			e.m.SetPower(r.at, r.watts)
		}
	}
	return e
}

// podOf reports whether pod is the engine's pod: its name, or the host of
// its host:port (the proxy names an engine by its upstream address).
func podOf(engine, pod string) bool {
	if engine == pod {
		return true
	}
	host, _, err := net.SplitHostPort(engine)
	return err == nil && host == pod
}

// started: the session arrives on its engine (a session opened by a token
// that overtook its start arrives at its first token).
// acc is the session's account; now is the collector's time of the event.
func (a *attributor) started(s *session.Session, acc *shareAccount, now int64) {
	if !a.cfg.Enabled || !s.HasStart {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.engine(s.Engine)
	e.seenAt = now
	acc.open = true
	acc.series = a.seriesOf(s)
	prompt := s.PromptTokens
	if prompt < 0 {
		var ok bool
		if prompt, ok = acc.series.prompts.mean(); !ok {
			if prompt, ok = e.prompts.mean(); !ok {
				prompt = int64(a.cfg.DefaultPromptTokens)
			}
		}
	}
	e.m.Arrive(&acc.Share, s.StartTime, prompt)
}

// tenantOf is the session's tenant attribute ("" without one).
func (a *attributor) tenantOf(s *session.Session) string {
	for _, at := range s.Attributes() {
		if at.Key == a.cfg.TenantAttribute {
			return at.Value
		}
	}
	return ""
}

// firstToken: the session's prefill ended.
func (a *attributor) firstToken(s *session.Session, acc *shareAccount, now int64) {
	if !a.cfg.Enabled {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.engine(s.Engine)
	e.seenAt = now
	if !acc.open {
		acc.open = true
		e.m.Arrive(&acc.Share, s.FirstTokenTime, -1)
	}
	e.m.FirstToken(&acc.Share, s.FirstTokenTime)
}

// ended closes the session's account, writes its share into the end (the
// engine's own, if the end event brought one, stays) and counts it.
func (a *attributor) ended(s *session.Session, e *session.End, acc *shareAccount, now int64) {
	if !a.cfg.Enabled || !acc.open {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	sh := &acc.Share
	at := e.Time
	if at == 0 {
		// No end event (timeout, eviction): the last token is when the
		// engine last computed for it.
		at = sessionEnd(s, e)
	}
	eng := a.engine(s.Engine)
	eng.seenAt = now
	eng.m.End(sh, at, outputTokens(s, e))
	if e.Share.Source == "" {
		e.Share = session.EngineShare{
			Prefill: sh.Prefill, Decode: sh.Decode, Energy: sh.Energy, HasEnergy: sh.EnergyKnown,
			Source: session.ShareCollector,
		}
	}
	sr := acc.series
	if sr == nil {
		sr = a.seriesOf(s)
	}
	if s.PromptTokens >= 0 {
		// The counters' tenant's, so bounded as they are; and the
		// engine's, for the tenants not seen yet.
		sr.prompts.add(s.PromptTokens)
		eng.prompts.add(s.PromptTokens)
	}
	sr.prefill += e.Share.Prefill
	sr.decode += e.Share.Decode
	if sh.EnergyKnown {
		sr.hasEnergy = true
		sr.prefillEnergy += sh.PrefillEnergy
		sr.decodeEnergy += sh.Energy - sh.PrefillEnergy
	}
	*acc = shareAccount{}
}

// seriesOf is the counters' series of the session: its engine, model and
// tenant, the tenant folded into _OTHER beyond max_tenants.
func (a *attributor) seriesOf(s *session.Session) *shareSeries {
	tenant := a.tenantOf(s)
	if tenant != "" {
		if _, ok := a.tenants[tenant]; !ok {
			if len(a.tenants) >= a.cfg.MaxTenants {
				tenant = tenantOverflow
				a.tenantOverflows++
			} else {
				a.tenants[tenant] = struct{}{}
			}
		}
	}
	k := seriesKey{engine: s.Engine, model: s.Model, tenant: tenant}
	sr, ok := a.series[k]
	if !ok {
		pk := promptKey{engine: s.Engine, tenant: tenant}
		m, ok := a.prompts[pk]
		if !ok {
			m = &promptMean{}
			a.prompts[pk] = m
		}
		sr = &shareSeries{key: k, prompts: m}
		a.series[k] = sr
	}
	return sr
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
		prev, ok := a.energy[pod]
		a.energy[pod] = r
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
		a.pods[pod] = r
		for _, e := range a.engines {
			if podOf(e.name, pod) {
				e.m.SetPower(r.at, r.watts)
			}
		}
	}
}

// appendTo writes the llm.engine.time and llm.engine.energy counters
// (cumulative): each engine, model and tenant's prefill and decode, and
// each engine's idle time, up to attributionLag before now.
func (a *attributor) appendTo(sm pmetric.ScopeMetrics, now time.Time) {
	if !a.cfg.Enabled {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.engines) == 0 {
		return
	}
	ts := pcommon.NewTimestampFromTime(now)
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

	point := func(dps pmetric.NumberDataPointSlice, v float64, k seriesKey, state string) {
		dp := dps.AppendEmpty()
		dp.SetStartTimestamp(a.created)
		dp.SetTimestamp(ts)
		dp.SetDoubleValue(v)
		m := dp.Attributes()
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
		point(td.DataPoints(), sr.prefill, k, statePrefill)
		point(td.DataPoints(), sr.decode, k, stateDecode)
		if sr.hasEnergy {
			point(ed.DataPoints(), sr.prefillEnergy, k, statePrefill)
			point(ed.DataPoints(), sr.decodeEnergy, k, stateDecode)
		}
	}
	names := make([]string, 0, len(a.engines))
	for n := range a.engines {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e := a.engines[n]
		at := e.m.Latest()
		if since := now.UnixNano() - e.seenAt - attributionLag; e.seenAt != 0 && since > 0 {
			// Idle (or busy) since the latest event, on the engine's clock.
			at += since
			e.seenAt += since
		}
		tot := e.m.Totals(at)
		point(td.DataPoints(), tot.Idle, seriesKey{engine: n}, stateIdle)
		if e.m.HasPower() || tot.IdleEnergy > 0 {
			point(ed.DataPoints(), tot.IdleEnergy, seriesKey{engine: n}, stateIdle)
		}
	}
	if ed.DataPoints().Len() > 0 {
		energyM.MoveTo(sm.Metrics().AppendEmpty())
	}
}

// overflows returns the sessions counted as _OTHER so far.
func (a *attributor) overflows() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tenantOverflows
}

// putShare writes a session's share of its engine on its summary and span.
func putShare(m pcommon.Map, sh *session.EngineShare) {
	if sh.Source == "" {
		return
	}
	m.PutDouble(attrEngineTime, sh.Prefill+sh.Decode)
	m.PutDouble(attrEngineTimePrefill, sh.Prefill)
	m.PutDouble(attrEngineTimeDecode, sh.Decode)
	if sh.HasEnergy && !math.IsNaN(sh.Energy) {
		m.PutDouble(attrEnergy, sh.Energy)
	}
	m.PutStr(attrAttributionSource, sh.Source)
}
