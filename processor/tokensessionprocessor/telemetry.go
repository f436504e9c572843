// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"context"
	"errors"
	"sync/atomic"

	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// signal is a pipeline the processor emits to.
type signal int

const (
	signalLogs signal = iota
	signalMetrics
	signalTraces
)

var signalNames = [...]string{"logs", "metrics", "traces"}

// processorTelemetry is the processor's own metrics (metadata.yaml): every
// session's outcome, every event it could not use as it came, every span it
// held, released, dropped or could not hold, and every output the next
// consumer refused. The collector adds otelcol.component.id to each.
type processorTelemetry struct {
	builder *metadata.TelemetryBuilder

	// Read by the observable gauges.
	active  atomic.Int64
	heldNow atomic.Int64

	// Attribute sets built once: recording allocates nothing.
	sessionSet  [session.OutcomeShutdown + 1][2]metric.AddOption
	disorderSet [len(disorderKinds)]metric.AddOption
	rejectedSet [len(rejectReasons)][len(eventKinds)]metric.AddOption
	timingSet   map[[2]string]metric.AddOption
	shareSet    [len(shareResults)]metric.AddOption
	signalSet   [len(signalNames)]metric.AddOption

	// Accumulated under the sessions' lock, reported by reportCounters.
	releasedSpans int64
	droppedSpans  int64
	// ended counts the sessions ended by outcome and sampled, as
	// sessionSet: an Add per session allocated (its options' slice) and
	// cost more than the session's own metrics; one per batch does not.
	ended [session.OutcomeShutdown + 1][2]int64

	// bounds are the counts of the bounds as last reported; keySet their
	// key attribute's sets.
	bounds boundCounts
	keySet [len(boundKeys)]metric.AddOption
}

// boundKeys are the key attribute's values of keys_overflowed, in the
// order of boundCounts.keys.
var boundKeys = [...]string{"model", "engine", "tenant", "pod", "engine_instance"}

const (
	keyModel = iota
	keyEngine
	keyTenant
	keyPod
	keyEngineInstance
)

// boundCounts are the totals of what the bounds on per-key state folded,
// turned away or forgot.
type boundCounts struct {
	// metricOverflows are the recordings on an otel.metric.overflow series.
	metricOverflows uint64
	// keys are the sessions (or readings) beyond each key's bound.
	keys [len(boundKeys)]uint64
	// forgotten are the series forgotten after metrics::forget_after.
	forgotten uint64
	// lateTokens are the token events that came after their engine step
	// was settled.
	lateTokens uint64
	// truncatedValues are the values of records cut to their bound.
	truncatedValues uint64
}

func newProcessorTelemetry(set processor.Settings) (*processorTelemetry, error) {
	b, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	t := &processorTelemetry{builder: b}
	for o := session.OutcomeActive; o <= session.OutcomeShutdown; o++ {
		for i, sampled := range []bool{false, true} {
			t.sessionSet[o][i] = metric.WithAttributeSet(attribute.NewSet(
				attribute.String("outcome", o.String()), attribute.Bool("sampled", sampled)))
		}
	}
	for i, kind := range disorderKinds {
		t.disorderSet[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("kind", kind)))
	}
	for i, reason := range rejectReasons {
		for j, kind := range eventKinds {
			t.rejectedSet[i][j] = metric.WithAttributeSet(attribute.NewSet(
				attribute.String("reason", reason), attribute.String("event", kind)))
		}
	}
	t.timingSet = make(map[[2]string]metric.AddOption)
	for _, source := range timingSources {
		for _, result := range timingResults {
			t.timingSet[[2]string{source, result}] = metric.WithAttributeSet(attribute.NewSet(
				attribute.String("source", source), attribute.String("result", result)))
		}
	}
	for i, result := range shareResults {
		t.shareSet[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", result)))
	}
	for i, name := range signalNames {
		t.signalSet[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("signal", name)))
	}
	for i, key := range boundKeys {
		t.keySet[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("key", key)))
	}
	err = errors.Join(
		b.RegisterProcessorTokenSessionSessionsActiveCallback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(t.active.Load())
			return nil
		}),
		b.RegisterProcessorTokenSessionSpansHeldCallback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(t.heldNow.Load())
			return nil
		}))
	if err != nil {
		b.Shutdown()
		return nil, err
	}
	return t, nil
}

