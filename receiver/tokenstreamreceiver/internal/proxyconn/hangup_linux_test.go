// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxyconn

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// watchedPair is a loopback connection whose first end w watches; hung
// gets a value when w calls back.
func watchedPair(t *testing.T, w *HangupWatcher) (conn *rawTCPConn, peer *net.TCPConn, hung chan struct{}, stop func()) {
	t.Helper()
	conn, peer = tcpPair(t)
	hung = make(chan struct{}, 1)
	stop, ok := w.Watch(conn, func() { hung <- struct{}{} })
	require.True(t, ok)
	return conn, peer, hung, stop
}

// The watcher calls back when the peer closes (FIN) or resets (RST) the
// connection, not when it sends bytes (a pipelined request, which must
// stay in the socket for net/http), and never after stop.
func TestHangupWatcher(t *testing.T) {
	w, err := NewHangupWatcher()
	require.NoError(t, err)
	defer w.Close()

	t.Run("bytes then close", func(t *testing.T) {
		conn, peer, hung, _ := watchedPair(t, w)
		_, err := peer.Write([]byte("GET / HTTP/1.1\r\n"))
		require.NoError(t, err)
		select {
		case <-hung:
			t.Fatal("bytes from the peer are not a hang-up")
		case <-time.After(100 * time.Millisecond):
		}
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		require.NoError(t, err)
		assert.Equal(t, "GET / HTTP/1.1\r\n", string(buf[:n]), "the bytes stay for the connection's reader")
		peer.Close()
		select {
		case <-hung:
		case <-time.After(5 * time.Second):
			t.Fatal("no call back after the peer closed")
		}
	})
	t.Run("reset", func(t *testing.T) {
		_, peer, hung, _ := watchedPair(t, w)
		require.NoError(t, peer.SetLinger(0))
		peer.Close()
		select {
		case <-hung:
		case <-time.After(5 * time.Second):
			t.Fatal("no call back after the peer reset")
		}
	})
	t.Run("stopped", func(t *testing.T) {
		_, peer, hung, stop := watchedPair(t, w)
		stop()
		peer.Close()
		select {
		case <-hung:
			t.Fatal("called back after stop")
		case <-time.After(100 * time.Millisecond):
		}
	})
}

func TestHangupWatcherClosed(t *testing.T) {
	w, err := NewHangupWatcher()
	require.NoError(t, err)
	w.Close()
	conn, _ := tcpPair(t)
	_, ok := w.Watch(conn, func() {})
	assert.False(t, ok, "a closed watcher watches nothing")
}
