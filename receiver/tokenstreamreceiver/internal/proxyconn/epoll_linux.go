// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxyconn // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"

import (
	"errors"

	"golang.org/x/sys/unix"
)

// epoll is an epoll instance of its own and an eventfd registered in it
// as wakeID, whose write wakes the goroutine waiting on the instance: the
// Loop's and the HangupWatcher's, each of which waits in epoll_wait on its
// own thread.
type epoll struct {
	fd, wakefd int
}

// wakeID is the epoll id of the wake eventfd; the watched sockets get the
// others.
const wakeID = 0

func newEpoll() (epoll, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return epoll{}, errors.Join(errors.New("proxyconn: epoll_create1"), err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return epoll{}, errors.Join(errors.New("proxyconn: eventfd"), err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: wakeID}
	if err := unix.EpollCtl(fd, unix.EPOLL_CTL_ADD, wakefd, &ev); err != nil {
		unix.Close(wakefd)
		unix.Close(fd)
		return epoll{}, errors.Join(errors.New("proxyconn: epoll_ctl"), err)
	}
	return epoll{fd: fd, wakefd: wakefd}, nil
}

// wake makes the instance's waiter return from epoll_wait with wakeID
// ready, until it reads the eventfd (woken).
func (e epoll) wake() {
	one := [8]byte{1}
	_, _ = unix.Write(e.wakefd, one[:])
}

// woken reads the eventfd, so that wakeID is ready again only after the
// next wake.
func (e epoll) woken() {
	var b [8]byte
	_, _ = unix.Read(e.wakefd, b[:])
}

// wait is epoll_wait, again after a signal interrupted it.
func (e epoll) wait(events []unix.EpollEvent, timeoutMs int) (int, error) {
	for {
		n, err := unix.EpollWait(e.fd, events, timeoutMs)
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// eventID is the id of the watched socket (or wakeID) an event carries.
func eventID(ev *unix.EpollEvent) uint32 {
	return uint32(ev.Fd) //nolint:gosec // G115: the id was a uint32 stored as the event's data
}

func (e epoll) close() {
	unix.Close(e.wakefd)
	unix.Close(e.fd)
}
