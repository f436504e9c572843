// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package sessionmetrics aggregates the metrics of the token_session processor over 100% of
// sessions: GenAI semconv latency histograms, per-token inter-token latency, token usage,
// sessions by outcome, stalls and active sessions, under a per-metric cardinality limit and
// bounds on the distinct models and engines, forgetting what has had no data for
// Config.ForgetAfter.
//
// An Aggregator is not safe for concurrent use: the caller (the session state machine and the
// processor's flush) must serialize every call, including AppendTo.
package sessionmetrics

import (
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otelcol-llm/otelcol-llm/internal/keyset"
)

// Metric names.
const (
	MetricTimeToFirstToken  = "gen_ai.server.time_to_first_token"
	MetricTimePerOutputTok  = "gen_ai.server.time_per_output_token"
	MetricRequestDuration   = "gen_ai.server.request.duration"
	MetricInterTokenLatency = "llm.session.inter_token_latency"
	MetricTokenUsage        = "llm.session.token.usage"
	MetricSessions          = "llm.sessions"
	MetricStalls            = "llm.session.stalls"
	MetricActiveSessions    = "llm.sessions.active"
	MetricQueueTime         = "llm.session.queue_time"
	MetricPrefillTime       = "llm.session.prefill_time"
)

// Dims is the identity of a series. An empty string means the attribute is absent.
type Dims struct {
	Operation string // gen_ai.operation.name
	Provider  string // gen_ai.provider.name
	Model     string // gen_ai.request.model
	ErrorType string // error.type; ignored by SessionStarted, taken from Result at the end
	Engine    string // llm.engine
	// Extra holds the values of Config.Dimensions in the same order; missing trailing values are
	// absent and values beyond len(Config.Dimensions) are ignored. The aggregator copies it.
	Extra []string
}

// Result is what SessionEnded records about a finished session.
type Result struct {
	ErrorType string // error.type on the end-of-session metrics; empty when the session did not fail
	Outcome   string // completed, error, aborted, timeout, evicted or shutdown
	Sampled   bool   // whether tail sampling kept the session

	TTFT     time.Duration
	HasTTFT  bool
	TPOT     time.Duration
	HasTPOT  bool
	Duration time.Duration // always recorded on gen_ai.server.request.duration

	InputTokens, OutputTokens       int64
	HasInputTokens, HasOutputTokens bool
}

// Live is the handle a running session holds from SessionStarted to SessionEnded. It is resolved
// once, so per-token recording is a pointer access. Sessions with the same dims may share a handle;
// it must not be used after the SessionEnded of the session that obtained it.
type Live struct {
	series *liveSeries // where live data goes: the dims' own series or the overflow series
	key    string      // encoded live dims, the prefix of the end-of-session keys
	dims   *Dims       // normalized copy, shared read-only with the end-of-session series
	// model and engine are the dims' places under MaxModels and MaxEngines, held open by the
	// sessions of the handle (nil for an absent value).
	model, engine *keyset.Key
}

// Model is the gen_ai.request.model the handle's sessions are recorded under: theirs, or
// ModelOverflow beyond MaxModels.
func (l *Live) Model() string { return l.dims.Model }

// Engine is the llm.engine the handle's sessions are recorded under: theirs, or ModelOverflow
// beyond MaxEngines.
func (l *Live) Engine() string { return l.dims.Engine }

// liveSeries holds the three metrics whose attributes are the live dims: inter-token latency,
// stalls and active sessions. They are created and dropped together, so they share one
// cardinality count, which is then exactly the per-metric count.
type liveSeries struct {
	live     Live // the handle given to sessions; live.series points back here
	start    pcommon.Timestamp
	itl      histogram
	stalls   uint64
	active   int64
	overflow bool
	// activity is its sessions' starts and ends, for ForgetAfter.
	activity keyset.Activity
	// displaced: forgotten early to make room (see displace), to be taken
	// out of the order at the next flush.
	displaced bool
	// ends caches the end-of-session series its sessions without an error
	// type ended on, so that the next one's end finds them without a map
	// lookup each (six per session, on keys of tens of bytes).
	ends endCache
}

// endCache is the end-of-session series of a live series' sessions
// without an error type, for the delta interval epoch (a series found in
// an earlier one has been dropped since); nil until looked up. sessions is
// llm.sessions' series for outcome and sampled, those of the session that
// looked it up last.
type endCache struct {
	epoch                               uint64
	ttft, tpot, duration, input, output *endSeries
	sessions                            *endSeries
	outcome                             string
	sampled                             bool
}

