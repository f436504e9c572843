// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxyconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TryWrite writes what the socket takes and says what it wrote: to a peer
// that does not read, a write larger than the buffers comes back short
// with ErrWouldBlock, and the peer gets exactly the bytes counted.
func TestTryWrite(t *testing.T) {
	raw, peer := tcpPair(t)
	out := bytes.Repeat([]byte("0123456789abcdef"), 4<<20) // 64 MiB
	written := 0
	for written < len(out) {
		n, err := TryWrite(raw, out[written:])
		written += n
		if errors.Is(err, ErrWouldBlock) {
			break
		}
		require.NoError(t, err)
	}
	require.Less(t, written, len(out), "the sockets hold less than 64 MiB")
	require.NoError(t, raw.CloseWrite())
	got, err := io.ReadAll(peer)
	require.NoError(t, err)
	assert.Equal(t, out[:written], got)
}

// The loop calls a watch's callback while its socket has bytes to read
// (level-triggered), on its goroutine with what is posted, and not after
// Stop; a timer runs once when due and not when unscheduled. The socket,
// detached from its connection, reads without waiting, and attached again
// is a connection that reads what is left.
func TestLoop(t *testing.T) {
	l, err := NewLoop()
	require.NoError(t, err)
	defer l.Close()
	conn, peer := tcpPair(t)
	raw, err := Detach(conn)
	require.NoError(t, err)
	_, err = conn.Read(make([]byte, 1))
	require.ErrorIs(t, err, net.ErrClosed, "the connection is closed, the socket open")
	_, err = raw.Read(make([]byte, 1))
	require.ErrorIs(t, err, ErrWouldBlock, "nothing to read")

	got := make(chan string, 16)
	var w *Watch
	watched := make(chan error, 1)
	require.True(t, l.Post(func() {
		var err error
		w, err = l.Watch(raw, func() {
			// Half of what is there: the rest calls back again.
			var b [2]byte
			n, _ := raw.Read(b[:])
			got <- string(b[:n])
		})
		watched <- err
	}))
	require.NoError(t, <-watched)
	_, err = peer.Write([]byte("abcd"))
	require.NoError(t, err)
	var all string
	for len(all) < 4 {
		select {
		case s := <-got:
			all += s
		case <-time.After(10 * time.Second):
			t.Fatal("no callback")
		}
	}
	assert.Equal(t, "abcd", all)

	stopped := make(chan struct{})
	require.True(t, l.Post(func() { w.Stop(); w.Stop(); close(stopped) }))
	<-stopped
	_, err = peer.Write([]byte("ef"))
	require.NoError(t, err)

	ran := make(chan string, 2)
	require.True(t, l.Post(func() {
		kept, dropped := NewTimer(func() { ran <- "kept" }), NewTimer(func() { ran <- "dropped" })
		l.Schedule(dropped, time.Now().Add(time.Millisecond))
		l.Schedule(kept, time.Now().Add(time.Hour))
		l.Schedule(kept, time.Now().Add(2*time.Millisecond)) // moved earlier
		l.Unschedule(dropped)
		l.Unschedule(dropped)
	}))
	select {
	case s := <-ran:
		assert.Equal(t, "kept", s)
	case <-time.After(10 * time.Second):
		t.Fatal("the timer did not run")
	}
	// A round trip through the loop: anything due before it ran.
	done := make(chan struct{})
	require.True(t, l.Post(func() { close(done) }))
	<-done
	assert.Empty(t, ran, "a timer runs once; an unscheduled one never")
	assert.Empty(t, got, "no callback after Stop")
	c, err := raw.Attach()
	require.NoError(t, err)
	defer c.Close()
	assert.True(t, CanTry(c))
	buf := make([]byte, 8)
	n, err := io.ReadAtLeast(c, buf, 2)
	require.NoError(t, err)
	assert.Equal(t, "ef", string(buf[:n]), "the bytes stay for the next reader")
	require.NoError(t, peer.Close())
	_, err = c.Read(buf)
	assert.ErrorIs(t, err, io.EOF)
}

// Close runs what was posted before it; Post after it is refused.
func TestLoopClose(t *testing.T) {
	l, err := NewLoop()
	require.NoError(t, err)
	ran := false
	require.True(t, l.Post(func() { ran = true }))
	l.Close()
	assert.True(t, ran)
	assert.False(t, l.Post(func() {}))
	l.Close()
}

