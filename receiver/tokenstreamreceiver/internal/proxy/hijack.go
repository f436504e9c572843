// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"
)

// A streamed answer's body is relayed off net/http: once the response head
// is written (net/http's header policy, limits and error answers all came
// before), the client connection is hijacked, the handler returns, and one
// goroutine per stream relays the events with its own chunk framing, one
// write per read from the upstream. When the stream ends cleanly and the
// client keeps its connection alive, the connection goes back to the
// http.Server through the listener (handbackListener), which serves its
// next request as any other.
//
// Why: an open stream held net/http's connection for its length: its
// 4 KiB reader and 4 KiB writer, the 2 KiB chunk buffer, the request and
// response, the handler's and the background read's goroutines, and every
// event went through the otelhttp/httpsnoop wrappers, the chunk writer
// and two bufio writers before its write. What net/http did for the
// stream the proxy does itself: the write deadline (client_send_timeout),
// noticing a client that left (proxyconn.HangupWatcher), the drain at
// shutdown (offServer.relays and handlers).

// relayBuffer is the room for the events of one read from the upstream
// (sseReadBuffer) and their chunk framing: they leave in one write.
const relayBuffer = sseReadBuffer + chunkHeaderRoom + len("\r\n") + len(lastChunk)

// chunkHeaderRoom is kept free before a chunk's data for its size line
// (at most 8 hex digits and CRLF here: a chunk is at most relayBuffer, or
// one event written on its own).
const chunkHeaderRoom = 10

const lastChunk = "0\r\n\r\n"

// chunkedConnWriter writes HTTP/1.1 chunks to a hijacked client
// connection: what Write gets is gathered until Flush, which frames it as
// one chunk and writes it in one system call. The first failed write
// fails every later one.
//
// Its buffer is taken from relayBuffers at the first Write after a flush
// and given back by the flush: a stream spends nearly all its life waiting
// for the engine's next token, and holds no buffer while it waits (2 KiB
// less per open stream).
type chunkedConnWriter struct {
	c    net.Conn
	send *sendDeadline
	// buf holds chunkHeaderRoom bytes for the size line, then the data;
	// nil between flushes. pooled is where it came from.
	buf    []byte
	pooled *[]byte
	err    error
	// noWait: the event loop writes (relayloop.go), and must not wait for
	// the client: what the socket does not take at once is kept in
	// backlog, with everything written after it, for wait to write.
	noWait  bool
	backlog []byte
}

// relayBuffers are the chunk writers' buffers, in use from a read of the
// upstream to the write of its events.
var relayBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, relayBuffer)
	return &b
}}

func newChunkedConnWriter(c net.Conn, send *sendDeadline) *chunkedConnWriter {
	return &chunkedConnWriter{c: c, send: send}
}

