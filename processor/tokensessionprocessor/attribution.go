// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"math"
	"net"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/otelcol-llm/otelcol-llm/internal/attribution"
	"github.com/otelcol-llm/otelcol-llm/internal/keyset"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// attributor is the part of the core that divides each engine's time and
// energy among its sessions: this file keeps the engines' and series'
// accounts as sessions start and end; attributionpower.go reads the GPUs'
// power from the metrics; attributioncounters.go writes the counters; its
// configuration is a section of Config (config.go). mu is a leaf: the
// sessions part calls it with its own lock held (session events), the
// metrics path alone (power).
//
// Its counters are metrics of the processor's like the session metrics,
// under the metrics section's bounds: the engine and model of a series are
// the session's under metrics::max_engines and metrics::max_models, as its
// session metrics have them (its sessionmetrics.Live), its tenant under
// attribution::max_tenants; a counter holds at most
// metrics::cardinality_limit points, the overflow point included; and
// what has had no session for metrics::forget_after is forgotten.
type attributor struct {
	cfg AttributionConfig
	// limit is metrics::cardinality_limit, forgetAfter metrics::forget_after,
	// maxEngines metrics::max_engines (0: no bound).
	limit       int
	forgetAfter int64
	maxEngines  int
	// deliverySlack is stall::delivery_slack: how long an engine may send
	// nothing before the collector's clock advances its own (events come
	// in up to about this late, and until then its latest event is its
	// time; after it, a quiet engine's steps settle and its idle time
	// grows with the collector's clock), as the freeze check takes it.
	deliverySlack int64

	mu sync.Mutex
	// engines are the engines' steps, by the engines' own names: an engine
	// beyond metrics::max_engines has its steps too (its sessions' shares
	// are its own), but held only while it has an open session.
	engines map[string]*engineAccount
	last    *engineAccount
	// held counts the engines not folded; idleEngines are those idle at
	// the last flush, idle longest last: the session metrics let a new
	// engine take the place of one idle since the last flush, and its
	// account takes the place of that one's (displaceEngine), so that the
	// accounts stay within max_engines.
	held        int
	idleEngines keyset.IdleQueue[*engineAccount]
	// pods holds the latest power reading of each pod, for engines seen
	// after it; energy the latest energy counter reading (mJ) of each pod
	// that has one.
	pods   map[string]powerReading
	energy map[string]powerReading

	series map[seriesKey]*shareSeries
	// overflow is the series beyond the cardinality limit (nil until
	// needed): otel.metric.overflow=true, with the shares of its sessions
	// and the idle time of the engines whose idle point did not fit, so
	// that the points still add up to every engine's time.
	overflow *shareSeries
	// idleSeries are the series idle at the last flush: those a new series
	// may take the place of (displaceSeries).
	idleSeries keyset.IdleQueue[*shareSeries]
	// points counts the regular points of llm.engine.time: two a series
	// (prefill, decode), one an engine's idle; at most limit-1.
	points  int
	tenants *keyset.Set
	// prompts are the mean prompt lengths by engine and tenant, learned at
	// the sessions' ends: the estimate for a session whose start did not
	// give its prompt (the proxy learns it from the usage at the end). Each
	// series points at its engine and tenant's, so that a session's end
	// looks up no map for it.
	prompts map[promptKey]*promptMean
	counts  attributionCounts
	// final collects the accounts a settlement made final, handed out
	// after mu is released (settle).
	final []*attribution.Account
	// lastFlush is the start of the flush interval under way: a series
	// made in it starts there.
	lastFlush pcommon.Timestamp
}

// attributionCounts are the attributor's totals for the self-telemetry.
type attributionCounts struct {
	// overflowed counts the sessions counted on the overflow series, and
	// the engines whose idle time went there.
	overflowed uint64
	// forgotten counts the points forgotten (series of llm.engine.time
	// and llm.engine.energy no longer sent).
	forgotten uint64
	// tenants counts the sessions whose tenant counted as _OTHER; pods the
	// power readings of pods beyond maxPods, not held.
	tenants, pods uint64
	// lateTokens counts the token events that came after their engine
	// step was settled.
	lateTokens uint64
}

