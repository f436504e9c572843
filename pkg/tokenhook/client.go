// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// The event model is pkg/tokenevent's, the wire schema v1 of the
// token_stream receiver (free of pdata and of the collector); these names
// are its own, so that a hook needs one import.
type (
	// Event is one token event, as the receiver parses it from a line.
	// Which fields count depends on Kind; the others are ignored.
	// PromptTokens and CompletionTokens hold -1 when absent, zero IDs and
	// empty strings are absent, and a token event's Count is at least 1.
	Event = tokenevent.Event
	// Kind says which of the four events an Event is.
	Kind = tokenevent.Kind
	// TraceID and SpanID are W3C trace context IDs.
	TraceID = tokenevent.TraceID
	SpanID  = tokenevent.SpanID
	// Attribute is one of a start event's free-form string attributes.
	Attribute = tokenevent.Attribute
	// FieldError is the error for an invalid event: the wire field at
	// fault and why.
	FieldError = tokenevent.FieldError
)

// Event kinds.
const (
	KindStart = tokenevent.KindStart
	KindToken = tokenevent.KindToken
	KindEnd   = tokenevent.KindEnd
	KindShare = tokenevent.KindShare
)

// AttrEngineRequestID is the start attribute that names the engine's own id
// of the request, the id a Share carries: set it in Start.Attributes when
// another process sends the request's share.
const AttrEngineRequestID = tokenevent.AttrEngineRequestID

// Operation values for Event.Operation and Start.Operation (GenAI semconv
// gen_ai.operation.name).
const (
	OperationChat           = tokenevent.OperationChat
	OperationTextCompletion = tokenevent.OperationTextCompletion
)

// Start holds the fields of a start Event in Go terms (a time.Time, a
// flag for the optional prompt count), for Client.Start. Zero fields are
// not sent.
type Start struct {
	// SessionID identifies the session in its Token and End events. Required.
	SessionID string
	// Time is when the engine received the request; zero means now.
	Time         time.Time
	TraceID      [16]byte
	SpanID       [8]byte
	ParentSpanID [8]byte
	Model        string
	// Operation is OperationChat, OperationTextCompletion or empty.
	Operation string
	// PromptTokens is sent only when HasPromptTokens is set, since 0 is a
	// valid count.
	PromptTokens    int
	HasPromptTokens bool
	// Engine names the engine instance.
	Engine string
	// Attributes are free-form string attributes, e.g. "quantization".
	// Start copies them; keys must not be empty.
	Attributes map[string]string
	// NoStream marks a request that asked for one whole response (sent as
	// "stream": false): its session gets no TTFT, TPOT or gaps.
	NoStream bool
	// TraceState is the caller's W3C tracestate header, if any: its
	// sampling entries (ot=rv, th) take part in the session's sampling.
	TraceState string
}

// End holds the fields of an end Event in Go terms, for Client.End. Zero
// fields are not sent.
type End struct {
	// SessionID is the ID given to Start. Required.
	SessionID string
	// Time is when the session ended; zero means now.
	Time time.Time
	// CompletionTokens is sent only when HasCompletionTokens is set.
	CompletionTokens    int
	HasCompletionTokens bool
	// FinishReason is the engine's finish reason, e.g. "stop" or "length".
	FinishReason string
	// Error is the error type when the session failed.
	Error string
	// ResponseModel is the model that answered, when it differs from the
	// request's (an alias resolved, a LoRA adapter).
	ResponseModel string
	// The engine's own split of the request's time, sent when HasTiming is
	// set: waiting in its queue, in prefill (scheduled to first token), in
	// decode (first to last token). A negative part is not sent.
	QueueTime, PrefillTime, DecodeTime time.Duration
	HasTiming                          bool
	// The request's share of the engine's busy time, as the engine
	// computed it from its steps (each step's time split among its requests
	// by the tokens each computed in it), sent when HasEngineTime is set;
	// EnergyJ, its share of the GPU's energy, when HasEnergy is set too.
	EnginePrefill, EngineDecode time.Duration
	HasEngineTime               bool
	EnergyJ                     float64
	HasEnergy                   bool
}

