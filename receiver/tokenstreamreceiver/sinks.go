// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"sync"

	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"
)

// hookSink is what a hook endpoint is given by the receiver: pooled batch
// decoders, the hand-over of a decoded batch to the pipeline, the one
// counter of its own (UDP's) and the logs logger.
type hookSink interface {
	decoder() *batchDecoder
	release(d *batchDecoder)
	consume(ctx context.Context, d *batchDecoder) error
	countDroppedDatagrams(n int64)
	countRefusedConnections(n int64)
	Logger() *zap.Logger
}

// outlets are what a receiver's sinks share of it: the consumers of each
// signal, its telemetry and the loggers of each signal's sources, and the
// hooks' pooled batch decoders.
type outlets struct {
	settings    receiver.Settings // without the collector's otelcol.signal
	next        consumer.Logs     // nil unless the receiver is in a logs pipeline
	nextMetrics consumer.Metrics  // nil unless the receiver is in a metrics pipeline
	telemetry   *metadata.TelemetryBuilder
	batches     sync.Pool // of *batchDecoder

	// The loggers of the sources of each signal, which name it.
	logsLogger, metricsLogger *zap.Logger
}

// release drops the batch's records and returns d to the pool.
func (o *outlets) release(d *batchDecoder) {
	d.logs, d.records = plog.Logs{}, plog.LogRecordSlice{}
	d.writer.Reset(plog.LogRecordSlice{}, 0)
	o.batches.Put(d)
}

func (o *outlets) decoder() *batchDecoder { return o.batches.Get().(*batchDecoder) }

// logsSink is how a log source hands its records to the logs pipeline,
// with the standard receiver observability and the token event counters
// around the call. It is what the hooks (hookSink) and the proxy
// (proxy.Sink) are given.
type logsSink struct {
	r         *outlets
	obs       *receiverhelper.ObsReport
	transport transportKind
	format    string // of the standard receiver metrics: ndjson or sse
}

func (o *outlets) newLogsSink(transport transportKind, format string) (*logsSink, error) {
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{
		ReceiverID: o.settings.ID, Transport: transport.String(), ReceiverCreateSettings: o.settings,
	})
	if err != nil {
		return nil, err
	}
	return &logsSink{r: o, obs: obs, transport: transport, format: format}, nil
}

// ConsumeEvents hands records holding events token events to the pipeline.
func (s *logsSink) ConsumeEvents(ctx context.Context, logs plog.Logs, events int) error {
	ctx = s.obs.StartLogsOp(ctx)
	n := logs.LogRecordCount()
	err := s.r.next.ConsumeLogs(ctx, logs)
	s.obs.EndLogsOp(ctx, s.format, n, err)
	attrs := transportAttrs[s.transport]
	if err != nil {
		s.r.telemetry.ReceiverTokenStreamRefusedEvents.Add(ctx, int64(events), attrs)
		s.r.logsLogger.Debug("pipeline refused token events", zap.Stringer("transport", s.transport), zap.Int("events", events), zap.Error(err))
		return err
	}
	s.r.telemetry.ReceiverTokenStreamAcceptedEvents.Add(ctx, int64(events), attrs)
	return nil
}

func (s *logsSink) decoder() *batchDecoder { return s.r.decoder() }

func (s *logsSink) release(d *batchDecoder) { s.r.release(d) }

// consume hands a decoded batch to the pipeline, counting its rejected
// lines and whether it was cut.
func (s *logsSink) consume(ctx context.Context, d *batchDecoder) error {
	attrs := transportAttrs[s.transport]
	if d.rejected > 0 {
		s.r.telemetry.ReceiverTokenStreamRejectedEvents.Add(ctx, int64(d.rejected), attrs)
	}
	if d.truncated > 0 {
		s.r.telemetry.ReceiverTokenStreamTruncatedBatches.Add(ctx, int64(d.truncated), attrs)
	}
	if cut := d.parser.TakeCuts(); cut > 0 {
		s.r.telemetry.ReceiverTokenStreamTruncatedValues.Add(ctx, int64(cut), attrs)
	}
	if d.accepted == 0 {
		return nil
	}
	return s.ConsumeEvents(ctx, d.logs, d.accepted)
}

func (s *logsSink) countDroppedDatagrams(n int64) {
	s.r.telemetry.ReceiverTokenStreamUDPDroppedDatagrams.Add(context.Background(), n)
}

func (s *logsSink) countRefusedConnections(n int64) {
	s.r.telemetry.ReceiverTokenStreamUnixRefusedConnections.Add(context.Background(), n)
}

func (s *logsSink) Counters() proxy.Counters {
	t := s.r.telemetry
	return proxy.Counters{
		RefusedRequests:     t.ReceiverTokenStreamProxyRefusedRequests,
		PassthroughFailures: t.ReceiverTokenStreamProxyPassthroughFailures,
		OversizedEvents:     t.ReceiverTokenStreamProxyOversizedEvents,
		DroppedEvents:       t.ReceiverTokenStreamProxyDroppedEvents,
		StalledStreams:      t.ReceiverTokenStreamProxyStalledStreams,
		CutStreams:          t.ReceiverTokenStreamProxyCutStreams,
		UpstreamRetries:     t.ReceiverTokenStreamProxyUpstreamRetries,
		Migrations:          t.ReceiverTokenStreamProxyMigrations,
		TruncatedValues:     t.ReceiverTokenStreamTruncatedValues,
	}
}

func (s *logsSink) Logger() *zap.Logger { return s.r.logsLogger }

// metricsSink is how the vllm scraper hands what it reads to the metrics
// pipeline, with the standard receiver observability around the call.
type metricsSink struct {
	r   *outlets
	obs *receiverhelper.ObsReport
}

func (o *outlets) newMetricsSink() (*metricsSink, error) {
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{
		ReceiverID: o.settings.ID, Transport: "http", ReceiverCreateSettings: o.settings,
	})
	if err != nil {
		return nil, err
	}
	return &metricsSink{r: o, obs: obs}, nil
}

func (s *metricsSink) ConsumeMetrics(ctx context.Context, md pmetric.Metrics) error {
	n := md.DataPointCount()
	ctx = s.obs.StartMetricsOp(ctx)
	err := s.r.nextMetrics.ConsumeMetrics(ctx, md)
	s.obs.EndMetricsOp(ctx, "prometheus", n, err)
	return err
}

func (s *metricsSink) counters() scrapeCounters {
	t := s.r.telemetry
	return scrapeCounters{
		invalidDataPoints: t.ReceiverTokenStreamInvalidDataPoints,
		skippedFamilies:   t.ReceiverTokenStreamSkippedFamilies,
		failedScrapes:     t.ReceiverTokenStreamFailedScrapes,
	}
}

func (s *metricsSink) Logger() *zap.Logger { return s.r.metricsLogger }

type transportKind int

const (
	transportHTTP transportKind = iota
	transportUDP
	transportProxy
	transportUnix
	transportKinds
)

func (t transportKind) String() string { return [...]string{"http", "udp", "proxy", "unix"}[t] }

// transportAttrs are the attribute sets of the token event counters, one a
// transport, built once: they are on every batch's path. The counters count
// token events, not the log records the standard receiver metrics count
// (several token events of one session are packed into one record).
var transportAttrs = func() (attrs [transportKinds]metric.MeasurementOption) {
	for k := range transportKinds {
		attrs[k] = metric.WithAttributeSet(attribute.NewSet(attribute.String("transport", k.String())))
	}
	return attrs
}()
