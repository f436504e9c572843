// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxyconn // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"

import (
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// HangupWatcher tells when the peer of a watched connection closed or
// reset it, for connections nothing reads from: the client connections
// the proxy relays a stream to after taking them from net/http, whose
// background read noticed a client that left before.
//
// Why not a goroutine per connection blocked in a read: its stack is held
// for the stream's length (the proxy's memory per open stream is what is
// bounded), and a read could take bytes of the client's next request. One
// goroutine waits on an epoll instance of its own for every watched
// connection, registered for the peer's hang-up only (EPOLLRDHUP, and
// EPOLLHUP/EPOLLERR, which epoll always reports), once: bytes the client
// sends meanwhile (a pipelined request) wake nothing and stay in the
// socket for net/http. A stream costs two epoll_ctl calls, nothing per
// event.
type HangupWatcher struct {
	// ep's wake ends the waiting goroutine (Close).
	ep epoll
	mu sync.Mutex
	// fns are the watched connections' callbacks by their epoll id.
	fns    map[uint32]func()
	next   uint32
	closed bool
	done   chan struct{}
}

// NewHangupWatcher starts a watcher; Close ends it.
func NewHangupWatcher() (*HangupWatcher, error) {
	ep, err := newEpoll()
	if err != nil {
		return nil, err
	}
	w := &HangupWatcher{ep: ep, fns: map[uint32]func(){}, done: make(chan struct{})}
	go w.run()
	return w, nil
}

// run waits for hang-ups until Close. It blocks its thread in epoll_wait
// (a blocking system call: the runtime lends its P to the other
// goroutines), so a hang-up costs a thread wake-up and nothing else does.
func (w *HangupWatcher) run() {
	defer close(w.done)
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := w.ep.wait(events, -1)
		if err != nil {
			return
		}
		for i := range events[:n] {
			id := eventID(&events[i])
			if id == wakeID {
				return
			}
			w.mu.Lock()
			fn := w.fns[id]
			delete(w.fns, id)
			w.mu.Unlock()
			if fn != nil {
				fn()
			}
		}
	}
}

// Watch calls hangup, once, when c's peer closes or resets c. stop ends
// the watch (hangup is not called after it returns) and must be called
// before c is closed or handed to another reader. ok is false when c
// cannot be watched (not a socket, or the watcher is closed).
func (w *HangupWatcher) Watch(c net.Conn, hangup func()) (stop func(), ok bool) {
	sc, isSys := c.(syscall.Conn)
	if !isSys {
		return nil, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, false
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, false
	}
	for {
		w.next++
		if _, used := w.fns[w.next]; w.next != wakeID && !used {
			break
		}
	}
	id := w.next
	w.fns[id] = hangup
	w.mu.Unlock()
	var ctlErr error
	err = rc.Control(func(fd uintptr) {
		ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(id)} //nolint:gosec // G115: stored back as a uint32 in run
		ctlErr = unix.EpollCtl(w.ep.fd, unix.EPOLL_CTL_ADD, int(fd), &ev)
	})
	if err != nil || ctlErr != nil {
		w.forget(id)
		return nil, false
	}
	return func() {
		w.forget(id)
		_ = rc.Control(func(fd uintptr) {
			_ = unix.EpollCtl(w.ep.fd, unix.EPOLL_CTL_DEL, int(fd), nil)
		})
	}, true
}

func (w *HangupWatcher) forget(id uint32) {
	w.mu.Lock()
	delete(w.fns, id)
	w.mu.Unlock()
}

// Close ends the watcher; connections still watched are no longer.
func (w *HangupWatcher) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	clear(w.fns)
	w.mu.Unlock()
	w.ep.wake()
	<-w.done
	w.ep.close()
}