// endAttrs are the attributes of an end-of-session series: the live dims, error.type and the
// metric's own extras.
type endAttrs struct {
	dims      *Dims
	errorType string
	tokenType string // llm.session.token.usage only
	outcome   string // llm.sessions only
	sampled   bool   // llm.sessions only
}

// endSeries is one series of an end-of-session metric: a histogram or, for llm.sessions, a count.
type endSeries struct {
	key       string // in its endMetric's series
	attrs     endAttrs
	start     pcommon.Timestamp
	h         histogram
	n         uint64
	overflow  bool
	activity  keyset.Activity
	displaced bool
}

// endMetric is an end-of-session metric with its series in creation order, so output order is
// stable without sorting.
type endMetric struct {
	name, unit, desc string
	bounds           []float64 // nil for llm.sessions
	series           map[string]*endSeries
	order            []*endSeries
	overflow         *endSeries
	// idle are the series idle at the last flush (cumulative only): those a
	// new series may take the place of.
	idle keyset.IdleQueue[*endSeries]
}

// Aggregator accumulates session metrics between flushes. Not safe for concurrent use.
type Aggregator struct {
	cfg       Config
	lastFlush pcommon.Timestamp // New's start until the first AppendTo
	keyBuf    []byte

	live         map[string]*liveSeries
	liveOrder    []*liveSeries
	liveOverflow *liveSeries
	liveIdle     keyset.IdleQueue[*liveSeries] // as endMetric.idle

	ttft, tpot, duration, tokens, sessions endMetric
	// queue and prefill are the engine's own split of TTFT, recorded when
	// a session's engine timing is known (at its end, or later).
	queue, prefill endMetric

	overflowed uint64
	// epoch counts the delta intervals, for endCache.
	epoch uint64

	// models and engines are the values of gen_ai.request.model and llm.engine held, up to
	// MaxModels and MaxEngines.
	models, engines *keyset.Set
	// forgotten counts the series forgotten after ForgetAfter without data;
	// displaced those forgotten early, idle, to make room for a new one.
	forgotten, displaced uint64
}

// New returns an Aggregator; start is the start timestamp of the first interval.
func New(cfg Config, start time.Time) (*Aggregator, error) {
	if err := errors.Join(cfg.Validate()...); err != nil {
		return nil, err
	}
	cfg = cfg.normalized()
	cfg.Dimensions = append([]string(nil), cfg.Dimensions...)
	newMetric := func(name, unit, desc string, bounds []float64) endMetric {
		return endMetric{name: name, unit: unit, desc: desc, bounds: bounds, series: make(map[string]*endSeries)}
	}
	return &Aggregator{
		cfg:       cfg,
		lastFlush: pcommon.NewTimestampFromTime(start),
		keyBuf:    make([]byte, 0, 256),
		live:      make(map[string]*liveSeries),
		models:    keyset.New(cfg.MaxModels, cfg.ForgetAfter),
		engines:   keyset.New(cfg.MaxEngines, cfg.ForgetAfter),
		ttft: newMetric(MetricTimeToFirstToken, "s",
			"Time from the start of a streamed session to its first token with content.", ttftBounds),
		tpot: newMetric(MetricTimePerOutputTok, "s",
			"Time per output token after the first, (last token - first token) / (output tokens - 1).", tpotBounds),
		duration: newMetric(MetricRequestDuration, "s",
			"Duration of a streamed session from its start to its end.", durationBounds),
		tokens: newMetric(MetricTokenUsage, "{token}",
			"Input and output tokens per session.", tokenBounds),
		sessions: newMetric(MetricSessions, "{session}",
			"Finished sessions by outcome and sampling decision.", nil),
		queue: newMetric(MetricQueueTime, "s",
			"Time a session's request waited in the engine's queue, as the engine says.", ttftBounds),
		prefill: newMetric(MetricPrefillTime, "s",
			"Time from a session's scheduling to its first token (prefill), as the engine says.", ttftBounds),
	}, nil
}

