package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/internal/earlystop"
	"github.com/otelcol-llm/otelcol-llm/internal/heldspans"
	"github.com/otelcol-llm/otelcol-llm/internal/session"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// core is the one token_session behind the logs, metrics and traces
// instances that share a component ID. Everything stateful sits under mu;
// outputs produced while folding are collected in pending and handed to the
// next consumers after mu is released.
type core struct {
	cfg       *Config
	set       processor.Settings
	telemetry *processorTelemetry

	mu      sync.Mutex
	table   *session.Table[*sessionmetrics.Live]
	metrics *sessionmetrics.Aggregator
	held    *heldspans.Buffer
	pending outputs
	// nowTS is the collector time of the operation under way.
	nowTS    pcommon.Timestamp
	nowNanos int64
	event    tokenevent.Event
	// applyFn folds an event into the table, collecting its reports in
	// reports; bound once so that folding a record allocates nothing.
	applyFn func(*tokenevent.Event)
	reports []session.Report[*sessionmetrics.Live]
	// With pass_token_events: sampled, the token event records of each
	// active session.
	sampledRecords map[string]plog.LogRecordSlice
	// limits are the rules token event records are held to.
	limits tokenevent.Limits
	// engines is the engine state read from the metrics pipeline.
	engines engineStates
	// held are kept sessions whose outputs wait (for their engine's next
	// scrape, or for the engine's timing); timing joins the engine's own
	// timing to sessions. See timing.go.
	heldOutputs []*heldOutput
	timing      timingJoin
	counters    session.Counters // as last reported to telemetry

	nextLogs    consumer.Logs
	nextMetrics consumer.Metrics
	nextTraces  consumer.Traces

	stop chan struct{}
	done sync.WaitGroup
}

// outputs are what a locked operation produced for the pipelines.
type outputs struct {
	logs   plog.Logs
	traces ptrace.Traces
}

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

func newCore(cfg *Config, set processor.Settings) (*core, error) {
	c := &core{cfg: cfg, set: set, stop: make(chan struct{}), limits: cfg.Limits.eventLimits(), timing: newTimingJoin()}
	var err error
	if c.table, err = session.NewTable[*sessionmetrics.Live](cfg.sessionConfig(), c); err != nil {
		return nil, err
	}
	if c.metrics, err = sessionmetrics.New(cfg.Metrics, time.Now()); err != nil {
		return nil, err
	}
	if c.held, err = heldspans.New(cfg.Traces); err != nil {
		return nil, err
	}
	if c.telemetry, err = newProcessorTelemetry(set); err != nil {
		return nil, err
	}
	c.table.SetTraceMemory(c.held.KeptTrace)
	c.applyFn = func(ev *tokenevent.Event) { c.reports = c.table.Apply(ev, c.nowNanos, c.reports) }
	c.pending = newOutputs()
	if cfg.PassTokenEvents == PassSampled {
		c.sampledRecords = make(map[string]plog.LogRecordSlice)
	}
	return c, nil
}

func newOutputs() outputs { return outputs{logs: plog.NewLogs(), traces: ptrace.NewTraces()} }

func (c *core) setNext(logs consumer.Logs, metrics consumer.Metrics, traces consumer.Traces) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case logs != nil && c.nextLogs != nil, metrics != nil && c.nextMetrics != nil, traces != nil && c.nextTraces != nil:
		return errors.New("token_session: a component ID may appear in one pipeline per signal; give the others their own name (token_session/<name>)")
	}
	if logs != nil {
		c.nextLogs = logs
	}
	if metrics != nil {
		c.nextMetrics = metrics
	}
	if traces != nil {
		c.nextTraces = traces
	}
	return nil
}

func (c *core) Start(context.Context, component.Host) error {
	c.done.Add(1)
	go c.run()
	return nil
}

