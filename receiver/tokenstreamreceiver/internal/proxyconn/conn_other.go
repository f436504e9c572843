// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package proxyconn // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"

import (
	"errors"
	"net"
)

// wrap is c itself: the raw system call path is Linux only.
func wrap(c net.Conn) net.Conn { return c }

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
