// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otelcol-llm/otelcol-llm/internal/attribution"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// sessions is the part of the core that folds token events into sessions
// and makes their outputs: the session table, the session metrics, the
// token event records held for sampled sessions, the kept sessions whose
// outputs wait (timing.go) and the join of engine timings. mu guards all of
// it. Outputs made under mu are collected in pending and handed to the next
// consumers after mu is released.
//
// Under mu it takes the engine context's lock (to write a session's engine
// context) and the span gate's (to release a trace's held spans, or to
// route a span batch); never the other way round.
type sessions struct {
	cfg       *Config
	telemetry *processorTelemetry
	engines   *engineContext
	spans     *spanGate
	attr      *attributor

	// waiting is held.len(), for the metrics path, which takes mu
	// only when outputs wait (for a scrape this may be).
	waiting atomic.Int32

	mu sync.Mutex
	// toLogs, toMetrics and toTraces: the processor is in a pipeline of that
	// signal, and makes outputs for it.
	toLogs, toMetrics, toTraces bool

	table   *session.Table[sessionState]
	metrics *sessionmetrics.Aggregator
	pending outputs
	// nowTS is the collector time of the operation under way.
	nowTS    pcommon.Timestamp
	nowNanos int64
	event    tokenevent.Event
	// applyFn folds an event into the table, collecting its reports in
	// reports; bound once so that folding a record allocates nothing.
	applyFn func(*tokenevent.Event)
	// truncatedValues counts the values applyFn cut to their bound.
	truncatedValues uint64
	reports         []session.Report[sessionState]
	// shareReleased: a share event ended the wait of a held output in the
	// batch being folded (shares.go).
	shareReleased bool
	// With pass_token_events: sampled, the token event records of each
	// active session.
	sampledRecords map[string]plog.LogRecordSlice
	// limits are the rules token event records are held to.
	limits tokenevent.Limits
	// held are kept sessions whose outputs wait (for their engine's next
	// scrape, the engine's timing or its share: held.go); timing joins the
	// engine's own timing to sessions (timing.go), shares the engine's
	// share events (shares.go). writeHeld writes a held session's outputs,
	// bound once.
	held      heldOutputs
	timing    timingJoin
	shares    shareJoin
	writeHeld func(*session.Session, *session.End)
	// settledFn hands an account the engines' steps made final to the
	// share join (shares.go), bound once.
	settledFn func(*attribution.Account)
	// startPromptBytes is the prompt size of the start event being applied
	// (its llm.request.prompt_bytes), for the attribution's estimate.
	startPromptBytes int64
	counters         session.Counters // as last reported to telemetry
	// live takes the sessions that end: the live view (internal/live);
	// nil when it is off.
	live endedSink
}

// endedSink takes each session that ends, with its end, at collector time
// now; called with mu held.
type endedSink interface {
	Ended(s *session.Session, e *session.End, now int64)
}

// outputs are what a locked operation produced for the pipelines.
type outputs struct {
	logs   plog.Logs
	traces ptrace.Traces
}

func newOutputs() outputs { return outputs{logs: plog.NewLogs(), traces: ptrace.NewTraces()} }

// records is where session log records go: one resource (named, like
// those of the spans and metrics, after the provider) and this scope.
func (o *outputs) records(provider string) plog.LogRecordSlice {
	if o.logs.ResourceLogs().Len() == 0 {
		rl := o.logs.ResourceLogs().AppendEmpty()
		rl.Resource().Attributes().PutStr(attrServiceName, provider)
		sl := rl.ScopeLogs().AppendEmpty()
		sl.Scope().SetName(metadata.ScopeName)
		return sl.LogRecords()
	}
	return o.logs.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords()
}

