// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otelcol-llm/otelcol-llm/internal/exphist"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/otlpsink"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
)

// Names of what the sink picks out of the collector's output.
const (
	metricSessions    = sessionmetrics.MetricSessions
	metricStalls      = sessionmetrics.MetricStalls
	metricTTFT        = sessionmetrics.MetricTimeToFirstToken
	metricTPOT        = sessionmetrics.MetricTimePerOutputTok
	metricQueue       = sessionmetrics.MetricQueueTime
	metricPrefill     = sessionmetrics.MetricPrefillTime
	metricKVUsage     = "vllm:kv_cache_usage_perc"
	metricPreemptions = "vllm:num_preemptions_total"
	metricWaiting     = "vllm:num_requests_waiting"
	eventStall        = tokenrecord.EventNameStall
	eventSummary      = tokenrecord.EventNameSummary
	// The processor's other spans: the phases of a kept session (their
	// names begin so) and the verdict span.
	phaseSpanPrefix = "llm.session."
	verdictSpanName = "llm.session.verdict"
)

// Sample is one scraped engine value.
type Sample struct {
	T float64 `json:"t"` // seconds since the load started
	V float64 `json:"v"`
	// at is the absolute time; T is filled in against the load's start.
	at time.Time
}

// Span is what the report needs of one session span.
type Span struct {
	TraceID        string  `json:"trace_id"`
	TTFTms         float64 `json:"ttft_ms"`
	TPOTms         float64 `json:"tpot_ms"`
	Outcome        string  `json:"outcome"`
	SamplingReason string  `json:"sampling_reason"`
	Stalls         int64   `json:"stalls"`
	// TimingSource is llm.session.timing_source ("" without the engine's
	// split); QueueMs and PrefillMs the split.
	TimingSource string  `json:"timing_source,omitempty"`
	QueueMs      float64 `json:"queue_ms,omitempty"`
	PrefillMs    float64 `json:"prefill_ms,omitempty"`
	// Phases are the names of its phase spans (traces::phase_spans).
	Phases []string `json:"phases,omitempty"`
	spanID string
	// EngineTimeS is the session's share of its engine's busy time;
	// EndUnixNano its end.
	EngineTimeS float64 `json:"engine_time_s,omitempty"`
	EndUnixNano int64   `json:"end_unix_nano,omitempty"`
	// DecodeMs is the engine's decode time, OutputTokens the session's
	// output tokens (make demo-real: llama.cpp's TPOT).
	DecodeMs     float64 `json:"decode_ms,omitempty"`
	OutputTokens int64   `json:"output_tokens,omitempty"`
	// WaitingStart is the requests waiting for the engine when the session
	// started (<prefix>.num_requests_waiting.start), -1 without it.
	WaitingStart float64 `json:"waiting_start"`
}

// StallAlert is one llm.session.stall record.
type StallAlert struct {
	T       float64 `json:"t"` // seconds since the load started
	TraceID string  `json:"trace_id"`
	KVUsage float64 `json:"kv_usage"` // vllm.kv_cache_usage when detected; -1 if absent
	at      time.Time
}

// sink is the demo's OTLP/HTTP backend (protobuf, optionally gzip): it
// keeps the figures the report is made of. Cumulative metrics are kept as
// their latest value per attribute set.
type sink struct {
	otlp *otlpsink.Sink

	mu         sync.Mutex
	sessions   map[string]float64 // attribute set -> latest cumulative count
	outcomes   map[string]string  // attribute set -> its llm.session.outcome
	stalls     map[string]float64
	ttft, tpot map[string]exphist.Histogram
	// queue and prefill are the engine's split, as token_session reports it.
	queue, prefill map[string]exphist.Histogram
	kv             []Sample
	preemptions    []Sample
	waiting        []Sample
	spans          []Span
	// phases are the phase spans' names by their parent, a session span.
	phases map[string][]string
	alerts []StallAlert
	// engineTime and engineEnergy are the latest llm.engine.time and
	// llm.engine.energy by "tenant/state".
	engineTime, engineEnergy map[string]float64
	summaries                int
}

func startSink() (*sink, error) {
	s := &sink{
		sessions: map[string]float64{}, outcomes: map[string]string{}, stalls: map[string]float64{},
		ttft: map[string]exphist.Histogram{}, tpot: map[string]exphist.Histogram{},
		queue: map[string]exphist.Histogram{}, prefill: map[string]exphist.Histogram{},
		phases:     map[string][]string{},
		engineTime: map[string]float64{}, engineEnergy: map[string]float64{},
	}
	otlp, err := otlpsink.Start("127.0.0.1:0", otlpsink.Options{HTTP: true, OnMetrics: s.metrics, OnTraces: s.traces, OnLogs: s.logs})
	if err != nil {
		return nil, err
	}
	s.otlp = otlp
	return s, nil
}

