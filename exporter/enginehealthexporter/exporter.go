// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

import (
	"context"
	"errors"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/internal/exphist"
	"github.com/otelcol-llm/otelcol-llm/internal/httpserve"
	"github.com/otelcol-llm/otelcol-llm/internal/keyset"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
)

// What the exporter reads: token_session's session metrics and stall alerts.
const (
	metricSessions = sessionmetrics.MetricSessions
	metricStalls   = sessionmetrics.MetricStalls
	metricTTFT     = sessionmetrics.MetricTimeToFirstToken
	metricActive   = sessionmetrics.MetricActiveSessions
	eventStall     = tokenrecord.EventNameStall

	attrEngine    = tokenrecord.AttrEngine
	attrOutcome   = sessionmetrics.AttrOutcome
	attrErrorType = tokenrecord.AttrErrorType
	attrSessionID = tokenrecord.AttrSessionID
)

// engineHealth is the one judge behind the metrics and logs exporters of a
// component ID, with the endpoints that serve its verdicts.
type engineHealth struct {
	cfg *Config
	set exporter.Settings
	tel *metadata.TelemetryBuilder
	now func() time.Time
	// started is when this exporter was made (see historyBefore).
	started time.Time
	// lastSessions is when the last batch with llm.sessions came, and
	// flushWarned when the warning that they come too seldom was last
	// logged (see checkFlushInterval).
	lastSessions, flushWarned time.Time

	mu    sync.Mutex
	judge *judge
	// series are the last points of cumulative series, by metric, engine
	// and attributes: a delta is the point minus the last one.
	series *seriesTable
	// ejected is read by the engines_ejected gauge.
	ejected int
	// verdicts is the judge's last word, for the endpoints.
	verdicts atomic.Pointer[verdicts]

	http     *httpserve.Server
	agent    *agentServer
	stop     chan struct{}
	stopOnce sync.Once
	done     sync.WaitGroup
}

func newEngineHealth(cfg *Config, set exporter.Settings) (*engineHealth, error) {
	tel, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	h := &engineHealth{
		cfg: cfg, set: set, tel: tel, now: time.Now, started: time.Now(), judge: newJudge(cfg.judgeConfig()),
		series: newSeriesTable(), stop: make(chan struct{}),
	}
	h.verdicts.Store(newVerdicts(h.judge.statuses()))
	err = tel.RegisterExporterEngineHealthEnginesEjectedCallback(func(_ context.Context, o metric.Int64Observer) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		o.Observe(int64(h.ejected))
		return nil
	})
	if err != nil {
		tel.Shutdown()
		return nil, err
	}
	return h, nil
}

func (h *engineHealth) Start(ctx context.Context, host component.Host) error {
	h.http = &httpserve.Server{}
	if err := h.http.Serve(ctx, &h.cfg.ServerConfig, h.endpoints().handler(), host, h.set.TelemetrySettings, nil); err != nil {
		return err
	}
	if a := h.cfg.Agent.Get(); h.cfg.Agent.HasValue() && a != nil {
		h.agent = &agentServer{verdicts: h.verdicts.Load, logger: h.set.Logger, tel: h.tel}
		if err := h.agent.serve(a.Endpoint); err != nil {
			return errors.Join(err, h.http.Shutdown(ctx))
		}
	}
	// Re-admissions come with time, not with data: the judge looks every
	// second too.
	h.done.Add(1)
	go func() {
		defer h.done.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-tick.C:
				h.evaluate()
			}
		}
	}()
	return nil
}

// endpoints serve the verdicts h stores, by h's clock (read at each
// request: tests set it).
func (h *engineHealth) endpoints() endpoints {
	return endpoints{verdicts: h.verdicts.Load, now: func() time.Time { return h.now() }}
}

func (h *engineHealth) Shutdown(ctx context.Context) error {
	h.stopOnce.Do(func() { close(h.stop) })
	h.done.Wait()
	var errs []error
	if h.agent != nil {
		errs = append(errs, h.agent.shutdown())
	}
	if h.http != nil && h.http.HTTP != nil {
		errs = append(errs, h.http.Shutdown(ctx))
	}
	h.tel.Shutdown()
	return errors.Join(errs...)
}

