// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeStreamReceiver listens on a Unix socket and answers each read of
// lines with ack(lines), standing in for the receiver's hooks::unix.
func fakeStreamReceiver(t *testing.T, ack func(lines int) string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewScanner(c)
				for r.Scan() {
					if a := ack(1); a != "" {
						if _, err := c.Write([]byte(a)); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return path
}

// Each line's fate is the acknowledgement's: accepted lines are sent,
// rejected ones rejected, refused ones failed; Close waits for the
// acknowledgements of what it wrote last.
func TestStreamAcknowledgementsSettle(t *testing.T) {
	n := 0
	path := fakeStreamReceiver(t, func(int) string {
		n++
		switch n % 3 {
		case 0:
			return `{"accepted":0,"rejected":1,"refused":0,"errors":[{"line":3,"message":"x: bad"}]}` + "\n"
		case 1:
			return `{"accepted":1,"rejected":0,"refused":0,"errors":[]}` + "\n"
		}
		return `{"accepted":0,"rejected":0,"refused":1,"errors":[]}` + "\n"
	})
	c, err := New(Config{Endpoint: "unix://" + path, FlushInterval: time.Millisecond})
	require.NoError(t, err)
	for i := range 30 {
		require.NoError(t, c.Token(fmt.Sprint("s", i), time.Time{}, 1))
	}
	require.NoError(t, c.Close(context.Background()))
	assert.Equal(t, Stats{Sent: 10, Rejected: 10, Failed: 10}, c.Stats())
}

// A receiver that never acknowledges: Close waits at most Timeout, and the
// lines in flight count as failed.
func TestStreamUnacknowledgedFailAtClose(t *testing.T) {
	path := fakeStreamReceiver(t, func(int) string { return "" })
	c, err := New(Config{Endpoint: "unix://" + path, FlushInterval: time.Millisecond, Timeout: 100 * time.Millisecond})
	require.NoError(t, err)
	for range 5 {
		require.NoError(t, c.Token("s", time.Time{}, 1))
	}
	require.NoError(t, c.Close(context.Background()))
	assert.Equal(t, Stats{Failed: 5}, c.Stats())
}

// No one listens: batches fail at once (the engine never waits), and an
// acknowledgement that is not the receiver's ends the connection, its
// lines in flight failed.
func TestStreamNoReceiverAndForeignAnswers(t *testing.T) {
	c, err := New(Config{Endpoint: "unix:///nonexistent-dir/s.sock", FlushInterval: time.Millisecond})
	require.NoError(t, err)
	for range 5 {
		require.NoError(t, c.Token("s", time.Time{}, 1))
	}
	require.NoError(t, c.Close(context.Background()))
	assert.Equal(t, Stats{Failed: 5}, c.Stats())

	path := fakeStreamReceiver(t, func(int) string { return "HTTP/1.1 400 Bad Request\n" })
	c, err = New(Config{Endpoint: "unix://" + path, FlushInterval: time.Millisecond})
	require.NoError(t, err)
	for range 5 {
		require.NoError(t, c.Token("s", time.Time{}, 1))
	}
	require.NoError(t, c.Close(context.Background()))
	st := c.Stats()
	assert.Equal(t, uint64(5), st.Failed+st.Sent)
	assert.Zero(t, st.Sent)
}

// Close's context ending aborts the wait for acknowledgements.
func TestStreamCloseAborts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		// Takes the connection and neither reads nor closes it: a
		// receiver hung.
		if c, err := ln.Accept(); err == nil {
			held <- c
		}
	}()
	c, err := New(Config{Endpoint: "unix://" + path, FlushInterval: time.Millisecond, Timeout: time.Hour})
	require.NoError(t, err)
	require.NoError(t, c.Token("s", time.Time{}, 1))
	conn := <-held
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Close(ctx), context.DeadlineExceeded)
	assert.Equal(t, Stats{Failed: 1}, c.Stats())
}