func (c *core) Shutdown(ctx context.Context) error {
	select {
	case <-c.stop:
		return nil
	default:
	}
	// The token_stream receivers stop first, whatever order the service
	// stops the pipelines in: the proxy's drain, and what the hooks have
	// taken, reach a processor that still folds sessions and whose
	// pipelines' exporters all still run (see earlystop).
	stopErr := earlystop.StopAll(ctx)
	if stopErr != nil {
		stopErr = fmt.Errorf("stopping the token_stream receivers before token_session: %w", stopErr)
	}
	close(c.stop)
	c.done.Wait()
	now := time.Now()
	c.mu.Lock()
	c.setNow(now)
	c.reports = c.table.Shutdown(c.nowNanos, c.reports)
	c.handleReports(nil)
	c.releaseHeld(true)
	c.held.Flush(c.pending.traces)
	out := c.takePending()
	md := c.sessionMetrics(now)
	c.mu.Unlock()
	c.emit(ctx, out)
	c.emitMetrics(ctx, md)
	c.telemetry.shutdown()
	return stopErr
}

// run checks for timeouts and freezes, and flushes the session metrics.
func (c *core) run() {
	defer c.done.Done()
	tick := time.NewTicker(c.cfg.Stall.CheckInterval)
	defer tick.Stop()
	flush := time.NewTicker(c.cfg.Metrics.FlushInterval)
	defer flush.Stop()
	ctx := context.Background()
	for {
		select {
		case <-c.stop:
			return
		case now := <-tick.C:
			c.mu.Lock()
			c.setNow(now)
			c.reports = c.table.Tick(c.nowNanos, c.reports)
			c.handleReports(nil)
			c.expireTimings()
			c.releaseHeld(false)
			if n := c.held.Expire(now, c.pending.traces); n > 0 {
				c.telemetry.expired(ctx, n)
			}
			out := c.takePending()
			c.mu.Unlock()
			c.emit(ctx, out)
		case now := <-flush.C:
			c.mu.Lock()
			md := c.sessionMetrics(now)
			c.mu.Unlock()
			c.emitMetrics(ctx, md)
		}
	}
}

func (c *core) setNow(now time.Time) {
	c.nowNanos = now.UnixNano()
	c.nowTS = pcommon.Timestamp(c.nowNanos)
}

// takePending returns the outputs collected so far and starts new ones;
// it also reports the table's disorder counters. Call with mu held.
func (c *core) takePending() outputs {
	c.telemetry.reportCounters(&c.counters, &c.table.Counters, c.table.Active(), c.held.HeldSpans(),
		c.cfg.Traces.VerdictSpans && c.nextTraces != nil)
	out := c.pending
	c.pending = newOutputs()
	return out
}

// sessionMetrics renders the session metrics, or returns an empty
// pmetric.Metrics when no metrics pipeline uses this processor. Call with
// mu held.
func (c *core) sessionMetrics(now time.Time) pmetric.Metrics {
	if c.nextMetrics == nil {
		return pmetric.Metrics{}
	}
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr(attrServiceName, c.cfg.ProviderName)
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName(metadata.ScopeName)
	c.metrics.AppendTo(sm, now)
	c.telemetry.reportOverflows(context.Background(), c.metrics.OverflowCount(), c.metrics.ModelOverflowCount())
	return md
}

// emit hands outputs produced outside a logs or traces call (timeouts,
// freezes, shutdown) to the pipelines.
func (c *core) emit(ctx context.Context, out outputs) {
	c.emitLogs(ctx, out.logs)
	c.emitTraces(ctx, out.traces)
}

// The emit functions pass what the processor made to a pipeline that uses
// it, through emitTo.

func (c *core) emitLogs(ctx context.Context, ld plog.Logs) {
	if c.nextLogs != nil {
		emitTo(ctx, c, c.nextLogs.ConsumeLogs, ld, ld.LogRecordCount(), signalLogs)
	}
}

func (c *core) emitTraces(ctx context.Context, td ptrace.Traces) {
	if c.nextTraces != nil {
		emitTo(ctx, c, c.nextTraces.ConsumeTraces, td, td.SpanCount(), signalTraces)
	}
}

