// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

import (
	"cmp"
	"container/list"
	"math"
	"slices"
	"sort"
	"time"
)

// The judge is plain Go, with time passed in: it keeps a sliding window of
// each engine's sessions and judges it healthy or ejected, with Envoy's
// outlier-detection semantics (ejection for a growing time, re-admission,
// never more than a share of the engines out at once). The exporter feeds it
// what token_session's metrics and stall alerts say, and serves its verdicts.

// Engine states.
const (
	stateHealthy = "healthy"
	stateEjected = "ejected"
)

// Reasons for an ejection: which threshold the engine reached.
const (
	reasonStallRatio     = "stall_ratio"
	reasonTTFTP99        = "ttft_p99"
	reasonErrorRatio     = "error_ratio"
	reasonSaturatedRatio = "saturated_ratio"
)

// judgeConfig is what the judge needs of the configuration.
type judgeConfig struct {
	window      time.Duration
	minSessions int
	stallRatio  float64
	ttftP99     time.Duration
	errorRatio  float64
	// saturatedRatio ejects on the share of requests refused with 429;
	// 0: never.
	saturatedRatio float64
	baseTime       time.Duration
	maxTime        time.Duration
	maxPercent     float64
	// keepLast: never eject the last engine with traffic (eject::keep_last).
	keepLast bool
	// engines are known from the start and never forgotten (engines).
	engines []string
}

// bucket is one histogram bucket: count values in (lower, upper], in
// seconds (upper is +Inf for the last explicit bucket).
type bucket struct {
	lower, upper float64
	count        uint64
}

// sample is what one metrics batch or alert added to an engine's window.
type sample struct {
	at       time.Time
	sessions float64 // sessions ended, whatever their end
	errors   float64 // of those, ended by a fault of the engine (sessionEnd)
	// saturated ended with the engine refusing them for load (429), and
	// rejected with any other answer under 500 (the request's fault): the
	// engine did not take either on.
	saturated, rejected float64
	stalls              float64 // stall episodes (llm.session.stalls)
	stalled             string  // a session a stall alert named ("" for none)
	// active are the sessions in flight at the flush (llm.sessions.active).
	active float64
	ttft   []bucket
}

// engineState is one engine's window and verdict.
type engineState struct {
	name      string
	samples   []sample
	state     string
	reason    string
	ejections int
	until     time.Time
	// pinned: named in the configuration, known from the start and never
	// forgotten.
	pinned bool
	// lastEvidence is when a sample last said something new of the engine
	// (see sample.evidence), or when it became known; lru is its place in
	// the judge's order of it.
	lastEvidence time.Time
	lru          *list.Element
	// figures as last judged
	figures windowFigures
}

// windowFigures are an engine's window, summed.
type windowFigures struct {
	// Sessions are the sessions the engine took on: those that ended, less
	// the saturated and the client errors (or the sessions stall alerts
	// named, when more). The stall and error ratios are over them.
	Sessions   float64 `json:"sessions"`
	StallRatio float64 `json:"stall_ratio"`
	ErrorRatio float64 `json:"error_ratio"`
	// Saturated are the sessions refused for load (429); SaturatedRatio
	// their share of Sessions + Saturated.
	Saturated      float64 `json:"saturated"`
	SaturatedRatio float64 `json:"saturated_ratio"`
	// ClientErrors are the sessions answered under 500, 429 aside.
	ClientErrors float64 `json:"client_errors"`
	// TTFTP99 is in seconds; NaN (null in JSON) without a TTFT in the window.
	TTFTP99 float64 `json:"-"`
	// inFlight is the most sessions in flight a flush in the window saw.
	inFlight float64
}

// traffic reports whether the engine had sessions in the window: ended,
// stalled or in flight.
func (f windowFigures) traffic() bool {
	return f.Sessions+f.Saturated+f.ClientErrors > 0 || f.inFlight > 0
}

// change is a transition the judge made.
type change struct {
	engine string
	state  string // the new state
	reason string // of an ejection
}

type judge struct {
	cfg     judgeConfig
	engines map[string]*engineState
	// byEvidence orders the engines by lastEvidence, the oldest first (those
	// known without evidence before all): the one to forget when a new
	// engine comes and maxEngines are known.
	byEvidence list.List
	// forgotten counts the engines forgotten, by why, until taken.
	forgotten forgottenCounts
}

