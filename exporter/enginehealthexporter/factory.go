// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/internal/sharedcomponent"
)

// judges holds one judge per component ID, shared by its metrics and logs
// pipelines.
var judges = sharedcomponent.NewMap[component.ID, *engineHealth]()

// NewFactory returns the factory of the engine_health exporter.
func NewFactory() exporter.Factory {
	return exporter.NewFactory(metadata.Type, func() component.Config { return createDefaultConfig() },
		exporter.WithMetrics(createMetrics, metadata.MetricsStability),
		exporter.WithLogs(createLogs, metadata.LogsStability))
}

func shared(set exporter.Settings, cfg component.Config) (*sharedcomponent.Component[*engineHealth], error) {
	return judges.LoadOrStore(set.ID, func() (*engineHealth, error) { return newEngineHealth(cfg.(*Config), set) })
}

func createMetrics(_ context.Context, set exporter.Settings, cfg component.Config) (exporter.Metrics, error) {
	c, err := shared(set, cfg)
	if err != nil {
		return nil, err
	}
	return &metricsExporter{c}, nil
}

func createLogs(_ context.Context, set exporter.Settings, cfg component.Config) (exporter.Logs, error) {
	c, err := shared(set, cfg)
	if err != nil {
		return nil, err
	}
	return &logsExporter{c}, nil
}

// The exporter only reads what it is given.
var capabilities = consumer.Capabilities{MutatesData: false}

type metricsExporter struct {
	*sharedcomponent.Component[*engineHealth]
}

func (e *metricsExporter) Capabilities() consumer.Capabilities { return capabilities }
func (e *metricsExporter) ConsumeMetrics(_ context.Context, md pmetric.Metrics) error {
	e.Unwrap().consumeMetrics(md)
	return nil
}

type logsExporter struct {
	*sharedcomponent.Component[*engineHealth]
}

func (e *logsExporter) Capabilities() consumer.Capabilities { return capabilities }
func (e *logsExporter) ConsumeLogs(_ context.Context, ld plog.Logs) error {
	e.Unwrap().consumeLogs(ld)
	return nil
}
