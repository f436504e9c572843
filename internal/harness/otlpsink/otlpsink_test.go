// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package otlpsink

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpcgzip "google.golang.org/grpc/encoding/gzip"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogs() plog.Logs {
	ld := plog.NewLogs()
	lrs := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords()
	lrs.AppendEmpty().SetEventName("llm.session.summary")
	lrs.AppendEmpty().SetEventName("llm.session.stall")
	return ld
}

func testTraces() ptrace.Traces {
	td := ptrace.NewTraces()
	td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty().SetName("llm.session")
	return td
}

func testMetrics(v int64) pmetric.Metrics {
	md := pmetric.NewMetrics()
	m := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("llm.sessions")
	dps := m.SetEmptySum().DataPoints()
	dps.AppendEmpty().SetIntValue(v)
	dps.AppendEmpty().SetIntValue(v)
	return md
}

// check checks what one request of logs, one of traces and two of metrics
// left in s.
func check(t *testing.T, s *Sink, got *atomic.Int32) {
	t.Helper()
	assert.Equal(t, Counts{LogRecords: 2, Spans: 1, Points: 4}, s.Counts())
	require.Len(t, s.LogRecords(), 2)
	assert.Equal(t, "llm.session.stall", s.LogRecords()[1].EventName())
	require.Len(t, s.Spans(), 1)
	assert.Equal(t, "llm.session", s.Spans()[0].Name())
	m, ok := s.Metric("llm.sessions")
	require.True(t, ok)
	assert.Equal(t, int64(7), m.Sum().DataPoints().At(0).IntValue(), "the latest request's")
	_, ok = s.Metric("llm.sessions.active")
	assert.False(t, ok)
	assert.Equal(t, int32(4), got.Load(), "every request handed on")
}

func TestGRPC(t *testing.T) {
	var got atomic.Int32
	count := func() { got.Add(1) }
	s, err := Start("127.0.0.1:0", Options{
		Keep: true, OnLogs: func(plog.Logs) { count() },
		OnTraces: func(ptrace.Traces) { count() }, OnMetrics: func(pmetric.Metrics) { count() },
	})
	require.NoError(t, err)
	defer s.Close()

	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.UseCompressor(grpcgzip.Name)))
	require.NoError(t, err)
	defer conn.Close()
	ctx := context.Background()
	_, err = plogotlp.NewGRPCClient(conn).Export(ctx, plogotlp.NewExportRequestFromLogs(testLogs()))
	require.NoError(t, err)
	_, err = ptraceotlp.NewGRPCClient(conn).Export(ctx, ptraceotlp.NewExportRequestFromTraces(testTraces()))
	require.NoError(t, err)
	for _, v := range []int64{3, 7} {
		_, err = pmetricotlp.NewGRPCClient(conn).Export(ctx, pmetricotlp.NewExportRequestFromMetrics(testMetrics(v)))
		require.NoError(t, err)
	}
	check(t, s, &got)
}

func post(t *testing.T, url string, body []byte, gz bool) int {
	t.Helper()
	status, err := Post(url, body, gz)
	require.NoError(t, err)
	return status
}

func TestHTTP(t *testing.T) {
	var got atomic.Int32
	count := func() { got.Add(1) }
	s, err := Start("127.0.0.1:0", Options{
		HTTP: true, Keep: true, OnLogs: func(plog.Logs) { count() },
		OnTraces: func(ptrace.Traces) { count() }, OnMetrics: func(pmetric.Metrics) { count() },
	})
	require.NoError(t, err)
	defer s.Close()

	body, err := plogotlp.NewExportRequestFromLogs(testLogs()).MarshalProto()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, post(t, s.URL()+"/v1/logs", body, true))
	body, err = ptraceotlp.NewExportRequestFromTraces(testTraces()).MarshalProto()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, post(t, s.URL()+"/v1/traces", body, false))
	for _, v := range []int64{3, 7} {
		body, err = pmetricotlp.NewExportRequestFromMetrics(testMetrics(v)).MarshalProto()
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, post(t, s.URL()+"/v1/metrics", body, v == 7))
	}
	check(t, s, &got)

	n, errs := s.Refused()
	assert.Zero(t, n)
	assert.Empty(t, errs)
	assert.Equal(t, http.StatusBadRequest, post(t, s.URL()+"/v1/logs", []byte("not protobuf \xff\xff"), false))
	assert.Equal(t, http.StatusBadRequest, post(t, s.URL()+"/v1/traces", []byte("not protobuf either"), false))
	n, errs = s.Refused()
	assert.Equal(t, 2, n)
	require.Len(t, errs, 2)
	assert.Contains(t, errs[0], "/v1/logs (15 bytes declared): ")
	assert.Equal(t, Counts{LogRecords: 2, Spans: 1, Points: 4}, s.Counts(), "nothing refused is counted")
}