// forgottenCounts are the engines (or series) forgotten because nothing new
// came of them for forgetAfter (idle), and those forgotten early to make
// room for a new one (overflow).
type forgottenCounts struct{ idle, overflow int }

func newJudge(cfg judgeConfig) *judge {
	j := &judge{cfg: cfg, engines: make(map[string]*engineState)}
	for _, raw := range cfg.engines {
		name, _ := normalizeEngine(raw)
		if j.engines[name] == nil {
			e := j.newEngine(name)
			e.pinned = true
			j.engines[name] = e
		}
	}
	return j
}

// newEngine is an engine's state before any sample: healthy, its window
// empty. A pinned engine has no place in byEvidence: it is never forgotten.
func (j *judge) newEngine(name string) *engineState {
	return &engineState{name: name, state: stateHealthy, figures: windowFigures{TTFTP99: math.NaN()}}
}

// maxEngines bounds the engines the judge keeps (the names come from the
// sessions' llm.engine).
const maxEngines = 1024

// evidence reports whether the sample says anything new of its engine: a
// session that ended, a stall, a session in flight, a TTFT. Under cumulative
// temporality every series is re-sent at each flush; an unchanged point
// adds a sample with nothing in it, which must not keep an engine that is
// gone known for ever.
func (s *sample) evidence() bool {
	return s.sessions != 0 || s.errors != 0 || s.saturated != 0 || s.rejected != 0 || s.stalls != 0 ||
		s.stalled != "" || s.active != 0 || len(s.ttft) != 0
}

// add records a sample for engine; it reports false when the engine could
// not be kept. An engine is known from the first sample that names it, but
// only a sample with evidence is kept in its window and keeps it known (see
// forgetAfter). A new engine with evidence when maxEngines are known takes
// the place of the engine not ejected that has had none for longest; false
// when every one is ejected. A new engine without evidence takes no place:
// it is known only when there is room, and first to go.
func (j *judge) add(name string, s sample) bool {
	evidence := s.evidence()
	e := j.engines[name]
	switch {
	case e != nil && !evidence:
		return true
	case e != nil:
		if e.lru != nil {
			j.byEvidence.MoveToBack(e.lru)
		}
	case len(j.engines) >= maxEngines && !evidence:
		return true // nothing to judge, nothing lost
	case len(j.engines) >= maxEngines && !j.forgetOldest():
		return false
	default:
		e = j.newEngine(name)
		if evidence {
			e.lru = j.byEvidence.PushBack(e)
		} else {
			e.lru = j.byEvidence.PushFront(e)
		}
		j.engines[name] = e
	}
	e.lastEvidence = s.at
	if evidence {
		e.samples = append(e.samples, s)
	}
	return true
}

// forgetOldest forgets the engine not ejected with the oldest evidence;
// false when every engine is ejected (an ejection is kept to its end).
func (j *judge) forgetOldest() bool {
	for el := j.byEvidence.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*engineState); e.state != stateEjected {
			j.forget(e)
			j.forgotten.overflow++
			return true
		}
	}
	return false
}

func (j *judge) forget(e *engineState) {
	j.byEvidence.Remove(e.lru)
	delete(j.engines, e.name)
}

// forgetAfter is how long an engine not ejected stays known without
// evidence: engines come and go (pods are replaced), and the judge keeps at
// most maxEngines. It is at least max_time, so that an engine ejected again
// soon after a re-admission still has its ejection count.
func (j *judge) forgetAfter() time.Duration {
	return max(10*j.cfg.window, j.cfg.maxTime)
}

// reset forgets an engine's window: its counters went backwards (a
// collector upstream restarted), so what came before is no base.
func (j *judge) reset(name string) {
	if e := j.engines[name]; e != nil {
		clear(e.samples)
		e.samples = e.samples[:0]
	}
}

// prune drops the samples older than the window.
func (j *judge) prune(e *engineState, now time.Time) {
	from := now.Add(-j.cfg.window)
	i := 0
	for i < len(e.samples) && !e.samples[i].at.After(from) {
		i++
	}
	if i > 0 {
		n := copy(e.samples, e.samples[i:])
		clear(e.samples[n:])
		e.samples = e.samples[:n]
	}
}

