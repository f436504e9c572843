package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"context"
	"errors"
	"sync/atomic"

	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/otelcol-llm/otelcol-llm/internal/session"
)

// processorTelemetry is the processor's own metrics: every session's
// outcome, every event it could not use as it came, every span it held,
// dropped or could not hold, and every output the next consumer refused.
type processorTelemetry struct {
	processorID attribute.KeyValue

	sessions       metric.Int64Counter
	disorder       metric.Int64Counter
	invalidRecords metric.Int64Counter
	heldSpans      metric.Int64Counter
	spanVerdicts   metric.Int64Counter
	expiredSpans   metric.Int64Counter
	outputFailures metric.Int64Counter
	registration   metric.Registration

	// Read by the observable gauges.
	active     atomic.Int64
	heldNow    atomic.Int64
	sessionSet [session.OutcomeShutdown + 1][2]metric.MeasurementOption

	// Accumulated under the core's lock, reported by reportCounters.
	releasedSpans int64
	droppedSpans  int64
}

func newProcessorTelemetry(set processor.Settings, c *core) (*processorTelemetry, error) {
	meter := set.MeterProvider.Meter(scopeName)
	t := &processorTelemetry{processorID: attribute.String("processor", set.ID.String())}
	for o := session.OutcomeActive; o <= session.OutcomeShutdown; o++ {
		for i, sampled := range []bool{false, true} {
			t.sessionSet[o][i] = metric.WithAttributeSet(attribute.NewSet(t.processorID,
				attribute.String("outcome", o.String()), attribute.Bool("sampled", sampled)))
		}
	}
	var errs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		ctr, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return ctr
	}
	t.sessions = counter("otelcol_processor_token_session_sessions", "Sessions ended, by outcome and sampling verdict.", "{session}")
	t.disorder = counter("otelcol_processor_token_session_disorder_events",
		"Token events that did not fit their session as they came, by kind: orphan_token (opened a session before its start), orphan_end and late (dropped), duplicate_start (ignored), out_of_order (no gap).", "{event}")
	t.invalidRecords = counter("otelcol_processor_token_session_invalid_records", "Token event records that could not be read; dropped.", "{record}")
	t.heldSpans = counter("otelcol_processor_token_session_held_spans_total", "Spans held until their session's verdict, or passed on because the hold was full (result=overflow).", "{span}")
	t.spanVerdicts = counter("otelcol_processor_token_session_span_verdicts", "Held or late spans released (verdict=keep) or dropped (verdict=drop) by their session's verdict.", "{span}")
	t.expiredSpans = counter("otelcol_processor_token_session_expired_spans", "Held spans released unsampled because their session outlasted traces::max_hold.", "{span}")
	t.outputFailures = counter("otelcol_processor_token_session_output_failures", "Session logs, spans and metric points the next consumer refused; lost.", "{item}")
	active, err := meter.Int64ObservableGauge("otelcol_processor_token_session_active_sessions", metric.WithDescription("Sessions in the table."), metric.WithUnit("{session}"))
	errs = append(errs, err)
	held, err := meter.Int64ObservableGauge("otelcol_processor_token_session_held_spans", metric.WithDescription("Spans held now."), metric.WithUnit("{span}"))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	attrs := metric.WithAttributeSet(attribute.NewSet(t.processorID))
	t.registration, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(active, t.active.Load(), attrs)
		o.ObserveInt64(held, t.heldNow.Load(), attrs)
		return nil
	}, active, held)
	return t, err
}

func (t *processorTelemetry) shutdown() error {
	if t.registration == nil {
		return nil
	}
	return t.registration.Unregister()
}

func (t *processorTelemetry) sessionEnded(o session.Outcome, sampled bool) {
	i := 0
	if sampled {
		i = 1
	}
	t.sessions.Add(context.Background(), 1, t.sessionSet[o][i])
}

// reportCounters reports what changed since the last call: the table's
// disorder counters (reported is the state last reported), the gauges and
// the span verdicts accumulated under the lock.
func (t *processorTelemetry) reportCounters(reported, now *session.Counters, active, held int) {
	ctx := context.Background()
	for _, d := range []struct {
		kind    string
		was, is uint64
	}{
		{"orphan_token", reported.OrphanTokens, now.OrphanTokens},
		{"orphan_end", reported.OrphanEnds, now.OrphanEnds},
		{"late", reported.LateEvents, now.LateEvents},
		{"duplicate_start", reported.DuplicateStarts, now.DuplicateStarts},
		{"out_of_order", reported.OutOfOrder, now.OutOfOrder},
	} {
		if d.is > d.was {
			t.disorder.Add(ctx, int64(d.is-d.was), metric.WithAttributes(t.processorID, attribute.String("kind", d.kind)))
		}
	}
	*reported = *now
	t.active.Store(int64(active))
	t.heldNow.Store(int64(held))
	if t.releasedSpans > 0 {
		t.spanVerdicts.Add(ctx, t.releasedSpans, metric.WithAttributes(t.processorID, attribute.String("verdict", "keep")))
		t.releasedSpans = 0
	}
	if t.droppedSpans > 0 {
		t.spanVerdicts.Add(ctx, t.droppedSpans, metric.WithAttributes(t.processorID, attribute.String("verdict", "drop")))
		t.droppedSpans = 0
	}
}

// spans reports the outcome of one traces batch.
func (t *processorTelemetry) spans(ctx context.Context, held, dropped, overflow int) {
	if held > 0 {
		t.heldSpans.Add(ctx, int64(held), metric.WithAttributes(t.processorID, attribute.String("result", "held")))
	}
	if overflow > 0 {
		t.heldSpans.Add(ctx, int64(overflow), metric.WithAttributes(t.processorID, attribute.String("result", "overflow")))
	}
	if dropped > 0 {
		t.spanVerdicts.Add(ctx, int64(dropped), metric.WithAttributes(t.processorID, attribute.String("verdict", "drop")))
	}
}

func (t *processorTelemetry) outputFailed(ctx context.Context, signal string, n int) {
	t.outputFailures.Add(ctx, int64(n), metric.WithAttributes(t.processorID, attribute.String("signal", signal)))
}