func newSessions(cfg *Config, telemetry *processorTelemetry, engines *engineContext, spans *spanGate) (*sessions, error) {
	s := &sessions{
		cfg: cfg, telemetry: telemetry, engines: engines, spans: spans, limits: cfg.Limits.eventLimits(),
		held: heldOutputs{engines: engines}, pending: newOutputs(), attr: newAttributor(cfg.Attribution, cfg.Metrics, cfg.Stall.DeliverySlack, time.Now()),
	}
	var err error
	if s.table, err = session.NewTable[sessionState](cfg.sessionConfig(), s); err != nil {
		return nil, err
	}
	if s.metrics, err = sessionmetrics.New(cfg.Metrics, time.Now()); err != nil {
		return nil, err
	}
	s.timing = newTimingJoin(cfg.EngineTiming, s.metrics, telemetry)
	s.shares = newShareJoin(cfg.Attribution, s.attr, telemetry)
	s.writeHeld = s.appendOutputs
	s.settledFn = func(acct *attribution.Account) {
		s.shareReleased = s.shares.settled(acct) || s.shareReleased
	}
	s.table.SetTraceMemory(spans.keptTrace)
	s.applyFn = func(ev *tokenevent.Event) {
		// A record an SDK wrote went through no receiver's cut: a value
		// longer than its bound (a model name, a metric dimension) is cut
		// here, as the hooks and the proxy cut it.
		s.truncatedValues += uint64(ev.CutValues())
		if ev.Kind == tokenevent.KindShare {
			// Of no session: the table never sees it.
			s.shareReleased = s.shares.arrived(ev, s.nowNanos) || s.shareReleased
			return
		}
		if ev.Kind == tokenevent.KindStart {
			// For the Started the Apply calls: the session keeps no field
			// for it.
			s.startPromptBytes = ev.PromptBytes
		}
		s.reports = s.table.Apply(ev, s.nowNanos, s.reports)
		s.startPromptBytes = 0
	}
	if cfg.PassTokenEvents == PassSampled {
		s.sampledRecords = make(map[string]plog.LogRecordSlice)
	}
	return s, nil
}

func (p *sessions) setNow(now time.Time) {
	p.nowNanos = now.UnixNano()
	p.nowTS = pcommon.Timestamp(p.nowNanos)
}

// fold folds the token event records of ld, taking them out (unless
// pass_token_events: all), and returns the outputs they produced, with the
// count of invalid records and the first one's error.
func (p *sessions) fold(ld plog.Logs, now time.Time) (out outputs, invalid int, firstErr error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setNow(now)
	ld.ResourceLogs().RemoveIf(func(rl plog.ResourceLogs) bool {
		rl.ScopeLogs().RemoveIf(func(sl plog.ScopeLogs) bool {
			sl.LogRecords().RemoveIf(func(lr plog.LogRecord) bool {
				if !tokenrecord.IsTokenEvent(lr) {
					return false
				}
				err := tokenrecord.ReadRecord(lr, p.limits, &p.event, p.applyFn)
				batch := tokenrecord.IsTokenBatch(lr)
				if batch {
					// Of many sessions: no end in it to send after the
					// records held for its session (handleReports).
					p.handleReports(nil)
				} else {
					p.handleReports(&lr)
				}
				if err != nil {
					// A batch record's bad session entries were skipped, its
					// others folded: each skipped one counts as a record.
					var skipped *tokenrecord.EntryError
					read := errors.As(err, &skipped)
					n := 1
					if read {
						n = skipped.Skipped
					}
					if invalid += n; invalid == n {
						firstErr = err
					}
					if !read {
						return true
					}
				}
				if p.sampledRecords != nil {
					if batch {
						p.holdSampledBatch(lr)
					} else if p.table.Contains(p.event.SessionID) {
						lr.CopyTo(p.sampledOf(p.event.SessionID).AppendEmpty())
					}
				}
				return p.cfg.PassTokenEvents != PassAll
			})
			return sl.LogRecords().Len() == 0
		})
		return rl.ScopeLogs().Len() == 0
	})
	// The last event's strings (its session ID, attributes) would live on
	// in p.event until the next batch.
	p.event.Reset()
	clear(p.event.Attributes[:cap(p.event.Attributes)])
	p.settle()
	if p.shareReleased {
		p.shareReleased = false
		p.releaseHeld(false)
	}
	return p.takePending(), invalid, firstErr
}

// sampledOf returns the token event records held for the session id
// (pass_token_events: sampled).
func (p *sessions) sampledOf(id string) plog.LogRecordSlice {
	recs, ok := p.sampledRecords[id]
	if !ok {
		recs = plog.NewLogRecordSlice()
		// The ID may be part of a batch record's string: a copy keeps the
		// map from holding the whole record.
		p.sampledRecords[strings.Clone(id)] = recs
	}
	return recs
}

