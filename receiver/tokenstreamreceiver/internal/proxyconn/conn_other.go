// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package proxyconn // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"

import (
	"errors"
	"net"
	"time"
)

// wrap is c itself: the raw system call path is Linux only.
func wrap(c net.Conn) net.Conn { return c }

// TryWrite is not available here (CanTry is false).
func TryWrite(net.Conn, []byte) (int, error) { return 0, errNoTry }

// CanTry is false: the non-blocking calls are Linux only.
func CanTry(net.Conn) bool { return false }

// Idle reports whether c can be reused; elsewhere than on Linux it is
// not checked (a closed one fails its next request).
func Idle(net.Conn) bool { return true }

// HangupWatcher is Linux only; NewHangupWatcher fails elsewhere, and the
// proxy then leaves its client connections to net/http.
type HangupWatcher struct{}

// NewHangupWatcher is unsupported here.
func NewHangupWatcher() (*HangupWatcher, error) {
	return nil, errors.New("proxyconn: no hang-up watcher on this platform")
}

// Watch is never reached: no watcher exists here.
func (*HangupWatcher) Watch(net.Conn, func()) (stop func(), ok bool) { return nil, false }

// Close does nothing.
func (*HangupWatcher) Close() {}

// Loop is Linux only; NewLoop fails elsewhere, and the proxy then relays
// each stream on a goroutine of its own.
type Loop struct{}

// NewLoop is unsupported here.
func NewLoop() (*Loop, error) {
	return nil, errors.New("proxyconn: no event loop on this platform")
}

// Post is never reached: no loop exists here.
func (*Loop) Post(func()) bool { return false }

// Close does nothing.
func (*Loop) Close() {}

// Watch is never reached.
func (*Loop) Watch(*Socket, func()) (*Watch, error) { return nil, errNoTry }

// Socket is Linux only.
type Socket struct{}

// Detach is unsupported here.
func Detach(net.Conn) (*Socket, error) { return nil, errNoTry }

// Read is never reached.
func (*Socket) Read([]byte) (int, error) { return 0, errNoTry }

// Attach is never reached.
func (*Socket) Attach() (net.Conn, error) { return nil, errNoTry }

// Close does nothing.
func (*Socket) Close() {}

// Watch is Linux only.
type Watch struct{}

// Stop does nothing.
func (*Watch) Stop() {}

// Timer is Linux only.
type Timer struct{}

// NewTimer is a timer no loop runs.
func NewTimer(func()) *Timer { return &Timer{} }

// Schedule is never reached.
func (*Loop) Schedule(*Timer, time.Time) {}

// Unschedule is never reached.
func (*Loop) Unschedule(*Timer) {}