func (s *sink) url() string { return s.otlp.URL() }

func (s *sink) close() { s.otlp.Close() }

func attrKey(m pcommon.Map) string {
	parts := make([]string, 0, m.Len())
	for k, v := range m.All() {
		parts = append(parts, k+"="+v.AsString())
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (s *sink) metrics(md pmetric.Metrics) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rm := range md.ResourceMetrics().All() {
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				s.metric(m)
			}
		}
	}
}

// metric takes one metric; called with s.mu held.
func (s *sink) metric(m pmetric.Metric) {
	switch m.Name() {
	case metricSessions, metricStalls:
		if m.Type() != pmetric.MetricTypeSum {
			return
		}
		for _, dp := range m.Sum().DataPoints().All() {
			key := attrKey(dp.Attributes())
			if m.Name() == metricStalls {
				s.stalls[key] = dp.DoubleValue() + float64(dp.IntValue())
				continue
			}
			s.sessions[key] = float64(dp.IntValue()) + dp.DoubleValue()
			if o, ok := dp.Attributes().Get("llm.session.outcome"); ok {
				s.outcomes[key] = o.Str()
			}
		}
	case metricTTFT, metricTPOT, metricQueue, metricPrefill:
		if m.Type() != pmetric.MetricTypeExponentialHistogram {
			return
		}
		dst := map[string]map[string]exphist.Histogram{metricTTFT: s.ttft, metricTPOT: s.tpot, metricQueue: s.queue, metricPrefill: s.prefill}[m.Name()]
		for _, dp := range m.ExponentialHistogram().DataPoints().All() {
			dst[attrKey(dp.Attributes())] = exphist.Of(dp)
		}
	case metricKVUsage, metricWaiting:
		if m.Type() != pmetric.MetricTypeGauge {
			return
		}
		for _, dp := range m.Gauge().DataPoints().All() {
			smp := Sample{at: dp.Timestamp().AsTime(), V: dp.DoubleValue() + float64(dp.IntValue())}
			if m.Name() == metricKVUsage {
				s.kv = append(s.kv, smp)
			} else {
				s.waiting = append(s.waiting, smp)
			}
		}
	case metricEngineTime, metricEngineEnergy:
		if m.Type() != pmetric.MetricTypeSum {
			return
		}
		dst := s.engineTime
		if m.Name() == metricEngineEnergy {
			dst = s.engineEnergy
		}
		for _, dp := range m.Sum().DataPoints().All() {
			dst[attrStr(dp.Attributes(), "llm.tenant")+"/"+attrStr(dp.Attributes(), "state")] = dp.DoubleValue()
		}
	case metricPreemptions:
		if m.Type() != pmetric.MetricTypeSum {
			return
		}
		for _, dp := range m.Sum().DataPoints().All() {
			s.preemptions = append(s.preemptions, Sample{at: dp.Timestamp().AsTime(), V: dp.DoubleValue() + float64(dp.IntValue())})
		}
	}
}

func (s *sink) traces(td ptrace.Traces) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range td.ResourceSpans().All() {
		for _, ss := range rs.ScopeSpans().All() {
			for _, sp := range ss.Spans().All() {
				a := sp.Attributes()
				if strings.HasPrefix(sp.Name(), phaseSpanPrefix) && sp.Name() != verdictSpanName {
					s.phases[sp.ParentSpanID().String()] = append(s.phases[sp.ParentSpanID().String()], sp.Name())
					continue
				}
				if _, ok := a.Get("llm.session.id"); !ok || sp.Name() == verdictSpanName {
					continue // not a session span
				}
				s.spans = append(s.spans, Span{
					TraceID:        sp.TraceID().String(),
					TTFTms:         attrFloat(a, "llm.session.ttft") * 1000,
					TPOTms:         attrFloat(a, "llm.session.tpot") * 1000,
					Outcome:        attrStr(a, "llm.session.outcome"),
					SamplingReason: attrStr(a, "llm.session.sampling.reason"),
					Stalls:         attrInt(a, "llm.session.stalls"),
					TimingSource:   attrStr(a, "llm.session.timing_source"),
					QueueMs:        attrFloat(a, "llm.session.queue_time") * 1000,
					PrefillMs:      attrFloat(a, "llm.session.prefill_time") * 1000,
					spanID:         sp.SpanID().String(),
					EngineTimeS:    attrFloat(a, "llm.session.engine_time"),
					EndUnixNano:    int64(sp.EndTimestamp()),
					DecodeMs:       attrFloat(a, "llm.session.decode_time") * 1000,
					OutputTokens:   attrInt(a, "gen_ai.usage.output_tokens"),
					WaitingStart:   waitingStart(a),
				})
			}
		}
	}
}