// SessionStarted counts a session as active on the series of d (d.ErrorType is ignored) and
// returns the handle for its later calls. It allocates only when it creates a series or the
// series is over the cardinality limit.
func (a *Aggregator) SessionStarted(d Dims) *Live {
	model, engine := a.models.Open(d.Model), a.engines.Open(d.Engine)
	d.Model, d.Engine = model.Name(), engine.Name()
	key := a.appendLiveKey(a.keyBuf[:0], &d)
	a.keyBuf = key[:0]
	if s, ok := a.live[string(key)]; ok {
		s.active++
		s.activity.Touch()
		return &s.live
	}
	dims := a.cloneDims(&d)
	if len(a.live) >= a.cfg.CardinalityLimit-1 && !a.displaceLive() {
		if a.liveOverflow == nil {
			a.liveOverflow = &liveSeries{start: a.lastFlush, itl: a.newHistogram(tpotBounds), overflow: true}
		}
		a.liveOverflow.active++
		a.liveOverflow.activity.Touch()
		a.overflowed++
		return &Live{series: a.liveOverflow, key: string(key), dims: dims, model: model, engine: engine}
	}
	s := &liveSeries{start: a.lastFlush, itl: a.newHistogram(tpotBounds), active: 1}
	s.activity.Touch()
	s.live = Live{series: s, key: string(key), dims: dims, model: model, engine: engine}
	a.live[s.live.key] = s
	a.liveOrder = append(a.liveOrder, s)
	return &s.live
}

// SessionRestarted moves a session whose dims became known only now (its
// start arrived after a token) from l's series to those of d, and returns its
// new handle: it leaves the active count of l's series and joins d's. What
// was recorded under l stays there.
func (a *Aggregator) SessionRestarted(l *Live, d Dims) *Live {
	a.leave(l)
	return a.SessionStarted(d)
}

// leave takes a session off l's live series and lets go of its model and engine.
func (a *Aggregator) leave(l *Live) {
	l.series.active--
	l.series.activity.Touch()
	l.model.Close()
	l.engine.Close()
}

// ObserveGap records one observation of perTokenGap with weight tokens on
// llm.session.inter_token_latency: a chunk of n tokens after a gap g is ObserveGap(l, g/n, n),
// counted per token like SGLang. tokens < 1 records nothing; a negative gap is recorded as 0.
func (a *Aggregator) ObserveGap(l *Live, perTokenGap time.Duration, tokens int64) {
	if tokens < 1 {
		return
	}
	s := l.series
	s.itl.record(seconds(perTokenGap), uint64(tokens))
	if s.overflow {
		a.overflowed++
	}
}

// Stall adds one stall episode to llm.session.stalls.
func (a *Aggregator) Stall(l *Live) {
	s := l.series
	s.stalls++
	if s.overflow {
		a.overflowed++
	}
}

// SessionEnded takes the session off the active gauge and records the end-of-session metrics on
// the series of l's dims plus r.ErrorType. Each end-of-session metric has its own cardinality
// count, so a session whose live series overflowed may still land on regular end series.
// Negative durations and token counts are recorded as 0.
func (a *Aggregator) SessionEnded(l *Live, r Result) {
	ls := l.series
	a.leave(l)
	if ls.overflow {
		a.overflowed++
	}

	key := appendString(append(a.keyBuf[:0], l.key...), r.ErrorType)
	n := len(key)
	attrs := endAttrs{dims: l.dims, errorType: r.ErrorType}
	// The cache is the live series' own, so it serves only sessions whose
	// handle is the series' (an overflowed session's key is its own), and
	// only for no error type (the series' keys end with it).
	var c endCache
	cached := r.ErrorType == "" && !ls.overflow
	if cached && ls.ends.epoch == a.epoch {
		c = ls.ends
	}
	if r.HasTTFT {
		a.cachedEndSeries(&c.ttft, &a.ttft, key, &attrs).h.record(seconds(r.TTFT), 1)
	}
	if r.HasTPOT {
		a.cachedEndSeries(&c.tpot, &a.tpot, key, &attrs).h.record(seconds(r.TPOT), 1)
	}
	a.cachedEndSeries(&c.duration, &a.duration, key, &attrs).h.record(seconds(r.Duration), 1)
	if r.HasInputTokens {
		key = append(key[:n], 'i')
		attrs.tokenType = "input"
		a.cachedEndSeries(&c.input, &a.tokens, key, &attrs).h.record(float64(max(r.InputTokens, 0)), 1)
	}
	if r.HasOutputTokens {
		key = append(key[:n], 'o')
		attrs.tokenType = "output"
		a.cachedEndSeries(&c.output, &a.tokens, key, &attrs).h.record(float64(max(r.OutputTokens, 0)), 1)
	}
	attrs.tokenType = ""
	key = appendString(key[:n], r.Outcome)
	if r.Sampled {
		key = append(key, 1)
	} else {
		key = append(key, 0)
	}
	attrs.outcome, attrs.sampled = r.Outcome, r.Sampled
	if c.outcome != r.Outcome || c.sampled != r.Sampled {
		c.sessions, c.outcome, c.sampled = nil, r.Outcome, r.Sampled
	}
	a.cachedEndSeries(&c.sessions, &a.sessions, key, &attrs).n++
	a.keyBuf = key[:0]
	if cached {
		c.epoch = a.epoch
		ls.ends = c
	}
}