func (c *core) emitMetrics(ctx context.Context, md pmetric.Metrics) {
	if c.nextMetrics != nil {
		emitTo(ctx, c, c.nextMetrics.ConsumeMetrics, md, md.DataPointCount(), signalMetrics)
	}
}

// emitTo hands n items of data to next, if there are any. A refusal is
// counted and logged, not returned: session telemetry must never block or
// fail the token stream.
func emitTo[T any](ctx context.Context, c *core, next func(context.Context, T) error, data T, n int, s signal) {
	if n == 0 {
		return
	}
	if err := next(ctx, data); err != nil {
		c.telemetry.outputFailed(ctx, s, n)
		c.set.Logger.Debug("next consumer refused session "+signalNames[s], zap.Error(err))
	}
}

// consumeLogs folds the token event records of ld and passes the rest on,
// with the summaries and alerts the batch produced.
func (c *core) consumeLogs(ctx context.Context, ld plog.Logs) error {
	now := time.Now()
	c.mu.Lock()
	c.setNow(now)
	invalid, tokenRecords := 0, 0
	ld.ResourceLogs().RemoveIf(func(rl plog.ResourceLogs) bool {
		rl.ScopeLogs().RemoveIf(func(sl plog.ScopeLogs) bool {
			sl.LogRecords().RemoveIf(func(lr plog.LogRecord) bool {
				if !tokenrecord.IsTokenEvent(lr) {
					return false
				}
				tokenRecords++
				err := tokenrecord.ReadRecord(lr, c.limits, &c.event, c.applyFn)
				c.handleReports(&lr)
				if err != nil {
					invalid++
					if invalid == 1 {
						c.set.Logger.Debug("invalid token event record", zap.Error(err))
					}
					return true
				}
				if c.sampledRecords != nil && c.table.Contains(c.event.SessionID) {
					recs, ok := c.sampledRecords[c.event.SessionID]
					if !ok {
						recs = plog.NewLogRecordSlice()
						c.sampledRecords[c.event.SessionID] = recs
					}
					lr.CopyTo(recs.AppendEmpty())
				}
				return c.cfg.PassTokenEvents != PassAll
			})
			return sl.LogRecords().Len() == 0
		})
		return rl.ScopeLogs().Len() == 0
	})
	// The last event's strings (its session ID, attributes) would live on
	// in c.event until the next batch.
	c.event.Reset()
	clear(c.event.Attributes[:cap(c.event.Attributes)])
	out := c.takePending()
	c.mu.Unlock()
	if invalid > 0 {
		c.telemetry.invalidRecords(ctx, invalid)
	}
	c.emitTraces(ctx, out.traces)
	out.logs.ResourceLogs().MoveAndAppendTo(ld.ResourceLogs())
	if ld.ResourceLogs().Len() == 0 {
		return nil
	}
	if tokenRecords == 0 {
		return c.nextLogs.ConsumeLogs(ctx, ld)
	}
	// The batch's token events are folded: an error returned now would
	// invite the sender to retry them (the hook endpoint answers 503), and
	// a retry would fold the same tokens twice. What the next consumer
	// refused is this processor's output, lost and counted as such.
	n := ld.LogRecordCount()
	if err := c.nextLogs.ConsumeLogs(ctx, ld); err != nil {
		c.telemetry.outputFailed(ctx, signalLogs, n)
		c.set.Logger.Debug("next consumer refused session logs after the token events were folded", zap.Error(err))
	}
	return nil
}

// consumeMetrics reads the engine state from the metrics passing through
// (for the sessions' engine context) and passes them on; the session
// metrics are added on their own schedule.
func (c *core) consumeMetrics(ctx context.Context, md pmetric.Metrics) error {
	now := time.Now()
	c.mu.Lock()
	c.setNow(now)
	c.engines.observe(md, c.nowNanos)
	var out outputs
	released := len(c.heldOutputs) > 0
	if released {
		c.releaseHeld(false)
		out = c.takePending()
	}
	c.mu.Unlock()
	if released {
		c.emit(ctx, out)
	}
	return c.nextMetrics.ConsumeMetrics(ctx, md)
}