// holdSampledBatch holds, for each active session of the batch token
// record lr, its tokens there as a record of the session's own
// (pass_token_events: sampled): what passes on is a session's records.
func (p *sessions) holdSampledBatch(lr plog.LogRecord) {
	tokenrecord.BatchSessions(lr, p.limits, func(id, events string) {
		if p.table.Contains(id) {
			tokenrecord.AppendSessionRecord(p.sampledOf(id), lr, id, events)
		}
	})
}

// tick ends idle sessions, reports freezes, gives up on engine timings
// that did not come, releases the outputs that wait no more and the held
// spans that waited too long (expired: how many).
func (p *sessions) tick(now time.Time) (out outputs, expired int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setNow(now)
	p.reports = p.table.Tick(p.nowNanos, p.reports)
	p.handleReports(nil)
	p.timing.expire(p.nowNanos)
	p.settle()
	p.shares.expire(p.nowNanos)
	p.releaseHeld(false)
	expired = p.spans.expire(now, p.pending.traces)
	return p.takePending(), expired
}

// shutdown ends every session and releases everything held, with the last
// session metrics.
func (p *sessions) shutdown(now time.Time) (outputs, pmetric.Metrics) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setNow(now)
	p.reports = p.table.Shutdown(p.nowNanos, p.reports)
	p.handleReports(nil)
	p.attr.settleAll(p.settledFn)
	p.shares.shutdown()
	p.releaseHeld(true)
	p.spans.flush(p.pending.traces)
	return p.takePending(), p.renderMetrics(now)
}

// settle settles the engines' steps up to now (attribution::settle_after
// behind), and has the share join take the accounts made final. Call with
// mu held.
func (p *sessions) settle() { p.attr.settle(p.nowNanos, p.settledFn) }

// releaseWaiting releases the outputs that a scrape (just observed) may
// have ended the wait of.
func (p *sessions) releaseWaiting(now time.Time) outputs {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setNow(now)
	p.releaseHeld(false)
	return p.takePending()
}

// routeSpans routes a span batch through the span gate (spans.go), which
// asks this part whether a span's trace has an active session and gives it
// the engine spans' timing; then releases the outputs whose engine span
// just came.
func (p *sessions) routeSpans(td ptrace.Traces, now time.Time) (spanCounts, outputs) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setNow(now)
	n := p.spans.route(td, now, p)
	if p.held.len() > 0 {
		p.releaseHeld(false)
	}
	return n, p.takePending()
}

// withTable runs fn with mu held, on the session table: how the live view
// takes its snapshots.
func (p *sessions) withTable(fn func(live.Table)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p.table)
}

// traceActive is for the span gate: the table's view of a trace.
func (p *sessions) traceActive(id pcommon.TraceID) (active, kept bool, th sampling.Threshold) {
	return p.table.TraceActive(id)
}

// takePending returns the outputs collected so far and starts new ones;
// it also reports the table's disorder counters. Call with mu held.
func (p *sessions) takePending() outputs {
	p.telemetry.reportCounters(&p.counters, &p.table.Counters, p.table.Active(), p.spans.heldSpans(),
		p.cfg.Traces.VerdictSpans && p.toTraces)
	p.waiting.Store(int32(p.held.len()))
	out := p.pending
	p.pending = newOutputs()
	return out
}

// sessionMetrics renders the session metrics, or returns an empty
// pmetric.Metrics when no metrics pipeline uses this processor.
func (p *sessions) sessionMetrics(now time.Time) pmetric.Metrics {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.renderMetrics(now)
}

// renderMetrics renders the metrics at each flush, whether a metrics
// pipeline takes them or not: the flush is when what has had no data for
// metrics::forget_after is forgotten, and the bounds' counts reported.
func (p *sessions) renderMetrics(now time.Time) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr(attrServiceName, p.cfg.ProviderName)
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName(metadata.ScopeName)
	p.metrics.AppendTo(sm, now)
	p.attr.appendTo(sm, now)
	ac := p.attr.takeCounts()
	p.telemetry.reportBounds(context.Background(), boundCounts{
		metricOverflows: p.metrics.OverflowCount() + ac.overflowed,
		keys: [len(boundKeys)]uint64{
			keyModel: p.metrics.ModelOverflowCount(), keyEngine: p.metrics.EngineOverflowCount(),
			keyTenant: ac.tenants, keyPod: ac.pods, keyEngineInstance: p.engines.overflowed(),
		},
		forgotten:       p.metrics.ForgottenCount() + p.metrics.DisplacedCount() + ac.forgotten,
		lateTokens:      ac.lateTokens,
		truncatedValues: p.truncatedValues,
	})
	if !p.toMetrics {
		return pmetric.Metrics{}
	}
	return md
}