// cachedEndSeries is endSeriesFor through the cache entry *cached: the
// series found there, else the one endSeriesFor finds, kept there. The
// overflow series counts every recording, found in the cache or not.
func (a *Aggregator) cachedEndSeries(cached **endSeries, m *endMetric, key []byte, attrs *endAttrs) *endSeries {
	if s := *cached; s != nil {
		if s.overflow {
			a.overflowed++
		}
		s.activity.Touch()
		return s
	}
	s := a.endSeriesFor(m, key, attrs)
	*cached = s
	return s
}

// Timing is the engine's own split of a session's TTFT, for EngineTiming.
type Timing struct {
	Queue, Prefill       time.Duration
	HasQueue, HasPrefill bool
}

// EngineTiming records a session's engine timing on llm.session.queue_time and
// llm.session.prefill_time, on the series of l's dims plus errorType (as
// SessionEnded's end-of-session metrics). It may be called after the session's
// SessionEnded, when the timing comes later (the engine's span): it reads only
// the dims the handle names, never its live series.
func (a *Aggregator) EngineTiming(l *Live, errorType string, t Timing) {
	if !t.HasQueue && !t.HasPrefill {
		return
	}
	// The model and engine are used again, after the session's end.
	l.model.Touch()
	l.engine.Touch()
	key := appendString(append(a.keyBuf[:0], l.key...), errorType)
	attrs := endAttrs{dims: l.dims, errorType: errorType}
	if t.HasQueue {
		a.endSeriesFor(&a.queue, key, &attrs).h.record(seconds(t.Queue), 1)
	}
	if t.HasPrefill {
		a.endSeriesFor(&a.prefill, key, &attrs).h.record(seconds(t.Prefill), 1)
	}
	a.keyBuf = key[:0]
}

// OverflowCount returns how many recordings went to an overflow series since New: one per
// SessionStarted, ObserveGap, Stall and SessionEnded on an overflowed live series, plus one per
// end-of-session metric point (TTFT, TPOT, duration, each token type, session count) that
// overflowed.
func (a *Aggregator) OverflowCount() uint64 { return a.overflowed }

// ModelOverflowCount returns how many sessions were recorded with the model ModelOverflow since
// New, their own model being beyond Config.MaxModels.
func (a *Aggregator) ModelOverflowCount() uint64 { return a.models.Overflowed() }

// EngineOverflowCount returns how many sessions were recorded with the engine ModelOverflow since
// New, their own engine being beyond Config.MaxEngines.
func (a *Aggregator) EngineOverflowCount() uint64 { return a.engines.Overflowed() }

// DisplacedCount returns how many series were forgotten early, idle, to make room for a new one
// at the cardinality limit (cumulative only; a live series counts for its three metrics).
func (a *Aggregator) DisplacedCount() uint64 { return a.displaced }

// KeysDisplaced returns how many models and engines were forgotten early, idle, to make room for
// a new one at MaxModels or MaxEngines.
func (a *Aggregator) KeysDisplaced() (models, engines uint64) {
	return a.models.Displaced(), a.engines.Displaced()
}

// ForgottenCount returns how many series (one attribute set of one metric; a live series is
// three, as in SeriesCount) were forgotten since New after Config.ForgetAfter without data.
func (a *Aggregator) ForgottenCount() uint64 { return a.forgotten }

// KeyCounts returns the models and the engines held now (their overflow not counted): at most
// Config.MaxModels and Config.MaxEngines.
func (a *Aggregator) KeyCounts() (models, engines int) { return a.models.Len(), a.engines.Len() }

// SeriesCount returns the number of regular (not overflow) series held, summed over metrics, with
// the live series counted once per live metric (inter-token latency, stalls, active).
func (a *Aggregator) SeriesCount() int {
	return 3*len(a.live) + len(a.ttft.series) + len(a.tpot.series) + len(a.duration.series) +
		len(a.queue.series) + len(a.prefill.series) +
		len(a.tokens.series) + len(a.sessions.series)
}

