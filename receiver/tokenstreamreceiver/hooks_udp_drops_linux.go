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

// readQueuedDatagram reads a datagram if one is queued, without waiting:
// ok is false when none is (or the read failed otherwise, which the next
// waiting read reports). err is the connection's (closed).
func (l *hooksUDPListener) readQueuedDatagram(buf []byte) (n int, ok bool, err error) {
	var oobn int
	var rerr error
	err = l.raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, l.oob, unix.MSG_DONTWAIT)
		return true // never wait for readiness
	})
	if err != nil || rerr != nil {
		return 0, false, err
	}
	l.countDrops(l.oob[:oobn])
	return n, true, nil
}