func (s *sink) logs(ld plog.Logs) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rl := range ld.ResourceLogs().All() {
		for _, sl := range rl.ScopeLogs().All() {
			for _, lr := range sl.LogRecords().All() {
				switch lr.EventName() {
				case eventStall:
					kv := -1.0
					if v, ok := lr.Attributes().Get("vllm.kv_cache_usage"); ok {
						kv = v.Double()
					}
					s.alerts = append(s.alerts, StallAlert{at: lr.Timestamp().AsTime(), TraceID: lr.TraceID().String(), KVUsage: kv})
				case eventSummary:
					s.summaries++
				}
			}
		}
	}
}

// waitingStart is the session's <engine>.num_requests_waiting.start
// (vllm., llamacpp., …), -1 without one.
func waitingStart(m pcommon.Map) float64 {
	for k, v := range m.All() {
		if strings.HasSuffix(k, ".num_requests_waiting.start") {
			return v.Double()
		}
	}
	return -1
}

func attrFloat(m pcommon.Map, k string) float64 {
	if v, ok := m.Get(k); ok {
		return v.Double()
	}
	return 0
}

func attrInt(m pcommon.Map, k string) int64 {
	if v, ok := m.Get(k); ok {
		return v.Int()
	}
	return 0
}

func attrStr(m pcommon.Map, k string) string {
	if v, ok := m.Get(k); ok {
		return v.AsString()
	}
	return ""
}

// sessionCount is the number of sessions counted so far, all outcomes.
// spansByTrace returns the session spans so far by trace ID.
func (s *sink) spansByTrace() map[string]Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Span, len(s.spans))
	for _, sp := range s.spans {
		out[sp.TraceID] = sp
	}
	return out
}

func (s *sink) sessionCount() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n float64
	for _, v := range s.sessions {
		n += v
	}
	return n
}

// waitSessions waits until the collector has counted want sessions (its
// metrics are flushed every second), or the timeout passes.
func (s *sink) waitSessions(ctx context.Context, want float64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for s.sessionCount() < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("the collector counted %g sessions of %g within %s", s.sessionCount(), want, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// CollectorFigures are the collector-side results of one point, read from
// what it exported.
type CollectorFigures struct {
	Sessions          float64            `json:"sessions"`           // llm.sessions, all outcomes
	SessionsCompleted float64            `json:"sessions_completed"` // llm.sessions{outcome=completed}
	SessionsByOutcome map[string]float64 `json:"sessions_by_outcome"`
	TTFT              Quantiles
	TPOT              Quantiles
	// Queue and Prefill are the engine's split of TTFT, as token_session
	// joined it to the sessions (llm.session.queue_time, prefill_time).
	Queue   Quantiles `json:"queue"`
	Prefill Quantiles `json:"prefill"`
	// SplitSessions are the sessions with the engine's split: the count of
	// the queue_time histogram.
	SplitSessions float64 `json:"split_sessions"`
	// TTFTBucketWidth is the relative width of the TTFT histogram's buckets
	// (base − 1): the bound of its quantiles' error; as the others'.
	TTFTBucketWidth    float64        `json:"ttft_bucket_width"`
	TPOTBucketWidth    float64        `json:"tpot_bucket_width"`
	QueueBucketWidth   float64        `json:"queue_bucket_width"`
	PrefillBucketWidth float64        `json:"prefill_bucket_width"`
	Spans              []Span         `json:"spans"`
	SpansKept          int            `json:"spans_kept"`
	SpansByReason      map[string]int `json:"spans_by_reason"`
	Summaries          int            `json:"summaries"`
	StallEpisodes      float64        `json:"stall_episodes"` // llm.session.stalls
	StallAlerts        []StallAlert   `json:"stall_alerts"`
	KVUsage            []Sample       `json:"kv_usage"`
	Preemptions        []Sample       `json:"preemptions"` // vllm:num_preemptions_total as scraped
	Waiting            []Sample       `json:"waiting"`
	MaxKVUsage         float64        `json:"max_kv_usage"`
	PreemptionCount    float64        `json:"preemption_count"` // the counter's last value
	BadRequests        int            `json:"bad_otlp_requests"`
	// BadRequestErrors: why the first of them were refused.
	BadRequestErrors []string `json:"bad_otlp_request_errors,omitempty"`
	ttftHist         exphist.Histogram
	tpotHist         exphist.Histogram
}

// Quantiles are p50 and p99 in ms; NaN when there was nothing to measure.
type Quantiles struct {
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
}

// MarshalJSON writes a NaN quantile as null, which JSON has and NaN not.
func (q Quantiles) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"p50_ms": orNull(q.P50), "p99_ms": orNull(q.P99)})
}

