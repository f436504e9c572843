// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"

	"github.com/otelcol-llm/otelcol-llm/internal/sharedcomponent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// cores holds one core per component ID, shared by its pipelines.
var cores = sharedcomponent.NewMap[component.ID, *core]()

// NewFactory returns the factory of the token_session processor.
func NewFactory() processor.Factory {
	return processor.NewFactory(metadata.Type, func() component.Config { return createDefaultConfig() },
		processor.WithLogs(createLogs, metadata.LogsStability),
		processor.WithMetrics(createMetrics, metadata.MetricsStability),
		processor.WithTraces(createTraces, metadata.TracesStability))
}

// capabilities: the processor removes the token event records it folds and
// the spans it holds from what it was given.
// The logs and traces faces change what passes (token records are taken
// out, held spans moved, kept spans' tracestates stamped); the metrics face
// only reads the engine state from what passes.
var (
	capabilities        = consumer.Capabilities{MutatesData: true}
	metricsCapabilities = consumer.Capabilities{MutatesData: false}
)

// sharedComponent is the core of one component ID, started and stopped once
// for all its pipelines.
type sharedComponent = sharedcomponent.Component[*core]

// withCore returns face, the processor of one signal, over the core of
// set.ID, with next as that signal's next consumer (the others nil).
func withCore[P any](set processor.Settings, cfg component.Config, face func(*sharedComponent) P,
	logs consumer.Logs, metrics consumer.Metrics, traces consumer.Traces,
) (P, error) {
	var none P
	c, err := cores.LoadOrStore(set.ID, func() (*core, error) { return newCore(cfg.(*Config), set) })
	if err != nil {
		return none, err
	}
	if err := c.Unwrap().setNext(logs, metrics, traces); err != nil {
		return none, err
	}
	return face(c), nil
}

func createLogs(_ context.Context, set processor.Settings, cfg component.Config, next consumer.Logs) (processor.Logs, error) {
	return withCore(set, cfg, func(c *sharedComponent) processor.Logs { return &logsProcessor{c} }, next, nil, nil)
}

func createMetrics(_ context.Context, set processor.Settings, cfg component.Config, next consumer.Metrics) (processor.Metrics, error) {
	return withCore(set, cfg, func(c *sharedComponent) processor.Metrics { return &metricsProcessor{c} }, nil, next, nil)
}

func createTraces(_ context.Context, set processor.Settings, cfg component.Config, next consumer.Traces) (processor.Traces, error) {
	return withCore(set, cfg, func(c *sharedComponent) processor.Traces { return &tracesProcessor{c} }, nil, nil, next)
}

// The per-signal faces of the shared core. Start and Shutdown come from
// the shared component, which runs them once for all three.

type logsProcessor struct {
	*sharedComponent
}

func (p *logsProcessor) Capabilities() consumer.Capabilities { return capabilities }
func (p *logsProcessor) ConsumeLogs(ctx context.Context, ld plog.Logs) error {
	return p.Unwrap().consumeLogs(ctx, ld)
}

type metricsProcessor struct {
	*sharedComponent
}

func (p *metricsProcessor) Capabilities() consumer.Capabilities { return metricsCapabilities }
func (p *metricsProcessor) ConsumeMetrics(ctx context.Context, md pmetric.Metrics) error {
	return p.Unwrap().consumeMetrics(ctx, md)
}

type tracesProcessor struct {
	*sharedComponent
}

func (p *tracesProcessor) Capabilities() consumer.Capabilities { return capabilities }
func (p *tracesProcessor) ConsumeTraces(ctx context.Context, td ptrace.Traces) error {
	return p.Unwrap().consumeTraces(ctx, td)
}
