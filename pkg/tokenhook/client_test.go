// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenparse"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Bounds for polling; never a measure of how fast anything must be.
const (
	waitFor = 10 * time.Second
	tick    = 2 * time.Millisecond
)

var t0 = time.Unix(1_700_000_000, 0)

// collector is a loopback stand-in for the token_stream receiver.
type collector interface {
	endpoint() string
	// batches returns the datagrams or request bodies received so far.
	batches() [][]byte
}

// received parses every batch c got so far, failing t on a line the
// receiver's parser rejects or a batch that does not end a line.
func received(t *testing.T, c collector) []tokenevent.Event {
	t.Helper()
	p := tokenparse.NewParser(tokenevent.Limits{})
	var out []tokenevent.Event
	for _, b := range c.batches() {
		assert.True(t, bytes.HasSuffix(b, []byte("\n")), "batch %q does not end a line", b)
		p.ParseBatch(b, 0, func(ev *tokenevent.Event) {
			e := *ev
			e.Attributes = nil // the parser reuses its slice
			if len(ev.Attributes) > 0 {
				e.Attributes = slices.Clone(ev.Attributes)
			}
			if !e.HasTiming() {
				// The expectations spell an absent timing as the zero value.
				e.QueueTimeNs, e.PrefillTimeNs, e.DecodeTimeNs = 0, 0, 0
			}
			out = append(out, e)
		}, func(err *tokenparse.LineError) {
			t.Errorf("receiver would reject %v", err)
		})
	}
	return out
}

// countReceived is received without the checks, for polling.
func countReceived(c collector) int {
	n := 0
	for _, b := range c.batches() {
		n += bytes.Count(b, []byte("\n"))
	}
	return n
}

type udpCollector struct {
	conn net.PacketConn
	mu   sync.Mutex
	got  [][]byte
}

func newUDPCollector(t *testing.T) *udpCollector {
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	u := &udpCollector{conn: conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<16)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			u.mu.Lock()
			u.got = append(u.got, slices.Clone(buf[:n]))
			u.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = conn.Close()
		<-done
	})
	return u
}

func (u *udpCollector) endpoint() string { return "udp://" + u.conn.LocalAddr().String() }

func (u *udpCollector) batches() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.got)
}

type httpRequest struct {
	path   string
	header http.Header
	body   []byte
}

type httpCollector struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []httpRequest
	// respond answers request number i (0-based); nil accepts every line.
	respond func(w http.ResponseWriter, r *http.Request, i int)
}