// figures sums an engine's window. The share of sessions with a stall takes
// the larger of two counts: the distinct sessions stall alerts named, and the
// stall episodes the metrics counted (a session with two episodes counts
// twice there). Sessions are those that ended and the engine took on (not
// refused for load, not the request's fault), or the alerted ones when more
// (an engine that freezes ends few sessions).
func figures(samples []sample) windowFigures {
	var f windowFigures
	var episodes float64
	alerted := map[string]struct{}{}
	hist := map[float64]bucket{} // by upper bound
	for i := range samples {
		s := &samples[i]
		f.Sessions += s.sessions - s.saturated - s.rejected
		f.ErrorRatio += s.errors
		f.Saturated += s.saturated
		f.ClientErrors += s.rejected
		f.inFlight = max(f.inFlight, s.active)
		episodes += s.stalls
		if s.stalled != "" {
			alerted[s.stalled] = struct{}{}
		}
		for _, b := range s.ttft {
			h, ok := hist[b.upper]
			if !ok {
				h = bucket{lower: b.lower, upper: b.upper}
			}
			// The same upper bound at two exponential scales: the wider.
			h.lower = min(h.lower, b.lower)
			h.count += b.count
			hist[b.upper] = h
		}
	}
	stalled := max(episodes, float64(len(alerted)))
	f.Sessions = max(f.Sessions, float64(len(alerted)))
	if f.Sessions > 0 {
		f.StallRatio = min(stalled/f.Sessions, 1)
		f.ErrorRatio /= f.Sessions
	}
	if f.Saturated > 0 {
		f.SaturatedRatio = f.Saturated / (f.Sessions + f.Saturated)
	}
	f.TTFTP99 = p99(hist)
	return f
}

// p99 is the 99th percentile of a histogram, interpolated linearly within
// its bucket as Prometheus's histogram_quantile does (the bucket's upper
// bound would read a p99 of 1.1 s as 2.5 s with the GenAI TTFT buckets, and
// eject at a 2 s threshold); the bucket's lower bound when it is the +Inf
// bucket; NaN for an empty histogram.
func p99(hist map[float64]bucket) float64 {
	var total uint64
	buckets := make([]bucket, 0, len(hist))
	for _, b := range hist {
		if b.count > 0 {
			total += b.count
			buckets = append(buckets, b)
		}
	}
	if total == 0 {
		return math.NaN()
	}
	slices.SortFunc(buckets, func(a, b bucket) int { return cmp.Compare(a.upper, b.upper) })
	rank := 0.99 * float64(total)
	var below float64 // the count of the buckets before this one
	for _, b := range buckets {
		c := float64(b.count)
		if below+c >= rank {
			if math.IsInf(b.upper, 1) {
				return b.lower
			}
			return b.lower + (b.upper-b.lower)*(rank-below)/c
		}
		below += c
	}
	return buckets[len(buckets)-1].upper
}

// breach returns the reason an engine's figures warrant an ejection and how
// far over the threshold it is (the worst reason, as a ratio to its
// threshold); "" when none holds or the window has too few sessions.
func (j *judge) breach(f windowFigures) (reason string, severity float64) {
	check := func(r string, v, th float64) {
		if th > 0 && v >= th && v/th > severity {
			reason, severity = r, v/th
		}
	}
	minSessions := max(float64(j.cfg.minSessions), 1)
	if f.Sessions >= minSessions {
		check(reasonStallRatio, f.StallRatio, j.cfg.stallRatio)
		check(reasonErrorRatio, f.ErrorRatio, j.cfg.errorRatio)
		if !math.IsNaN(f.TTFTP99) {
			check(reasonTTFTP99, f.TTFTP99, j.cfg.ttftP99.Seconds())
		}
	}
	// Refusals for load are judged on the requests the engine was asked to
	// take on, the refused included.
	if f.Sessions+f.Saturated >= minSessions {
		check(reasonSaturatedRatio, f.SaturatedRatio, j.cfg.saturatedRatio)
	}
	return reason, severity
}