// consumeTraces holds the spans of traces with an active session until the
// session's verdict, drops those of traces already dropped, and passes the
// others on, with the session spans and released spans ready.
func (c *core) consumeTraces(ctx context.Context, td ptrace.Traces) error {
	now := time.Now()
	var held, dropped, overflow int
	c.mu.Lock()
	c.setNow(now)
	td.ResourceSpans().RemoveIf(func(rs ptrace.ResourceSpans) bool {
		rs.ScopeSpans().RemoveIf(func(ss ptrace.ScopeSpans) bool {
			ss.Spans().RemoveIf(func(span ptrace.Span) bool {
				c.observeEngineSpan(span)
				id := span.TraceID()
				// A trace kept once stays kept, when it calls the model
				// again too; every kept span carries its threshold.
				keep, th, known := c.held.Verdict(id)
				if known && keep {
					heldspans.StampThreshold(span.TraceState(), th)
					return false
				}
				if active, kept, th := c.table.TraceActive(id); active {
					if kept {
						heldspans.StampThreshold(span.TraceState(), th)
						return false
					}
					if c.held.HoldMove(id, rs.Resource(), rs.SchemaUrl(), ss.Scope(), ss.SchemaUrl(), span, now) {
						held++
						return true
					}
					overflow++
					return false
				}
				if known {
					dropped++
					return true
				}
				return false
			})
			return ss.Spans().Len() == 0
		})
		return rs.ScopeSpans().Len() == 0
	})
	if len(c.heldOutputs) > 0 {
		c.releaseHeld(false) // those whose engine span just came
	}
	out := c.takePending()
	c.mu.Unlock()
	c.telemetry.spans(ctx, held, dropped, overflow)
	c.emitLogs(ctx, out.logs)
	out.traces.ResourceSpans().MoveAndAppendTo(td.ResourceSpans())
	if td.ResourceSpans().Len() == 0 {
		return nil
	}
	return c.nextTraces.ConsumeTraces(ctx, td)
}

// The session.Observer side: called by the table under mu, it keeps the
// sessions' metric state.

func (c *core) Started(s *session.Session) *sessionmetrics.Live {
	return c.metrics.SessionStarted(c.dims(s))
}

func (c *core) Restarted(s *session.Session, live *sessionmetrics.Live) *sessionmetrics.Live {
	return c.metrics.SessionRestarted(live, c.dims(s))
}

func (c *core) Gap(_ *session.Session, live *sessionmetrics.Live, g time.Duration, n int64) {
	c.metrics.ObserveGap(live, g, n)
}

// handleReports acts on what the table reported during the call just made,
// in order, then hands the reports back. folded is the token event record
// they came from, nil for a tick or shutdown: with pass_token_events:
// sampled, the end record of a kept session goes out after the records
// held for it. Call with mu held.
func (c *core) handleReports(folded *plog.LogRecord) {
	for i := range c.reports {
		r := &c.reports[i]
		switch r.Kind {
		case session.ReportStalled:
			c.stalled(r)
		case session.ReportKeptEarly:
			if kept, _ := c.held.Release(r.Session.TraceID, true, r.Trace.Threshold, c.pending.traces); kept > 0 {
				c.telemetry.releasedSpans += int64(kept)
			}
			if c.cfg.Traces.VerdictSpans && c.nextTraces != nil {
				c.appendVerdictSpan(c.pendingScopeSpans(), r.Session, r.Trace.Threshold, r.At)
			}
		case session.ReportEnded:
			c.ended(r, folded)
		}
	}
	c.reports = c.table.Release(c.reports)
}

