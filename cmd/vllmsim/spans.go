// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/otelcol-llm/otelcol-llm/cmd/vllmsim/internal/sim"
)

// spanExporter sends vLLM's llm_request span for every finished request
// (--otlp-traces-endpoint): one SERVER span from arrival to finish,
// parented on the request's traceparent, with vLLM's attribute names
// (SpanAttributes in vllm/tracing) and the simulator's true queue, prefill
// and decode times. Like vLLM's BatchSpanProcessor it sends them in
// batches, every delay (5 s by default) or at 512 spans, over OTLP/HTTP
// (protobuf), as vLLM does with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf.
//
// As an engine Observer it runs under the engine lock: Finished only builds
// the span's data and queues it, dropping it (counted) when the queue is
// full.
type spanExporter struct {
	url    string
	model  string
	delay  time.Duration
	client *http.Client
	logger *log.Logger

	mu      sync.Mutex
	queue   []spanData
	dropped int
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// spanData is what the span of one request holds.
type spanData struct {
	trace                  pcommon.TraceID
	parent                 pcommon.SpanID
	id                     string
	start, end             time.Time
	prompt, completion     int
	maxTokens              int
	queue, prefill, decode time.Duration
	firstToken             time.Duration
}

const (
	spanBatchSize = 512
	spanQueueSize = 2048
)

func newSpanExporter(endpoint, model string, delay time.Duration, logger *log.Logger) (*spanExporter, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("-otlp-traces-endpoint: want an http(s) URL, got %q", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	e := &spanExporter{
		url: u.String(), model: model, delay: delay, client: &http.Client{Timeout: 10 * time.Second},
		logger: logger, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go e.run()
	return e, nil
}

func (e *spanExporter) Started(*sim.Request)          {}
func (e *spanExporter) Token(*sim.Request, sim.Event) {}

func (e *spanExporter) Finished(r *sim.Request, _ string, t time.Time) {
	d := spanData{
		id: r.ID, start: r.Arrival, end: t, prompt: r.Params.PromptTokens, completion: r.Generated(),
		maxTokens: r.Params.MaxTokens,
	}
	d.trace, d.parent = parseTraceparent(r.Params.TraceParent)
	d.queue, d.prefill, d.decode = r.Timing()
	d.firstToken = -1
	if d.queue >= 0 && d.prefill >= 0 {
		d.firstToken = d.queue + d.prefill
	}
	e.mu.Lock()
	if len(e.queue) >= spanQueueSize {
		e.dropped++
	} else {
		e.queue = append(e.queue, d)
	}
	full := len(e.queue) >= spanBatchSize
	e.mu.Unlock()
	if full {
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
}

// parseTraceparent reads a W3C traceparent; without a valid one the span
// starts a trace of its own, as vLLM's does.
func parseTraceparent(tp string) (pcommon.TraceID, pcommon.SpanID) {
	if trace, parent, ok := readTraceparent(tp); ok {
		return trace, parent
	}
	var trace pcommon.TraceID
	_, _ = rand.Read(trace[:])
	return trace, pcommon.SpanID{}
}

// readTraceparent reads the trace and parent IDs of a W3C traceparent; ok
// is false when it is not a valid one.
func readTraceparent(tp string) (trace pcommon.TraceID, parent pcommon.SpanID, ok bool) {
	parts := strings.Split(tp, "-")
	if len(parts) == 4 && len(parts[1]) == 32 && len(parts[2]) == 16 {
		_, err1 := hex.Decode(trace[:], []byte(parts[1]))
		_, err2 := hex.Decode(parent[:], []byte(parts[2]))
		if err1 == nil && err2 == nil {
			return trace, parent, true
		}
	}
	return pcommon.TraceID{}, pcommon.SpanID{}, false
}

func (e *spanExporter) run() {
	defer close(e.done)
	tick := time.NewTicker(e.delay)
	defer tick.Stop()
	for {
		select {
		case <-e.stop:
			e.flush()
			return
		case <-tick.C:
		case <-e.kick:
		}
		e.flush()
	}
}

// flush sends what is queued, a batch at a time.
func (e *spanExporter) flush() {
	for {
		e.mu.Lock()
		n := min(len(e.queue), spanBatchSize)
		batch := append([]spanData(nil), e.queue[:n]...)
		e.queue = append(e.queue[:0], e.queue[n:]...)
		dropped := e.dropped
		e.dropped = 0
		e.mu.Unlock()
		if dropped > 0 {
			e.logger.Printf("otlp traces: %d spans dropped, the queue was full", dropped)
		}
		if n == 0 {
			return
		}
		if err := e.send(batch); err != nil {
			e.logger.Printf("otlp traces: %d spans not sent: %v", n, err)
		}
	}
}

// send exports one batch as an OTLP/HTTP protobuf request.
func (e *spanExporter) send(batch []spanData) error {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "vllm")
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName("vllm.llm_engine")
	for i := range batch {
		d := &batch[i]
		span := ss.Spans().AppendEmpty()
		span.SetName("llm_request")
		span.SetKind(ptrace.SpanKindServer)
		span.SetTraceID(d.trace)
		span.SetParentSpanID(d.parent)
		var id pcommon.SpanID
		_, _ = rand.Read(id[:])
		span.SetSpanID(id)
		span.SetStartTimestamp(pcommon.NewTimestampFromTime(d.start))
		span.SetEndTimestamp(pcommon.NewTimestampFromTime(d.end))
		a := span.Attributes()
		a.PutStr("gen_ai.response.model", e.model)
		a.PutStr("gen_ai.request.id", d.id)
		a.PutInt("gen_ai.request.max_tokens", int64(d.maxTokens))
		a.PutInt("gen_ai.usage.prompt_tokens", int64(d.prompt))
		a.PutInt("gen_ai.usage.completion_tokens", int64(d.completion))
		a.PutDouble("gen_ai.latency.e2e", d.end.Sub(d.start).Seconds())
		for _, l := range [...]struct {
			key string
			d   time.Duration
		}{
			{"gen_ai.latency.time_to_first_token", d.firstToken},
			{"gen_ai.latency.time_in_queue", d.queue},
			{"gen_ai.latency.time_in_model_prefill", d.prefill},
			{"gen_ai.latency.time_in_model_decode", d.decode},
		} {
			if l.d >= 0 {
				a.PutDouble(l.key, l.d.Seconds())
			}
		}
		if d.prefill >= 0 && d.decode >= 0 {
			a.PutDouble("gen_ai.latency.time_in_model_inference", (d.prefill + d.decode).Seconds())
		}
	}
	body, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := e.client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", e.url, resp.Status)
	}
	return nil
}

// close sends what is queued and stops.
func (e *spanExporter) close() {
	close(e.stop)
	<-e.done
}

// timingLog keeps the engine's true split of every finished request and
// writes it as NDJSON when the simulator stops (-timings-out): the truth a
// demo compares the collector's figures with. One line a request: id,
// trace_id (from its traceparent, "" without one: the key to the client's
// and the collector's records of it), finish (stop, length, abort),
// queue_s, prefill_s, decode_s (-1 for a part never reached).
type timingLog struct {
	path string
	mu   sync.Mutex
	recs []timingRecord
}

type timingRecord struct {
	ID       string  `json:"id"`
	TraceID  string  `json:"trace_id"`
	Finish   string  `json:"finish"`
	QueueS   float64 `json:"queue_s"`
	PrefillS float64 `json:"prefill_s"`
	DecodeS  float64 `json:"decode_s"`
}

func (l *timingLog) Started(*sim.Request)          {}
func (l *timingLog) Token(*sim.Request, sim.Event) {}

func (l *timingLog) Finished(r *sim.Request, reason string, _ time.Time) {
	q, p, d := r.Timing()
	sec := func(x time.Duration) float64 {
		if x < 0 {
			return -1
		}
		return x.Seconds()
	}
	var trace string
	if id, _, ok := readTraceparent(r.Params.TraceParent); ok {
		trace = id.String()
	}
	l.mu.Lock()
	l.recs = append(l.recs, timingRecord{ID: r.ID, TraceID: trace, Finish: reason, QueueS: sec(q), PrefillS: sec(p), DecodeS: sec(d)})
	l.mu.Unlock()
}

// close writes the file.
func (l *timingLog) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, r := range l.recs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return os.WriteFile(l.path, b.Bytes(), 0o644)
}

// observers fans the engine's lifecycle out to several observers.
type observers []sim.Observer

func (o observers) Started(r *sim.Request) {
	for _, x := range o {
		x.Started(r)
	}
}

func (o observers) Token(r *sim.Request, ev sim.Event) {
	for _, x := range o {
		x.Token(r, ev)
	}
}

func (o observers) Finished(r *sim.Request, reason string, t time.Time) {
	for _, x := range o {
		x.Finished(r, reason, t)
	}
}
