// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// socketPath is a socket path in a directory of the test's own.
func socketPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "hooks.sock")
}

// startUnixReceiver starts a receiver with the Unix socket hook only.
func startUnixReceiver(t *testing.T, next *consumertest.LogsSink, mutate func(*UnixConfig)) (*testReceiver, string) {
	t.Helper()
	path := socketPath(t)
	tr := startReceiver(t, next, func(c *Config) {
		c.Hooks.HTTP = configoptional.None[HTTPConfig]()
		c.Hooks.UDP = configoptional.None[UDPConfig]()
		u := c.Hooks.Unix.GetOrInsertDefault()
		u.Endpoint = path
		if mutate != nil {
			mutate(u)
		}
	})
	return tr, path
}

// unixClient is a raw client of the socket: it writes lines and reads the
// acknowledgements.
type unixClient struct {
	t    *testing.T
	conn *net.UnixConn
	acks *bufio.Scanner
}

func dialUnix(t *testing.T, path string) *unixClient {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &unixClient{t: t, conn: c, acks: bufio.NewScanner(c)}
}

func (c *unixClient) write(s string) {
	c.t.Helper()
	_, err := c.conn.Write([]byte(s))
	require.NoError(c.t, err)
}

// readAcks reads acknowledgements until they cover lines lines, and
// returns their sum (errors concatenated).
func (c *unixClient) readAcks(lines int) unixAck {
	c.t.Helper()
	var sum unixAck
	sum.Errors = []lineError{}
	require.NoError(c.t, c.conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	for sum.Accepted+sum.Rejected+sum.Refused < lines {
		require.True(c.t, c.acks.Scan(), "acknowledgement: %v", c.acks.Err())
		var a unixAck
		require.NoError(c.t, json.Unmarshal(c.acks.Bytes(), &a), c.acks.Text())
		sum.Accepted += a.Accepted
		sum.Rejected += a.Rejected
		sum.Refused += a.Refused
		sum.Errors = append(sum.Errors, a.Errors...)
	}
	return sum
}

func TestUnixStream(t *testing.T) {
	tr, path := startUnixReceiver(t, new(consumertest.LogsSink), nil)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o660), fi.Mode().Perm(), "its owner and group may connect, no one else")

	c := dialUnix(t, path)
	// A line may come in pieces, across writes.
	c.write(startLine + "\n" + tok1[:20])
	c.write(tok1[20:] + "\n")
	c.write(tok2 + "\n" + endLine + "\n")
	assert.Equal(t, unixAck{Accepted: 4, Errors: []lineError{}}, c.readAcks(4))
	assert.Equal(t, []string{startLine, tok1, tok2, endLine}, events(t, tr.sink))
	assert.Equal(t, int64(4), counter(t, tr.tel, "otelcol_receiver_token_stream_accepted_events", "unix"))
}

// A bad line is rejected with its line number (counted from the
// connection's first line, across batches), field and reason; the lines
// around it are taken, and the connection goes on.
func TestUnixBadLines(t *testing.T) {
	tr, path := startUnixReceiver(t, new(consumertest.LogsSink), nil)
	c := dialUnix(t, path)
	c.write(startLine + "\n" + tok1 + "\n")
	assert.Equal(t, unixAck{Accepted: 2, Errors: []lineError{}}, c.readAcks(2))
	c.write(`{"event":"token","session_id":"s-1"}` + "\n\n" + `{"event":"token","session_id":"s-1","time_unix_nano":"x"}` + "\n" + tok2 + "\n")
	assert.Equal(t, unixAck{Accepted: 1, Rejected: 2, Errors: []lineError{
		{Line: 3, Message: "time_unix_nano: missing"},
		{Line: 5, Message: "time_unix_nano: want a non-negative integer"},
	}}, c.readAcks(3))
	c.write(endLine + "\n")
	assert.Equal(t, unixAck{Accepted: 1, Errors: []lineError{}}, c.readAcks(1))
	assert.Equal(t, []string{startLine, tok1, tok2, endLine}, events(t, tr.sink))
	assert.Equal(t, int64(2), counter(t, tr.tel, "otelcol_receiver_token_stream_rejected_events", "unix"))
	warned := tr.warnings.FilterMessageSnippet("Unix hook rejected").All()
	require.Len(t, warned, 1)
}

