// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package otlpsink is the OTLP backend of the benchmarks, the demo and the
// tests: it takes logs, traces and metrics over OTLP/gRPC or OTLP/HTTP
// (protobuf, gzip or not), counts what arrives, keeps it when asked, and
// hands each request to the caller's functions.
package otlpsink // import "github.com/otelcol-llm/otelcol-llm/internal/harness/otlpsink"

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // the otlp exporter compresses with gzip
)

// Options choose the transport and what the sink does with what arrives.
type Options struct {
	// HTTP serves OTLP/HTTP (POST /v1/logs, /v1/traces, /v1/metrics) instead
	// of OTLP/gRPC.
	HTTP bool
	// Keep keeps every request, for LogRecords, Spans and Metric.
	Keep bool
	// OnLogs, OnTraces and OnMetrics, when set, get each request as it
	// arrives, from the server's goroutines: they synchronize themselves.
	OnLogs    func(plog.Logs)
	OnTraces  func(ptrace.Traces)
	OnMetrics func(pmetric.Metrics)
}

// Counts are what a sink has received so far.
type Counts struct {
	LogRecords int64 `json:"log_records"`
	Spans      int64 `json:"spans"`
	Points     int64 `json:"metric_points"`
}

// maxRefusedErrors is how many refused requests' errors a sink keeps.
const maxRefusedErrors = 5

// Sink is a running OTLP backend.
type Sink struct {
	opts                      Options
	addr                      string
	grpc                      *grpc.Server
	http                      *http.Server
	done                      chan struct{}
	logRecords, spans, points atomic.Int64

	mu      sync.Mutex
	logs    []plog.Logs
	traces  []ptrace.Traces
	metrics []pmetric.Metrics
	refused int
	// refusedErrors are the first maxRefusedErrors refusals, for a report or
	// a failing test to say why.
	refusedErrors []string
}

// Start serves a sink on addr (a port of 0 picks a free one) until Close.
func Start(addr string, o Options) (*Sink, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Sink{opts: o, addr: ln.Addr().String(), done: make(chan struct{})}
	if o.HTTP {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/logs", s.handle(func(b []byte) error {
			req := plogotlp.NewExportRequest()
			if err := req.UnmarshalProto(b); err != nil {
				return err
			}
			s.takeLogs(req.Logs())
			return nil
		}))
		mux.HandleFunc("POST /v1/traces", s.handle(func(b []byte) error {
			req := ptraceotlp.NewExportRequest()
			if err := req.UnmarshalProto(b); err != nil {
				return err
			}
			s.takeTraces(req.Traces())
			return nil
		}))
		mux.HandleFunc("POST /v1/metrics", s.handle(func(b []byte) error {
			req := pmetricotlp.NewExportRequest()
			if err := req.UnmarshalProto(b); err != nil {
				return err
			}
			s.takeMetrics(req.Metrics())
			return nil
		}))
		s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			defer close(s.done)
			_ = s.http.Serve(ln)
		}()
		return s, nil
	}
	s.grpc = grpc.NewServer()
	plogotlp.RegisterGRPCServer(s.grpc, &logsService{s: s})
	ptraceotlp.RegisterGRPCServer(s.grpc, &tracesService{s: s})
	pmetricotlp.RegisterGRPCServer(s.grpc, &metricsService{s: s})
	go func() {
		defer close(s.done)
		_ = s.grpc.Serve(ln)
	}()
	return s, nil
}

// Addr is the host:port the sink listens on.
func (s *Sink) Addr() string { return s.addr }

// URL is the sink's OTLP/HTTP base URL.
func (s *Sink) URL() string { return "http://" + s.addr }

// Close stops the sink and waits until it has.
func (s *Sink) Close() {
	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.http.Shutdown(ctx)
	} else {
		s.grpc.Stop()
	}
	<-s.done
}

// Counts are the log records, spans and metric data points received so far.
func (s *Sink) Counts() Counts {
	return Counts{LogRecords: s.logRecords.Load(), Spans: s.spans.Load(), Points: s.points.Load()}
}

// Refused is the number of OTLP/HTTP requests the sink could not read, and
// the errors of the first of them.
func (s *Sink) Refused() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused, slices.Clone(s.refusedErrors)
}

func (s *Sink) takeLogs(ld plog.Logs) {
	s.logRecords.Add(int64(ld.LogRecordCount()))
	take(s, &s.logs, ld, s.opts.OnLogs)
}

