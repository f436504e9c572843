// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package tokenstreamreceiver

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
)

// waitQueued waits until bytes are queued on c for reading, without reading
// them (MSG_PEEK).
func waitQueued(t *testing.T, c *net.UnixConn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	var peekErr error
	require.NoError(t, raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if errors.Is(err, syscall.EAGAIN) {
			return false
		}
		peekErr = err
		return true
	}))
	require.NoError(t, peekErr)
}

// A client that closes with an answer still unread resets the connection:
// the other end reads what the client wrote, then ECONNRESET instead of
// EOF. This is what the kernel does, and what the next test relies on.
func TestUnixCloseWithUnreadDataResets(t *testing.T) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socketPath(t), Net: "unix"})
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.DialUnix("unix", nil, ln.Addr().(*net.UnixAddr))
	require.NoError(t, err)
	server, err := ln.AcceptUnix()
	require.NoError(t, err)
	defer server.Close()

	_, err = server.Write([]byte("ack\n"))
	require.NoError(t, err)
	waitQueued(t, client)
	_, err = client.Write([]byte("last"))
	require.NoError(t, err)
	require.NoError(t, client.Close())

	require.NoError(t, server.SetReadDeadline(time.Now().Add(10*time.Second)))
	got, err := io.ReadAll(server)
	assert.Equal(t, "last", string(got), "what the client wrote is read first")
	assert.ErrorIs(t, err, syscall.ECONNRESET)
}

// Every line a client wrote before its connection ended is taken or
// counted, whether the end is an EOF (the client read its answers) or a
// reset (it closed, or was killed, with an answer unread): a last line
// whole but for its newline is taken, one cut short is rejected and
// counted, saying that the connection ended mid-line; with a batch window
// or without.
func TestUnixStreamEndKeepsLastLine(t *testing.T) {
	for _, window := range []time.Duration{defaultUnixBatchWindow, 0} {
		for _, end := range []string{"eof", "reset"} {
			for _, last := range []string{"whole", "cut"} {
				t.Run(window.String()+"/"+end+"/"+last, func(t *testing.T) {
					tr, path := startUnixReceiver(t, new(consumertest.LogsSink), func(u *UnixConfig) { u.BatchWindow = window })
					c := dialUnix(t, path)
					c.write(tok1 + "\n")
					if end == "eof" {
						assert.Equal(t, 1, c.readAcks(1).Accepted)
					} else {
						waitQueued(t, c.conn)
					}
					if last == "whole" {
						c.write(tok2)
					} else {
						c.write(tok2[:33])
					}
					require.NoError(t, c.conn.Close())

					if last == "whole" {
						require.Eventually(t, func() bool { return len(tr.sink.AllLogs()) == 2 }, 10*time.Second, 5*time.Millisecond)
						assert.Equal(t, []string{tok1, tok2}, events(t, tr.sink))
						return
					}
					require.Eventually(t, func() bool {
						return counter(t, tr.tel, "otelcol_receiver_token_stream_rejected_events", "unix") == 1
					}, 10*time.Second, 5*time.Millisecond)
					assert.Equal(t, []string{tok1}, events(t, tr.sink))
					warned := tr.warnings.FilterMessageSnippet("Unix hook rejected").All()
					require.Len(t, warned, 1)
					assert.Contains(t, warned[0].ContextMap()["error"], "line 2: session_id: unterminated string (the connection ended before the line's newline)")
					assert.Empty(t, tr.warnings.FilterMessageSnippet("does not read its acknowledgements").All(),
						"a client that went away is not one that does not read")
				})
			}
		}
	}
}

// A client that writes its last lines and closes without waiting for their
// answers (a client killed): the answer it does not read cannot be written,
// and what it wrote after is still read and counted, not dropped with the
// connection.
func TestUnixClientGoneBeforeAnswer(t *testing.T) {
	sink := new(consumertest.LogsSink)
	entered, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	next, err := consumer.NewLogs(func(ctx context.Context, ld plog.Logs) error {
		first.Do(func() {
			close(entered)
			<-release
		})
		return sink.ConsumeLogs(ctx, ld)
	})
	require.NoError(t, err)
	path := socketPath(t)
	tr := startReceiver(t, next, func(c *Config) {
		c.Hooks.HTTP = configoptional.None[HTTPConfig]()
		c.Hooks.UDP = configoptional.None[UDPConfig]()
		c.Hooks.Unix.GetOrInsertDefault().Endpoint = path
	})
	c := dialUnix(t, path)
	c.write(tok1 + "\n")
	<-entered // the first batch is in the pipeline, its answer not yet written
	c.write(tok2 + "\n" + endLine[:20])
	require.NoError(t, c.conn.Close())
	close(release)

	require.Eventually(t, func() bool {
		return counter(t, tr.tel, "otelcol_receiver_token_stream_rejected_events", "unix") == 1 && len(sink.AllLogs()) == 2
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, []string{tok1, tok2}, events(t, sink))
	assert.Empty(t, tr.warnings.FilterMessageSnippet("does not read its acknowledgements").All())
}