type engineAccount struct {
	name string
	// host is the host of name when it is a host:port (the proxy names an
	// engine by its upstream address): its pod may be named so.
	host string
	m    *attribution.Steps
	// clockAt is the engine's time (its clock: the events') of its latest
	// session event and seenAt the collector's when it came: the steps
	// settle by the engine's clock, advanced by the collector's time
	// since (the two clocks may differ).
	clockAt, seenAt int64
	// prompts is the engine's mean prompt over all its tenants: the
	// estimate for a tenant none of whose sessions ended yet.
	prompts promptMean
	// promptTokens and promptBytes sum the prompts of its ended sessions
	// whose start gave their size and whose end their tokens: their ratio
	// is its tokenizer's tokens per byte, the estimate of a prompt that
	// gives its size only.
	promptTokens, promptBytes float64
	// open counts its sessions arrived and not counted, whose accounts
	// its steps hold: it is not forgotten while any is open.
	open     int
	activity keyset.Activity
	// folded: the engine is beyond metrics::max_engines; it has no idle
	// point and is forgotten with its last session.
	folded bool
	// idlePoint: its idle time has a point of its own; otherwise (the
	// cardinality limit) it goes to the overflow series, which has had
	// idleFolded and idleEnergyFolded of it so far.
	idlePoint                    bool
	idleFolded, idleEnergyFolded float64
	// energyPoint: its idle energy has been sent.
	energyPoint bool
	start       pcommon.Timestamp
}

// shareAccount is a session's account, kept beside it (sessionState): its
// share of the engine (its own allocation: the engine's steps point at it
// until it is final, after the session's state has gone to a next
// session), the engine it is open on, and the counters' series it will
// count in and its tenant's place under max_tenants, resolved once at its
// start (nil for a session opened by a token, which got no start: at its
// end).
type shareAccount struct {
	share  *attribution.Account
	engine *engineAccount
	series *shareSeries
	tenant *keyset.Key
	// promptBytes is the size of its prompt its start gave (the proxy's
	// measure of the request body; 0: none; at most MaxInt32, which keeps
	// the entry in its size class), to learn its engine's tokens per byte
	// from at its end.
	promptBytes int32
	open        bool
}

type seriesKey struct{ engine, model, tenant string }

type promptKey struct{ engine, tenant string }

// promptMean is a running mean; refs counts the series that point at it.
type promptMean struct {
	sum, n float64
	refs   int
}

func (m *promptMean) add(tokens int64) {
	m.sum += float64(tokens)
	m.n++
}

// mean is the rounded mean, false before any (and for none: the overflow
// series has no mean of its own).
func (m *promptMean) mean() (int64, bool) {
	if m == nil || m.n == 0 {
		return 0, false
	}
	return int64(m.sum/m.n + 0.5), true
}

type shareSeries struct {
	key seriesKey
	// prompts is the mean prompt of the series' engine and tenant (shared
	// by the series of its models); nil for the overflow series.
	prompts                     *promptMean
	prefill, decode             float64
	prefillEnergy, decodeEnergy float64
	hasEnergy                   bool
	// idle and idleEnergy are the overflow series' only: the engines'
	// idle time folded into it.
	idle, idleEnergy float64
	// open counts the sessions that will count in it: it is not forgotten
	// while any is open.
	open     int
	activity keyset.Activity
	start    pcommon.Timestamp
}