func (s *Sink) takeTraces(td ptrace.Traces) {
	s.spans.Add(int64(td.SpanCount()))
	take(s, &s.traces, td, s.opts.OnTraces)
}

func (s *Sink) takeMetrics(md pmetric.Metrics) {
	s.points.Add(int64(md.DataPointCount()))
	take(s, &s.metrics, md, s.opts.OnMetrics)
}

// take keeps v (Options.Keep) and hands it to the signal's callback.
func take[T any](s *Sink, kept *[]T, v T, on func(T)) {
	if s.opts.Keep {
		s.mu.Lock()
		*kept = append(*kept, v)
		s.mu.Unlock()
	}
	if on != nil {
		on(v)
	}
}

// Post sends body to url as OTLP/HTTP protobuf, gzipped when gz, and returns
// the answer's status: what an exporter does, for the tests of a sink.
func Post(url string, body []byte, gz bool) (int, error) {
	if gz {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		if _, err := w.Write(body); err != nil {
			return 0, err
		}
		if err := w.Close(); err != nil {
			return 0, err
		}
		body = b.Bytes()
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	if gz {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// LogRecords returns every log record kept so far (Options.Keep).
func (s *Sink) LogRecords() []plog.LogRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []plog.LogRecord
	for _, ld := range s.logs {
		for _, rl := range ld.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					out = append(out, lr)
				}
			}
		}
	}
	return out
}

// Spans returns every span kept so far (Options.Keep).
func (s *Sink) Spans() []ptrace.Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ptrace.Span
	for _, td := range s.traces {
		for _, rs := range td.ResourceSpans().All() {
			for _, ss := range rs.ScopeSpans().All() {
				for _, span := range ss.Spans().All() {
					out = append(out, span)
				}
			}
		}
	}
	return out
}

// Metric returns the named metric of the latest request kept that has it
// (Options.Keep).
func (s *Sink) Metric(name string) (pmetric.Metric, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.metrics) - 1; i >= 0; i-- {
		for _, rm := range s.metrics[i].ResourceMetrics().All() {
			for _, sm := range rm.ScopeMetrics().All() {
				for _, m := range sm.Metrics().All() {
					if m.Name() == name {
						return m, true
					}
				}
			}
		}
	}
	return pmetric.Metric{}, false
}

// handle reads an OTLP/HTTP request body and hands it to decode; the answer
// is an empty success (an empty protobuf message is zero bytes).
func (s *Sink) handle(decode func([]byte) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = http.MaxBytesReader(w, r.Body, 64<<20)
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(body)
			if err != nil {
				s.refuse(w, r, err)
				return
			}
			defer zr.Close()
			body = zr
		}
		data, err := io.ReadAll(body)
		if err == nil {
			err = decode(data)
		}
		if err != nil {
			s.refuse(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}
}

func (s *Sink) refuse(w http.ResponseWriter, r *http.Request, err error) {
	s.mu.Lock()
	s.refused++
	if len(s.refusedErrors) < maxRefusedErrors {
		s.refusedErrors = append(s.refusedErrors, fmt.Sprintf("%s (%d bytes declared): %v", r.URL.Path, r.ContentLength, err))
	}
	s.mu.Unlock()
	// 400 is permanent for the exporter: it does not retry garbage.
	http.Error(w, err.Error(), http.StatusBadRequest)
}

type logsService struct {
	plogotlp.UnimplementedGRPCServer
	s *Sink
}

func (l logsService) Export(_ context.Context, req plogotlp.ExportRequest) (plogotlp.ExportResponse, error) {
	l.s.takeLogs(req.Logs())
	return plogotlp.NewExportResponse(), nil
}

type tracesService struct {
	ptraceotlp.UnimplementedGRPCServer
	s *Sink
}

func (t tracesService) Export(_ context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	t.s.takeTraces(req.Traces())
	return ptraceotlp.NewExportResponse(), nil
}

type metricsService struct {
	pmetricotlp.UnimplementedGRPCServer
	s *Sink
}

func (m metricsService) Export(_ context.Context, req pmetricotlp.ExportRequest) (pmetricotlp.ExportResponse, error) {
	m.s.takeMetrics(req.Metrics())
	return pmetricotlp.NewExportResponse(), nil
}