func (t *processorTelemetry) shutdown() { t.builder.Shutdown() }

// sessionEnded counts an ended session, reported by the next
// reportCounters (every call that ends sessions makes one before it
// returns). Call with the sessions' lock held.
func (t *processorTelemetry) sessionEnded(o session.Outcome, sampled bool) {
	i := 0
	if sampled {
		i = 1
	}
	t.ended[o][i]++
}

// disorderKinds are the kind attribute's values, in the order of
// disorderCounts.
var disorderKinds = [...]string{
	"orphan_token", "orphan_end", "late", "duplicate_start", "out_of_order",
	"duplicate_token", "invalid_tracestate", "orphan_move", "excess_move",
}

func disorderCounts(c *session.Counters) [len(disorderKinds)]uint64 {
	return [...]uint64{
		c.OrphanTokens, c.OrphanEnds, c.LateEvents, c.DuplicateStarts, c.OutOfOrder,
		c.DuplicateTokens, c.InvalidTraceStates, c.OrphanMoves, c.ExcessMoves,
	}
}

// rejectReasons and eventKinds are the values of events_rejected's reason
// and event attributes, in the order of session.Counters' arrays.
var (
	rejectReasons = [...]string{"future", "before_start"}
	eventKinds    = [len(session.EventKinds)]string{"start", "token", "end", "move"}
)

func rejectedCounts(c *session.Counters) [len(rejectReasons)][len(eventKinds)]uint64 {
	return [...][len(eventKinds)]uint64{c.FutureEvents, c.EventsBeforeStart}
}

// reportCounters reports what changed since the last call: the table's
// disorder counters (reported is the state last reported), the gauges, and
// the ended sessions and span verdicts accumulated under the lock. verdictSpans: the
// processor emits verdict spans, so an early keep never reported is one
// dropped.
func (t *processorTelemetry) reportCounters(reported, now *session.Counters, active, held int, verdictSpans bool) {
	ctx := context.Background()
	was, is := disorderCounts(reported), disorderCounts(now)
	for i := range is {
		if is[i] > was[i] {
			t.builder.ProcessorTokenSessionDisorderEvents.Add(ctx, int64(is[i]-was[i]), t.disorderSet[i])
		}
	}
	wasRejected, isRejected := rejectedCounts(reported), rejectedCounts(now)
	for i := range isRejected {
		for j := range isRejected[i] {
			if d := isRejected[i][j] - wasRejected[i][j]; d > 0 {
				t.builder.ProcessorTokenSessionEventsRejected.Add(ctx, int64(d), t.rejectedSet[i][j])
			}
		}
	}
	if d := now.WithdrawnFreezes - reported.WithdrawnFreezes; d > 0 {
		t.builder.ProcessorTokenSessionFreezesWithdrawn.Add(ctx, int64(d))
	}
	if d := now.ReinstatedFreezes - reported.ReinstatedFreezes; d > 0 {
		t.builder.ProcessorTokenSessionFreezesReinstated.Add(ctx, int64(d))
	}
	if d := now.UnreportedKeeps - reported.UnreportedKeeps; d > 0 && verdictSpans {
		t.builder.ProcessorTokenSessionVerdictSpansDropped.Add(ctx, int64(d))
	}
	*reported = *now
	for o := range t.ended {
		for i, n := range t.ended[o] {
			if n > 0 {
				t.builder.ProcessorTokenSessionSessionsEnded.Add(ctx, n, t.sessionSet[o][i])
				t.ended[o][i] = 0
			}
		}
	}
	t.active.Store(int64(active))
	t.heldNow.Store(int64(held))
	if t.releasedSpans > 0 {
		t.builder.ProcessorTokenSessionSpansReleased.Add(ctx, t.releasedSpans)
		t.releasedSpans = 0
	}
	if t.droppedSpans > 0 {
		t.builder.ProcessorTokenSessionSpansDropped.Add(ctx, t.droppedSpans)
		t.droppedSpans = 0
	}
}

