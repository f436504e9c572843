//go:build !linux

package proxyconn // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"

import "net"

// wrap is c itself: the raw system call path is Linux only.
func wrap(c net.Conn) net.Conn { return c }

// Idle reports whether c can be reused; elsewhere than on Linux it is
// not checked (a closed one fails its next request).
func Idle(net.Conn) bool { return true }