// sessionState is what the processor keeps beside each open session, in
// the table's entry (the table's Observer state): its metric series and
// its account of the engine's time, so that neither needs a lookup by
// session. Its size counts against 512 B per in-flight session:
// TestSessionEntrySize guards it.
type sessionState struct {
	live *sessionmetrics.Live
	acct shareAccount
}

// The session.Observer side: called by the table under mu, it keeps the
// sessions' metric state.

func (p *sessions) Started(s *session.Session, st *sessionState) {
	st.live = p.metrics.SessionStarted(p.dims(s))
	p.attr.started(s, &st.acct, st.live, p.nowNanos, p.startPromptBytes)
}

func (p *sessions) FirstToken(s *session.Session, st *sessionState) {
	p.attr.firstToken(s, &st.acct, st.live, p.nowNanos)
}

func (p *sessions) Restarted(s *session.Session, st *sessionState) {
	st.live = p.metrics.SessionRestarted(st.live, p.dims(s))
}

func (p *sessions) Gap(s *session.Session, st *sessionState, g time.Duration, n int64) {
	p.metrics.ObserveGap(st.live, g, n)
	p.attr.token(&st.acct, s.LastTokenTime, n, p.nowNanos)
}

// handleReports acts on what the table reported during the call just made,
// in order, then hands the reports back. folded is the token event record
// they came from, nil for a tick or shutdown: with pass_token_events:
// sampled, the end record of a kept session goes out after the records
// held for it. Call with mu held.
func (p *sessions) handleReports(folded *plog.LogRecord) {
	for i := range p.reports {
		r := &p.reports[i]
		switch r.Kind {
		case session.ReportStalled:
			p.stalled(r)
		case session.ReportKeptEarly:
			if kept, _ := p.spans.release(r.Session.TraceID, true, r.Trace.Threshold, p.pending.traces); kept > 0 {
				p.telemetry.releasedSpans += int64(kept)
			}
			if p.cfg.Traces.VerdictSpans && p.toTraces {
				appendVerdictSpan(p.pendingScopeSpans(), r.Session, r.Trace.Threshold, r.At)
			}
		case session.ReportEnded:
			p.ended(r, folded)
		}
	}
	p.reports = p.table.Release(p.reports)
}

func (p *sessions) stalled(r *session.Report[sessionState]) {
	p.metrics.Stall(r.State.live)
	if p.toLogs {
		appendStallAlert(p.pending.records(p.cfg.ProviderName), r, p.nowTS, p.cfg.ProviderName, p.engines)
	}
}

func (p *sessions) ended(r *session.Report[sessionState], folded *plog.LogRecord) {
	s, e := r.Session, &r.End
	ttft, hasTTFT := s.TTFT()
	tpot, hasTPOT := s.TPOT(e.CompletionTokens)
	// GenAI semconv defines TTFT and TPOT for successful responses: a
	// session cut short would pull them towards its failure.
	completed := s.Outcome == session.OutcomeCompleted
	hasTTFT, hasTPOT = hasTTFT && completed, hasTPOT && completed
	res := sessionmetrics.Result{
		ErrorType: s.ErrorType(e), Outcome: s.Outcome.String(), Sampled: s.Keep,
		TTFT: ttft, HasTTFT: hasTTFT, TPOT: tpot, HasTPOT: hasTPOT, Duration: s.Duration(e),
		InputTokens: int64(s.PromptTokens), HasInputTokens: s.PromptTokens >= 0,
	}
	if n := s.OutputTokens(e); n >= 0 {
		res.OutputTokens, res.HasOutputTokens = n, true
	}
	p.metrics.SessionEnded(r.State.live, res)
	if p.live != nil {
		p.live.Ended(s, e, p.nowNanos)
	}
	p.telemetry.sessionEnded(s.Outcome, s.Keep)
	if p.sampledRecords != nil {
		recs, ok := p.sampledRecords[s.ID]
		delete(p.sampledRecords, s.ID)
		if s.Keep && p.toLogs {
			out := p.pending.records(p.cfg.ProviderName)
			if ok {
				recs.MoveAndAppendTo(out)
			}
			// p.event is the folded record's last event: its session.
			if folded != nil && p.event.SessionID == s.ID {
				folded.CopyTo(out.AppendEmpty())
			}
		}
	}
	sw := p.shares.ended(s, e, &r.State.acct, r.State.live, p.nowNanos)
	aw := p.timing.join(s, e, r.State.live, p.toTraces, p.nowNanos)
	if s.Keep && !p.hold(s, e, aw, sw) {
		p.appendOutputs(s, e)
	}
	if r.Trace.Done {
		kept, dropped := p.spans.release(s.TraceID, r.Trace.Kept, r.Trace.Threshold, p.pending.traces)
		p.telemetry.releasedSpans += int64(kept)
		p.telemetry.droppedSpans += int64(dropped)
	}
}

