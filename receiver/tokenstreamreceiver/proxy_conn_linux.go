package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// proxyConn returns c as a rawTCPConn when it is a TCP connection, else c.
func proxyConn(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	r := &rawTCPConn{TCPConn: tc, rc: rc}
	r.readFn, r.writeFn = r.doRead, r.doWrite
	return r
}

// rawTCPConn is a TCP connection whose reads and writes are raw system
// calls on its non-blocking socket, made inside the runtime poller's
// RawConn callbacks (which wait for readiness and honour deadlines as for
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
	*net.TCPConn
	rc syscall.RawConn

	// The callbacks and their arguments live in the conn so that a call
	// allocates nothing; the mutexes keep concurrent Reads (or Writes)
	// from sharing them.
	rmu     sync.Mutex
	rbuf    []byte
	rn      int
	rerr    syscall.Errno
	readFn  func(uintptr) bool
	wmu     sync.Mutex
	wbuf    []byte
	wn      int
	werr    syscall.Errno
	writeFn func(uintptr) bool
}

// doRead makes one read; false asks the poller to wait for readiness.
func (c *rawTCPConn) doRead(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rbuf[0])), uintptr(len(c.rbuf)))
		switch e {
		case 0:
			c.rn = int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			c.rerr = e
			return true
		}
	}
}

func (c *rawTCPConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.rbuf, c.rn, c.rerr = b, 0, 0
	err := c.rc.Read(c.readFn)
	c.rbuf = nil
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case c.rerr != 0:
		return 0, c.opError("read", os.NewSyscallError("read", c.rerr))
	case c.rn == 0:
		return 0, io.EOF
	}
	return c.rn, nil
}

// doWrite writes until all is written or the socket is full (false: wait
// for it to drain).
func (c *rawTCPConn) doWrite(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&c.wbuf[c.wn])), uintptr(len(c.wbuf)-c.wn))
		switch e {
		case 0:
			c.wn += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.werr = e
			return true
		}
	}
	return true
}

func (c *rawTCPConn) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf, c.wn, c.werr = b, 0, 0
	err := c.rc.Write(c.writeFn)
	n := c.wn
	c.wbuf = nil
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case c.werr != 0:
		return n, c.opError("write", os.NewSyscallError("write", c.werr))
	}
	return n, nil
}

// opError gives errors the shape net.Conn's have (RawConn reports its own
// op names), so that callers checking for timeouts or closed connections
// see what they expect.
func (c *rawTCPConn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