// A connection not of this package is not detached.
func TestDetachRefused(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	assert.False(t, CanTry(a))
	_, err := Detach(a)
	assert.Error(t, err)
}

// A detached socket reads the peer's bytes, then io.EOF once it closed.
func TestSocketReadEOF(t *testing.T) {
	conn, peer := tcpPair(t)
	sock, err := Detach(conn)
	require.NoError(t, err)
	defer sock.Close()
	_, err = peer.Write([]byte("last"))
	require.NoError(t, err)
	require.NoError(t, peer.Close())
	var got []byte
	buf := make([]byte, 8)
	require.Eventually(t, func() bool {
		n, err := sock.Read(buf)
		got = append(got, buf[:n]...)
		return errors.Is(err, io.EOF)
	}, 10*time.Second, time.Millisecond)
	assert.Equal(t, "last", string(got))
}

// BenchmarkDetachAttach is what a stream relayed by the loop pays to take
// its upstream's socket out of the runtime's poller and to put it back.
func BenchmarkDetachAttach(b *testing.B) {
	raw, _ := tcpPair(b)
	var c net.Conn = raw
	for b.Loop() {
		sock, err := Detach(c)
		if err != nil {
			b.Fatal(err)
		}
		if c, err = sock.Attach(); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
}

// A socket attached again is a connection as net.Conn's are: its
// addresses, a read deadline that times out as a net.Error, a write, the
// half-close, Idle, a second detach, and net.ErrClosed once closed.
func TestAttachedConn(t *testing.T) {
	conn, peer := tcpPair(t)
	laddr, raddr := conn.LocalAddr().String(), conn.RemoteAddr().String()
	sock, err := Detach(conn)
	require.NoError(t, err)
	c, err := sock.Attach()
	require.NoError(t, err)
	defer c.Close()
	require.True(t, CanTry(c))
	assert.Equal(t, laddr, c.LocalAddr().String())
	assert.Equal(t, raddr, c.RemoteAddr().String())
	assert.True(t, Idle(c), "open, nothing to read")

	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	require.NoError(t, c.SetReadDeadline(time.Time{}))

	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(peer, buf)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(buf))

	// Detached and attached again, the bytes the peer sent stay.
	_, err = peer.Write([]byte("pong"))
	require.NoError(t, err)
	sock, err = Detach(c)
	require.NoError(t, err)
	c, err = sock.Attach()
	require.NoError(t, err)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "pong", string(buf))

	raw, ok := c.(*rawTCPConn)
	require.True(t, ok)
	require.NoError(t, raw.CloseWrite())
	n, err := peer.Read(buf)
	assert.Equal(t, 0, n)
	require.ErrorIs(t, err, io.EOF, "the peer sees the half-close")

	require.NoError(t, peer.Close())
	require.Eventually(t, func() bool { return !Idle(c) }, 10*time.Second, time.Millisecond, "a closed peer is not idle")

	require.NoError(t, c.Close())
	_, err = c.Read(buf)
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = c.Write(buf)
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, c.Close(), net.ErrClosed)
}

// A socket attached again is relayed by the loop as the first one was.
func TestAttachedConnDetachedForLoop(t *testing.T) {
	l, err := NewLoop()
	require.NoError(t, err)
	defer l.Close()
	conn, peer := tcpPair(t)
	sock, err := Detach(conn)
	require.NoError(t, err)
	c, err := sock.Attach()
	require.NoError(t, err)
	sock, err = Detach(c)
	require.NoError(t, err)
	defer sock.Close()
	got := make(chan string, 1)
	require.True(t, l.Post(func() {
		var w *Watch
		w, err := l.Watch(sock, func() {
			var b [8]byte
			n, _ := sock.Read(b[:])
			w.Stop()
			got <- string(b[:n])
		})
		if err != nil {
			got <- err.Error()
		}
	}))
	_, err = peer.Write([]byte("tok"))
	require.NoError(t, err)
	select {
	case s := <-got:
		assert.Equal(t, "tok", s)
	case <-time.After(10 * time.Second):
		t.Fatal("no callback")
	}
}