// A line longer than the read buffer is rejected and skipped up to its
// newline, in a buffer of fixed size; a client that never sends a newline
// costs no more memory, and its next line is read once it does.
func TestUnixOverlongLine(t *testing.T) {
	tr, path := startUnixReceiver(t, new(consumertest.LogsSink), nil)
	c := dialUnix(t, path)
	c.write(tok1 + "\n")
	assert.Equal(t, unixAck{Accepted: 1, Errors: []lineError{}}, c.readAcks(1))
	// Five buffers' worth without a newline, in pieces.
	junk := `{"event":"token","session_id":"` + strings.Repeat("x", 64<<10)
	for range 5 {
		c.write(junk)
	}
	c.write("\n" + tok2 + "\n")
	got := c.readAcks(2)
	assert.Equal(t, 1, got.Accepted)
	assert.Equal(t, 1, got.Rejected)
	require.Len(t, got.Errors, 1)
	assert.Equal(t, 2, got.Errors[0].Line)
	assert.Equal(t, "line is longer than 65536 bytes, limit is 16384", got.Errors[0].Message)
	// A line over max_line_bytes that fits the buffer: the parser's error.
	c.write(`{"event":"token","session_id":"` + strings.Repeat("y", 20000) + `"}` + "\n")
	got = c.readAcks(1)
	require.Len(t, got.Errors, 1)
	assert.Equal(t, "line is 20033 bytes, limit is 16384", got.Errors[0].Message)
	assert.Equal(t, []string{tok1, tok2}, events(t, tr.sink))
	// Under the listener's lock: a connection that ends leaves the map.
	tr.r.unix.mu.Lock()
	defer tr.r.unix.mu.Unlock()
	for conn := range tr.r.unix.conns {
		assert.Len(t, conn.lines.buf, unixReadBufferBytes, "the buffer never grows")
	}
}

// A connection over the limit is closed at once and counted; the ones
// within it go on.
func TestUnixConnectionsOverLimit(t *testing.T) {
	tr, path := startUnixReceiver(t, new(consumertest.LogsSink), nil)
	l := tr.r.unix
	l.mu.Lock()
	l.maxConns = 1
	l.mu.Unlock()
	first := dialUnix(t, path)
	first.write(startLine + "\n")
	first.readAcks(1) // served: it is in the listener's map

	over := dialUnix(t, path)
	require.NoError(t, over.conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := over.conn.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "closed at once")
	refused := func() int64 {
		m, err := tr.tel.GetMetric("otelcol_receiver_token_stream_unix_refused_connections")
		if err != nil {
			return 0
		}
		return m.Data.(metricdata.Sum[int64]).DataPoints[0].Value
	}
	assert.Equal(t, int64(1), refused())

	first.write(tok1 + "\n")
	assert.Equal(t, unixAck{Accepted: 1, Errors: []lineError{}}, first.readAcks(1))
}

// Within batch_window the lines of several writes go to the pipeline as
// one batch, a session's tokens in one record.
func TestUnixBatchWindow(t *testing.T) {
	sink := new(consumertest.LogsSink)
	_, path := startUnixReceiver(t, sink, func(u *UnixConfig) { u.BatchWindow = maxBatchWindow })
	c := dialUnix(t, path)
	c.write(tok1 + "\n")
	c.write(tok2 + "\n")
	assert.Equal(t, 2, c.readAcks(2).Accepted)
	assert.Len(t, sink.AllLogs(), 1)
	assert.Equal(t, 1, sink.LogRecordCount())
}

// A pipeline refusal is told to the client as refused lines (it counts them
// failed), and the connection goes on.
func TestUnixRefused(t *testing.T) {
	path := socketPath(t)
	tr := startReceiver(t, consumertest.NewErr(errors.New("refused")), func(c *Config) {
		c.Hooks.HTTP = configoptional.None[HTTPConfig]()
		c.Hooks.UDP = configoptional.None[UDPConfig]()
		c.Hooks.Unix.GetOrInsertDefault().Endpoint = path
	})
	c := dialUnix(t, path)
	c.write(tok1 + "\n" + "{}\n")
	assert.Equal(t, unixAck{Refused: 1, Rejected: 1, Errors: []lineError{{Line: 2, Message: "event: missing"}}}, c.readAcks(2))
	c.write(tok2 + "\n")
	assert.Equal(t, unixAck{Refused: 1, Errors: []lineError{}}, c.readAcks(1))
	assert.Equal(t, int64(2), counter(t, tr.tel, "otelcol_receiver_token_stream_refused_events", "unix"))
}

