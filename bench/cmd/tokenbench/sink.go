//go:build linux

package main

import (
	"context"
	"net"
	"sync/atomic"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // the otlp exporter compresses with gzip
)

// sink is the OTLP/gRPC backend both pipelines export to; it only counts what
// arrives, so that what a pipeline sent can be checked against the workload.
type sink struct {
	srv        *grpc.Server
	addr       string
	logRecords atomic.Int64
	spans      atomic.Int64
	points     atomic.Int64
}

type sinkCounts struct {
	LogRecords int64 `json:"log_records"`
	Spans      int64 `json:"spans"`
	Points     int64 `json:"metric_points"`
}

func startSink() (*sink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{srv: grpc.NewServer(), addr: l.Addr().String()}
	plogotlp.RegisterGRPCServer(s.srv, &logsSink{s: s})
	ptraceotlp.RegisterGRPCServer(s.srv, &tracesSink{s: s})
	pmetricotlp.RegisterGRPCServer(s.srv, &metricsSink{s: s})
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

func (s *sink) counts() sinkCounts {
	return sinkCounts{LogRecords: s.logRecords.Load(), Spans: s.spans.Load(), Points: s.points.Load()}
}

func (s *sink) stop() { s.srv.Stop() }

type logsSink struct {
	plogotlp.UnimplementedGRPCServer
	s *sink
}

func (l *logsSink) Export(_ context.Context, req plogotlp.ExportRequest) (plogotlp.ExportResponse, error) {
	l.s.logRecords.Add(int64(req.Logs().LogRecordCount()))
	return plogotlp.NewExportResponse(), nil
}

type tracesSink struct {
	ptraceotlp.UnimplementedGRPCServer
	s *sink
}

func (t *tracesSink) Export(_ context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	t.s.spans.Add(int64(req.Traces().SpanCount()))
	return ptraceotlp.NewExportResponse(), nil
}

type metricsSink struct {
	pmetricotlp.UnimplementedGRPCServer
	s *sink
}

func (m *metricsSink) Export(_ context.Context, req pmetricotlp.ExportRequest) (pmetricotlp.ExportResponse, error) {
	m.s.points.Add(int64(req.Metrics().DataPointCount()))
	return pmetricotlp.NewExportResponse(), nil
}