// UnmarshalJSON reads what MarshalJSON wrote, null as NaN.
func (q *Quantiles) UnmarshalJSON(b []byte) error {
	var raw struct {
		P50 *float64 `json:"p50_ms"`
		P99 *float64 `json:"p99_ms"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	q.P50, q.P99 = math.NaN(), math.NaN()
	if raw.P50 != nil {
		q.P50 = *raw.P50
	}
	if raw.P99 != nil {
		q.P99 = *raw.P99
	}
	return nil
}

// figures summarizes what the sink holds, times relative to start.
func (s *sink) figures(start time.Time) CollectorFigures {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := CollectorFigures{SpansByReason: map[string]int{}, Summaries: s.summaries}
	f.BadRequests, f.BadRequestErrors = s.otlp.Refused()
	f.SessionsByOutcome = map[string]float64{}
	for k, v := range s.sessions {
		f.Sessions += v
		f.SessionsByOutcome[s.outcomes[k]] += v
	}
	f.SessionsCompleted = f.SessionsByOutcome["completed"]
	for _, v := range s.stalls {
		f.StallEpisodes += v
	}
	for _, k := range slices.Sorted(maps.Keys(s.ttft)) {
		f.ttftHist = f.ttftHist.Merge(s.ttft[k])
	}
	for _, k := range slices.Sorted(maps.Keys(s.tpot)) {
		f.tpotHist = f.tpotHist.Merge(s.tpot[k])
	}
	f.TTFT = Quantiles{P50: f.ttftHist.Quantile(0.5) * 1000, P99: f.ttftHist.Quantile(0.99) * 1000}
	f.TPOT = Quantiles{P50: f.tpotHist.Quantile(0.5) * 1000, P99: f.tpotHist.Quantile(0.99) * 1000}
	f.TTFTBucketWidth, f.TPOTBucketWidth = f.ttftHist.RelativeBucketWidth(), f.tpotHist.RelativeBucketWidth()
	merged := func(m map[string]exphist.Histogram) (Quantiles, exphist.Histogram) {
		var h exphist.Histogram
		for _, k := range slices.Sorted(maps.Keys(m)) {
			h = h.Merge(m[k])
		}
		if h.Count == 0 {
			return Quantiles{P50: math.NaN(), P99: math.NaN()}, h
		}
		return Quantiles{P50: h.Quantile(0.5) * 1000, P99: h.Quantile(0.99) * 1000}, h
	}
	var qh, ph exphist.Histogram
	f.Queue, qh = merged(s.queue)
	f.Prefill, ph = merged(s.prefill)
	f.SplitSessions = float64(qh.Count)
	f.QueueBucketWidth, f.PrefillBucketWidth = qh.RelativeBucketWidth(), ph.RelativeBucketWidth()
	f.Spans = slices.Clone(s.spans)
	for i := range f.Spans {
		f.Spans[i].Phases = slices.Clone(s.phases[f.Spans[i].spanID])
	}
	f.SpansKept = len(s.spans)
	for _, sp := range s.spans {
		f.SpansByReason[sp.SamplingReason]++
	}
	rel := func(t time.Time) float64 { return t.Sub(start).Seconds() }
	for _, a := range s.alerts {
		a.T = rel(a.at)
		f.StallAlerts = append(f.StallAlerts, a)
	}
	sort.Slice(f.StallAlerts, func(i, j int) bool { return f.StallAlerts[i].T < f.StallAlerts[j].T })
	series := func(in []Sample) []Sample {
		out := make([]Sample, len(in))
		for i, smp := range in {
			smp.T = rel(smp.at)
			out[i] = smp
		}
		sort.Slice(out, func(i, j int) bool { return out[i].T < out[j].T })
		return out
	}
	f.KVUsage, f.Preemptions, f.Waiting = series(s.kv), series(s.preemptions), series(s.waiting)
	for _, smp := range f.KVUsage {
		f.MaxKVUsage = max(f.MaxKVUsage, smp.V)
	}
	if n := len(f.Preemptions); n > 0 {
		f.PreemptionCount = f.Preemptions[n-1].V
	}
	return f
}

// engineShares returns copies of the latest llm.engine.time and
// llm.engine.energy points by "tenant/state".
func (s *sink) engineShares() (engineTime, engineEnergy map[string]float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.engineTime), maps.Clone(s.engineEnergy)
}
