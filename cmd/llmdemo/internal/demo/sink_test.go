// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.uber.org/goleak"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/otlpsink"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func post(t *testing.T, url string, body []byte, gz bool) int {
	t.Helper()
	status, err := otlpsink.Post(url, body, gz)
	require.NoError(t, err)
	return status
}

// metricsAt builds a flush of the collector: cumulative session counts, a
// TTFT histogram and one scrape of the engine.
func metricsAt(ts time.Time, completed, errored int64, kv float64, preempt int64) pmetric.Metrics {
	md := pmetric.NewMetrics()
	sm := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty()
	sessions := sm.Metrics().AppendEmpty()
	sessions.SetName(metricSessions)
	sum := sessions.SetEmptySum()
	for outcome, n := range map[string]int64{"completed": completed, "error": errored} {
		dp := sum.DataPoints().AppendEmpty()
		dp.Attributes().PutStr("llm.session.outcome", outcome)
		dp.SetIntValue(n)
	}
	ttft := sm.Metrics().AppendEmpty()
	ttft.SetName(metricTTFT)
	dp := ttft.SetEmptyExponentialHistogram().DataPoints().AppendEmpty()
	dp.SetScale(0)
	dp.Positive().SetOffset(-2) // (0.25, 0.5], (0.5, 1]
	dp.Positive().BucketCounts().FromRaw([]uint64{uint64(completed), 0})
	dp.SetCount(uint64(completed))
	gauge := sm.Metrics().AppendEmpty()
	gauge.SetName(metricKVUsage)
	g := gauge.SetEmptyGauge().DataPoints().AppendEmpty()
	g.SetTimestamp(pcommon.NewTimestampFromTime(ts))
	g.SetDoubleValue(kv)
	pre := sm.Metrics().AppendEmpty()
	pre.SetName(metricPreemptions)
	p := pre.SetEmptySum().DataPoints().AppendEmpty()
	p.SetTimestamp(pcommon.NewTimestampFromTime(ts))
	p.SetDoubleValue(float64(preempt))
	return md
}