// Under cumulative temporality a series, once made, is sent at every flush until it has been
// idle for ForgetAfter. When the cardinality limit is reached, a new series takes the place of
// one idle since the last flush (what it counted has been sent; it will no longer be, and if it
// comes back it starts from zero at a new start timestamp), the one idle longest: otherwise the
// series of engines and models gone for less than ForgetAfter (pods replaced, names made up)
// would send a new engine's sessions to the overflow series, which has no engine.

// displaceEnd forgets an idle series of m to make room; false when none is idle.
func (a *Aggregator) displaceEnd(m *endMetric) bool {
	s, ok := m.idle.Take(func(s *endSeries) bool { return s.activity.Unused() && !s.displaced })
	if ok {
		s.displaced = true
		delete(m.series, s.key)
		a.displaced++
		a.epoch++ // a live series' endCache may hold it
	}
	return ok
}

// displaceLive forgets an idle live series (no active session) to make room; false when none is.
func (a *Aggregator) displaceLive() bool {
	s, ok := a.liveIdle.Take(func(s *liveSeries) bool { return s.activity.Unused() && s.active <= 0 && !s.displaced })
	if ok {
		s.displaced = true
		delete(a.live, s.live.key)
		a.displaced += 3
	}
	return ok
}

// endSeriesFor returns the series of key in m, creating it or falling back to the overflow series.
func (a *Aggregator) endSeriesFor(m *endMetric, key []byte, attrs *endAttrs) *endSeries {
	if s, ok := m.series[string(key)]; ok {
		s.activity.Touch()
		return s
	}
	if len(m.series) >= a.cfg.CardinalityLimit-1 && !a.displaceEnd(m) {
		if m.overflow == nil {
			m.overflow = &endSeries{start: a.lastFlush, overflow: true}
			if m.bounds != nil {
				m.overflow.h = a.newHistogram(m.bounds)
			}
		}
		m.overflow.activity.Touch()
		a.overflowed++
		return m.overflow
	}
	s := &endSeries{
		attrs: endAttrs{
			dims:      attrs.dims,
			errorType: strings.Clone(attrs.errorType),
			tokenType: attrs.tokenType,
			outcome:   strings.Clone(attrs.outcome),
			sampled:   attrs.sampled,
		},
		key:   string(key),
		start: a.lastFlush,
	}
	s.activity.Touch()
	if m.bounds != nil {
		s.h = a.newHistogram(m.bounds)
	}
	m.series[s.key] = s
	m.order = append(m.order, s)
	return s
}

func (a *Aggregator) newHistogram(bounds []float64) histogram {
	if a.cfg.Histogram == Exponential {
		return newExponential(a.cfg.ExponentialMaxSize)
	}
	return newExplicit(bounds)
}

// appendLiveKey encodes the live dims, each value length-prefixed so that no two dims share a key.
func (a *Aggregator) appendLiveKey(buf []byte, d *Dims) []byte {
	buf = appendString(buf, d.Operation)
	buf = appendString(buf, d.Provider)
	buf = appendString(buf, d.Model)
	buf = appendString(buf, d.Engine)
	for i := range a.cfg.Dimensions {
		var v string
		if i < len(d.Extra) {
			v = d.Extra[i]
		}
		buf = appendString(buf, v)
	}
	return buf
}

// cloneDims copies d with Extra normalized to len(Config.Dimensions), so the series neither pins
// nor follows the caller's memory.
func (a *Aggregator) cloneDims(d *Dims) *Dims {
	c := &Dims{
		Operation: strings.Clone(d.Operation),
		Provider:  strings.Clone(d.Provider),
		Model:     d.Model,  // the key set's copy
		Engine:    d.Engine, // the key set's copy
	}
	if len(a.cfg.Dimensions) > 0 {
		c.Extra = make([]string, len(a.cfg.Dimensions))
		for i := range c.Extra {
			if i < len(d.Extra) {
				c.Extra[i] = strings.Clone(d.Extra[i])
			}
		}
	}
	return c
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

// seconds converts with one correctly rounded division, so that e.g. 1.28 s lands exactly on the
// 1.28 bucket bound (float64(sec) + float64(nsec)/1e9 can miss it by one ulp).
func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return float64(d) / 1e9
}
