// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxyconn

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configopaque"
)

// tcpPair returns both ends of a loopback TCP connection, the first one
// wrapped by wrap.
func tcpPair(tb testing.TB) (*rawTCPConn, *net.TCPConn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(tb, err)
	peer := <-accepted
	require.NotNil(tb, peer)
	raw, ok := wrap(d).(*rawTCPConn)
	require.True(tb, ok, "a TCP connection is wrapped")
	tb.Cleanup(func() { raw.Close(); peer.Close() })
	return raw, peer.(*net.TCPConn)
}

func TestRawTCPConnCarriesBytesBothWays(t *testing.T) {
	raw, peer := tcpPair(t)
	// Far more than the socket buffers hold, so that writes come back with
	// EAGAIN and partial counts while the peer is slow to read.
	out := make([]byte, 16<<20)
	_, _ = rand.Read(out)
	var got bytes.Buffer
	done := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, err := io.Copy(&got, io.LimitReader(peer, int64(len(out))))
		done <- err
	}()
	n, err := raw.Write(out)
	require.NoError(t, err)
	require.Equal(t, len(out), n)
	require.NoError(t, <-done)
	require.True(t, bytes.Equal(out, got.Bytes()), "the peer got exactly what was written")

	in := make([]byte, 1<<20)
	_, _ = rand.Read(in)
	go func() {
		_, _ = peer.Write(in)
		_ = peer.CloseWrite()
	}()
	back, err := io.ReadAll(raw)
	require.NoError(t, err, "the peer's close is io.EOF")
	require.True(t, bytes.Equal(in, back))

	n, err = raw.Read(make([]byte, 8))
	assert.Equal(t, 0, n)
	assert.ErrorIs(t, err, io.EOF, "EOF again after EOF")
	n, err = raw.Read(nil)
	assert.Equal(t, 0, n)
	assert.NoError(t, err)
}

func TestRawTCPConnConcurrentReadAndWrite(t *testing.T) {
	raw, peer := tcpPair(t)
	const msgs, size = 200, 3000
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { // echo
		defer wg.Done()
		_, _ = io.CopyN(peer, peer, msgs*size)
	}()
	go func() {
		defer wg.Done()
		msg := bytes.Repeat([]byte{'x'}, size)
		for range msgs {
			if _, err := raw.Write(msg); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var read int
	go func() {
		defer wg.Done()
		buf := make([]byte, 1000)
		for read < msgs*size {
			n, err := raw.Read(buf)
			if err != nil {
				t.Error(err)
				return
			}
			read += n
		}
	}()
	wg.Wait()
	assert.Equal(t, msgs*size, read)
}

func TestRawTCPConnErrorsHaveNetConnShapes(t *testing.T) {
	t.Run("read deadline", func(t *testing.T) {
		raw, _ := tcpPair(t)
		require.NoError(t, raw.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
		_, err := raw.Read(make([]byte, 8))
		var ne net.Error
		require.ErrorAs(t, err, &ne)
		assert.True(t, ne.Timeout())
		assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
		var oe *net.OpError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, "read", oe.Op)
	})
	t.Run("write deadline", func(t *testing.T) {
		raw, _ := tcpPair(t) // the peer never reads: the buffers fill up
		require.NoError(t, raw.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))
		n, err := raw.Write(make([]byte, 64<<20))
		assert.Positive(t, n, "what fitted was written")
		assert.Less(t, n, 64<<20)
		assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	})
	t.Run("closed while reading", func(t *testing.T) {
		raw, _ := tcpPair(t)
		go func() {
			time.Sleep(20 * time.Millisecond)
			raw.Close()
		}()
		_, err := raw.Read(make([]byte, 8))
		assert.ErrorIs(t, err, net.ErrClosed)
	})
	t.Run("peer reset", func(t *testing.T) {
		raw, peer := tcpPair(t)
		require.NoError(t, peer.SetLinger(0))
		require.NoError(t, peer.Close()) // RST
		var err error
		require.Eventually(t, func() bool {
			_, err = raw.Write([]byte("data: x\n\n"))
			return err != nil
		}, 5*time.Second, 5*time.Millisecond)
		var oe *net.OpError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, "write", oe.Op)
		assert.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE), "%v", err)
	})
}

func TestProxyConnLeavesOtherConnsAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	assert.Same(t, a, wrap(a))
}

// The upstream client keeps every confighttp setting (here a header) and
// dials rawTCPConns.
func TestUpstreamClientUsesProxyConns(t *testing.T) {
	gotHeader := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHeader <- r.Header.Get("X-Engine-Key")
		_, _ = io.WriteString(w, "ok")
	}))
	defer up.Close()
	cfg := confighttp.NewDefaultClientConfig()
	cfg.Endpoint = up.URL
	cfg.Headers = configopaque.MapList{{Name: "X-Engine-Key", Value: "k"}}
	client, err := UpstreamClient(context.Background(), cfg, componenttest.NewNopHost(), componenttest.NewNopTelemetrySettings())
	require.NoError(t, err)
	assert.Empty(t, cfg.Middlewares, "the caller's config is not changed")

	var conn net.Conn
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conn = i.Conn }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, up.URL, http.NoBody)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "ok", string(body))
	assert.Equal(t, "k", <-gotHeader)
	assert.IsType(t, &rawTCPConn{}, conn)
	client.CloseIdleConnections()
}

// The proxy's own listener hands out rawTCPConns.
func TestConnListenerWrapsAcceptedConns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cl := Listener(ln)
	defer cl.Close()
	go func() {
		c, derr := net.Dial("tcp", ln.Addr().String())
		if derr == nil {
			defer c.Close()
			_, _ = c.Write([]byte("x"))
		}
	}()
	c, err := cl.Accept()
	require.NoError(t, err)
	defer c.Close()
	assert.IsType(t, &rawTCPConn{}, c)
	b := make([]byte, 1)
	_, err = io.ReadFull(c, b)
	require.NoError(t, err)
	assert.Equal(t, "x", string(b))
}