func newHTTPCollector(t *testing.T, respond func(w http.ResponseWriter, r *http.Request, i int)) *httpCollector {
	h := &httpCollector{respond: respond}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		i := len(h.got)
		h.got = append(h.got, httpRequest{path: r.URL.Path, header: r.Header.Clone(), body: body})
		h.mu.Unlock()
		if h.respond != nil {
			h.respond(w, r, i)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"accepted":%d,"rejected":0,"errors":[]}`, bytes.Count(body, []byte("\n")))
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *httpCollector) endpoint() string { return h.srv.URL + DefaultHTTPPath }

func (h *httpCollector) requests() []httpRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.got)
}

func (h *httpCollector) batches() [][]byte {
	var out [][]byte
	for _, r := range h.requests() {
		out = append(out, r.body)
	}
	return out
}

// transports runs fn once against each kind of endpoint.
func transports(t *testing.T, fn func(t *testing.T, c collector)) {
	t.Run("udp", func(t *testing.T) { fn(t, newUDPCollector(t)) })
	t.Run("http", func(t *testing.T) { fn(t, newHTTPCollector(t, nil)) })
}

func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func closeClient(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	require.NoError(t, c.Close(ctx))
}

// session sends a complete session with every field set and returns what
// the receiver must parse.
func session(t *testing.T, c *Client, id string) []tokenevent.Event {
	t.Helper()
	require.NoError(t, c.Start(Start{
		SessionID:       id,
		Time:            t0,
		TraceID:         [16]byte{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
		SpanID:          [8]byte{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
		ParentSpanID:    [8]byte{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		Model:           "meta-llama/Llama-3.1-8B-Instruct",
		Operation:       OperationChat,
		PromptTokens:    812,
		HasPromptTokens: true,
		Engine:          "vllm-0",
		Attributes:      map[string]string{"tenant": "a \"quoted\"\n", "quantization": "fp8"},
		NoStream:        true,
		TraceState:      "ot=th:8,vendor=x",
	}))
	require.NoError(t, c.Token(id, t0.Add(250*time.Millisecond), 1))
	require.NoError(t, c.Token(id, t0.Add(300*time.Millisecond), 3))
	require.NoError(t, c.End(End{
		SessionID: id, Time: t0.Add(time.Second), CompletionTokens: 4, HasCompletionTokens: true, FinishReason: "stop",
		ResponseModel: "llama-fp8", QueueTime: 120 * time.Millisecond, PrefillTime: 80 * time.Millisecond, DecodeTime: -1, HasTiming: true,
	}))

	ns := uint64(t0.UnixNano())
	return []tokenevent.Event{
		{
			Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: ns,
			TraceID:      tokenevent.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
			SpanID:       tokenevent.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
			ParentSpanID: tokenevent.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
			Model:        "meta-llama/Llama-3.1-8B-Instruct", Operation: "chat", PromptTokens: 812, Engine: "vllm-0",
			Attributes: []tokenevent.Attribute{{Key: "quantization", Value: "fp8"}, {Key: "tenant", Value: "a \"quoted\"\n"}},
			NoStream:   true, TraceState: "ot=th:8,vendor=x",
			Count: 1, CompletionTokens: -1,
		},
		{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: ns + 250e6, PromptTokens: -1, Count: 1, CompletionTokens: -1},
		{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: ns + 300e6, PromptTokens: -1, Count: 3, CompletionTokens: -1},
		{
			Kind: tokenevent.KindEnd, SessionID: id, TimeUnixNano: ns + 1e9, PromptTokens: -1, Count: 1, CompletionTokens: 4, FinishReason: "stop",
			ResponseModel: "llama-fp8", QueueTimeNs: 120e6, PrefillTimeNs: 80e6, DecodeTimeNs: -1, TimingSource: tokenevent.TimingHook,
		},
	}
}

func TestEventsArriveIntactAndInOrder(t *testing.T) {
	transports(t, func(t *testing.T, col collector) {
		c := newClient(t, Config{Endpoint: col.endpoint()})
		want := session(t, c, "s-1")
		// A bare session: absent optional fields must stay absent.
		require.NoError(t, c.Start(Start{SessionID: "s-2", Time: t0}))
		require.NoError(t, c.End(End{SessionID: "s-2", Time: t0.Add(time.Second), Error: "timeout"}))
		ns := uint64(t0.UnixNano())
		want = append(want,
			tokenevent.Event{Kind: tokenevent.KindStart, SessionID: "s-2", TimeUnixNano: ns, PromptTokens: -1, Count: 1, CompletionTokens: -1},
			tokenevent.Event{Kind: tokenevent.KindEnd, SessionID: "s-2", TimeUnixNano: ns + 1e9, PromptTokens: -1, Count: 1, CompletionTokens: -1, Error: "timeout"},
		)
		for i := range 100 {
			require.NoError(t, c.Token("s-3", t0.Add(time.Duration(i)), i+1))
			want = append(want, tokenevent.Event{
				Kind: tokenevent.KindToken, SessionID: "s-3", TimeUnixNano: ns + uint64(i), PromptTokens: -1, Count: int64(i + 1), CompletionTokens: -1,
			})
		}
		closeClient(t, c)
		require.Eventually(t, func() bool { return countReceived(col) >= len(want) }, waitFor, tick)
		assert.Equal(t, want, received(t, col))
		assert.Equal(t, Stats{Sent: uint64(len(want))}, c.Stats())
	})
}

func TestHTTPRequestShape(t *testing.T) {
	col := newHTTPCollector(t, nil)
	c := newClient(t, Config{
		Endpoint: strings.TrimSuffix(col.endpoint(), DefaultHTTPPath), // the path defaults
		Headers:  map[string]string{"Authorization": "Bearer secret", "x-tenant": "a"},
	})
	require.NoError(t, c.Token("s-1", t0, 1))
	closeClient(t, c)
	reqs := col.requests()
	require.Len(t, reqs, 1)
	assert.Equal(t, DefaultHTTPPath, reqs[0].path)
	assert.Equal(t, "application/x-ndjson", reqs[0].header.Get("Content-Type"))
	assert.Equal(t, "Bearer secret", reqs[0].header.Get("Authorization"))
	assert.Equal(t, "a", reqs[0].header.Get("X-Tenant"))
	assert.Equal(t, Stats{Sent: 1}, c.Stats())
}

func TestBatchesBySize(t *testing.T) {
	const maxBatch = 256
	line := len(tokenevent.AppendJSON(nil, &tokenevent.Event{Kind: tokenevent.KindToken, SessionID: "s-1", TimeUnixNano: uint64(t0.UnixNano()), Count: 1}))
	perBatch := maxBatch / line
	transports(t, func(t *testing.T, col collector) {
		const queue = 64
		c := newClient(t, Config{Endpoint: col.endpoint(), QueueSize: queue, MaxBatchBytes: maxBatch, FlushInterval: time.Hour})
		// A half-full queue wakes the background goroutine. The interval
		// never elapses and Close is not called yet, so what arrives was
		// sent because the next line would not fit.
		const n = queue / 2
		for i := range n {
			require.NoError(t, c.Token("s-1", t0.Add(time.Duration(i)), 1))
		}
		require.Eventually(t, func() bool { return countReceived(col) == n/perBatch*perBatch }, waitFor, tick)

		closeClient(t, c)
		require.Eventually(t, func() bool { return countReceived(col) == n }, waitFor, tick)
		batches := col.batches()
		assert.Len(t, batches, (n+perBatch-1)/perBatch)
		for _, b := range batches {
			assert.LessOrEqual(t, len(b), maxBatch)
		}
		got := received(t, col)
		require.Len(t, got, n)
		for i, ev := range got {
			assert.Equal(t, uint64(t0.UnixNano())+uint64(i), ev.TimeUnixNano, "event %d out of order", i)
		}
		assert.Equal(t, Stats{Sent: n}, c.Stats())
	})
}

// A batch ends at MaxBatchLines lines, far below MaxBatchBytes: the
// receiver reads no more lines of a body or datagram.
func TestBatchesByLines(t *testing.T) {
	transports(t, func(t *testing.T, col collector) {
		const n, maxLines = 23, 5
		// The interval never elapses and the queue never gets half full:
		// Close takes all n at once.
		c := newClient(t, Config{Endpoint: col.endpoint(), QueueSize: 64, MaxBatchLines: maxLines, FlushInterval: time.Hour})
		for i := range n {
			require.NoError(t, c.Token("s-1", t0.Add(time.Duration(i)), 1))
		}
		closeClient(t, c)
		require.Eventually(t, func() bool { return countReceived(col) == n }, waitFor, tick)
		var lines []int
		for _, b := range col.batches() {
			lines = append(lines, bytes.Count(b, []byte("\n")))
		}
		assert.Equal(t, []int{5, 5, 5, 5, 3}, lines)
		got := received(t, col)
		require.Len(t, got, n)
		for i, ev := range got {
			assert.Equal(t, uint64(t0.UnixNano())+uint64(i), ev.TimeUnixNano, "event %d out of order", i)
		}
		assert.Equal(t, Stats{Sent: n}, c.Stats())
	})
}

// limitedReceiver answers as the token_stream receiver with these limits
// (maxLineBytes without the newline): a body over maxBody gets 413, a line
// over maxLineBytes and the lines after the first maxLines are rejected,
// and the answer to a body over maxBody or maxLines states the limits.
func limitedReceiver(t *testing.T, maxLines, maxLineBytes, maxBody int) *httpCollector {
	limits := fmt.Sprintf(`{"max_lines_per_batch":%d,"max_line_bytes":%d,"max_request_body_size":%d}`, maxLines, maxLineBytes, maxBody)
	var col *httpCollector
	col = newHTTPCollector(t, func(w http.ResponseWriter, _ *http.Request, i int) {
		body := col.requests()[i].body
		w.Header().Set("Content-Type", "application/json")
		if len(body) > maxBody {
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			_, _ = fmt.Fprintf(w, `{"accepted":0,"rejected":0,"errors":[],"error":"body larger than max_request_body_size (%d bytes)","limits":%s}`, maxBody, limits)
			return
		}
		accepted, rejected := 0, 0
		lines := bytes.Split(bytes.TrimSuffix(body, []byte("\n")), []byte("\n"))
		for j, line := range lines {
			if j >= maxLines || len(line) > maxLineBytes {
				rejected++
			} else {
				accepted++
			}
		}
		stated := ""
		if len(lines) > maxLines {
			stated = `,"limits":` + limits
		}
		_, _ = fmt.Fprintf(w, `{"accepted":%d,"rejected":%d,"errors":[]%s}`, accepted, rejected, stated)
	})
	return col
}

// The client keeps its next batches within the limits a receiver
// configured below the defaults states when a batch broke one; it never
// raises its own.
func TestReceiverStatedLimitsAdopted(t *testing.T) {
	line := len(tokenevent.AppendJSON(nil, &tokenevent.Event{Kind: tokenevent.KindToken, SessionID: "s-1", TimeUnixNano: uint64(t0.UnixNano()), Count: 1}))
	requestLines := func(col *httpCollector) []int {
		var out []int
		for _, b := range col.batches() {
			out = append(out, bytes.Count(b, []byte("\n")))
		}
		return out
	}

	t.Run("max_lines_per_batch and max_line_bytes", func(t *testing.T) {
		col := limitedReceiver(t, 4, 1000, 1<<20)
		// Close takes the queue at once: the first batch (10 lines, the
		// client's own bound) breaks the receiver's 4 and learns them.
		c := newClient(t, Config{Endpoint: col.endpoint(), QueueSize: 64, MaxBatchLines: 10, FlushInterval: time.Hour})
		for i := range 10 {
			require.NoError(t, c.Token("s-1", t0.Add(time.Duration(i)), 1))
		}
		// Over the learned max_line_bytes: not sent.
		require.NoError(t, c.Start(Start{SessionID: "s-2", Time: t0, Attributes: map[string]string{"big": strings.Repeat("x", 1000)}}))
		for i := range 9 {
			require.NoError(t, c.Token("s-1", t0.Add(time.Duration(10+i)), 1))
		}
		closeClient(t, c)
		assert.Equal(t, []int{10, 4, 4, 1}, requestLines(col))
		assert.Equal(t, Stats{Sent: 4 + 9, Rejected: 6 + 1}, c.Stats())
	})

	t.Run("max_request_body_size", func(t *testing.T) {
		col := limitedReceiver(t, 10_000, 16<<10, 3*line)
		c := newClient(t, Config{Endpoint: col.endpoint(), QueueSize: 64, MaxBatchBytes: 8 * line, FlushInterval: time.Hour})
		for i := range 14 {
			require.NoError(t, c.Token("s-1", t0.Add(time.Duration(i)), 1))
		}
		closeClient(t, c)
		// The first batch (8 lines) fails whole with a 413; the rest go
		// in bodies the receiver takes.
		assert.Equal(t, []int{8, 3, 3}, requestLines(col))
		assert.Equal(t, Stats{Sent: 6, Failed: 8}, c.Stats())
	})

	t.Run("never raised", func(t *testing.T) {
		// A receiver stating limits above the client's own, in every answer.
		col := newHTTPCollector(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
			_, _ = io.WriteString(w, `{"accepted":2,"rejected":0,"errors":[],"limits":{"max_lines_per_batch":10000,"max_line_bytes":65536,"max_request_body_size":8388608}}`)
		})
		c := newClient(t, Config{Endpoint: col.endpoint(), QueueSize: 64, MaxBatchLines: 2, MaxBatchBytes: 4 * line, FlushInterval: time.Hour})
		for i := range 5 {
			require.NoError(t, c.Token("s-1", t0.Add(time.Duration(i)), 1))
		}
		closeClient(t, c)
		assert.Equal(t, []int{2, 2, 1}, requestLines(col))
		assert.Equal(t, Stats{Sent: 5}, c.Stats())
	})
}

func TestBatchesByInterval(t *testing.T) {
	transports(t, func(t *testing.T, col collector) {
		c := newClient(t, Config{Endpoint: col.endpoint(), FlushInterval: 20 * time.Millisecond})
		// Far from MaxBatchBytes and before Close: only the interval sends.
		require.NoError(t, c.Token("s-1", t0, 1))
		require.NoError(t, c.Token("s-1", t0.Add(1), 1))
		require.Eventually(t, func() bool { return countReceived(col) == 2 }, waitFor, tick)
		require.NoError(t, c.Token("s-1", t0.Add(2), 1))
		require.Eventually(t, func() bool { return countReceived(col) == 3 }, waitFor, tick)
		assert.GreaterOrEqual(t, len(col.batches()), 2)
		closeClient(t, c)
		assert.Equal(t, Stats{Sent: 3}, c.Stats())
		assert.Len(t, received(t, col), 3)
	})
}

// blockingHTTP is a receiver that holds every request until released.
func blockingHTTP(t *testing.T) (col *httpCollector, entered <-chan struct{}, release func()) {
	in := make(chan struct{}, 1)
	out := make(chan struct{})
	col = newHTTPCollector(t, func(_ http.ResponseWriter, r *http.Request, _ int) {
		select {
		case in <- struct{}{}:
		default:
		}
		select {
		case <-out:
		case <-r.Context().Done():
		}
	})
	var once sync.Once
	release = func() { once.Do(func() { close(out) }) }
	t.Cleanup(release) // before the server closes: Cleanups run last in, first out
	return col, in, release
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatal(what)
	}
}

func TestQueueFullDropsWithoutBlocking(t *testing.T) {
	col, entered, release := blockingHTTP(t)
	const queue = 4
	c := newClient(t, Config{Endpoint: col.endpoint(), QueueSize: queue, FlushInterval: time.Millisecond})
	require.NoError(t, c.Token("s-1", t0, 1))
	waitClosed(t, entered, "the first batch never reached the receiver")

	// The background goroutine is stuck in the request: the queue fills.
	const more = 14
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range more {
			assert.NoError(t, c.Token("s-1", t0.Add(time.Duration(i+1)), 1))
		}
	}()
	waitClosed(t, done, "Token blocked on a full queue")
	assert.Equal(t, Stats{Dropped: more - queue}, c.Stats())

	release()
	closeClient(t, c)
	assert.Equal(t, Stats{Sent: 1 + queue, Dropped: more - queue}, c.Stats())
	assert.Len(t, received(t, col), 1+queue)
}

func TestCloseFlushes(t *testing.T) {
	transports(t, func(t *testing.T, col collector) {
		c := newClient(t, Config{Endpoint: col.endpoint(), FlushInterval: time.Hour})
		want := session(t, c, "s-1")
		closeClient(t, c)
		assert.Equal(t, Stats{Sent: uint64(len(want))}, c.Stats(), "Close returns after the last send")
		require.Eventually(t, func() bool { return countReceived(col) == len(want) }, waitFor, tick)
		assert.Equal(t, want, received(t, col))
	})
}

func TestCloseTwiceAndEventsAfterClose(t *testing.T) {
	transports(t, func(t *testing.T, col collector) {
		c, err := New(Config{Endpoint: col.endpoint()})
		require.NoError(t, err)
		require.NoError(t, c.Token("s-1", t0, 1))
		require.NoError(t, c.Close(context.Background()))
		require.NoError(t, c.Close(context.Background()))

		require.NoError(t, c.Start(Start{SessionID: "s-2", Time: t0}))
		require.NoError(t, c.Token("s-2", t0, 1))
		require.NoError(t, c.End(End{SessionID: "s-2", Time: t0}))
		assert.Equal(t, Stats{Sent: 1, Dropped: 3}, c.Stats())
		require.NoError(t, c.Close(context.Background()))
	})
}

func TestCloseAbortsWhenContextEnds(t *testing.T) {
	col, entered, _ := blockingHTTP(t)
	c := newClient(t, Config{Endpoint: col.endpoint(), FlushInterval: time.Millisecond})
	require.NoError(t, c.Token("s-1", t0, 1))
	waitClosed(t, entered, "the first batch never reached the receiver")
	require.NoError(t, c.Token("s-1", t0.Add(1), 1))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, c.Close(ctx), context.Canceled)
	// The goroutine has stopped (goleak checks it at the end) and nothing
	// is lost from the count.
	assert.Equal(t, Stats{Failed: 2}, c.Stats())
}

func TestHTTPStatus(t *testing.T) {
	for _, tc := range []struct {
		name     string
		respond  func(w http.ResponseWriter, r *http.Request, i int)
		want     Stats
		requests int
	}{
		{
			name:    "400 fails the batch",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) { http.Error(w, "bad", http.StatusBadRequest) },
			want:    Stats{Failed: 3}, requests: 1,
		},
		{
			name:    "503 without Retry-After fails the batch",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusServiceUnavailable) },
			want:    Stats{Failed: 3}, requests: 1,
		},
		{
			name: "503 with a long Retry-After fails the batch",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) {
				w.Header().Set("Retry-After", "5")
				w.WriteHeader(http.StatusServiceUnavailable)
			},
			want: Stats{Failed: 3}, requests: 1,
		},
		{
			name: "503 with a short Retry-After is retried once",
			respond: func(w http.ResponseWriter, _ *http.Request, i int) {
				if i == 0 {
					w.Header().Set("Retry-After", "0")
					w.WriteHeader(http.StatusServiceUnavailable)
				}
			},
			want: Stats{Sent: 3}, requests: 2,
		},
		{
			name: "503 is retried only once",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) {
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(http.StatusServiceUnavailable)
			},
			want: Stats{Failed: 3}, requests: 2,
		},
		{
			name: "rejected lines are rejected",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) {
				_, _ = io.WriteString(w, `{"accepted":2,"rejected":1,"errors":[{"line":2,"message":"session_id: 300 bytes, limit is 256"}]}`)
			},
			want: Stats{Sent: 2, Rejected: 1}, requests: 1,
		},
		{
			name: "a 400 naming every line rejects them",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) {
				w.WriteHeader(http.StatusBadRequest)
				_, _ = io.WriteString(w, `{"accepted":0,"rejected":3,"errors":[]}`)
			},
			want: Stats{Rejected: 3}, requests: 1,
		},
		{
			name: "a 503 fails the lines it does not reject",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, `{"accepted":0,"rejected":1,"errors":[],"error":"pipeline refused the batch"}`)
			},
			want: Stats{Failed: 2, Rejected: 1}, requests: 1,
		},
		{
			name: "a rejected count beyond the batch rejects the batch",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) {
				_, _ = io.WriteString(w, `{"accepted":0,"rejected":7}`)
			},
			want: Stats{Rejected: 3}, requests: 1,
		},
		{
			name: "a rejected count that is not an integer rejects nothing",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) {
				w.WriteHeader(http.StatusBadRequest)
				_, _ = io.WriteString(w, `{"rejected":true}`)
			},
			want: Stats{Failed: 3}, requests: 1,
		},
		{
			name: "a redirect is not followed and fails the batch",
			respond: func(w http.ResponseWriter, r *http.Request, _ int) {
				http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
			},
			want: Stats{Failed: 3}, requests: 1,
		},
		{
			name: "limits it cannot read do not void the rejected count",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) {
				_, _ = io.WriteString(w, `{"accepted":2,"rejected":1,"errors":[],"limits":{"max_lines_per_batch":"many"}}`)
			},
			want: Stats{Sent: 2, Rejected: 1}, requests: 1,
		},
		{
			name:    "a 2xx without a verdict delivers all",
			respond: func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusNoContent) },
			want:    Stats{Sent: 3}, requests: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			col := newHTTPCollector(t, tc.respond)
			c := newClient(t, Config{Endpoint: col.endpoint(), FlushInterval: time.Hour})
			for i := range 3 {
				require.NoError(t, c.Token("s-1", t0.Add(time.Duration(i)), 1))
			}
			closeClient(t, c)
			assert.Equal(t, tc.want, c.Stats())
			assert.Len(t, col.requests(), tc.requests)
		})
	}
}

func TestHTTPTransportErrorFails(t *testing.T) {
	col := newHTTPCollector(t, nil)
	endpoint := col.endpoint()
	col.srv.Close() // nothing listens there any more
	c := newClient(t, Config{Endpoint: endpoint})
	require.NoError(t, c.Token("s-1", t0, 1))
	closeClient(t, c)
	assert.Equal(t, Stats{Failed: 1}, c.Stats())
}

// Invalid events are refused at the call, with the error the receiver's
// parser would give their line, and count nowhere; a line too long for a
// batch is rejected on the sender's side.
func TestInvalidEventsRefused(t *testing.T) {
	transports(t, func(t *testing.T, col collector) {
		c := newClient(t, Config{Endpoint: col.endpoint(), MaxBatchBytes: 512})
		for _, tc := range []struct {
			call func() error
			want string
		}{
			{func() error { return c.Token("", t0, 1) }, "session_id: must not be empty"},
			{func() error { return c.Token(strings.Repeat("x", 257), t0, 1) }, "session_id: 257 bytes, limit is 256"},
			{func() error { return c.Token("s-1", t0, 0) }, "count: must be at least 1"},
			{func() error { return c.Token("s-1", time.Unix(-1, 0), 1) }, "time_unix_nano: must be greater than 0"},
			{func() error { return c.Start(Start{SessionID: "s-1", Operation: "embeddings"}) }, `operation: want chat or text_completion, got "embeddings"`},
			{func() error { return c.Start(Start{SessionID: "s-1", PromptTokens: -1, HasPromptTokens: true}) }, "prompt_tokens: must not be negative, got -1"},
			{func() error { return c.Start(Start{SessionID: "s-1", Attributes: map[string]string{"": "x"}}) }, "attributes: empty key"},
			{func() error { return c.Start(Start{SessionID: "s-1", Attributes: manyAttributes(33)}) }, "attributes: more than 32 entries"},
			{func() error { return c.Start(Start{Time: t0}) }, "session_id: must not be empty"},
			{func() error { return c.End(End{SessionID: "s-1", CompletionTokens: -2, HasCompletionTokens: true}) }, "completion_tokens: must not be negative, got -2"},
			{func() error { return c.Send(&Event{Kind: KindToken, SessionID: "s-1", TimeUnixNano: 1}) }, "count: must be at least 1"},
			{func() error { return c.Send(&Event{Kind: KindEnd, SessionID: "s-1"}) }, "time_unix_nano: must be greater than 0"},
			{func() error { return c.Send(&Event{SessionID: "s-1", TimeUnixNano: 1}) }, "event: want start, token, end, share or move, got kind 0"},
			{func() error { return c.Share(Share{Engine: "e"}) }, "engine_request_id: must not be empty"},
			{func() error { return c.Share(Share{EngineRequestID: strings.Repeat("r", 257)}) }, "engine_request_id: 257 bytes, limit is 256"},
			{func() error { return c.Share(Share{EngineRequestID: "r", Time: time.Unix(-1, 0)}) }, "time_unix_nano: must be greater than 0"},
		} {
			err := tc.call()
			require.EqualError(t, err, tc.want)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
		}
		require.NoError(t, c.Start(Start{SessionID: "s-1", Attributes: map[string]string{"big": strings.Repeat("x", 512)}})) // longer than a batch
		require.NoError(t, c.Token("s-1", t0, 1))
		closeClient(t, c)
		assert.Equal(t, Stats{Sent: 1, Rejected: 1}, c.Stats())
		require.Eventually(t, func() bool { return countReceived(col) == 1 }, waitFor, tick)
		assert.Equal(t, "s-1", received(t, col)[0].SessionID)
	})
}

func manyAttributes(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprint("k", i)] = "v"
	}
	return m
}

// A line longer than the receiver's line limit is not sent, even when it
// would fit a batch.
func TestLineOverReceiverLimitRejected(t *testing.T) {
	col := newHTTPCollector(t, nil)
	c := newClient(t, Config{Endpoint: col.endpoint()})
	require.NoError(t, c.Start(Start{SessionID: "s-1", Time: t0, Attributes: map[string]string{"big": strings.Repeat("x", tokenevent.DefaultMaxLineBytes)}}))
	require.NoError(t, c.Token("s-1", t0, 1))
	closeClient(t, c)
	assert.Equal(t, Stats{Sent: 1, Rejected: 1}, c.Stats())
	assert.Len(t, received(t, col), 1)
}

// Share sends the engine's share of a request by its engine request id,
// with no session ID, its parts always (a share of 0 is a share), and reads
// back as the receiver parses it.
func TestShareEvents(t *testing.T) {
	transports(t, func(t *testing.T, col collector) {
		c := newClient(t, Config{Endpoint: col.endpoint()})
		ns := uint64(t0.UnixNano())
		require.NoError(t, c.Share(Share{
			EngineRequestID: "cmpl-1-0a1b2c3d", Time: t0, Engine: "vllm-0",
			EnginePrefill: 41 * time.Millisecond, EngineDecode: 96500 * time.Microsecond, EnergyJ: 1.25, HasEnergy: true,
		}))
		require.NoError(t, c.Share(Share{EngineRequestID: "cmpl-2-0a1b2c3d", Time: t0.Add(1), EngineDecode: -5}))
		closeClient(t, c)
		require.Eventually(t, func() bool { return countReceived(col) == 2 }, waitFor, tick)
		assert.Equal(t, []Event{
			{
				Kind: KindShare, EngineRequestID: "cmpl-1-0a1b2c3d", TimeUnixNano: ns, Engine: "vllm-0", PromptTokens: -1, Count: 1, CompletionTokens: -1,
				EngineTimePrefillNs: 41_000_000, EngineTimeDecodeNs: 96_500_000, HasEngineTime: true, EnergyMilliJ: 1250, HasEnergy: true,
			},
			{Kind: KindShare, EngineRequestID: "cmpl-2-0a1b2c3d", TimeUnixNano: ns + 1, PromptTokens: -1, Count: 1, CompletionTokens: -1, HasEngineTime: true},
		}, received(t, col))
		assert.Equal(t, Stats{Sent: 2}, c.Stats())
	})
}

// Send takes the collector's Event and sends what the receiver parses back.
func TestSendEvents(t *testing.T) {
	transports(t, func(t *testing.T, col collector) {
		c := newClient(t, Config{Endpoint: col.endpoint()})
		ns := uint64(t0.UnixNano())
		attrs := []Attribute{{Key: "tenant", Value: "a"}}
		want := []Event{
			{Kind: KindStart, SessionID: "s-1", TimeUnixNano: ns, TraceID: TraceID{1}, Model: "m", Operation: OperationChat, PromptTokens: 0, Attributes: attrs, Count: 1, CompletionTokens: -1},
			{Kind: KindToken, SessionID: "s-1", TimeUnixNano: ns + 1, PromptTokens: -1, Count: 2, CompletionTokens: -1},
			{Kind: KindEnd, SessionID: "s-1", TimeUnixNano: ns + 2, PromptTokens: -1, Count: 1, CompletionTokens: 2, FinishReason: "stop"},
		}
		for i := range want {
			ev := want[i]
			ev.Attributes = slices.Clone(ev.Attributes)
			require.NoError(t, c.Send(&ev))
			if len(ev.Attributes) > 0 {
				ev.Attributes[0].Value = "changed after Send" // Send copied them
			}
		}
		closeClient(t, c)
		require.Eventually(t, func() bool { return countReceived(col) == len(want) }, waitFor, tick)
		assert.Equal(t, want, received(t, col))
		assert.Equal(t, Stats{Sent: 3}, c.Stats())
	})
}

func TestZeroTimeMeansNow(t *testing.T) {
	col := newHTTPCollector(t, nil)
	c := newClient(t, Config{Endpoint: col.endpoint()})
	before := time.Now().UnixNano()
	require.NoError(t, c.Token("s-1", time.Time{}, 1))
	require.NoError(t, c.Start(Start{SessionID: "s-2"}))
	require.NoError(t, c.End(End{SessionID: "s-2"}))
	after := time.Now().UnixNano()
	closeClient(t, c)
	got := received(t, col)
	require.Len(t, got, 3)
	for _, ev := range got {
		assert.GreaterOrEqual(t, int64(ev.TimeUnixNano), before)
		assert.LessOrEqual(t, int64(ev.TimeUnixNano), after)
	}
}

func TestNilClientIgnoresCalls(t *testing.T) {
	var c *Client
	require.NoError(t, c.Start(Start{SessionID: "s-1"}))
	require.NoError(t, c.Token("s-1", t0, 1))
	require.NoError(t, c.End(End{SessionID: "s-1"}))
	require.NoError(t, c.Share(Share{EngineRequestID: "r"}))
	assert.Equal(t, Stats{}, c.Stats())
	assert.NoError(t, c.Close(context.Background()))
}

func TestHTTPTimeoutFails(t *testing.T) {
	col, entered, release := blockingHTTP(t)
	c := newClient(t, Config{Endpoint: col.endpoint(), Timeout: 50 * time.Millisecond, FlushInterval: time.Millisecond})
	require.NoError(t, c.Token("s-1", t0, 1))
	waitClosed(t, entered, "the batch never reached the receiver")
	require.Eventually(t, func() bool { return c.Stats().Failed == 1 }, waitFor, tick, "the request outlived its Timeout")
	release()
	closeClient(t, c)
	assert.Equal(t, Stats{Failed: 1}, c.Stats())
}
