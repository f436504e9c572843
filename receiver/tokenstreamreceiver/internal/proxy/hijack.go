// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
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
	go p.relayToFirstToken(h)
	return true
}

// errClientLeft is the cause of a relayed stream's end when its client
// closed or reset the connection.
var errClientLeft = errors.New("proxy: the client closed the connection")

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
// relayToFirstToken relays h on this goroutine up to its first token,
// which the client gets the moment the proxy has read it, then hands the
// rest to the event loop when it can: a loop busy with other streams, or
// waiting for a core, would add its delay to the time to first token, the
// figure the collector's session and the client must agree on.
func (p *offServer) relayToFirstToken(h *hijackedStream) {
	buf := make([]byte, sseReadBuffer)
	for !h.r.over && h.s.chunks == 0 {
		n, err := h.x.body.Read(buf)
		if n > 0 {
			h.r.feed(buf[:n])
		}
		if err != nil {
			h.r.readEnd(err)
		}
	}
	if !h.r.over && p.relayOnLoop(h) {
		return
	}
	h.r.run(h.x.body, buf)
	p.endHijacked(h)
}

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

// relayOnLoop has the loop relay h, when it can (see the top of this
// file); false: it cannot, and h is as it was.
func (p *offServer) relayOnLoop(h *hijackedStream) bool {
	if p.loop == nil || !proxyconn.CanTry(h.conn) {
		return false
	}
	body, ok := h.x.body.(*directBody)
	if !ok || body.dechunked == nil || !proxyconn.CanTry(body.c) {
		return false
	}
	ls := &loopStream{l: p.loop, h: h, body: body, idle: body.d.idle, off: func(relay bool) {
		if relay {
			p.relayHijacked(h)
			return
		}
		p.endHijacked(h)
	}}
	ls.timer = proxyconn.NewTimer(ls.idleCheck)
	h.cw.noWait = true
	// Cancelled (the breaker, the client's hang-up, the drain's cut): the
	// loop ends the stream, as a read would have failed; before attach ran,
	// attach does nothing.
	ls.stopCancelWatch = context.AfterFunc(h.ctx, func() { p.loop.loop.Post(ls.cancelled) })
	if !p.loop.loop.Post(ls.attach) {
		// Closed: not while a handler runs (Shutdown closes it after).
		ls.stopCancelWatch()
		h.cw.noWait = false
		return false
	}
	return true
}
