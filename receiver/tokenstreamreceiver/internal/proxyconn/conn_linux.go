// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxyconn // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// wrap returns c as a rawTCPConn when it is a TCP connection, else c.
func wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return newRawTCPConn(tc, rc)
}

func newRawTCPConn(sock socketConn, rc syscall.RawConn) *rawTCPConn {
	r := &rawTCPConn{socketConn: sock, rc: rc}
	r.r = call{op: "read", trap: syscall.SYS_READ}
	r.w = call{op: "write", trap: syscall.SYS_WRITE, whole: true}
	r.tw = call{op: "write", trap: syscall.SYS_WRITE, whole: true, noWait: true}
	r.r.fn, r.w.fn, r.tw.fn = r.r.do, r.w.do, r.tw.do
	return r
}

// socketConn is what a rawTCPConn holds its socket as: a *net.TCPConn, or
// a *fileConn once the socket was detached and attached again.
type socketConn interface {
	net.Conn
	syscall.Conn
}

// rawTCPConn is a TCP connection whose reads and writes are raw system
// calls on its non-blocking socket, made inside the runtime poller's
// RawConn callbacks (which wait for readiness and honor deadlines as for
// any net.Conn).
//
// Why: a read or write through net.Conn goes through syscall.Syscall, which
// tells the scheduler that the thread may block. When every P was idle, the
// first such call wakes the sysmon thread, which then polls every 20 µs
// until the process is idle again. A proxy relaying one SSE event at a time
// is idle between events, so that happened once per event: at 5 000
// events/s a fifth of the proxy's CPU and twice nginx's context switches
// per event. A non-blocking socket never blocks the thread, so the
// scheduler need not be told.
type rawTCPConn struct {
	socketConn
	rc syscall.RawConn
	// r and w are Read's and Write's; tw is TryWrite's.
	r, w, tw call
}

// call is what a Read or a Write hands the poller: the callback and its
// arguments live in the conn so that a call allocates nothing; mu keeps
// concurrent Reads (or Writes) from sharing them.
type call struct {
	mu    sync.Mutex
	op    string
	trap  uintptr // the system call
	whole bool    // go on until all of buf is written
	// noWait: a full socket ends the call with EAGAIN rather than waiting
	// for readiness.
	noWait bool
	fn     func(fd uintptr) bool
	buf    []byte
	n      int
	errno  syscall.Errno
}

// do makes the system calls of one Read or Write; false asks the poller to
// wait for readiness (nothing to read, or a full socket to write to).
func (c *call) do(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(c.trap, fd, uintptr(unsafe.Pointer(&c.buf[c.n])), uintptr(len(c.buf)-c.n))
		switch e {
		case 0:
			c.n += int(n)
			if !c.whole || c.n == len(c.buf) {
				return true
			}
		case syscall.EINTR:
		case syscall.EAGAIN:
			if c.noWait {
				c.errno = e
				return true
			}
			return false
		default:
			c.errno = e
			return true
		}
	}
}

func (c *rawTCPConn) Read(b []byte) (int, error) {
	n, err := c.run(&c.r, b)
	if err == nil && n == 0 && len(b) > 0 {
		return 0, io.EOF
	}
	return n, err
}

func (c *rawTCPConn) Write(b []byte) (int, error) { return c.run(&c.w, b) }

// run makes one Read or Write of b through the poller.
func (c *rawTCPConn) run(call *call, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	call.mu.Lock()
	defer call.mu.Unlock()
	call.buf, call.n, call.errno = b, 0, 0
	var err error
	if call.whole {
		err = c.rc.Write(call.fn)
	} else {
		err = c.rc.Read(call.fn)
	}
	n := call.n
	call.buf = nil
	switch {
	case err != nil:
		return n, c.opError(call.op, err)
	case call.errno == syscall.EAGAIN:
		return n, ErrWouldBlock
	case call.errno != 0:
		return n, c.opError(call.op, os.NewSyscallError(call.op, call.errno))
	}
	return n, nil
}

// TryWrite is a Write of c that never waits: when the socket is full it
// returns what it wrote and ErrWouldBlock. c must be one of this
// package's connections (CanTry).
func TryWrite(c net.Conn, b []byte) (int, error) {
	rc, ok := c.(*rawTCPConn)
	if !ok {
		return 0, errNoTry
	}
	return rc.run(&rc.tw, b)
}

// CanTry reports whether c takes TryWrite and Detach.
func CanTry(c net.Conn) bool {
	_, ok := c.(*rawTCPConn)
	return ok
}

// opError gives errors the shape net.Conn's have (RawConn reports its own
// op names), so that callers checking for timeouts or closed connections
// see what they expect.
func (c *rawTCPConn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	if fc, ok := c.socketConn.(*fileConn); ok && fc.closed.Load() {
		// An *os.File says "use of closed file".
		err = net.ErrClosed
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Idle reports whether c, a connection with no request on it, is still
// open and has nothing to read: what a kept-alive connection must be
// before it is reused. A peer that closed it (an upstream's keep-alive
// timeout) shows as end of file; unexpected bytes make it unusable too.
// It never waits.
func Idle(c net.Conn) bool {
	var sc syscall.Conn
	switch c := c.(type) {
	case *rawTCPConn:
		sc = c.socketConn
	case *net.TCPConn:
		sc = c
	default:
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	idle := false
	var b [1]byte
	if err := rc.Control(func(fd uintptr) {
		_, _, e := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		idle = errors.Is(e, syscall.EAGAIN)
	}); err != nil {
		return false
	}
	return idle
}

// ReadFrom, WriteTo and CloseWrite are the *net.TCPConn's, as when it was
// embedded; a fileConn has the plain copies and shutdown.
func (c *rawTCPConn) ReadFrom(r io.Reader) (int64, error) {
	if tc, ok := c.socketConn.(*net.TCPConn); ok {
		return tc.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c}, r)
}

func (c *rawTCPConn) WriteTo(w io.Writer) (int64, error) {
	if tc, ok := c.socketConn.(*net.TCPConn); ok {
		return tc.WriteTo(w)
	}
	return io.Copy(w, struct{ io.Reader }{c})
}

func (c *rawTCPConn) CloseWrite() error {
	if tc, ok := c.socketConn.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	var serr error
	if err := c.rc.Control(func(fd uintptr) { serr = syscall.Shutdown(int(fd), syscall.SHUT_WR) }); err != nil {
		return c.opError("close", err)
	}
	if serr != nil {
		return c.opError("close", os.NewSyscallError("shutdown", serr))
	}
	return nil
}

// fileConn is a TCP socket in the runtime's poller as an *os.File, what
// Socket.Attach makes: os.NewFile costs two system calls where
// net.FileConn costs fifteen (a copy of the descriptor, its addresses
// read again, TCP_NODELAY and keep-alive set again, a second registration
// with the poller), once per stream the loop relays. Its reads and writes
// are the rawTCPConn's, through the File's RawConn, with deadlines as a
// net.Conn's.
type fileConn struct {
	*os.File
	laddr, raddr net.Addr
	closed       atomic.Bool
}

func (c *fileConn) LocalAddr() net.Addr  { return c.laddr }
func (c *fileConn) RemoteAddr() net.Addr { return c.raddr }

func (c *fileConn) Close() error {
	c.closed.Store(true)
	if err := c.File.Close(); err != nil {
		return &net.OpError{Op: "close", Net: "tcp", Source: c.laddr, Addr: c.raddr, Err: net.ErrClosed}
	}
	return nil
}