// hold holds back the outputs of the kept session s while they wait
// (held.go), and reports whether it did: for its engine's next scrape, for
// its engine span, aw (the timing join's place for it, nil when it does
// not wait for one), or for its engine's share, sw (likewise). A session
// whose outputs cannot be held waits for its share no more.
func (p *sessions) hold(s *session.Session, e *session.End, aw *awaited, sw *awaitedShare) bool {
	if !p.toLogs && !p.toTraces {
		return false
	}
	var timingUntil int64
	if aw != nil {
		timingUntil = aw.until
	}
	h, full := p.held.hold(s, e, timingUntil, sw != nil, p.nowNanos)
	if full {
		p.telemetry.heldOverflow()
		if sw != nil {
			p.shares.giveUp(sw) // e holds its estimate, counted so
		}
	}
	if h == nil {
		return false
	}
	if aw != nil {
		aw.held = h
	}
	if sw != nil {
		sw.held = h
	}
	return true
}

// releaseHeld writes the outputs of the held sessions that wait no more;
// all of them with force (shutdown). Call with mu held.
func (p *sessions) releaseHeld(force bool) { p.held.release(p.nowNanos, force, p.writeHeld) }

// observeEngineSpan is for the span gate: an engine span passing through,
// whose timing the join takes. Call with mu held.
func (p *sessions) observeEngineSpan(span ptrace.Span) { p.timing.observe(span, p.nowNanos) }

// appendOutputs writes the summary and the span of a kept session, and its
// phase spans (traces::phase_spans).
func (p *sessions) appendOutputs(s *session.Session, e *session.End) {
	if p.toLogs {
		appendSummary(p.pending.records(p.cfg.ProviderName), s, e, p.nowTS, p.cfg.ProviderName, p.engines)
	}
	if p.toTraces {
		ss := p.pendingScopeSpans()
		appendSpan(ss, s, e, p.cfg.ProviderName, p.engines)
		if p.cfg.Traces.PhaseSpans {
			appendPhaseSpans(ss, s, e)
		}
	}
}

// pendingScopeSpans is where session spans go: one resource and scope of
// this processor's, ahead of any released spans.
func (p *sessions) pendingScopeSpans() ptrace.ScopeSpans {
	rss := p.pending.traces.ResourceSpans()
	for i := range rss.Len() {
		rs := rss.At(i)
		if v, ok := rs.Resource().Attributes().Get(attrServiceName); ok && v.Str() == p.cfg.ProviderName &&
			rs.ScopeSpans().Len() > 0 && rs.ScopeSpans().At(0).Scope().Name() == metadata.ScopeName {
			return rs.ScopeSpans().At(0)
		}
	}
	rs := rss.AppendEmpty()
	rs.Resource().Attributes().PutStr(attrServiceName, p.cfg.ProviderName)
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName(metadata.ScopeName)
	return ss
}

// dims are the metric dimensions of a session.
func (p *sessions) dims(s *session.Session) sessionmetrics.Dims {
	d := sessionmetrics.Dims{Operation: s.Operation, Provider: p.cfg.ProviderName, Model: s.Model, Engine: s.Engine}
	if n := len(p.cfg.Metrics.Dimensions); n > 0 {
		d.Extra = make([]string, n)
		for i, k := range p.cfg.Metrics.Dimensions {
			for _, a := range s.Attributes() {
				if a.Key == k {
					d.Extra[i] = a.Value
					break
				}
			}
		}
	}
	return d
}