// evaluate runs the judge and counts what changed.
func (h *engineHealth) evaluate() {
	h.mu.Lock()
	now := h.now()
	changes := h.judge.evaluate(now)
	// Series of engines (or models) gone as long as a forgotten engine.
	h.series.forgetIdle(now, h.judge.forgetAfter())
	h.ejected = h.judge.ejectedCount()
	h.verdicts.Store(newVerdicts(h.judge.statuses()))
	engines, series := h.judge.forgotten, h.series.forgotten
	h.judge.forgotten, h.series.forgotten = forgottenCounts{}, forgottenCounts{}
	h.mu.Unlock()
	ctx := context.Background()
	h.countForgotten(ctx, "engine", engines)
	h.countForgotten(ctx, "series", series)
	for _, c := range changes {
		if c.state == stateEjected {
			h.tel.ExporterEngineHealthEjections.Add(ctx, 1, metric.WithAttributes(
				attribute.String("engine", c.engine), attribute.String("reason", c.reason)))
			h.set.Logger.Info("engine ejected", zap.String("engine", c.engine), zap.String("reason", c.reason))
		} else {
			h.tel.ExporterEngineHealthReadmissions.Add(ctx, 1, metric.WithAttributes(attribute.String("engine", c.engine)))
			h.set.Logger.Info("engine re-admitted", zap.String("engine", c.engine))
		}
	}
}

// countForgotten counts the engines or series forgotten, by why.
func (h *engineHealth) countForgotten(ctx context.Context, kind string, n forgottenCounts) {
	for why, c := range map[string]int{"idle": n.idle, "overflow": n.overflow} {
		if c > 0 {
			h.tel.ExporterEngineHealthForgotten.Add(ctx, int64(c), metric.WithAttributes(
				attribute.String("kind", kind), attribute.String("why", why)))
		}
	}
}

// ignored counts items that could not be judged.
func (h *engineHealth) ignored(why string, n int) {
	if n > 0 {
		h.tel.ExporterEngineHealthIgnored.Add(context.Background(), int64(n), metric.WithAttributes(attribute.String("why", why)))
	}
}

// engineSample gathers what one batch says of one engine.
type engineSample struct {
	sessions, errors, saturated, rejected, stalls, active float64
	ttft                                                  []bucket
	reset                                                 bool
}

// sessionEnd is what a session's end says of its engine.
type sessionEnd uint8

const (
	endServed    sessionEnd = iota // completed, or ended by the client or the collector
	endFault                       // the engine's fault
	endSaturated                   // refused for load (429)
	endRejected                    // the request's fault (another answer under 500)
)

// classifyEnd reads a session's llm.session.outcome and error.type. Only
// the engine's faults count against it: a timeout (the session went silent),
// and an error whose type is not an HTTP status under 500. The proxy names
// an upstream's non-200 answer by its status ("503", "429", "404"), and an
// engine's error inside a 200 stream, an upstream that times out or resets
// by a name ("engine_error", "upstream_timeout", "upstream_stream_broken",
// "engine_stalled" when its stall breaker cut the stream, the error
// object's type); a hook names an engine's exception by its class.
// An error type of three digits is an HTTP status: 5xx is the engine's
// fault, 429 a refusal for load, any other the request's (an unknown model,
// a prompt too long), which a client could otherwise send to take every
// engine out.
func classifyEnd(outcome, errorType string) sessionEnd {
	switch outcome {
	case "timeout":
		return endFault
	case "error":
	default:
		return endServed
	}
	code, ok := httpStatus(errorType)
	switch {
	case !ok || code >= 500:
		return endFault
	case code == http.StatusTooManyRequests:
		return endSaturated
	default:
		return endRejected
	}
}