func (w *chunkedConnWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.buf == nil {
		w.pooled = relayBuffers.Get().(*[]byte)
		w.buf = (*w.pooled)[:chunkHeaderRoom]
	}
	if len(w.buf)+len(p)+len("\r\n")+len(lastChunk) > cap(w.buf) {
		w.Flush()
		if w.err != nil {
			return 0, w.err
		}
		if chunkHeaderRoom+len(p)+len("\r\n")+len(lastChunk) > relayBuffer {
			// Larger than the buffer (an event joined from several reads,
			// an oversized one's piece): a chunk of its own, unbuffered.
			return w.writeLarge(p)
		}
		return w.Write(p)
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *chunkedConnWriter) writeLarge(p []byte) (int, error) {
	w.send.arm(time.Now())
	head := strconv.AppendInt(make([]byte, 0, chunkHeaderRoom), int64(len(p)), 16)
	head = append(head, "\r\n"...)
	if w.err = w.put(head); w.err != nil {
		return 0, w.err
	}
	if w.err = w.put(p); w.err != nil {
		return 0, w.err
	}
	w.err = w.put(crlf)
	return len(p), w.err
}

// put writes b to the connection; without waiting (noWait), what the
// socket does not take goes to the backlog.
func (w *chunkedConnWriter) put(b []byte) error {
	if !w.noWait {
		_, err := w.c.Write(b)
		return err
	}
	if len(w.backlog) > 0 {
		w.backlog = append(w.backlog, b...)
		return nil
	}
	n, err := proxyconn.TryWrite(w.c, b)
	if errors.Is(err, proxyconn.ErrWouldBlock) {
		w.backlog = append(w.backlog, b[n:]...)
		return nil
	}
	return err
}

// blocked reports whether a write waits in the backlog.
func (w *chunkedConnWriter) blocked() bool { return len(w.backlog) > 0 }

// wait ends noWait: the backlog is written, waiting for the client as
// every later write will.
func (w *chunkedConnWriter) wait() error {
	w.noWait = false
	if len(w.backlog) > 0 && w.err == nil {
		w.send.arm(time.Now())
		_, w.err = w.c.Write(w.backlog)
	}
	w.backlog = nil
	return w.err
}

var (
	crlf           = []byte("\r\n")
	lastChunkBytes = []byte(lastChunk)
)

// Flush writes what was gathered as one chunk.
func (w *chunkedConnWriter) Flush() {
	if w.buf == nil {
		return
	}
	if w.err != nil || len(w.buf) == chunkHeaderRoom {
		w.release()
		return
	}
	w.write(w.frame())
}

// frame puts the gathered data's size line before it and CRLF after it,
// and returns the chunk.
func (w *chunkedConnWriter) frame() []byte {
	var head [chunkHeaderRoom]byte
	h := strconv.AppendInt(head[:0], int64(len(w.buf)-chunkHeaderRoom), 16)
	h = append(h, "\r\n"...)
	start := chunkHeaderRoom - len(h)
	copy(w.buf[start:], h)
	w.buf = append(w.buf, "\r\n"...)
	return w.buf[start:]
}

// write writes b, a chunk framed in the buffer, and gives the buffer back.
func (w *chunkedConnWriter) write(b []byte) {
	w.send.arm(time.Now())
	w.err = w.put(b)
	w.release()
}

func (w *chunkedConnWriter) release() {
	if w.pooled != nil {
		relayBuffers.Put(w.pooled)
	}
	w.buf, w.pooled = nil, nil
}

// finish writes what was gathered and the last chunk, in one write: the
// response is whole.
func (w *chunkedConnWriter) finish() error {
	if w.err != nil {
		w.release()
		return w.err
	}
	if w.buf == nil || len(w.buf) == chunkHeaderRoom {
		w.release()
		w.send.arm(time.Now())
		w.err = w.put(lastChunkBytes)
		return w.err
	}
	b := append(w.frame(), lastChunk...)
	w.write(b)
	return w.err
}

// handbackListener is the proxy's listener: it accepts new connections,
// and hands the http.Server the client connections of relayed streams
// that ended with the connection kept alive.
type handbackListener struct {
	net.Listener
	conns  chan net.Conn
	errs   chan error
	closed chan struct{}
	once   sync.Once
}

func newHandbackListener(ln net.Listener) *handbackListener {
	l := &handbackListener{Listener: ln, conns: make(chan net.Conn), errs: make(chan error), closed: make(chan struct{})}
	go l.acceptLoop()
	return l
}

// acceptLoop accepts the new connections, until the listener is closed.
func (l *handbackListener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			select {
			case l.errs <- err: // http.Server decides: retried or the end
			case <-l.closed:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case l.conns <- c:
		case <-l.closed:
			c.Close()
			return
		}
	}
}

func (l *handbackListener) Accept() (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// handBack gives c to the http.Server, as if just accepted; once the
// listener is closed (shutdown), c is closed instead.
func (l *handbackListener) handBack(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.closed:
		c.Close()
	}
}

func (l *handbackListener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		close(l.closed)
		err = l.Listener.Close()
	})
	return err
}

// prefixedConn is a client connection handed back with bytes net/http had
// read past the request (the start of a pipelined request): its reads
// return them first.
type prefixedConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixedConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// unreadBytes are the bytes br holds past the request, copied (br is
// net/http's and goes with its connection).
func unreadBytes(br *bufio.Reader) []byte {
	n := br.Buffered()
	if n == 0 {
		return nil
	}
	b, _ := br.Peek(n)
	return append([]byte(nil), b...)
}