func newAttributor(cfg AttributionConfig, metrics sessionmetrics.Config, deliverySlack time.Duration, now time.Time) *attributor {
	return &attributor{
		cfg: cfg, limit: metrics.CardinalityLimit, forgetAfter: int64(metrics.ForgetAfter), maxEngines: metrics.MaxEngines,
		deliverySlack: int64(deliverySlack),
		engines:       map[string]*engineAccount{},
		pods:          map[string]powerReading{}, energy: map[string]powerReading{}, series: map[seriesKey]*shareSeries{},
		tenants: keyset.New(cfg.MaxTenants, metrics.ForgetAfter),
		prompts: map[promptKey]*promptMean{}, lastFlush: pcommon.NewTimestampFromTime(now),
	}
}

// engine returns the account of the named engine, made on first sight
// with the power of its pod if one was read; folded: the engine is beyond
// metrics::max_engines.
func (a *attributor) engine(name string, folded bool) *engineAccount {
	if e := a.last; e != nil && e.name == name {
		return e // most events are of the engine of the event before
	}
	if e, ok := a.engines[name]; ok {
		a.last = e
		return e
	}
	e := &engineAccount{name: name, folded: folded, start: a.lastFlush, m: attribution.NewSteps(attribution.StepsConfig{
		StepTokens: a.cfg.StepTokens, PrefillFirst: a.cfg.PrefillFirst,
		Join: int64(a.cfg.StepJoin), Lag: int64(a.cfg.SettleAfter),
	})}
	if host, _, err := net.SplitHostPort(name); err == nil {
		e.host = host
	}
	if !folded {
		if a.maxEngines > 0 && a.held >= a.maxEngines {
			a.displaceEngine()
		}
		a.held++
		if a.points < a.limit-1 {
			e.idlePoint = true
			a.points++
		} else {
			a.counts.overflowed++
		}
	}
	a.engines[name] = e
	a.last = e
	if r, ok := a.pods[e.host]; ok && e.host != "" {
		e.m.SetPower(r.watts)
	}
	if r, ok := a.pods[name]; ok {
		e.m.SetPower(r.watts)
	}
	return e
}

// open opens a session's account on the named engine.
func (a *attributor) open(acc *shareAccount, engine string, folded bool) *engineAccount {
	e := a.engine(engine, folded)
	e.open++
	acc.engine, acc.open, acc.share = e, true, &attribution.Account{}
	return e
}

// defaultTokensPerByte is the estimate of a prompt's tokens from its size
// before its engine taught one: English text in a BPE tokenizer.
const defaultTokensPerByte = 0.25

// promptFromBytes estimates the tokens of a prompt of size bytes, by the
// tokens per byte of the engine's ended sessions.
func (e *engineAccount) promptFromBytes(size int64) int64 {
	perByte := defaultTokensPerByte
	if e.promptBytes > 0 {
		perByte = e.promptTokens / e.promptBytes
	}
	return int64(min(max(float64(size)*perByte+0.5, 1), attribution.MaxPromptTokens))
}

// seen notes an event of the engine at at (its clock), at collector time
// now. The engine's clock runs as the collector's: an event further ahead
// of it than slack (stall::delivery_slack) moves it no further (a sender's
// clock gone wrong), lest the steps before it settle before their tokens
// came.
func (e *engineAccount) seen(at, now, slack int64) {
	if e.seenAt != 0 {
		at = min(at, e.clockAt+max(now-e.seenAt, 0)+slack)
	}
	if at >= e.clockAt {
		e.clockAt, e.seenAt = at, now
	}
	e.activity.Touch()
}

// forgetEngine forgets an engine that has no open session.
// displaceEngine forgets the engine idle longest that is still idle (no
// session open on it, none since the last flush, which sent its idle time).
func (a *attributor) displaceEngine() {
	if e, ok := a.idleEngines.Take(func(e *engineAccount) bool {
		return a.engines[e.name] == e && e.open <= 0 && e.activity.Unused()
	}); ok {
		a.forgetEngine(e)
	}
}