// httpStatus reads an error type that is an HTTP status code (three
// digits, 100 to 599).
func httpStatus(errorType string) (int, bool) {
	if len(errorType) != 3 {
		return 0, false
	}
	code := 0
	for _, c := range []byte(errorType) {
		if c < '0' || c > '9' {
			return 0, false
		}
		code = code*10 + int(c-'0')
	}
	return code, code >= 100 && code <= 599
}

// batchReader reads one metrics batch into a sample per engine.
type batchReader struct {
	h       *engineHealth
	now     time.Time
	samples map[string]*engineSample
	skipped skippedCounts
	// sessions: the batch has llm.sessions; flushInterval is the longest
	// interval its points cover.
	sessions      bool
	flushInterval time.Duration
}

// skippedCounts are the points or alerts not judged for their llm.engine:
// none, a name too long, or token_session's _OTHER (the sessions of engines
// beyond its metrics::max_engines, which are no one engine).
type skippedCounts struct{ noEngine, longName, overflow int }

func (c skippedCounts) count(h *engineHealth) {
	h.ignored("no_engine", c.noEngine)
	h.ignored("engine_name_too_long", c.longName)
	h.ignored("engine_overflow", c.overflow)
}

// engineOf is the normalised llm.engine of attrs; false, counted, for none,
// a name too long, or the overflow.
func engineOf(attrs pcommon.Map, skipped *skippedCounts) (string, bool) {
	v, ok := attrs.Get(attrEngine)
	if !ok {
		skipped.noEngine++
		return "", false
	}
	raw := v.AsString()
	if raw == keyset.Overflow {
		skipped.overflow++
		return "", false
	}
	name, tooLong := normalizeEngine(raw)
	switch {
	case tooLong:
		skipped.longName++
		return "", false
	case name == "":
		skipped.noEngine++
		return "", false
	}
	return name, true
}

// point is the sample of a data point's engine and what the point adds: a
// delta point its value, a cumulative one its rise since the series' last
// point (counts, when not nil, are a histogram's, turned into deltas in
// place). false for a point without llm.engine, which is counted.
func (r *batchReader) point(name string, attrs pcommon.Map, cumulative bool, start pcommon.Timestamp, value float64,
	counts *[]uint64,
) (*engineSample, float64, bool) {
	engine, ok := engineOf(attrs, &r.skipped)
	if !ok {
		return nil, 0, false
	}
	s := r.samples[engine]
	if s == nil {
		s = &engineSample{}
		r.samples[engine] = s
	}
	if cumulative {
		var reset bool
		value, reset = r.h.delta(name, attrs, start, value, counts, r.now)
		s.reset = s.reset || reset
	}
	return s, value, true
}

// consumeMetrics reads the session metrics of md into the judge's windows.
func (h *engineHealth) consumeMetrics(md pmetric.Metrics) {
	var tooMany, resets int
	h.mu.Lock()
	r := &batchReader{h: h, now: h.now(), samples: map[string]*engineSample{}}
	for _, rm := range md.ResourceMetrics().All() {
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				switch {
				case (m.Name() == metricSessions || m.Name() == metricStalls) && m.Type() == pmetric.MetricTypeSum:
					r.readCount(m)
				case m.Name() == metricActive && m.Type() == pmetric.MetricTypeGauge:
					r.readActive(m.Gauge())
				case m.Name() == metricTTFT && m.Type() == pmetric.MetricTypeHistogram:
					r.readTTFT(m.Histogram())
				case m.Name() == metricTTFT && m.Type() == pmetric.MetricTypeExponentialHistogram:
					r.readExponentialTTFT(m.ExponentialHistogram())
				}
			}
		}
	}
	if r.sessions {
		h.lastSessions = r.now
	}
	warn := h.checkFlushInterval(r.flushInterval, r.now)
	names := make([]string, 0, len(r.samples))
	for name := range r.samples {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s := r.samples[name]
		if s.reset {
			h.judge.reset(name)
			resets++
		}
		if !h.judge.add(name, sample{
			at: r.now, sessions: s.sessions, errors: s.errors, saturated: s.saturated,
			rejected: s.rejected, stalls: s.stalls, active: s.active, ttft: s.ttft,
		}) {
			tooMany++
		}
	}
	h.mu.Unlock()
	r.skipped.count(h)
	h.ignored("too_many_engines", tooMany)
	if warn {
		h.set.Logger.Warn("session metrics come too seldom for the window: each flush must be well inside it, "+
			"or the window is empty between flushes and the verdicts and gauges flap; set token_session's "+
			"metrics::flush_interval to at most half of engine_health's window",
			zap.Duration("flush_interval_seen", r.flushInterval), zap.Duration("window", h.cfg.Window))
	}
	if resets > 0 {
		h.tel.ExporterEngineHealthWindowResets.Add(context.Background(), int64(resets))
	}
	h.evaluate()
}

