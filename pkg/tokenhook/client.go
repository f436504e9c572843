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

	"github.com/otelcol-llm/otelcol-llm/internal/tokenevent"
)

// Operation values for Start.Operation (GenAI semconv gen_ai.operation.name).
const (
	OperationChat           = tokenevent.OperationChat
	OperationTextCompletion = tokenevent.OperationTextCompletion
)

// Start opens a session: the engine received a request. Zero fields are
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
}

// End closes a session. Zero fields are not sent.
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
}

// Stats counts what happened to the events given to a Client. Once Close
// has returned, Sent+Dropped+Failed is the number of Start, Token and End
// calls.
type Stats struct {
	// Sent counts events handed over: accepted by the receiver (HTTP) or
	// written in a datagram (UDP, which has no acknowledgement).
	Sent uint64
	// Dropped counts events never queued: the queue was full, or Close had
	// been called.
	Dropped uint64
	// Failed counts events that were not delivered for any other reason:
	// invalid (empty SessionID, time before 1970, Token count below 1,
	// unknown Operation, negative token counts, empty attribute key), a
	// line longer than MaxBatchBytes, a send error, a non-2xx HTTP status,
	// or lines the receiver reported as rejected.
	Failed uint64
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
	// sent and failed are written by the background goroutine (and failed
	// by callers for invalid events); keep them off the line callers write.
	_      [64]byte
	sent   atomic.Uint64
	failed atomic.Uint64

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
// starts the background goroutine. Call Close to stop it.
func New(cfg Config) (*Client, error) {
	s, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var snd sender
	if s.udp {
		conn, err := net.Dial("udp", s.addr)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("tokenhook: Endpoint: %w", err)
		}
		snd = &udpSender{conn: conn}
	} else {
		hs := &httpSender{ctx: ctx, url: s.url, headers: s.headers, client: s.httpClient}
		if hs.client == nil {
			// A private pool, so Close can close its idle connections.
			tr := &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true}
			if dt, ok := http.DefaultTransport.(*http.Transport); ok {
				tr = dt.Clone()
			}
			hs.client = &http.Client{Transport: tr, Timeout: DefaultHTTPTimeout}
			hs.owned = true
		}
		snd = hs
	}
	c := &Client{
		queue:  make(chan item, s.queueSize),
		wakeAt: max(s.queueSize/2, 1),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		abort:  func() { cancel(); snd.abort() },
	}
	w := &worker{c: c, snd: snd, maxBatchBytes: s.maxBatchBytes, flushInterval: s.flushInterval}
	go func() {
		defer close(c.done)
		defer cancel()
		defer snd.close()
		w.run()
	}()
	return c, nil
}

// Token records a chunk of count tokens (at least 1) streamed at t (zero
// means now). It never blocks and does not allocate.
func (c *Client) Token(sessionID string, t time.Time, count int) {
	if c == nil {
		return
	}
	ns := unixNano(t)
	if sessionID == "" || ns <= 0 || count < 1 {
		c.failed.Add(1)
		return
	}
	c.enqueue(item{sid: sessionID, t: ns, count: int64(count)})
}

// Start records the start of a session. It never blocks.
func (c *Client) Start(s Start) {
	if c == nil {
		return
	}
	if c.closed.Load() {
		c.dropped.Add(1)
		return
	}
	ev := &tokenevent.Event{
		Kind:             tokenevent.KindStart,
		SessionID:        s.SessionID,
		TimeUnixNano:     uint64(max(unixNano(s.Time), 0)),
		TraceID:          tokenevent.TraceID(s.TraceID),
		SpanID:           tokenevent.SpanID(s.SpanID),
		ParentSpanID:     tokenevent.SpanID(s.ParentSpanID),
		Model:            s.Model,
		Operation:        s.Operation,
		PromptTokens:     -1,
		Engine:           s.Engine,
		Count:            1,
		CompletionTokens: -1,
	}
	valid := s.SessionID != "" && ev.TimeUnixNano > 0 &&
		(s.Operation == "" || s.Operation == OperationChat || s.Operation == OperationTextCompletion)
	if s.HasPromptTokens {
		ev.PromptTokens = int64(s.PromptTokens)
		valid = valid && s.PromptTokens >= 0
	}
	if len(s.Attributes) > 0 {
		ev.Attributes = make([]tokenevent.Attribute, 0, len(s.Attributes))
		for k, v := range s.Attributes {
			valid = valid && k != ""
			ev.Attributes = append(ev.Attributes, tokenevent.Attribute{Key: k, Value: v})
		}
		// Sorted, so the same attributes always encode the same way.
		slices.SortFunc(ev.Attributes, func(a, b tokenevent.Attribute) int { return cmp.Compare(a.Key, b.Key) })
	}
	if !valid {
		c.failed.Add(1)
		return
	}
	c.enqueue(item{ev: ev})
}

// End records the end of a session. It never blocks.
func (c *Client) End(e End) {
	if c == nil {
		return
	}
	if c.closed.Load() {
		c.dropped.Add(1)
		return
	}
	ev := &tokenevent.Event{
		Kind:             tokenevent.KindEnd,
		SessionID:        e.SessionID,
		TimeUnixNano:     uint64(max(unixNano(e.Time), 0)),
		PromptTokens:     -1,
		Count:            1,
		CompletionTokens: -1,
		FinishReason:     e.FinishReason,
		Error:            e.Error,
	}
	valid := e.SessionID != "" && ev.TimeUnixNano > 0
	if e.HasCompletionTokens {
		ev.CompletionTokens = int64(e.CompletionTokens)
		valid = valid && e.CompletionTokens >= 0
	}
	if !valid {
		c.failed.Add(1)
		return
	}
	c.enqueue(item{ev: ev})
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

// unixNano returns t in Unix nanoseconds, or now for a zero t.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return time.Now().UnixNano()
	}
	return t.UnixNano()
}

// Stats returns the counters. It is safe to call at any time, also after
// Close.
func (c *Client) Stats() Stats {
	if c == nil {
		return Stats{}
	}
	s := Stats{Sent: c.sent.Load(), Dropped: c.dropped.Load(), Failed: c.failed.Load()}
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
	c             *Client
	snd           sender
	maxBatchBytes int
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
// line does not fit.
func (w *worker) add(it item) {
	ev := it.ev
	if ev == nil {
		ev = &w.token
		ev.SessionID, ev.TimeUnixNano, ev.Count = it.sid, uint64(it.t), it.count
	}
	w.line = tokenevent.AppendJSON(w.line[:0], ev)
	if len(w.line) > w.maxBatchBytes {
		w.c.failed.Add(1)
		return
	}
	if len(w.batch)+len(w.line) > w.maxBatchBytes {
		w.flush()
	}
	w.batch = append(w.batch, w.line...)
	w.events++
}

func (w *worker) flush() {
	if w.events == 0 {
		return
	}
	sent, reuse := w.snd.send(w.batch, w.events)
	w.c.sent.Add(uint64(sent))
	w.c.failed.Add(uint64(w.events - sent))
	w.events = 0
	if reuse {
		w.batch = w.batch[:0]
	} else {
		w.batch = make([]byte, 0, cap(w.batch))
	}
}