// evaluate re-admits the engines whose ejection time is over and ejects
// those whose window breaches a threshold, the worst first. It never ejects
// more than max_percent of the engines in play (those with traffic in the
// window and those ejected now), nor (eject::keep_last, the default) the
// last engine with traffic still in:
// engines gone silent (pods replaced, known for minutes after) must not make
// room for ejecting every engine that carries traffic. It returns what
// changed.
func (j *judge) evaluate(now time.Time) []change {
	var changes []change
	ejected, inPlay, servingIn := 0, 0, 0
	type candidate struct {
		e        *engineState
		reason   string
		severity float64
	}
	var candidates []candidate
	for _, e := range j.engines {
		j.prune(e, now)
		if e.state == stateEjected {
			if !now.Before(e.until) {
				// Re-admitted and judged afresh, on what comes next.
				e.state, e.reason = stateHealthy, ""
				clear(e.samples)
				e.samples = e.samples[:0]
				changes = append(changes, change{engine: e.name, state: stateHealthy})
			} else {
				ejected++
				inPlay++
				e.figures = figures(e.samples)
				continue
			}
		}
		if len(e.samples) == 0 {
			if !e.pinned && now.Sub(e.lastEvidence) > j.forgetAfter() {
				j.forget(e) // gone: forgotten (deleting while ranging is safe)
				j.forgotten.idle++
				continue
			}
			e.figures = windowFigures{TTFTP99: math.NaN()}
			continue // no sessions in the window: the engine keeps its state
		}
		e.figures = figures(e.samples)
		if e.figures.traffic() {
			inPlay++
			servingIn++
		}
		if reason, severity := j.breach(e.figures); reason != "" {
			candidates = append(candidates, candidate{e, reason, severity})
		}
	}
	allowed := int(math.Floor(j.cfg.maxPercent/100*float64(inPlay))) - ejected
	if j.cfg.keepLast {
		allowed = min(allowed, servingIn-1)
	}
	sort.Slice(candidates, func(a, b int) bool {
		if candidates[a].severity != candidates[b].severity {
			return candidates[a].severity > candidates[b].severity
		}
		return candidates[a].e.name < candidates[b].e.name
	})
	for _, c := range candidates {
		if allowed <= 0 {
			break
		}
		allowed--
		e := c.e
		e.ejections++
		e.state, e.reason = stateEjected, c.reason
		e.until = now.Add(min(j.cfg.baseTime*time.Duration(e.ejections), j.cfg.maxTime))
		changes = append(changes, change{engine: e.name, state: stateEjected, reason: c.reason})
	}
	return changes
}

// engineStatus is what the endpoints serve about one engine.
type engineStatus struct {
	Engine    string        `json:"engine"`
	State     string        `json:"state"`
	Reason    string        `json:"reason,omitempty"`
	Window    windowFigures `json:"window"`
	TTFTP99S  *float64      `json:"ttft_p99_s"`
	Ejections int           `json:"ejections"`
	// TimeLeftS is the ejection time left, in seconds (0 when healthy),
	// filled in by at when the status is served.
	TimeLeftS float64 `json:"time_left_s"`
	until     time.Time
}

// at is the status as of now: the ejection time left.
func (st engineStatus) at(now time.Time) engineStatus {
	if st.State == stateEjected {
		st.TimeLeftS = max(st.until.Sub(now), 0).Seconds()
	}
	return st
}

func (j *judge) status(e *engineState) engineStatus {
	st := engineStatus{
		Engine: e.name, State: e.state, Reason: e.reason, Window: e.figures, Ejections: e.ejections,
		until: e.until,
	}
	if !math.IsNaN(e.figures.TTFTP99) && !math.IsInf(e.figures.TTFTP99, 0) {
		v := e.figures.TTFTP99
		st.TTFTP99S = &v
	}
	return st
}

// statuses lists every engine, by name.
func (j *judge) statuses() []engineStatus {
	out := make([]engineStatus, 0, len(j.engines))
	for _, e := range j.engines {
		out = append(out, j.status(e))
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Engine < out[b].Engine })
	return out
}

// ejectedCount is how many engines are ejected now.
func (j *judge) ejectedCount() int {
	n := 0
	for _, e := range j.engines {
		if e.state == stateEjected {
			n++
		}
	}
	return n
}