// Share holds the fields of a share Event in Go terms, for Client.Share:
// a request's share of the engine's busy time, sent by the process that
// sees the engine's steps when it is not the one that sends the request's
// session (vLLM's engine core, beside its API server).
type Share struct {
	// EngineRequestID is the engine's own id of the request, which the
	// session's Start names in its Attributes under AttrEngineRequestID;
	// the collector joins the two by it. Required.
	EngineRequestID string
	// Time is when the share was complete; zero means now.
	Time time.Time
	// Engine names the engine instance.
	Engine string
	// The request's share of the engine's busy time, prefill and decode, as
	// on End (a negative part is sent as 0); EnergyJ its share of the GPU's
	// energy, sent when HasEnergy is set.
	EnginePrefill, EngineDecode time.Duration
	EnergyJ                     float64
	HasEnergy                   bool
}

// Stats counts what happened to the events a Client took: each counts in
// exactly one field, so once Close has returned, the sum is the number of
// Start, Token, End, Share and Send calls that returned nil (invalid events are
// refused at the call and counted nowhere).
type Stats struct {
	// Sent counts events handed over: accepted by the receiver (HTTP) or
	// written in a datagram (UDP, which has no acknowledgement).
	Sent uint64
	// Dropped counts events never queued: the queue was full, or Close had
	// been called.
	Dropped uint64
	// Failed counts events whose send failed: a transport error or
	// timeout, a non-2xx HTTP status (but for the lines the answer names as
	// rejected), or Close giving up.
	Failed uint64
	// Rejected counts events whose line the receiver rejected (the
	// "rejected" count of its answer), or that the client did not send
	// since their line is longer than MaxBatchBytes or than the receiver's
	// line limit.
	Rejected uint64
}

// Client sends token events to a token_stream receiver. Its methods are safe
// for concurrent use, and a nil *Client ignores every call, so an engine can
// leave its hook nil when telemetry is off.
type Client struct {
	queue   chan item
	wakeAt  int           // queue length at which callers signal wake
	wake    chan struct{} // capacity 1: a pending signal is enough
	closed  atomic.Bool
	dropped atomic.Uint64
	// The other counters are written by the background goroutine; keep
	// them off the line callers write.
	_ [64]byte
	settled

	stopOnce sync.Once
	stop     chan struct{} // closed by Close: drain, flush, exit
	done     chan struct{} // closed by the background goroutine on exit
	abort    func()        // makes pending and future sends fail at once
}

// item is one queued event. Token events travel as values; start and end
// events, which are rare, as a pointer to the wire event.
type item struct {
	ev    *tokenevent.Event // nil for a token event
	sid   string
	t     int64
	count int64
}

// New validates cfg, opens the UDP socket or prepares the HTTP client, and
// starts the background goroutine. A Unix socket is connected at the first
// send, and again after the connection is lost: the collector may start
// after the engine, and restart. Call Close to stop it.
func New(cfg Config) (*Client, error) {
	s, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		queue:  make(chan item, s.queueSize),
		wakeAt: max(s.queueSize/2, 1),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	var snd sender
	switch {
	case s.unix != "":
		snd = newStreamSender(s.unix, s.timeout, &c.settled)
	case s.udp:
		conn, err := net.Dial("udp", s.addr)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("tokenhook: Endpoint: %w", err)
		}
		snd = &udpSender{conn: conn}
	default:
		hs := &httpSender{ctx: ctx, url: s.url, headers: s.headers, client: s.httpClient}
		if hs.client == nil {
			hs.client = newHTTPClient(s.timeout)
			hs.owned = true
		}
		snd = hs
	}
	c.abort = func() { cancel(); snd.abort() }
	w := &worker{
		c: c, snd: snd, flushInterval: s.flushInterval,
		maxLineBytes: min(s.maxBatchBytes, tokenevent.DefaultMaxLineBytes+1), maxBatchBytes: s.maxBatchBytes, maxBatchLines: s.maxBatchLines,
	}
	go func() {
		defer close(c.done)
		defer cancel()
		defer snd.close()
		w.run()
	}()
	return c, nil
}

