// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/internal/earlystop"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"
)

// core is the one token_session behind the logs, metrics and traces
// instances that share a component ID. It is four parts, each with its own
// lock:
//   - sessions (sessions.go), the fold: the session table, the session
//     metrics, the held outputs (held.go) and the join of engine timings
//     (timing.go), under sessions.mu; the outputs are functions of a
//     session (outputs.go, phases.go). Token event records, ticks and span
//     batches take it; application log batches and metrics batches do not
//     (unless outputs wait for a scrape).
//   - engines (engine.go): the engine state read from the metrics, under
//     engines.mu (a read-write lock).
//   - spans (spans.go): the held spans and the verdict cache, under
//     spans.mu.
//   - the attribution (sessions.attr, attribution.go): the engines' and
//     sessions' accounts of GPU time and energy, under attr.mu.
//
// The live view (internal/live: view its state, live its server) is fed
// the ended sessions by the fold and reads the table under sessions.mu.
//
// Lock order: sessions.mu, then any of the others; engines.mu, spans.mu
// and attr.mu are leaves, never held together or while taking sessions.mu.
// Outputs are handed to the next consumers with no lock held.
type core struct {
	cfg       *Config
	set       processor.Settings
	telemetry *processorTelemetry

	sessions *sessions
	engines  *engineContext
	spans    *spanGate
	// view is the live view's state, fed by sessions, and live serves it
	// (internal/live); nil when live::endpoint is not set.
	view *live.State
	live *live.Server

	// The next consumers are set while the pipelines are built, before
	// Start, and only read afterwards.
	nextLogs    consumer.Logs
	nextMetrics consumer.Metrics
	nextTraces  consumer.Traces

	stop chan struct{}
	done sync.WaitGroup
}

func newCore(cfg *Config, set processor.Settings) (*core, error) {
	buf, err := heldspans.New(cfg.Traces)
	if err != nil {
		return nil, err
	}
	telemetry, err := newProcessorTelemetry(set)
	if err != nil {
		return nil, err
	}
	c := &core{
		cfg: cfg, set: set, telemetry: telemetry, engines: &engineContext{states: engineStates{maxInstances: cfg.Metrics.MaxEngines}},
		spans: &spanGate{buf: buf},
		stop:  make(chan struct{}),
	}
	if c.sessions, err = newSessions(cfg, telemetry, c.engines, c.spans); err != nil {
		telemetry.shutdown()
		return nil, err
	}
	if cfg.Live.Enabled() {
		c.view = live.NewState(&cfg.Live, telemetry.builder, c.sessions.withTable)
		c.sessions.live = c.view
	}
	return c, nil
}

func (c *core) setNext(logs consumer.Logs, metrics consumer.Metrics, traces consumer.Traces) error {
	s := c.sessions
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case logs != nil && c.nextLogs != nil, metrics != nil && c.nextMetrics != nil, traces != nil && c.nextTraces != nil:
		return errors.New("token_session: a component ID may appear in one pipeline per signal; give the others their own name (token_session/<name>)")
	}
	if logs != nil {
		c.nextLogs = logs
		s.toLogs = true
	}
	if metrics != nil {
		c.nextMetrics = metrics
		s.toMetrics = true
	}
	if traces != nil {
		c.nextTraces = traces
		s.toTraces = true
	}
	return nil
}

func (c *core) Start(ctx context.Context, host component.Host) error {
	if c.cfg.Live.Enabled() {
		c.live = live.NewServer(&c.cfg.Live, c.view, c.set.TelemetrySettings, c.telemetry.builder)
		if err := c.live.Start(ctx, host); err != nil {
			return err
		}
	}
	c.done.Add(1)
	go c.run() //nolint:gosec // G118: Start's context ends with Start; run stops on Shutdown
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
	if c.live != nil {
		if err := c.live.Shutdown(ctx); err != nil {
			stopErr = errors.Join(stopErr, fmt.Errorf("stopping the live view: %w", err))
		}
	}
	out, md := c.sessions.shutdown(time.Now())
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
			out, expired := c.sessions.tick(now)
			if expired > 0 {
				c.telemetry.expired(ctx, expired)
			}
			c.emit(ctx, out)
		case now := <-flush.C:
			c.emitMetrics(ctx, c.sessions.sessionMetrics(now))
		}
	}
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
// with the summaries and alerts the batch produced. A batch without token
// event records (application logs) passes without any lock.
func (c *core) consumeLogs(ctx context.Context, ld plog.Logs) error {
	if !hasTokenEvents(ld) {
		removeEmpty(ld)
		if ld.ResourceLogs().Len() == 0 {
			return nil
		}
		return c.nextLogs.ConsumeLogs(ctx, ld)
	}
	out, invalid, err := c.sessions.fold(ld, time.Now())
	if invalid > 0 {
		c.telemetry.invalidRecords(ctx, invalid)
		c.set.Logger.Debug("invalid token event record", zap.Error(err))
	}
	c.emitTraces(ctx, out.traces)
	out.logs.ResourceLogs().MoveAndAppendTo(ld.ResourceLogs())
	if ld.ResourceLogs().Len() == 0 {
		return nil
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

// hasTokenEvents reports whether ld holds a token event record.
func hasTokenEvents(ld plog.Logs) bool {
	for _, rl := range ld.ResourceLogs().All() {
		for _, sl := range rl.ScopeLogs().All() {
			for _, lr := range sl.LogRecords().All() {
				if tokenrecord.IsTokenEvent(lr) {
					return true
				}
			}
		}
	}
	return false
}

// removeEmpty removes the scopes without records and the resources without
// scopes, as folding a batch does.
func removeEmpty(ld plog.Logs) {
	ld.ResourceLogs().RemoveIf(func(rl plog.ResourceLogs) bool {
		rl.ScopeLogs().RemoveIf(func(sl plog.ScopeLogs) bool { return sl.LogRecords().Len() == 0 })
		return rl.ScopeLogs().Len() == 0
	})
}

// consumeMetrics reads the engine state from the metrics passing through
// (for the sessions' engine context) and passes them on; the session
// metrics are added on their own schedule. It takes the sessions' lock only
// when kept sessions' outputs wait, for a scrape this may be.
func (c *core) consumeMetrics(ctx context.Context, md pmetric.Metrics) error {
	now := time.Now()
	c.engines.observe(md, now.UnixNano())
	c.sessions.attr.observePower(md, now.UnixNano())
	if c.sessions.waiting.Load() > 0 {
		c.emit(ctx, c.sessions.releaseWaiting(now))
	}
	return c.nextMetrics.ConsumeMetrics(ctx, md)
}

// consumeTraces holds the spans of traces with an active session until the
// session's verdict, drops those of traces already dropped, and passes the
// others on, with the session spans and released spans ready.
func (c *core) consumeTraces(ctx context.Context, td ptrace.Traces) error {
	n, out := c.sessions.routeSpans(td, time.Now())
	c.telemetry.spans(ctx, n.held, n.dropped, n.overflow)
	c.emitLogs(ctx, out.logs)
	out.traces.ResourceSpans().MoveAndAppendTo(td.ResourceSpans())
	if td.ResourceSpans().Len() == 0 {
		return nil
	}
	return c.nextTraces.ConsumeTraces(ctx, td)
}