// At the client's end (its write side closed) a last line without its
// newline is read, acknowledged, and the connection closed.
func TestUnixHalfCloseFlushes(t *testing.T) {
	tr, path := startUnixReceiver(t, new(consumertest.LogsSink), nil)
	c := dialUnix(t, path)
	c.write(tok1 + "\n" + tok2)
	require.NoError(t, c.conn.CloseWrite())
	assert.Equal(t, 2, c.readAcks(2).Accepted)
	assert.False(t, c.acks.Scan(), "closed after the last acknowledgement")
	assert.Equal(t, []string{tok1, tok2}, events(t, tr.sink))
}

// A collector restart: Shutdown hands over and acknowledges what was read,
// closes the connections and removes the socket; a new receiver on the
// same path takes new connections. A socket file left behind by a
// collector that did not shut down is replaced.
func TestUnixRestart(t *testing.T) {
	path := socketPath(t)
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.HTTP = configoptional.None[HTTPConfig]()
	cfg.Hooks.UDP = configoptional.None[UDPConfig]()
	cfg.Hooks.Unix.GetOrInsertDefault().Endpoint = path
	start := func(sink *consumertest.LogsSink) *tokenStreamReceiver {
		rcv, err := NewFactory().CreateLogs(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, sink)
		require.NoError(t, err)
		require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
		return rcv.(*tokenStreamReceiver)
	}

	sink := new(consumertest.LogsSink)
	r := start(sink)
	c := dialUnix(t, path)
	c.write(tok1 + "\n" + tok2[:10])
	assert.Equal(t, 1, c.readAcks(1).Accepted)
	require.NoError(t, r.Shutdown(context.Background()))
	// The partial line cut by the shutdown is not acknowledged: its
	// client counts it failed.
	assert.False(t, c.acks.Scan(), "connection closed")
	_, err := os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "socket removed")
	assert.Equal(t, []string{tok1}, events(t, sink))

	// A crashed collector's socket file: listening, then abandoned
	// without removal.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	sink2 := new(consumertest.LogsSink)
	r2 := start(sink2)
	c2 := dialUnix(t, path)
	c2.write(tok2 + "\n")
	assert.Equal(t, 1, c2.readAcks(1).Accepted)
	require.NoError(t, r2.Shutdown(context.Background()))
	assert.Equal(t, []string{tok2}, events(t, sink2))
}

// A path someone listens on, or a file that is no socket, fails the start.
func TestUnixStartFailsOnBusyPath(t *testing.T) {
	path := socketPath(t)
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	defer ln.Close()
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.Unix.GetOrInsertDefault().Endpoint = path
	rcv, err := NewFactory().CreateLogs(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.ErrorContains(t, rcv.Start(context.Background(), componenttest.NewNopHost()), "another process listens on it")
	require.NoError(t, rcv.Shutdown(context.Background()))

	file := socketPath(t)
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	cfg.Hooks.Unix.Get().Endpoint = file
	rcv, err = NewFactory().CreateLogs(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.ErrorContains(t, rcv.Start(context.Background(), componenttest.NewNopHost()), "exists and is not a socket")
	require.NoError(t, rcv.Shutdown(context.Background()))
}

// A client that never reads its acknowledgements does not hold the
// connection's reads for longer than ackWriteTimeout a batch: the
// connection is closed.
func TestUnixClientNotReadingAcks(t *testing.T) {
	tr, path := startUnixReceiver(t, new(consumertest.LogsSink), func(u *UnixConfig) { u.BatchWindow = 0 })
	c := dialUnix(t, path)
	require.NoError(t, c.conn.SetReadBuffer(1024))
	var err error
	// Each line a batch of its own (no window), each answered: the
	// answers fill the socket's buffers, then the listener gives up.
	for i := 0; i < 200_000 && err == nil; i++ {
		_, err = c.conn.Write([]byte(tok1 + "\n"))
		if i%64 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	require.Error(t, err, "the listener closed the connection")
	require.Eventually(t, func() bool {
		return len(tr.warnings.FilterMessageSnippet("does not read its acknowledgements").All()) == 1
	}, 10*time.Second, 10*time.Millisecond)
}