// readCount reads llm.sessions (by outcome) or llm.session.stalls.
func (r *batchReader) readCount(m pmetric.Metric) {
	cumulative := m.Sum().AggregationTemporality() == pmetric.AggregationTemporalityCumulative
	if m.Name() == metricSessions && m.Sum().DataPoints().Len() > 0 {
		// The interval the points cover: a delta point's own, the time
		// since the last batch for cumulative ones (re-sent at each flush).
		if dp := m.Sum().DataPoints().At(0); !cumulative {
			r.flushInterval = max(r.flushInterval, dp.Timestamp().AsTime().Sub(dp.StartTimestamp().AsTime()))
		} else if !r.h.lastSessions.IsZero() {
			r.flushInterval = max(r.flushInterval, r.now.Sub(r.h.lastSessions))
		}
		r.sessions = true
	}
	for _, dp := range m.Sum().DataPoints().All() {
		v := dp.DoubleValue()
		if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
			v = float64(dp.IntValue())
		}
		s, v, ok := r.point(m.Name(), dp.Attributes(), cumulative, dp.StartTimestamp(), v, nil)
		switch {
		case !ok:
		case m.Name() == metricStalls:
			s.stalls += v
		default:
			s.sessions += v
			var outcome, errorType string
			if o, ok := dp.Attributes().Get(attrOutcome); ok {
				outcome = o.Str()
			}
			if e, ok := dp.Attributes().Get(attrErrorType); ok {
				errorType = e.Str()
			}
			switch classifyEnd(outcome, errorType) {
			case endFault:
				s.errors += v
			case endSaturated:
				s.saturated += v
			case endRejected:
				s.rejected += v
			}
		}
	}
}

// readActive reads llm.sessions.active: an engine with sessions in flight
// carries traffic, though none of them ended in the window.
func (r *batchReader) readActive(g pmetric.Gauge) {
	for _, dp := range g.DataPoints().All() {
		v := dp.DoubleValue()
		if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
			v = float64(dp.IntValue())
		}
		if s, v, ok := r.point(metricActive, dp.Attributes(), false, 0, v, nil); ok {
			s.active += v
		}
	}
}

// readTTFT reads an explicit TTFT histogram as buckets.
func (r *batchReader) readTTFT(h pmetric.Histogram) {
	cumulative := h.AggregationTemporality() == pmetric.AggregationTemporalityCumulative
	for _, dp := range h.DataPoints().All() {
		counts := dp.BucketCounts().AsRaw()
		s, _, ok := r.point(metricTTFT, dp.Attributes(), cumulative, dp.StartTimestamp(), 0, &counts)
		if !ok {
			continue
		}
		bounds := dp.ExplicitBounds().AsRaw()
		for i, c := range counts {
			if c == 0 {
				continue
			}
			// TTFTs are not negative: the first bucket starts at 0.
			lower, upper := 0.0, math.Inf(1)
			if i > 0 && i-1 < len(bounds) {
				lower = bounds[i-1]
			}
			if i < len(bounds) {
				upper = bounds[i]
			}
			s.ttft = append(s.ttft, bucket{lower: lower, upper: upper, count: c})
		}
	}
}