func (c *core) stalled(r *session.Report[*sessionmetrics.Live]) {
	c.metrics.Stall(r.State)
	if c.nextLogs != nil {
		c.appendStallAlert(c.pending.records(c.cfg.ProviderName), r, c.nowTS)
	}
}

func (c *core) ended(r *session.Report[*sessionmetrics.Live], folded *plog.LogRecord) {
	s, e := r.Session, &r.End
	ttft, hasTTFT := s.TTFT()
	tpot, hasTPOT := s.TPOT(e.CompletionTokens)
	// GenAI semconv defines TTFT and TPOT for successful responses: a
	// session cut short would pull them towards its failure.
	completed := s.Outcome == session.OutcomeCompleted
	hasTTFT, hasTPOT = hasTTFT && completed, hasTPOT && completed
	res := sessionmetrics.Result{
		ErrorType: errorType(s, e), Outcome: s.Outcome.String(), Sampled: s.Keep,
		TTFT: ttft, HasTTFT: hasTTFT, TPOT: tpot, HasTPOT: hasTPOT, Duration: s.Duration(e),
		InputTokens: s.PromptTokens, HasInputTokens: s.PromptTokens >= 0,
	}
	if n := outputTokens(s, e); n >= 0 {
		res.OutputTokens, res.HasOutputTokens = n, true
	}
	c.metrics.SessionEnded(r.State, res)
	c.telemetry.sessionEnded(s.Outcome, s.Keep)
	if c.sampledRecords != nil {
		recs, ok := c.sampledRecords[s.ID]
		delete(c.sampledRecords, s.ID)
		if s.Keep && c.nextLogs != nil {
			out := c.pending.records(c.cfg.ProviderName)
			if ok {
				recs.MoveAndAppendTo(out)
			}
			// c.event is the folded record's last event: its session.
			if folded != nil && c.event.SessionID == s.ID {
				folded.CopyTo(out.AppendEmpty())
			}
		}
	}
	aw := c.joinTiming(r)
	if s.Keep && !c.hold(s, e, aw) {
		c.appendOutputs(s, e)
	}
	if r.Trace.Done {
		kept, dropped := c.held.Release(s.TraceID, r.Trace.Kept, r.Trace.Threshold, c.pending.traces)
		c.telemetry.releasedSpans += int64(kept)
		c.telemetry.droppedSpans += int64(dropped)
	}
}

// appendOutputs writes the summary and the span of a kept session.
func (c *core) appendOutputs(s *session.Session, e *session.End) {
	if c.nextLogs != nil {
		c.appendSummary(c.pending.records(c.cfg.ProviderName), s, e, c.nowTS)
	}
	if c.nextTraces != nil {
		c.appendSpan(c.pendingScopeSpans(), s, e)
	}
}

// pendingScopeSpans is where session spans go: one resource and scope of
// this processor's, ahead of any released spans.
func (c *core) pendingScopeSpans() ptrace.ScopeSpans {
	rss := c.pending.traces.ResourceSpans()
	for i := range rss.Len() {
		rs := rss.At(i)
		if v, ok := rs.Resource().Attributes().Get(attrServiceName); ok && v.Str() == c.cfg.ProviderName &&
			rs.ScopeSpans().Len() > 0 && rs.ScopeSpans().At(0).Scope().Name() == metadata.ScopeName {
			return rs.ScopeSpans().At(0)
		}
	}
	rs := rss.AppendEmpty()
	rs.Resource().Attributes().PutStr(attrServiceName, c.cfg.ProviderName)
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName(metadata.ScopeName)
	return ss
}

// dims are the metric dimensions of a session.
func (c *core) dims(s *session.Session) sessionmetrics.Dims {
	d := sessionmetrics.Dims{Operation: s.Operation, Provider: c.cfg.ProviderName, Model: s.Model, Engine: s.Engine}
	if n := len(c.cfg.Metrics.Dimensions); n > 0 {
		d.Extra = make([]string, n)
		for i, k := range c.cfg.Metrics.Dimensions {
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
