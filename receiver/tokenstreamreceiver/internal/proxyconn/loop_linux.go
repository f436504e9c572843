// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxyconn // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"

import (
	"container/heap"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Loop is an event loop: one goroutine waits on an epoll instance of its
// own for the watched connections to be readable and calls their
// callbacks, runs the timers that are due, and the functions posted to it,
// all on that goroutine, one at a time.
//
// Why: a goroutine blocked in a read per connection is parked and woken by
// the runtime's poller for every SSE event, and the scheduler's work for
// that (finding the goroutine, waking a thread for it, parking it again)
// was a fifth of the proxy's CPU. The loop's goroutine waits in epoll_wait,
// a blocking system call: a batch of ready connections costs its thread
// one wake-up, as nginx's worker, and nothing parks. A callback must never
// wait (a Socket's Read, TryWrite): it would hold every other connection.
type Loop struct {
	ep     epoll
	mu     sync.Mutex
	posted []func()
	closed bool
	// woken: the wake eventfd was written and not yet read; Post writes
	// it once per batch.
	woken atomic.Bool
	done  chan struct{}

	// Only the loop's goroutine uses these.
	// watches by epoll id; wakeID is the wake eventfd's.
	watches map[uint32]*Watch
	next    uint32
	timers  timerHeap
	running []func()
}

// yieldEvery is how often the loop's goroutine yields its P, so that it
// starts a new time slice. Why: it never parks, so one time slice would
// last as long as the load; sysmon takes the P from a goroutine 10 ms into
// its slice when it is in a system call (here epoll_wait), and with every P
// idle then, sysmon sleeps until the call returns and polls every 20 µs for
// a while after: 2 000 of its wake-ups a second at 100 streams. A yield
// with nothing else to run costs a pass through the scheduler, 200 times a
// second.
const yieldEvery = 5 * time.Millisecond

// NewLoop starts a loop; Close ends it.
func NewLoop() (*Loop, error) {
	ep, err := newEpoll()
	if err != nil {
		return nil, err
	}
	l := &Loop{ep: ep, done: make(chan struct{}), watches: map[uint32]*Watch{}}
	go l.run()
	return l, nil
}

func (l *Loop) run() {
	defer close(l.done)
	events := make([]unix.EpollEvent, 128)
	slice := time.Now()
	for {
		if now := time.Now(); now.Sub(slice) >= yieldEvery {
			runtime.Gosched()
			slice = now
		}
		timeout := -1
		if len(l.timers) > 0 {
			// Rounded up: a timer is never run early, and the loop does not
			// spin for the last fraction of a millisecond.
			d := time.Until(l.timers[0].at)
			timeout = int(max((d+time.Millisecond-1)/time.Millisecond, 0))
		}
		n, err := l.ep.wait(events, timeout)
		if err != nil {
			return
		}
		for i := range events[:n] {
			id := eventID(&events[i])
			if id == wakeID {
				l.ep.woken()
				continue
			}
			// A watch stopped by an earlier callback of this batch is gone.
			if w := l.watches[id]; w != nil {
				w.ready()
			}
		}
		if !l.runPosted() {
			return
		}
		if len(l.timers) > 0 {
			now := time.Now()
			for len(l.timers) > 0 && !l.timers[0].at.After(now) {
				t := heap.Pop(&l.timers).(*Timer)
				t.fn()
			}
		}
	}
}

// runPosted runs what was posted; false once the loop is closed.
func (l *Loop) runPosted() bool {
	if !l.woken.Load() {
		return true // nothing posted, not closed: Post and Close set woken
	}
	l.woken.Store(false)
	l.mu.Lock()
	l.running, l.posted = l.posted, l.running[:0]
	closed := l.closed
	l.mu.Unlock()
	for i, fn := range l.running {
		fn()
		l.running[i] = nil
	}
	return !closed
}

// Post has fn run on the loop's goroutine, after the functions posted
// before it; false: the loop is closed and fn will not run.
func (l *Loop) Post(fn func()) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.posted = append(l.posted, fn)
	l.mu.Unlock()
	if !l.woken.Swap(true) {
		l.ep.wake()
	}
	return true
}

// Close ends the loop once what was posted before it ran; the watches left
// are dropped, the timers never run.
func (l *Loop) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	l.woken.Store(true)
	l.ep.wake()
	<-l.done
	l.ep.close()
}

// Watch is a socket the loop watches.
type Watch struct {
	l     *Loop
	id    uint32
	fd    int
	ready func()
}

