// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"encoding/binary"
	"net"

	"golang.org/x/sys/unix"
)

// dropsOOBBytes is the room for the SO_RXQ_OVFL control message.
var dropsOOBBytes = unix.CmsgSpace(4)

// enableDropCount asks the kernel to attach to each datagram read the count
// of datagrams this socket dropped so far for want of receive buffer
// (SO_RXQ_OVFL). It reports whether the kernel accepted.
func enableDropCount(c *net.UDPConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1)
	}); err != nil {
		return false
	}
	return serr == nil
}

// dropCount reads the socket's cumulative drop count from a datagram's
// control messages. The kernel attaches it only once the count is non-zero.
func dropCount(oob []byte) (uint32, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_RXQ_OVFL && len(m.Data) >= 4 {
			return binary.NativeEndian.Uint32(m.Data), true
		}
	}
	return 0, false
}