// spans reports the outcome of one traces batch.
func (t *processorTelemetry) spans(ctx context.Context, held, dropped, overflow int) {
	if held > 0 {
		t.builder.ProcessorTokenSessionSpansDelayed.Add(ctx, int64(held))
	}
	if overflow > 0 {
		t.builder.ProcessorTokenSessionSpansOverflowed.Add(ctx, int64(overflow))
	}
	if dropped > 0 {
		t.builder.ProcessorTokenSessionSpansDropped.Add(ctx, int64(dropped))
	}
}

func (t *processorTelemetry) expired(ctx context.Context, n int) {
	t.builder.ProcessorTokenSessionSpansExpired.Add(ctx, int64(n))
}

// reportBounds reports what the bounds on per-key state folded, turned
// away or forgot since the last call; c holds totals.
func (t *processorTelemetry) reportBounds(ctx context.Context, c boundCounts) {
	if d := c.metricOverflows - t.bounds.metricOverflows; d > 0 {
		t.builder.ProcessorTokenSessionMetricOverflows.Add(ctx, int64(d))
	}
	for i := range c.keys {
		if d := c.keys[i] - t.bounds.keys[i]; d > 0 {
			t.builder.ProcessorTokenSessionKeysOverflowed.Add(ctx, int64(d), t.keySet[i])
		}
	}
	if d := c.forgotten - t.bounds.forgotten; d > 0 {
		t.builder.ProcessorTokenSessionSeriesForgotten.Add(ctx, int64(d))
	}
	if d := c.lateTokens - t.bounds.lateTokens; d > 0 {
		t.builder.ProcessorTokenSessionLateStepTokens.Add(ctx, int64(d))
	}
	if d := c.truncatedValues - t.bounds.truncatedValues; d > 0 {
		t.builder.ProcessorTokenSessionTruncatedValues.Add(ctx, int64(d))
	}
	t.bounds = c
}

// What became of an engine timing (the result attribute).
const (
	timingJoined    = "joined"
	timingInvalid   = "invalid"
	timingMissing   = "missing"
	timingUnmatched = "unmatched"
	timingOverflow  = "overflow"
)

var (
	timingSources = [...]string{session.TimingEngineSpan, session.TimingResponse, session.TimingLlamaCpp, session.TimingHook}
	timingResults = [...]string{timingJoined, timingInvalid, timingMissing, timingUnmatched, timingOverflow}
)

// timing counts one engine timing from source with result.
func (t *processorTelemetry) timing(source, result string) {
	if opt, ok := t.timingSet[[2]string{source, result}]; ok {
		t.builder.ProcessorTokenSessionEngineTimings.Add(context.Background(), 1, opt)
	}
}

// What became of an engine's share event (shares.go), as the result
// attribute of engine_shares spells it.
type shareResult int

const (
	shareJoined shareResult = iota
	shareExpired
	shareOrphaned
	shareOverflow
)

var shareResults = [...]string{"joined", "expired", "orphaned", "overflow"}

// share counts one share, or one session's wait for it, with result r.
func (t *processorTelemetry) share(r shareResult) {
	t.builder.ProcessorTokenSessionEngineShares.Add(context.Background(), 1, t.shareSet[r])
}

func (t *processorTelemetry) heldOverflow() {
	t.builder.ProcessorTokenSessionHeldOutputsOverflowed.Add(context.Background(), 1)
}

func (t *processorTelemetry) invalidRecords(ctx context.Context, n int) {
	t.builder.ProcessorTokenSessionInvalidRecords.Add(ctx, int64(n))
}

func (t *processorTelemetry) outputFailed(ctx context.Context, s signal, n int) {
	t.builder.ProcessorTokenSessionOutputFailures.Add(ctx, int64(n), t.signalSet[s])
}