func TestSink(t *testing.T) {
	s, err := startSink()
	require.NoError(t, err)
	defer s.close()
	start := time.Unix(1000, 0)

	// Two flushes: the sink keeps the latest cumulative value of each series.
	for i, flush := range []pmetric.Metrics{metricsAt(start.Add(time.Second), 3, 0, 0.5, 1), metricsAt(start.Add(2*time.Second), 7, 1, 0.9, 4)} {
		body, err := pmetricotlp.NewExportRequestFromMetrics(flush).MarshalProto()
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, post(t, s.url()+"/v1/metrics", body, i == 1))
	}

	td := ptrace.NewTraces()
	span := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty()
	span.SetTraceID(pcommon.TraceID{1, 2, 3})
	span.Attributes().PutStr("llm.session.id", "s1")
	span.Attributes().PutDouble("llm.session.ttft", 0.75)
	span.Attributes().PutStr("llm.session.sampling.reason", "ttft")
	span.Attributes().PutStr("llm.session.timing_source", "response")
	span.Attributes().PutDouble("llm.session.queue_time", 0.5)
	span.Attributes().PutDouble("llm.session.prefill_time", 0.125)
	span.SetSpanID(pcommon.SpanID{0x5e})
	spans := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans()
	other := spans.AppendEmpty()
	other.SetName("llm_request") // not a session span
	for _, name := range []string{"llm.session.queue", "llm.session.prefill", "llm.session.decode"} {
		ph := spans.AppendEmpty()
		ph.SetName(name)
		ph.SetParentSpanID(pcommon.SpanID{0x5e})
	}
	verdict := spans.AppendEmpty()
	verdict.SetName("llm.session.verdict") // not a session span, nor a phase
	verdict.Attributes().PutStr("llm.session.id", "s1")
	verdict.SetParentSpanID(pcommon.SpanID{0x5e})
	body, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, post(t, s.url()+"/v1/traces", body, false))

	ld := plog.NewLogs()
	lr := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	lr.SetEventName(eventStall)
	lr.SetTimestamp(pcommon.NewTimestampFromTime(start.Add(1500 * time.Millisecond)))
	lr.Attributes().PutDouble("vllm.kv_cache_usage", 0.8)
	body, err = plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, post(t, s.url()+"/v1/logs", body, false))

	assert.Equal(t, http.StatusBadRequest, post(t, s.url()+"/v1/logs", []byte("not protobuf \xff\xff"), false))

	f := s.figures(start)
	assert.Equal(t, 8.0, f.Sessions)
	assert.Equal(t, 7.0, f.SessionsCompleted)
	assert.InDelta(t, 1000*0.25*1.41421356, f.TTFT.P50, 1e-3, "all 7 in (0.25, 0.5]: the median sits at the log-middle")
	require.Len(t, f.Spans, 1)
	got := f.Spans[0]
	assert.Equal(t, "01020300000000000000000000000000", got.TraceID)
	assert.Equal(t, 750.0, got.TTFTms)
	assert.Equal(t, "ttft", got.SamplingReason)
	assert.Equal(t, "response", got.TimingSource)
	assert.Equal(t, 500.0, got.QueueMs)
	assert.Equal(t, 125.0, got.PrefillMs)
	assert.Equal(t, []string{"llm.session.queue", "llm.session.prefill", "llm.session.decode"}, got.Phases)
	assert.Equal(t, map[string]int{"ttft": 1}, f.SpansByReason)
	require.Len(t, f.StallAlerts, 1)
	assert.Equal(t, 1.5, f.StallAlerts[0].T)
	assert.Equal(t, 0.8, f.StallAlerts[0].KVUsage)
	assert.Equal(t, []float64{1, 2}, []float64{f.KVUsage[0].T, f.KVUsage[1].T})
	assert.Equal(t, 0.9, f.MaxKVUsage)
	assert.Equal(t, 4.0, f.PreemptionCount)
	assert.Equal(t, 1, f.BadRequests)
	require.Len(t, f.BadRequestErrors, 1)
	assert.Contains(t, f.BadRequestErrors[0], "/v1/logs (15 bytes declared): ")
}

// The truth's quantiles interpolate between the closest ranks, as numpy's
// default, llmload's and the histograms' quantiles do.
func TestExactQuantilesInterpolate(t *testing.T) {
	q := exactQuantiles([]float64{4, 1, 3, 2})
	assert.InDelta(t, 2.5, q.P50, 1e-12)
	assert.InDelta(t, 3.97, q.P99, 1e-12)
	one := exactQuantiles([]float64{7})
	assert.Equal(t, Quantiles{P50: 7, P99: 7}, one)
	// 87 values, the slowest far above the rest (c-c25's queue): the p99
	// sits 14% of the way from the second slowest to the slowest, not on it.
	xs := make([]float64, 87)
	for i := range xs {
		xs[i] = float64(i) / 10
	}
	xs[85], xs[86] = 37.6, 60.6
	assert.InDelta(t, 37.6+0.14*23, exactQuantiles(xs).P99, 1e-9)
}

func TestCheckSplit(t *testing.T) {
	truth := map[string]truthSplit{"a": {queueMs: 10, prefillMs: 20}, "b": {queueMs: 5, prefillMs: 6}}
	c := checkSplit([]Span{
		{TraceID: "a", TimingSource: "response", QueueMs: 10.004, PrefillMs: 20},
		{TraceID: "b", TimingSource: "engine_span", QueueMs: 5, PrefillMs: 7},
		{TraceID: "c", TimingSource: "response", QueueMs: 1, PrefillMs: 1}, // no truth
		{TraceID: "d"},
	}, truth)
	assert.Equal(t, 4, c.Kept)
	assert.Equal(t, map[string]int{"response": 2, "engine_span": 1, "none": 1}, c.BySource)
	assert.Equal(t, 2, c.Checked)
	assert.Equal(t, 1, c.Differ)
	assert.Equal(t, []string{"b"}, c.DifferIDs)
}
