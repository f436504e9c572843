// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"
)

// The relay's event loop: a stream relayed off net/http from a plain-HTTP
// upstream on the direct path (a dechunked body) to a plain TCP client is
// relayed by the proxy's event loop (proxyconn.Loop), not by a goroutine of
// its own. The loop waits on epoll for the upstreams' sockets; a ready one
// gets one read (without waiting) into the loop's buffer, the relay's step
// for it (eventRelay.feed: parse, observe, rewrite), and one write of its
// events to the client (without waiting). No goroutine is parked or woken
// per SSE event: the loop's thread wakes from epoll_wait, as nginx's worker.
//
// What the loop does not do, a goroutine does, as for any other stream:
//   - the end of the stream (the cut's error event, a move by
//     proxy::migrate, the end event, the last chunk, the connection handed
//     back): once the upstream's reads are over, a goroutine takes the
//     stream and runs endHijacked;
//   - a client that does not take a write at once: the stream leaves the
//     loop for a goroutine that writes what is left, waiting within
//     client_send_timeout, and relays the rest of the stream as before.
//
// The bounds stay what they are: stream_idle_timeout is a timer of the
// loop's per stream (re-set lazily: a read only moves a time), the stall
// breaker's timer and the client's hang-up cancel the exchange, which the
// loop learns through the exchange's context, as the drain's cut.

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

// relayLoop is the proxy's event loop and its read buffer: the events of
// one read are relayed before the next read, so one buffer serves every
// stream.
type relayLoop struct {
	loop *proxyconn.Loop
	buf  [sseReadBuffer]byte
}

func newRelayLoop() (*relayLoop, error) {
	l, err := proxyconn.NewLoop()
	if err != nil {
		return nil, err
	}
	return &relayLoop{loop: l}, nil
}

func (l *relayLoop) close() { l.loop.Close() }

// loopStream is a stream on the loop. Its fields are the loop goroutine's
// until it leaves the loop.
type loopStream struct {
	// off relays the rest of the stream on a goroutine (relay), or ends
	// it there: the stream's server's.
	off  func(relay bool)
	l    *relayLoop
	h    *hijackedStream
	body *directBody
	// idle is stream_idle_timeout (0: unbounded); idleAt when the upstream's
	// silence ends the stream, which timer checks.
	idle   time.Duration
	idleAt time.Time
	timer  *proxyconn.Timer
	watch  *proxyconn.Watch
	// stopCancelWatch stops the watch on the exchange's context.
	stopCancelWatch func() bool
	left            bool // the stream left the loop
}

// attach starts watching the upstream, and relays what came with the
// response head.
func (ls *loopStream) attach() {
	if ls.left {
		return
	}
	if err := ls.body.detach(); err != nil {
		// Closed already (cancelled): the goroutine's reads say so.
		ls.leave(true)
		return
	}
	w, err := ls.l.loop.Watch(ls.body.sock, ls.readable)
	if err != nil {
		ls.leave(true)
		return
	}
	ls.watch = w
	if ls.idle > 0 {
		ls.idleAt = time.Now().Add(ls.idle)
		ls.l.loop.Schedule(ls.timer, ls.idleAt)
	}
	ls.readable()
}

// readable relays what the upstream sent.
func (ls *loopStream) readable() {
	if ls.left {
		return
	}
	if ls.h.ctx.Err() != nil {
		// The socket outlives the connection the exchange closed: its
		// bytes are not relayed after the cancel.
		ls.cancelled()
		return
	}
	r, d := ls.h.r, ls.body.dechunked
	for {
		n, err := ls.body.tryRead(ls.l.buf[:])
		if n > 0 {
			r.feed(ls.l.buf[:n])
			if ls.idle > 0 {
				ls.idleAt = r.now.Add(ls.idle)
			}
		}
		if err != nil && !errors.Is(err, proxyconn.ErrWouldBlock) {
			r.readEnd(err)
		}
		switch {
		case r.over:
			ls.leave(false)
			return
		case ls.h.cw.blocked():
			ls.leave(true)
			return
		case len(d.prefix) == 0:
			// What came with the head is read; the rest comes through
			// the socket, which epoll watches.
			return
		}
	}
}

// idleCheck ends the stream when the upstream was silent for
// stream_idle_timeout, as the goroutine's read deadline does.
func (ls *loopStream) idleCheck() {
	if ls.left {
		return
	}
	if now := time.Now(); now.Before(ls.idleAt) {
		ls.l.loop.Schedule(ls.timer, ls.idleAt)
		return
	}
	ls.h.r.readEnd(errIdleTimeout)
	ls.leave(false)
}

// cancelled ends the stream whose exchange was cancelled: the upstream's
// connection is closed, or about to be.
func (ls *loopStream) cancelled() {
	if ls.left {
		return
	}
	ls.h.r.readEnd(ls.body.cancelled())
	ls.leave(false)
}

// leave takes the stream off the loop, to a goroutine: relaying goes on
// there (relay: the client's socket was full, or the upstream could not be
// watched), or the stream ends.
func (ls *loopStream) leave(relay bool) {
	ls.left = true
	if ls.watch != nil {
		ls.watch.Stop()
	}
	ls.l.loop.Unschedule(ls.timer)
	if ls.stopCancelWatch != nil {
		ls.stopCancelWatch()
	}
	h, off, body := ls.h, ls.off, ls.body
	go func() {
		body.reattach()
		if h.cw.wait() != nil {
			// As a write that failed on the goroutine: the client is gone.
			h.r.e.clientGone, h.r.over = true, true
		}
		off(relay)
	}()
}