// readExponentialTTFT reads an exponential TTFT histogram as buckets.
func (r *batchReader) readExponentialTTFT(h pmetric.ExponentialHistogram) {
	cumulative := h.AggregationTemporality() == pmetric.AggregationTemporalityCumulative
	for _, dp := range h.DataPoints().All() {
		hist := exphist.Of(dp)
		// The zero bucket first, then the positive ones: one list of counts.
		counts := append([]uint64{hist.ZeroCount}, hist.Counts...)
		s, _, ok := r.point(metricTTFT, dp.Attributes(), cumulative, dp.StartTimestamp(), 0, &counts)
		if !ok {
			continue
		}
		for i, c := range counts {
			if c == 0 {
				continue
			}
			// Positive bucket k is counts[k-offset+1].
			lower, upper := 0.0, 0.0
			if i > 0 {
				lower, upper = exphist.Bounds(hist.Scale, hist.Offset+int32(i)-1)
			}
			s.ttft = append(s.ttft, bucket{lower: lower, upper: upper, count: c})
		}
	}
}

// delta turns a cumulative point into what it adds since the series' last
// point (seriesTable.delta).
func (h *engineHealth) delta(name string, attrs pcommon.Map, start pcommon.Timestamp, value float64, counts *[]uint64,
	now time.Time,
) (float64, bool) {
	return h.series.delta(seriesKey(name, attrs), start, value, counts, now, h.historyBefore(now))
}

// flushWarnEvery is how often, at most, the flush interval warning is
// logged.
const flushWarnEvery = 10 * time.Minute

// checkFlushInterval reports whether to warn that the session metrics
// cover intervals longer than half the window (a flush every 15 s against
// a 10 s window left it empty for 5 s of every 15, and the llm-d router's
// gauges flapping); at most once every flushWarnEvery. Called under h.mu.
func (h *engineHealth) checkFlushInterval(seen time.Duration, now time.Time) bool {
	if seen <= h.cfg.Window/2 || (!h.flushWarned.IsZero() && now.Sub(h.flushWarned) < flushWarnEvery) {
		return false
	}
	h.flushWarned = now
	return true
}

// historyBefore is the start before which a cumulative series' first point
// is history, not the window's: a series that started before the window
// counted sessions this exporter cannot place in it. While this exporter is
// young (no series can have been forgotten yet), a series that started
// within a window of this exporter's own start is the collector's beside it
// starting with it: its first flush counts whole, or a restart would throw
// the first flush of every engine away.
func (h *engineHealth) historyBefore(now time.Time) time.Time {
	from := now.Add(-h.cfg.Window)
	if young := h.started.Add(-h.cfg.Window); now.Sub(h.started) < h.judge.forgetAfter() && young.Before(from) {
		return young
	}
	return from
}

// seriesKey names a series: the metric and its attributes, in order.
func seriesKey(name string, attrs pcommon.Map) string {
	var b strings.Builder
	b.WriteString(name)
	keys := make([]string, 0, attrs.Len())
	for k := range attrs.All() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, _ := attrs.Get(k)
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v.AsString())
	}
	return b.String()
}

// consumeLogs reads token_session's stall alerts: each names an engine's
// session that stalled, which the judge counts the moment it comes.
func (h *engineHealth) consumeLogs(ld plog.Logs) {
	now := h.now()
	var skipped skippedCounts
	var tooMany, alerts int
	h.mu.Lock()
	for _, rl := range ld.ResourceLogs().All() {
		for _, sl := range rl.ScopeLogs().All() {
			for _, lr := range sl.LogRecords().All() {
				if lr.EventName() != eventStall {
					continue
				}
				engine, ok := engineOf(lr.Attributes(), &skipped)
				if !ok {
					continue
				}
				id := "?"
				if v, ok := lr.Attributes().Get(attrSessionID); ok {
					id = v.Str()
				}
				alerts++
				if !h.judge.add(engine, sample{at: now, stalled: id}) {
					tooMany++
				}
			}
		}
	}
	h.mu.Unlock()
	skipped.count(h)
	h.ignored("too_many_engines", tooMany)
	if alerts > 0 {
		h.evaluate()
	}
}