func (a *attributor) forgetEngine(e *engineAccount) {
	delete(a.engines, e.name)
	if !e.folded {
		a.held--
	}
	if a.last == e {
		a.last = nil
	}
	if e.idlePoint {
		a.points--
		a.counts.forgotten++
		if e.energyPoint {
			a.counts.forgotten++
		}
	}
}

// started: the session arrives on its engine (a session opened by a token
// that overtook its start arrives at its first token). acc is the
// session's account, live its session metrics' handle (the engine and
// model it is recorded under); now is the collector's time of the event.
func (a *attributor) started(s *session.Session, acc *shareAccount, live *sessionmetrics.Live, now, promptBytes int64) {
	if !a.cfg.Enabled || !s.HasStart {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.open(acc, s.Engine, live.Engine() != s.Engine)
	e.seen(s.StartTime, now, a.deliverySlack)
	acc.tenant = a.tenants.Open(a.tenantOf(s))
	acc.series = a.seriesOf(live, acc.tenant)
	acc.series.open++
	prompt := int64(s.PromptTokens)
	acc.promptBytes = int32(min(promptBytes, math.MaxInt32))
	if prompt < 0 && promptBytes > 0 {
		prompt = e.promptFromBytes(promptBytes)
	}
	if prompt < 0 {
		var ok bool
		if prompt, ok = acc.series.prompts.mean(); !ok {
			if prompt, ok = e.prompts.mean(); !ok {
				prompt = int64(a.cfg.DefaultPromptTokens)
			}
		}
	}
	e.m.Arrive(acc.share, s.StartTime, prompt)
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

// firstToken: the session's prefill ended. A session opened by a token
// arrives now, on the engine it has so far (none: its start, which names
// it, has not come); it stays on that engine's steps to its end.
func (a *attributor) firstToken(s *session.Session, acc *shareAccount, live *sessionmetrics.Live, now int64) {
	if !a.cfg.Enabled {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := acc.engine
	if !acc.open {
		e = a.open(acc, s.Engine, live.Engine() != s.Engine)
		e.m.Arrive(acc.share, s.FirstTokenTime, -1)
	}
	e.seen(s.FirstTokenTime, now, a.deliverySlack)
	if !e.m.Token(acc.share, s.FirstTokenTime, 1) {
		a.counts.lateTokens++
	}
}

// token: n of the session's tokens at at (after its first).
func (a *attributor) token(acc *shareAccount, at, n, now int64) {
	if !acc.open {
		return
	}
	a.mu.Lock()
	acc.engine.seen(at, now, a.deliverySlack)
	if !acc.engine.m.Token(acc.share, at, n) {
		a.counts.lateTokens++
	}
	a.mu.Unlock()
}

// close ends the session's account on its engine's steps at its end, and
// writes its collector share so far into the end (the engine's own, if
// the end event brought one, stays); live is its session metrics' handle,
// with its start's dims if it came. The account then holds the series it
// counts in, for count once its share is final: the steps settle a
// while after they ended (attribution::settle_after), the engine's own
// share may come later still (shares.go), and a counter cannot be
// corrected once flushed. counted is false when there is nothing to count
// (attribution is off, or the session never arrived on an engine); final
// whether the collector's share is final already.
func (a *attributor) close(s *session.Session, e *session.End, acc *shareAccount, live *sessionmetrics.Live, now int64) (counted, final bool) {
	if !a.cfg.Enabled || !acc.open {
		return false, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	at := e.Time
	if at == 0 {
		// No end event (timeout, eviction): the last token is when the
		// engine last computed for it.
		at = s.EndedAt(e)
	}
	eng := acc.engine
	eng.seen(at, now, a.deliverySlack)
	eng.m.End(acc.share, at, int64(s.PromptTokens), s.OutputTokens(e))
	if e.Share.Source == "" {
		e.Share = collectorShare(acc.share)
	}
	if acc.series == nil {
		acc.tenant = a.tenants.Open(a.tenantOf(s))
		acc.series = a.seriesOf(live, acc.tenant)
		acc.series.open++
	}
	acc.open = false
	return true, acc.share.Final()
}

// collectorShare is the session's share as the collector's steps have it.
func collectorShare(sh *attribution.Account) session.EngineShare {
	return session.EngineShare{
		Prefill: sh.Prefill, Decode: sh.Decode, Energy: sh.Energy, HasEnergy: sh.EnergyKnown(),
		Source: session.ShareCollector,
	}
}

// settle settles, at collector time now, the steps of every engine that
// ended attribution::settle_after before its clock reads now, and hands
// each account made final to final.
func (a *attributor) settle(now int64, final func(*attribution.Account)) {
	if !a.cfg.Enabled {
		return
	}
	a.mu.Lock()
	for _, e := range a.engines {
		clock := e.clockAt
		if e.seenAt != 0 && now-e.seenAt > a.deliverySlack {
			clock += now - e.seenAt - a.deliverySlack
		}
		a.final = append(a.final, e.m.Settle(clock)...)
	}
	a.mu.Unlock()
	a.handFinal(final)
}

// settleAll settles every step of every engine (shutdown).
func (a *attributor) settleAll(final func(*attribution.Account)) {
	if !a.cfg.Enabled {
		return
	}
	a.mu.Lock()
	for _, e := range a.engines {
		a.final = append(a.final, e.m.SettleAll()...)
	}
	a.mu.Unlock()
	a.handFinal(final)
}

// handFinal hands the accounts made final to final, without mu: it counts
// them (count takes mu).
func (a *attributor) handFinal(final func(*attribution.Account)) {
	for i, acct := range a.final {
		final(acct)
		a.final[i] = nil
	}
	a.final = a.final[:0]
}

// count counts a closed account (close) with share, the session's final
// one, in its series; promptTokens is the session's prompt (-1: unknown).
// Until then its series, tenant and engine stay held, as for an open
// session. It empties the account.
func (a *attributor) count(acc *shareAccount, promptTokens int64, share *session.EngineShare) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sr, eng := acc.series, acc.engine
	if promptTokens >= 0 {
		// The counters' tenant's, so bounded as they are; and the
		// engine's, for the tenants not seen yet.
		if sr.prompts != nil {
			sr.prompts.add(promptTokens)
		}
		eng.prompts.add(promptTokens)
		if acc.promptBytes > 0 {
			eng.promptTokens += float64(promptTokens)
			eng.promptBytes += float64(acc.promptBytes)
		}
	}
	sr.prefill += share.Prefill
	sr.decode += share.Decode
	switch sh := acc.share; {
	case share.Source == session.ShareEngine && share.HasEnergy:
		// The engine's own, split between the phases as its time is.
		sr.hasEnergy = true
		prefill := 0.0
		if t := share.Prefill + share.Decode; t > 0 {
			prefill = share.Energy * share.Prefill / t
		}
		sr.prefillEnergy += prefill
		sr.decodeEnergy += share.Energy - prefill
	case sh.EnergyKnown():
		sr.hasEnergy = true
		sr.prefillEnergy += sh.PrefillEnergy
		sr.decodeEnergy += sh.Energy - sh.PrefillEnergy
	}
	sr.open--
	sr.activity.Touch()
	if sr == a.overflow {
		a.counts.overflowed++
	}
	acc.tenant.Close()
	if eng.open--; eng.open <= 0 && eng.folded {
		a.forgetEngine(eng)
	}
	*acc = shareAccount{}
}

// seriesOf is the counters' series of a session recorded under live's
// engine and model, of tenant: made on first sight while the cardinality
// limit has room, else the overflow series.
func (a *attributor) seriesOf(live *sessionmetrics.Live, tenant *keyset.Key) *shareSeries {
	k := seriesKey{engine: live.Engine(), model: live.Model(), tenant: tenant.Name()}
	if sr, ok := a.series[k]; ok {
		return sr
	}
	if a.points+2 > a.limit-1 && !a.displaceSeries() {
		return a.overflowSeries()
	}
	pk := promptKey{engine: k.engine, tenant: k.tenant}
	m, ok := a.prompts[pk]
	if !ok {
		m = &promptMean{}
		a.prompts[pk] = m
	}
	m.refs++
	sr := &shareSeries{key: k, prompts: m, start: a.lastFlush}
	a.series[k] = sr
	a.points += 2
	return sr
}

// dropSeries forgets a series: its points are no longer sent.
func (a *attributor) dropSeries(sr *shareSeries) {
	delete(a.series, sr.key)
	a.points -= 2
	a.counts.forgotten += 2
	if sr.hasEnergy {
		a.counts.forgotten += 2
	}
	if sr.prompts.refs--; sr.prompts.refs <= 0 {
		delete(a.prompts, promptKey{engine: sr.key.engine, tenant: sr.key.tenant})
	}
}

// displaceSeries forgets the series idle longest that is still idle (no
// session open on it, none ended in it since the last flush, which sent
// its totals), to make room for a new one at the cardinality limit, as the
// session metrics do; false when none is.
func (a *attributor) displaceSeries() bool {
	sr, ok := a.idleSeries.Take(func(sr *shareSeries) bool {
		return a.series[sr.key] == sr && sr.open <= 0 && sr.activity.Unused()
	})
	if ok {
		a.dropSeries(sr)
	}
	return ok
}

func (a *attributor) overflowSeries() *shareSeries {
	if a.overflow == nil {
		a.overflow = &shareSeries{start: a.lastFlush}
	}
	return a.overflow
}

// forget forgets, at collector time now, the series, engines, tenants and
// pods' readings that have had no session (no reading) for forget_after:
// their points are no longer sent. A series or an engine with an open
// session is kept. The series go first: each session's end uses its
// engine and tenant as well, so neither outlives its series.
func (a *attributor) forget(now int64) {
	after := a.forgetAfter
	a.idleSeries.Reset()
	for _, sr := range a.series {
		switch {
		case sr.open > 0:
		case sr.activity.Idle(now, after):
			a.dropSeries(sr)
		case sr.activity.Unused():
			a.idleSeries.Add(sr)
		}
	}
	a.idleSeries.Sort(func(sr *shareSeries) int64 { return sr.activity.UnusedSince() })
	if o := a.overflow; o != nil && o.activity.Idle(now, after) && o.open <= 0 {
		a.overflow = nil
		a.counts.forgotten++
		if o.hasEnergy || o.idleEnergy > 0 {
			a.counts.forgotten++
		}
	}
	a.idleEngines.Reset()
	for _, e := range a.engines {
		switch {
		case e.open > 0:
		case e.activity.Idle(now, after):
			a.forgetEngine(e)
		case !e.folded && e.activity.Unused():
			a.idleEngines.Add(e)
		}
	}
	a.idleEngines.Sort(func(e *engineAccount) int64 { return e.activity.UnusedSince() })
	a.tenants.Sweep(now)
	if after > 0 {
		for _, m := range []map[string]powerReading{a.pods, a.energy} {
			for pod, r := range m {
				if now-r.seen >= after {
					delete(m, pod)
				}
			}
		}
	}
}

// observePower reads the GPUs' power (power_metric) from a metrics batch
// (attributionpower.go) and sets it on the engines of their pods.
func (a *attributor) observePower(md pmetric.Metrics, now int64) {
	if !a.cfg.Enabled || (a.cfg.PowerMetric == "" && a.cfg.EnergyMetric == "") {
		return
	}
	byPod, energyByPod := readPower(md, &a.cfg, now)
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
			e.m.SetPower(r.watts)
		}
		if r, ok := byPod[e.name]; ok {
			e.m.SetPower(r.watts)
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
