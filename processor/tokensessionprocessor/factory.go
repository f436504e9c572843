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

func sharedCore(set processor.Settings, cfg component.Config) (*sharedcomponent.Component[*core], error) {
	return cores.LoadOrStore(set.ID, func() (*core, error) { return newCore(cfg.(*Config), set) })
}

// capabilities: the processor removes the token event records it folds and
// the spans it holds from what it was given.
var capabilities = consumer.Capabilities{MutatesData: true}

func createLogs(_ context.Context, set processor.Settings, cfg component.Config, next consumer.Logs) (processor.Logs, error) {
	c, err := sharedCore(set, cfg)
	if err != nil {
		return nil, err
	}
	if err := c.Unwrap().setNext(next, nil, nil); err != nil {
		return nil, err
	}
	return &logsProcessor{Component: c}, nil
}

func createMetrics(_ context.Context, set processor.Settings, cfg component.Config, next consumer.Metrics) (processor.Metrics, error) {
	c, err := sharedCore(set, cfg)
	if err != nil {
		return nil, err
	}
	if err := c.Unwrap().setNext(nil, next, nil); err != nil {
		return nil, err
	}
	return &metricsProcessor{Component: c}, nil
}

func createTraces(_ context.Context, set processor.Settings, cfg component.Config, next consumer.Traces) (processor.Traces, error) {
	c, err := sharedCore(set, cfg)
	if err != nil {
		return nil, err
	}
	if err := c.Unwrap().setNext(nil, nil, next); err != nil {
		return nil, err
	}
	return &tracesProcessor{Component: c}, nil
}

// The per-signal faces of the shared core. Start and Shutdown come from
// the shared component, which runs them once for all three.

type logsProcessor struct {
	*sharedcomponent.Component[*core]
}

func (p *logsProcessor) Capabilities() consumer.Capabilities { return capabilities }
func (p *logsProcessor) ConsumeLogs(ctx context.Context, ld plog.Logs) error {
	return p.Unwrap().consumeLogs(ctx, ld)
}

type metricsProcessor struct {
	*sharedcomponent.Component[*core]
}

func (p *metricsProcessor) Capabilities() consumer.Capabilities { return capabilities }
func (p *metricsProcessor) ConsumeMetrics(ctx context.Context, md pmetric.Metrics) error {
	return p.Unwrap().consumeMetrics(ctx, md)
}

type tracesProcessor struct {
	*sharedcomponent.Component[*core]
}

func (p *tracesProcessor) Capabilities() consumer.Capabilities { return capabilities }
func (p *tracesProcessor) ConsumeTraces(ctx context.Context, td ptrace.Traces) error {
	return p.Unwrap().consumeTraces(ctx, td)
}