// Watch calls ready on the loop's goroutine whenever s has bytes to read
// or its peer closed or reset it (level-triggered: until a read takes
// what is there), until Stop. To be called on the loop's goroutine.
func (l *Loop) Watch(s *Socket, ready func()) (*Watch, error) {
	for {
		l.next++
		if _, used := l.watches[l.next]; l.next != wakeID && !used {
			break
		}
	}
	w := &Watch{l: l, id: l.next, fd: s.fd, ready: ready}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(w.id)} //nolint:gosec // G115: stored back as a uint32 in run
	if err := unix.EpollCtl(l.ep.fd, unix.EPOLL_CTL_ADD, s.fd, &ev); err != nil {
		return nil, err
	}
	l.watches[w.id] = w
	return w, nil
}

// Stop ends the watch: ready is not called after it. To be called on the
// loop's goroutine, before the socket is closed or attached.
func (w *Watch) Stop() {
	if w.l.watches[w.id] != w {
		return
	}
	delete(w.l.watches, w.id)
	_ = unix.EpollCtl(w.l.ep.fd, unix.EPOLL_CTL_DEL, w.fd, nil)
}

// Socket is a connection's socket taken out of the runtime's poller
// (Detach), for a loop to watch.
//
// Why: the runtime's poller watches every connection's socket, edge-
// triggered, whether a goroutine waits on it or not, and wakes a thread
// for each of its events. A socket the loop watches would wake two threads
// per SSE event, the loop's and the poller's for nothing. Out of the
// poller, it wakes the loop's alone.
type Socket struct {
	fd int
	// laddr and raddr are the connection's, for Attach.
	laddr, raddr net.Addr
}

// Detach takes c's socket out of the runtime's poller: c is closed, the
// socket stays open as the Socket, until Attach or Close. c must be one of
// this package's connections (CanTry).
func Detach(c net.Conn) (*Socket, error) {
	rc, ok := c.(*rawTCPConn)
	if !ok {
		return nil, errNoTry
	}
	fd := -1
	var dupErr error
	if err := rc.rc.Control(func(sysfd uintptr) {
		fd, dupErr = unix.FcntlInt(sysfd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, dupErr
	}
	laddr, raddr := c.LocalAddr(), c.RemoteAddr()
	_ = c.Close()
	return &Socket{fd: fd, laddr: laddr, raddr: raddr}, nil
}

// Read is a read that never waits: ErrWouldBlock when there is nothing to
// read, io.EOF once the peer closed.
func (s *Socket) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(s.fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		switch e {
		case 0:
			if n == 0 {
				return 0, io.EOF
			}
			return int(n), nil
		case syscall.EINTR:
		case syscall.EAGAIN:
			return 0, ErrWouldBlock
		default:
			return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", e)}
		}
	}
}

// Attach puts the socket back in the runtime's poller: the connection it
// returns (one of this package's) is the socket's, s is no more.
func (s *Socket) Attach() (net.Conn, error) {
	// Non-blocking, so os.NewFile puts it in the poller (fileConn).
	f := os.NewFile(uintptr(s.fd), "tcp")
	s.fd = -1
	if f == nil {
		return nil, errors.New("proxyconn: attach: no socket")
	}
	// Deadlines need the poller; a file outside it refuses them.
	err := f.SetDeadline(time.Time{})
	var rc syscall.RawConn
	if err == nil {
		rc, err = f.SyscallConn()
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return newRawTCPConn(&fileConn{File: f, laddr: s.laddr, raddr: s.raddr}, rc), nil
}

// Close closes the socket.
func (s *Socket) Close() {
	if s.fd >= 0 {
		_ = unix.Close(s.fd)
		s.fd = -1
	}
}

// Timer runs a function on the loop's goroutine at a time; its methods are
// the loop goroutine's.
type Timer struct {
	at time.Time
	fn func()
	i  int // in the heap; -1: not scheduled
}

// NewTimer is a timer that runs fn, not scheduled.
func NewTimer(fn func()) *Timer { return &Timer{fn: fn, i: -1} }

// Schedule has t run at at (once), on l, in place of any time it had.
func (l *Loop) Schedule(t *Timer, at time.Time) {
	t.at = at
	if t.i >= 0 {
		heap.Fix(&l.timers, t.i)
		return
	}
	heap.Push(&l.timers, t)
}

// Unschedule keeps t from running.
func (l *Loop) Unschedule(t *Timer) {
	if t.i >= 0 {
		heap.Remove(&l.timers, t.i)
	}
}

// timerHeap is the loop's timers, the earliest first.
type timerHeap []*Timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}

func (h *timerHeap) Push(x any) {
	t := x.(*Timer)
	t.i = len(*h)
	*h = append(*h, t)
}

func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.i = -1
	return t
}
