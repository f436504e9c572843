// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/golden"
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/pdatatest/plogtest"
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/pdatatest/pmetrictest"
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/pdatatest/ptracetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// Golden-file tests of the token_session outputs: the session span, the
// summary and stall alert records, and the session metrics. Regenerate the
// files with
//
//	go test ./processor/tokensessionprocessor/ -run TestGolden -update-golden
//
// (the run that writes them fails on purpose, as golden.WriteX does), then
// read the diff: every figure in them was checked by hand.
var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/golden/*.yaml from the current outputs")

const goldenDir = "testdata/golden"

// Engine times are fixed, far from the collector's clock: the state machine
// only compares engine times with each other, and the idle and freeze checks
// compare the collector's clock with arrival times, never with engine times.
const (
	goldenT0 = int64(1_700_000_000_000_000_000)
	goldenMS = int64(time.Millisecond)
)

// goldenPipes is one token_session in the logs, metrics and traces
// pipelines, each ending in a sink. It does not use the helpers of
// processor_test.go so that the scenarios here stay fixed.
type goldenPipes struct {
	logs    processor.Logs
	metrics processor.Metrics
	traces  processor.Traces
	logSink *consumertest.LogsSink
	metSink *consumertest.MetricsSink
	trcSink *consumertest.TracesSink
	stopped bool
}

// goldenConfig pins every setting the golden figures depend on, so that a
// change of a default does not silently change the scenarios.
func goldenConfig() *Config {
	cfg := createDefaultConfig()
	cfg.PassTokenEvents = PassNone
	cfg.ProviderName = "vllm"
	// Each scenario comes whole: its steps settle at the end of each call.
	cfg.Attribution.SettleAfter, cfg.Attribution.StepJoin = 0, 0
	cfg.Window = 10
	cfg.Stall.Gap = 150 * time.Millisecond
	cfg.Stall.Consecutive = 3
	cfg.Stall.MaxRecords = 8
	// No Tick during a test: stalls come from K slow gaps only, never from
	// the collector-clock freeze check.
	cfg.Stall.CheckInterval = time.Hour
	cfg.Session.IdleTimeout = 5 * time.Minute
	cfg.Sampling.TTFT = 500 * time.Millisecond
	cfg.Sampling.TPOT = 80 * time.Millisecond
	cfg.Sampling.Stalls = true
	cfg.Sampling.Errors = true
	cfg.Sampling.NormalPercent = 0 // only rule-kept sessions
	cfg.Metrics.FlushInterval = time.Hour
	cfg.Metrics.Dimensions = nil
	cfg.Metrics.Temporality = sessionmetrics.Cumulative
	cfg.Metrics.Histogram = sessionmetrics.Explicit
	cfg.Traces.PhaseSpans = false // on in the phase spans' own golden test
	cfg.EngineTiming.ExpectSpans = false
	return cfg
}

func newGoldenPipes(t *testing.T, name string) *goldenPipes {
	t.Helper()
	return newGoldenPipesWith(t, name, nil)
}

// newGoldenPipesWith is newGoldenPipes with goldenConfig changed by mutate
// first.
func newGoldenPipesWith(t *testing.T, name string, mutate func(*Config)) *goldenPipes {
	t.Helper()
	cfg := goldenConfig()
	if mutate != nil {
		mutate(cfg)
	}
	require.NoError(t, cfg.Validate())
	set := processortest.NewNopSettings(metadata.Type)
	set.ID = component.NewIDWithName(metadata.Type, name)
	p := &goldenPipes{logSink: new(consumertest.LogsSink), metSink: new(consumertest.MetricsSink), trcSink: new(consumertest.TracesSink)}
	f := NewFactory()
	ctx := context.Background()
	var err error
	p.logs, err = f.CreateLogs(ctx, set, cfg, p.logSink)
	require.NoError(t, err)
	p.metrics, err = f.CreateMetrics(ctx, set, cfg, p.metSink)
	require.NoError(t, err)
	p.traces, err = f.CreateTraces(ctx, set, cfg, p.trcSink)
	require.NoError(t, err)
	host := componenttest.NewNopHost()
	for _, c := range []component.Component{p.logs, p.metrics, p.traces} {
		require.NoError(t, c.Start(ctx, host))
	}
	t.Cleanup(func() { p.shutdown(t) })
	return p
}

func (p *goldenPipes) shutdown(t *testing.T) {
	if p.stopped {
		return
	}
	p.stopped = true
	for _, c := range []component.Component{p.logs, p.metrics, p.traces} {
		assert.NoError(t, c.Shutdown(context.Background()))
	}
}

func (p *goldenPipes) feed(t *testing.T, evs ...tokenevent.Event) {
	t.Helper()
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), goldenBatch(evs...)))
}

// goldenBatch builds a logs batch the way the token_stream receiver does
// (the sessions' tokens packed into token records).
func goldenBatch(evs ...tokenevent.Event) plog.Logs {
	ld := plog.NewLogs()
	sl := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty()
	w := tokenrecord.NewRecordWriter()
	w.Reset(sl.LogRecords(), 1)
	for i := range evs {
		w.Append(&evs[i])
	}
	w.Flush()
	return ld
}

type goldenStartEvent struct {
	id, model, operation, engine string
	trace                        pcommon.TraceID
	span, parent                 pcommon.SpanID
	promptTokens                 int64
	attrs                        []tokenevent.Attribute
}

func (s goldenStartEvent) at(t int64) tokenevent.Event { //nolint:unparam // the fixtures read as data: a start at t0
	return tokenevent.Event{
		Kind: tokenevent.KindStart, SessionID: s.id, TimeUnixNano: uint64(t),
		TraceID: tokenevent.TraceID(s.trace), SpanID: tokenevent.SpanID(s.span), ParentSpanID: tokenevent.SpanID(s.parent), Model: s.model, Operation: s.operation,
		Engine: s.engine, PromptTokens: s.promptTokens, Attributes: s.attrs, Count: 1, CompletionTokens: -1,
	}
}

func goldenTok(id string, t, count int64) tokenevent.Event {
	return tokenevent.Event{
		Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: uint64(t), Count: count,
		PromptTokens: -1, CompletionTokens: -1,
	}
}

// goldenEnd: completion < 0 means the end event has no completion_tokens.
func goldenEnd(id string, t, completion int64, finish, errType string) tokenevent.Event {
	return tokenevent.Event{
		Kind: tokenevent.KindEnd, SessionID: id, TimeUnixNano: uint64(t), CompletionTokens: completion,
		FinishReason: finish, Error: errType, PromptTokens: -1, Count: 1,
	}
}

// The slow session: TTFT 800 ms (> 500 ms), then decoding at 20 ms per
// token, then three slow gaps of 200, 250 and 300 ms (a stall at the third),
// then 20 ms again; 10 output tokens in 9 chunks, TPOT 870 ms / 9 > 80 ms.
// llm.stall.since_unix_nano is t0+880 ms, the last token before the episode.
var goldenSlow = goldenStartEvent{
	id: "sess-slow", model: "llama-3.1-8b", operation: tokenevent.OperationChat, engine: "vllm-0",
	trace:        pcommon.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	span:         pcommon.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	parent:       pcommon.SpanID{0x53, 0x99, 0x5c, 0x3f, 0x42, 0xcd, 0x8a, 0xd8},
	promptTokens: 512,
	attrs:        []tokenevent.Attribute{{Key: "quantization", Value: "fp8"}},
}

// goldenSlowBatches are the slow session's events as three batches: up to
// the second slow gap (no output yet), the third slow gap (the stall alert),
// and the rest with the end (the summary and the span).
func goldenSlowBatches() [3][]tokenevent.Event {
	id, t0 := goldenSlow.id, goldenT0
	return [3][]tokenevent.Event{
		{
			goldenSlow.at(t0),
			goldenTok(id, t0+800*goldenMS, 1),  // first token: TTFT 800 ms
			goldenTok(id, t0+820*goldenMS, 1),  // gap 20 ms
			goldenTok(id, t0+840*goldenMS, 1),  // gap 20 ms
			goldenTok(id, t0+880*goldenMS, 2),  // 40 ms for 2 tokens: 2 × 20 ms
			goldenTok(id, t0+1080*goldenMS, 1), // slow gap 1: 200 ms
			goldenTok(id, t0+1330*goldenMS, 1), // slow gap 2: 250 ms
		},
		{
			goldenTok(id, t0+1630*goldenMS, 1), // slow gap 3: 300 ms, stall
		},
		{
			goldenTok(id, t0+1650*goldenMS, 1), // 20 ms, the episode ends
			goldenTok(id, t0+1670*goldenMS, 1), // 20 ms, last token
			goldenEnd(id, t0+1700*goldenMS, 10, "stop", ""),
		},
	}
}

func goldenPath(name string) string { return filepath.Join(goldenDir, name) }

func TestGoldenSlowSession(t *testing.T) {
	p := newGoldenPipes(t, "golden_slow_session")
	b := goldenSlowBatches()

	p.feed(t, b[0]...)
	assert.Zero(t, p.logSink.LogRecordCount(), "two slow gaps are not a stall, and the session runs on")
	assert.Zero(t, p.trcSink.SpanCount())

	before := time.Now()
	p.feed(t, b[1]...)
	after := time.Now()
	require.Len(t, p.logSink.AllLogs(), 1, "the stall alert, at once")
	alert := p.logSink.AllLogs()[0]
	goldenAssertObserved(t, alert, before, after)
	assert.Zero(t, p.trcSink.SpanCount())

	before = time.Now()
	p.feed(t, b[2]...)
	after = time.Now()
	require.Len(t, p.logSink.AllLogs(), 2, "the summary")
	summary := p.logSink.AllLogs()[1]
	goldenAssertObserved(t, summary, before, after)
	require.Len(t, p.trcSink.AllTraces(), 1)
	span := p.trcSink.AllTraces()[0]

	compareGoldenLogs(t, goldenPath("slow_session_stall_alert.yaml"), alert)
	compareGoldenLogs(t, goldenPath("slow_session_summary.yaml"), summary)
	compareGoldenTraces(t, goldenPath("slow_session_span.yaml"), span)

	// The ended session is not reported again at shutdown.
	p.shutdown(t)
	assert.Len(t, p.logSink.AllLogs(), 2)
	assert.Len(t, p.trcSink.AllTraces(), 1)
}

// goldenMetricsSessions are six sessions of two models, one batch each; the
// last is still running at shutdown.
//
//	llama-3.1-8b, chat, vllm-0:
//	  A1 sess-slow   the slow session above: completed, kept (ttft,tpot,stall)
//	  A2 sess-fast   TTFT 100 ms, 4 gaps of 25 ms, end at 210 ms, 5 tokens: completed, not kept
//	  A3 sess-error  TTFT 300 ms, one token, end at 350 ms with error server_error: kept (error)
//	qwen2.5-7b, text_completion, vllm-1:
//	  B1 sess-chunky TTFT 40 ms, a chunk of 3 tokens 60 ms later, 1 token 30 ms later, end at 140 ms
//	                 without completion_tokens (5 from the counts), finish length: not kept
//	  B2 sess-abort  TTFT 70 ms, a token 20 ms later, end at 95 ms with finish abort: aborted, not kept
//	  B3 sess-left   TTFT 50 ms, then nothing: ended by the shutdown, not kept
func goldenMetricsSessions() [][]tokenevent.Event {
	t0 := goldenT0
	llama := func(id string, trace byte, prompt int64) goldenStartEvent {
		return goldenStartEvent{
			id: id, model: "llama-3.1-8b", operation: tokenevent.OperationChat, engine: "vllm-0",
			trace: pcommon.TraceID{0xa0, trace}, span: pcommon.SpanID{0xa0, trace}, promptTokens: prompt,
			attrs: []tokenevent.Attribute{{Key: "quantization", Value: "fp8"}},
		}
	}
	qwen := func(id string, trace byte, prompt int64) goldenStartEvent {
		return goldenStartEvent{
			id: id, model: "qwen2.5-7b", operation: tokenevent.OperationTextCompletion, engine: "vllm-1",
			trace: pcommon.TraceID{0xb0, trace}, span: pcommon.SpanID{0xb0, trace}, promptTokens: prompt,
		}
	}
	b := goldenSlowBatches()
	slow := append(append(append([]tokenevent.Event(nil), b[0]...), b[1]...), b[2]...)
	return [][]tokenevent.Event{
		slow,
		{
			llama("sess-fast", 2, 128).at(t0),
			goldenTok("sess-fast", t0+100*goldenMS, 1),
			goldenTok("sess-fast", t0+125*goldenMS, 1),
			goldenTok("sess-fast", t0+150*goldenMS, 1),
			goldenTok("sess-fast", t0+175*goldenMS, 1),
			goldenTok("sess-fast", t0+200*goldenMS, 1),
			goldenEnd("sess-fast", t0+210*goldenMS, 5, "stop", ""),
		},
		{
			llama("sess-error", 3, 64).at(t0),
			goldenTok("sess-error", t0+300*goldenMS, 1),
			goldenEnd("sess-error", t0+350*goldenMS, 1, "", "server_error"),
		},
		{
			qwen("sess-chunky", 1, 32).at(t0),
			goldenTok("sess-chunky", t0+40*goldenMS, 1),
			goldenTok("sess-chunky", t0+100*goldenMS, 3),
			goldenTok("sess-chunky", t0+130*goldenMS, 1),
			goldenEnd("sess-chunky", t0+140*goldenMS, -1, "length", ""),
		},
		{
			qwen("sess-abort", 2, 16).at(t0),
			goldenTok("sess-abort", t0+70*goldenMS, 1),
			goldenTok("sess-abort", t0+90*goldenMS, 1),
			goldenEnd("sess-abort", t0+95*goldenMS, -1, "abort", ""),
		},
		{
			qwen("sess-left", 3, 8).at(t0),
			goldenTok("sess-left", t0+50*goldenMS, 1),
		},
	}
}

func TestGoldenMetricsFlush(t *testing.T) {
	created := time.Now()
	p := newGoldenPipes(t, "golden_metrics_flush")
	for _, s := range goldenMetricsSessions() {
		p.feed(t, s...)
	}
	assert.Zero(t, p.metSink.DataPointCount(), "nothing before the flush")
	before := time.Now()
	p.shutdown(t)
	after := time.Now()
	require.Len(t, p.metSink.AllMetrics(), 1, "one flush, at shutdown")
	md := p.metSink.AllMetrics()[0]
	goldenAssertWallClock(t, md, created, before, after)
	compareGoldenMetrics(t, goldenPath("metrics_flush.yaml"), md)

	// The kept sessions: A1 (ttft,tpot,stall) and A3 (error).
	assert.Len(t, goldenRecordsNamed(p.logSink.AllLogs(), eventNameSummary), 2)
	assert.Len(t, goldenRecordsNamed(p.logSink.AllLogs(), eventNameStall), 1)
	assert.Equal(t, 2, p.trcSink.SpanCount())
}

func goldenRecordsNamed(lds []plog.Logs, name string) []plog.LogRecord {
	var out []plog.LogRecord
	for _, ld := range lds {
		for _, rl := range ld.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					if lr.EventName() == name {
						out = append(out, lr)
					}
				}
			}
		}
	}
	return out
}

// goldenAssertObserved checks the one collector-clock field of the records.
func goldenAssertObserved(t *testing.T, ld plog.Logs, before, after time.Time) {
	t.Helper()
	for _, rl := range ld.ResourceLogs().All() {
		for _, sl := range rl.ScopeLogs().All() {
			for _, lr := range sl.LogRecords().All() {
				ts := lr.ObservedTimestamp().AsTime()
				assert.False(t, ts.Before(before) || ts.After(after), "observed timestamp %v not within [%v, %v]", ts, before, after)
			}
		}
	}
}

// goldenAssertWallClock checks the timestamps the golden comparison
// ignores: every point is stamped with the flush time, every sum and
// histogram point starts when the processor was created, and the gauge has
// no start.
func goldenAssertWallClock(t *testing.T, md pmetric.Metrics, created, before, after time.Time) {
	t.Helper()
	within := func(what string, ts pcommon.Timestamp, from, to time.Time) {
		tt := ts.AsTime()
		assert.False(t, tt.Before(from) || tt.After(to), "%s %v not within [%v, %v]", what, tt, from, to)
	}
	goldenForEachPoint(md, func(name string, dp goldenPointTimes, isGauge bool) {
		within(name+" timestamp", dp.Timestamp(), before, after)
		if isGauge {
			assert.Zero(t, dp.StartTimestamp(), "%s: a gauge has no start timestamp", name)
			return
		}
		within(name+" start timestamp", dp.StartTimestamp(), created, before)
	})
}

// goldenPointTimes are the timestamps of a data point of any type.
type goldenPointTimes interface {
	StartTimestamp() pcommon.Timestamp
	Timestamp() pcommon.Timestamp
	SetStartTimestamp(pcommon.Timestamp)
	SetTimestamp(pcommon.Timestamp)
}

func goldenForEachPoint(md pmetric.Metrics, fn func(name string, dp goldenPointTimes, isGauge bool)) {
	for _, rm := range md.ResourceMetrics().All() {
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				switch m.Type() {
				case pmetric.MetricTypeGauge:
					for _, dp := range m.Gauge().DataPoints().All() {
						fn(m.Name(), dp, true)
					}
				case pmetric.MetricTypeSum:
					for _, dp := range m.Sum().DataPoints().All() {
						fn(m.Name(), dp, false)
					}
				case pmetric.MetricTypeHistogram:
					for _, dp := range m.Histogram().DataPoints().All() {
						fn(m.Name(), dp, false)
					}
				case pmetric.MetricTypeExponentialHistogram:
					for _, dp := range m.ExponentialHistogram().DataPoints().All() {
						fn(m.Name(), dp, false)
					}
				case pmetric.MetricTypeSummary:
					for _, dp := range m.Summary().DataPoints().All() {
						fn(m.Name(), dp, false)
					}
				}
			}
		}
	}
}

func compareGoldenTraces(t *testing.T, path string, actual ptrace.Traces) {
	t.Helper()
	if *updateGolden {
		require.NoError(t, os.MkdirAll(goldenDir, 0o755))
		require.NoError(t, golden.WriteTraces(t, path, actual))
	}
	expected, err := golden.ReadTraces(path)
	require.NoError(t, err)
	// Every field is deterministic: times come from the engine events.
	require.NoError(t, ptracetest.CompareTraces(expected, actual), path)
	// CompareTraces does not look at the span flags.
	assert.Equal(t, goldenSpanFlags(expected), goldenSpanFlags(actual), path)
}

func goldenSpanFlags(td ptrace.Traces) []uint32 {
	var out []uint32
	for _, rs := range td.ResourceSpans().All() {
		for _, ss := range rs.ScopeSpans().All() {
			for _, span := range ss.Spans().All() {
				out = append(out, span.Flags())
			}
		}
	}
	return out
}

func compareGoldenLogs(t *testing.T, path string, actual plog.Logs) {
	t.Helper()
	if *updateGolden {
		// The observed timestamp is the collector's clock: written as 0 so
		// that the file does not change from one run to the next.
		w := plog.NewLogs()
		actual.CopyTo(w)
		for _, rl := range w.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					lr.SetObservedTimestamp(0)
				}
			}
		}
		require.NoError(t, os.MkdirAll(goldenDir, 0o755))
		require.NoError(t, golden.WriteLogs(t, path, w))
	}
	expected, err := golden.ReadLogs(path)
	require.NoError(t, err)
	require.NoError(t, plogtest.CompareLogs(expected, actual, plogtest.IgnoreObservedTimestamp()), path)
	// CompareLogs does not look at the event names; the records are in the
	// same order once it passed.
	assert.Equal(t, goldenEventNames(expected), goldenEventNames(actual), path)
}

func goldenEventNames(ld plog.Logs) []string {
	var out []string
	for _, rl := range ld.ResourceLogs().All() {
		for _, sl := range rl.ScopeLogs().All() {
			for _, lr := range sl.LogRecords().All() {
				out = append(out, lr.EventName())
			}
		}
	}
	return out
}

// compareGoldenMetrics compares everything but the wall-clock timestamps
// (the flush time, and the processor's creation time as the start), the
// data point order included: points come in series creation order.
func compareGoldenMetrics(t *testing.T, path string, actual pmetric.Metrics) {
	t.Helper()
	if *updateGolden {
		// golden.WriteMetrics sorts the points by attributes, which would
		// lose their order; write the points as emitted, with the
		// wall-clock timestamps as 0.
		w := pmetric.NewMetrics()
		actual.CopyTo(w)
		goldenForEachPoint(w, func(_ string, dp goldenPointTimes, _ bool) {
			dp.SetStartTimestamp(0)
			dp.SetTimestamp(0)
		})
		b, err := golden.MarshalMetricsYAML(w)
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(goldenDir, 0o755))
		require.NoError(t, os.WriteFile(path, b, 0o600))
		t.Errorf("golden file %s written; run again without -update-golden", path)
	}
	expected, err := golden.ReadMetrics(path)
	require.NoError(t, err)
	require.NoError(t, pmetrictest.CompareMetrics(expected, actual,
		pmetrictest.IgnoreTimestamp(), pmetrictest.IgnoreStartTimestamp()), path)
}