// relayConns are the client connections of the streams being relayed off
// net/http, which http.Server's Close no longer reaches.
type relayConns struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// add adds c; once closeAll ran, c is closed instead and add is false.
func (r *relayConns) add(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	if r.conns == nil {
		r.conns = map[net.Conn]struct{}{}
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relayConns) remove(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// closeAll closes them, and those added later: what http.Server's Close
// does to its own.
func (r *relayConns) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

// offServer relays streams off net/http: what a stream relayed on a
// goroutine of its own needs of its Server.
type offServer struct {
	shared
	streams atomic.Int64 // observed requests open
	// handlers counts the requests being served, pass-through ones too:
	// Shutdown waits for them after it cut the streams.
	handlers sync.WaitGroup
	// listener hands the connections of relayed streams back to the
	// http.Server; hangups tells when their clients leave. With no hangups
	// (not Linux), every stream stays on net/http's connection.
	listener *handbackListener
	hangups  *proxyconn.HangupWatcher
	// loop relays the streams it can (relayloop.go); nil: none (not
	// Linux), each is relayed on a goroutine of its own.
	loop *relayLoop
	// relays are the client connections of the streams relayed off
	// net/http, for Shutdown to close when they outlive the drain; kept
	// those handed back to it that have not started their next request.
	relays, kept relayConns
}

// relayOffServer takes the client connection from net/http, the response
// head written, and relays the stream off it: on the event loop
// (relayloop.go) when it can, else on a goroutine of its own (see the top
// of this file); false: the stream stays on net/http (HTTP/2, TLS, no
// hang-up watcher, or the connection could not be taken).
func (p *offServer) relayOffServer(ctx context.Context, w http.ResponseWriter, req *http.Request, body *bodyLimitReader, s *session,
	x *exchange, strip bool, stopClientWatch func() bool,
) bool {
	if p.hangups == nil || req.ProtoMajor != 1 || req.ProtoMinor < 1 || req.TLS != nil {
		// HTTP/1.0 has no chunks; TLS hides the socket from the watcher.
		return false
	}
	rc := http.NewResponseController(w)
	conn, brw, err := rc.Hijack()
	if err != nil {
		return false
	}
	var prefix []byte
	if pc, ok := conn.(*prefixedConn); ok {
		// A connection handed back with a pipelined request: what is left
		// of its bytes comes after those net/http buffered.
		conn, prefix = pc.Conn, pc.prefix
	}
	if _, ok := conn.(syscall.Conn); !ok {
		// Not a socket the watcher can see (a listener of another kind):
		// the head is out, the relay goes on, a client that left is
		// noticed by the next write, and the connection closed after.
		p.relays.add(conn)
		p.handlers.Add(1)
		go p.relayHijacked(p.hijacked(ctx, s, x, conn, nil, false, nil, strip))
		stopClientWatch()
		return true
	}
	// The connection is kept alive after the stream when the client asked
	// for it and its request was read whole, as net/http would have.
	keepAlive := !req.Close && body.whole.Load()
	prefix = append(unreadBytes(brw.Reader), prefix...)
	p.relays.add(conn)
	stopHangup, watched := p.hangups.Watch(conn, func() { x.cancel(errClientLeft) })
	if !watched {
		stopHangup = func() {}
	}
	// Until here a client that left cancelled the exchange through the
	// request's context, which ends when the handler returns.
	stopClientWatch()
	if req.Context().Err() != nil {
		x.cancel(context.Cause(req.Context()))
	}
	h := p.hijacked(ctx, s, x, conn, prefix, keepAlive, stopHangup, strip)
	p.handlers.Add(1)
	if !p.relayOnLoop(h) {
		go p.relayHijacked(h)
	}
	return true
}

// errClientLeft is the cause of a relayed stream's end when its client
// closed or reset the connection.
var errClientLeft = errors.New("proxy: the client closed the connection")

// hijackedStream is a stream relayed to its hijacked client connection.
type hijackedStream struct {
	ctx        context.Context
	s          *session
	x          *exchange
	conn       net.Conn
	prefix     []byte
	keepAlive  bool
	stopHangup func()
	cw         *chunkedConnWriter
	r          *eventRelay
}

func (p *offServer) hijacked(ctx context.Context, s *session, x *exchange, conn net.Conn, prefix []byte,
	keepAlive bool, stopHangup func(), strip bool,
) *hijackedStream {
	if s.send != nil {
		s.send = &sendDeadline{rc: conn, timeout: s.send.timeout}
		x.send = s.send
	}
	cw := newChunkedConnWriter(conn, s.send)
	return &hijackedStream{ctx: ctx, s: s, x: x, conn: conn, prefix: prefix, keepAlive: keepAlive, stopHangup: stopHangup, cw: cw, r: s.startRelay(cw, strip)}
}

// relayHijacked relays a stream to its hijacked client connection on the
// goroutine it is called on, then ends it (endHijacked).
func (p *offServer) relayHijacked(h *hijackedStream) {
	h.r.run(h.x.body, make([]byte, sseReadBuffer))
	p.endHijacked(h)
}

// endHijacked ends a stream whose upstream's reads are over, then hands
// its client connection back to the server or closes it.
func (p *offServer) endHijacked(h *hijackedStream) {
	defer p.handlers.Done()
	defer p.streams.Add(-1)
	s, x, conn, cw, keepAlive := h.s, h.x, h.conn, h.cw, h.keepAlive
	whole := s.endStream(h.ctx, h.r)
	if whole {
		whole = cw.finish() == nil
	} else {
		cw.release() // no last chunk: the connection is closed below
	}
	if h.stopHangup != nil {
		h.stopHangup()
	}
	clientLeft := errors.Is(context.Cause(h.ctx), errClientLeft)
	x.end(s)
	p.relays.remove(conn)
	select {
	case <-p.draining:
		keepAlive = false
	default:
	}
	if !whole || !keepAlive || clientLeft || h.stopHangup == nil {
		conn.Close()
		return
	}
	_ = conn.SetWriteDeadline(time.Time{})
	if len(h.prefix) > 0 {
		conn = &prefixedConn{Conn: conn, prefix: h.prefix}
	}
	if p.kept.add(conn) {
		p.listener.handBack(conn)
	}
}