// newHTTPClient returns the client a Config without HTTPClient gets: a
// private connection pool (so Close can close its idle connections), no
// proxy and no redirects. The collector runs next to the engine, so an
// HTTP(S)_PROXY meant for outside traffic must not take the events, and a
// redirect is a misconfigured endpoint to report, not to follow.
func newHTTPClient(timeout time.Duration) *http.Client {
	tr := &http.Transport{ForceAttemptHTTP2: true}
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		tr = dt.Clone()
	}
	tr.Proxy = nil
	return &http.Client{
		Transport:     tr,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Token records a chunk of count tokens (at least 1) streamed at t (zero
// means now). It never blocks and does not allocate. It returns a
// *FieldError, and sends nothing, when the event is invalid.
func (c *Client) Token(sessionID string, t time.Time, count int) error {
	if c == nil {
		return nil
	}
	ns := unixNano(t)
	if err := tokenevent.CheckSessionID(sessionID, 0); err != nil {
		return err
	}
	if err := tokenevent.CheckTime(ns); err != nil {
		return err
	}
	if err := tokenevent.CheckCount(int64(count)); err != nil {
		return err
	}
	c.enqueue(item{sid: sessionID, t: int64(ns), count: int64(count)})
	return nil
}

// Start records the start of a session. It never blocks. It returns a
// *FieldError, and sends nothing, when the event is invalid.
func (c *Client) Start(s Start) error {
	if c == nil {
		return nil
	}
	return c.send(s.event())
}

// End records the end of a session. It never blocks. It returns a
// *FieldError, and sends nothing, when the event is invalid.
func (c *Client) End(e End) error {
	if c == nil {
		return nil
	}
	return c.send(e.event())
}

// Share records a request's share of the engine's busy time. It never
// blocks. It returns a *FieldError, and sends nothing, when the event is
// invalid.
func (c *Client) Share(s Share) error {
	if c == nil {
		return nil
	}
	return c.send(s.event(), nil)
}

// event returns the share Event s describes: its parts always sent, as a
// share is one.
func (s Share) event() *tokenevent.Event {
	ev := newEvent(tokenevent.KindShare, "", s.Time)
	ev.EngineRequestID, ev.Engine = s.EngineRequestID, s.Engine
	setEngineShare(ev, s.EnginePrefill, s.EngineDecode, s.EnergyJ, s.HasEnergy)
	return ev
}

// setEngineShare sets the engine's share fields of an end or share.
func setEngineShare(ev *tokenevent.Event, prefill, decode time.Duration, energyJ float64, hasEnergy bool) {
	ev.EngineTimePrefillNs, ev.EngineTimeDecodeNs = max(int64(prefill), 0), max(int64(decode), 0)
	ev.HasEngineTime = true
	if hasEnergy && energyJ >= 0 {
		ev.EnergyMilliJ, ev.HasEnergy = int64(energyJ*1000+0.5), true
	}
}

// event returns the start Event s describes.
func (s Start) event() (*tokenevent.Event, error) {
	ev := newEvent(tokenevent.KindStart, s.SessionID, s.Time)
	ev.TraceID, ev.SpanID, ev.ParentSpanID = s.TraceID, s.SpanID, s.ParentSpanID
	ev.Model, ev.Operation, ev.Engine = s.Model, s.Operation, s.Engine
	ev.NoStream, ev.TraceState = s.NoStream, s.TraceState
	if len(s.Attributes) > 0 {
		ev.Attributes = make([]tokenevent.Attribute, 0, len(s.Attributes))
		for k, v := range s.Attributes {
			ev.Attributes = append(ev.Attributes, tokenevent.Attribute{Key: k, Value: v})
		}
		// Sorted, so the same attributes always encode the same way.
		slices.SortFunc(ev.Attributes, func(a, b tokenevent.Attribute) int { return cmp.Compare(a.Key, b.Key) })
	}
	return ev, setTokens(&ev.PromptTokens, "prompt_tokens", s.PromptTokens, s.HasPromptTokens)
}

// event returns the end Event e describes.
func (e End) event() (*tokenevent.Event, error) {
	ev := newEvent(tokenevent.KindEnd, e.SessionID, e.Time)
	ev.FinishReason, ev.Error, ev.ResponseModel = e.FinishReason, e.Error, e.ResponseModel
	if e.HasTiming {
		ev.TimingSource = tokenevent.TimingHook
		ev.QueueTimeNs, ev.PrefillTimeNs, ev.DecodeTimeNs = nsOrAbsent(e.QueueTime), nsOrAbsent(e.PrefillTime), nsOrAbsent(e.DecodeTime)
	}
	if e.HasEngineTime {
		setEngineShare(ev, e.EnginePrefill, e.EngineDecode, e.EnergyJ, e.HasEnergy)
	}
	return ev, setTokens(&ev.CompletionTokens, "completion_tokens", e.CompletionTokens, e.HasCompletionTokens)
}

// Send records ev, of any kind, as the receiver would parse it: its
// TimeUnixNano must be set (there is no "now" default here). It copies ev,
// so the caller may reuse it. It never blocks. It returns a *FieldError,
// and sends nothing, when the event is invalid.
func (c *Client) Send(ev *Event) error {
	if c == nil {
		return nil
	}
	if ev.Kind == tokenevent.KindToken {
		if err := ev.Validate(tokenevent.Limits{}); err != nil {
			return err
		}
		c.enqueue(item{sid: ev.SessionID, t: int64(ev.TimeUnixNano), count: ev.Count})
		return nil
	}
	cp := *ev
	cp.Attributes = slices.Clone(ev.Attributes)
	return c.send(&cp, nil)
}

// setTokens sets the token total *dst, of the wire field, to n if has is
// set (and n is a count).
// nsOrAbsent is a timing part in ns, -1 (absent on the wire) when negative.
func nsOrAbsent(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return int64(d)
}

func setTokens(dst *int64, field string, n int, has bool) error {
	if !has {
		return nil
	}
	if err := tokenevent.CheckTokens(field, int64(n)); err != nil {
		return err
	}
	*dst = int64(n)
	return nil
}

// newEvent returns an event of kind with every optional field absent.
func newEvent(kind tokenevent.Kind, sessionID string, t time.Time) *tokenevent.Event {
	ev := &tokenevent.Event{}
	ev.Reset()
	ev.Kind, ev.SessionID, ev.TimeUnixNano = kind, sessionID, unixNano(t)
	return ev
}

// send validates a start, end or share event that is the client's own and queues
// it, unless building it failed with err.
func (c *Client) send(ev *tokenevent.Event, err error) error {
	if err != nil {
		return err
	}
	if err := ev.Validate(tokenevent.Limits{}); err != nil {
		return err
	}
	c.enqueue(item{ev: ev})
	return nil
}

func (c *Client) enqueue(it item) {
	if c.closed.Load() {
		c.dropped.Add(1)
		return
	}
	select {
	case c.queue <- it:
		if len(c.queue) >= c.wakeAt {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	default:
		c.dropped.Add(1)
	}
}

// unixNano returns t in Unix nanoseconds, now for a zero t, or 0 (no
// valid time) for a t before 1970.
func unixNano(t time.Time) uint64 {
	if t.IsZero() {
		return uint64(time.Now().UnixNano())
	}
	return uint64(max(t.UnixNano(), 0))
}

// Stats returns the counters. It is safe to call at any time, also after
// Close.
func (c *Client) Stats() Stats {
	if c == nil {
		return Stats{}
	}
	s := Stats{Sent: c.sent.Load(), Dropped: c.dropped.Load(), Failed: c.failed.Load(), Rejected: c.rejected.Load()}
	select {
	case <-c.done:
		// An event that raced with Close into the queue after its last
		// drain will never be sent.
		s.Dropped += uint64(len(c.queue))
	default:
	}
	return s
}

// Close stops accepting events, sends what is queued, stops the background
// goroutine and closes the UDP socket or the idle connections of its own
// HTTP client (not those of a Config.HTTPClient). If ctx ends first, the
// sends under way are aborted, what is left counts as failed, and Close
// returns ctx.Err() once the goroutine has stopped. Calling Close again
// waits for the same end and returns nil.
func (c *Client) Close(ctx context.Context) error {
	if c == nil {
		return nil
	}
	c.closed.Store(true)
	c.stopOnce.Do(func() { close(c.stop) })
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		c.abort()
		<-c.done
		return ctx.Err()
	}
}

// worker is the state of the background goroutine, apart from Client so
// that its writes do not share cache lines with the callers' hot path.
type worker struct {
	c   *Client
	snd sender
	// The bounds of a batch and of its lines, lowered to those the
	// receiver states (adopt).
	maxLineBytes  int // newline included
	maxBatchBytes int
	maxBatchLines int
	flushInterval time.Duration

	batch  []byte // whole NDJSON lines
	events int    // events in batch
	line   []byte
	token  tokenevent.Event
}

func (w *worker) run() {
	w.token = tokenevent.Event{Kind: tokenevent.KindToken, PromptTokens: -1, CompletionTokens: -1}
	// The queue is polled, not waited on: a receiver parked on the channel
	// would make every Token pay for waking it (microseconds, not tens of
	// nanoseconds). Callers signal wake only when the queue is half full.
	ticker := time.NewTicker(w.flushInterval)
	defer ticker.Stop()
	for {
		select {
		case <-w.c.wake:
			w.drain(len(w.c.queue))
		case <-ticker.C:
			w.drain(len(w.c.queue))
			w.flush()
		case <-w.c.stop:
			for len(w.c.queue) > 0 {
				w.drain(len(w.c.queue))
			}
			w.flush()
			return
		}
	}
}

// drain takes n queued events into batches, sending each batch that fills
// up. This goroutine is the only receiver, so n from len never waits.
func (w *worker) drain(n int) {
	for range n {
		w.add(<-w.c.queue)
	}
}

// add encodes one event into the batch, sending the batch first if the
// line does not fit: the batch has maxBatchLines lines, or the line would
// take it past maxBatchBytes.
func (w *worker) add(it item) {
	ev := it.ev
	if ev == nil {
		ev = &w.token
		ev.SessionID, ev.TimeUnixNano, ev.Count = it.sid, uint64(it.t), it.count
	}
	w.line = tokenevent.AppendJSON(w.line[:0], ev)
	if w.events >= w.maxBatchLines || len(w.batch)+len(w.line) > w.maxBatchBytes {
		w.flush()
	}
	// After the flush, which may have lowered the bound.
	if len(w.line) > w.maxLineBytes {
		// The receiver would reject it, or no batch can hold it.
		w.c.rejected.Add(1)
		return
	}
	w.batch = append(w.batch, w.line...)
	w.events++
}

func (w *worker) flush() {
	if w.events == 0 {
		return
	}
	r := w.snd.send(w.batch, w.events)
	w.c.sent.Add(uint64(r.sent))
	w.c.rejected.Add(uint64(r.rejected))
	w.c.failed.Add(uint64(w.events - r.sent - r.rejected - r.inFlight))
	w.events = 0
	if r.reuse {
		w.batch = w.batch[:0]
	} else {
		w.batch = make([]byte, 0, cap(w.batch))
	}
	w.adopt(r.stated)
}

// adopt lowers the bounds of the next batches to the limits the receiver
// stated, which it does when a batch broke one: a receiver configured
// below the defaults (max_lines_per_batch, max_line_bytes,
// max_request_body_size) costs one batch's excess, not every batch's. The
// bounds are never raised.
func (w *worker) adopt(l receiverLimits) {
	if l.MaxLinesPerBatch > 0 {
		w.maxBatchLines = min(w.maxBatchLines, l.MaxLinesPerBatch)
	}
	if l.MaxRequestBodySize > 0 {
		w.maxBatchBytes = int(min(int64(w.maxBatchBytes), l.MaxRequestBodySize))
	}
	if l.MaxLineBytes > 0 {
		w.maxLineBytes = min(w.maxLineBytes, l.MaxLineBytes+1)
	}
	w.maxLineBytes = min(w.maxLineBytes, w.maxBatchBytes)
}
