// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// A stream relayed off net/http leaves the client connection as net/http
// would: kept alive after a whole response (its next request, pipelined
// or not, served on it, the chunk framing readable by any HTTP/1.1
// client), closed after a response to a request that asked for it.
func TestProxyRelayedStreamKeepsTheConnection(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return time.Millisecond })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink)
	conn, err := net.Dial("tcp", tr.p.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	// It asks for the usage chunk, which the proxy would add and strip
	// otherwise: the client gets the upstream's bytes as they are.
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`
	request := func(extra string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n" + extra +
			"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	br := bufio.NewReader(conn)
	readStream := func(i int) *http.Response {
		t.Helper()
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "response %d", i)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, []string{"chunked"}, resp.TransferEncoding, "response %d", i)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err, "response %d", i)
		assert.Equal(t, strings.Join(chat, ""), string(got), "response %d", i)
		return resp
	}

	// Two pipelined requests, then one after the answers.
	_, err = io.WriteString(conn, request("")+request(""))
	require.NoError(t, err)
	readStream(0)
	readStream(1)
	_, err = io.WriteString(conn, request(""))
	require.NoError(t, err)
	readStream(2)

	_, err = io.WriteString(conn, request("Connection: close\r\n"))
	require.NoError(t, err)
	resp := readStream(3)
	assert.True(t, resp.Close, "the response says the connection closes")
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the proxy closed the connection after the stream")

	evs := sessionEvents(t, sink, 4)
	ends := 0
	for _, ev := range evs {
		if ev.Kind == tokenevent.KindEnd {
			ends++
		}
	}
	assert.Equal(t, 4, ends)
	up.mu.Lock()
	assert.Len(t, up.bodies, 4)
	up.mu.Unlock()
}

// recordingConn is a client connection that keeps each write apart.
type recordingConn struct {
	net.Conn
	writes [][]byte
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, append([]byte(nil), p...))
	return len(p), nil
}

// The chunk writer frames what one flush gathered as one chunk in one
// write, an event larger than its buffer as a chunk of its own, and ends
// with the last chunk; between flushes it holds no buffer.
func TestChunkedConnWriterFrames(t *testing.T) {
	conn := &recordingConn{}
	w := newChunkedConnWriter(conn, nil)
	w.Flush()
	assert.Empty(t, conn.writes, "nothing gathered, nothing written")

	_, err := w.Write([]byte("data: a\n\n"))
	require.NoError(t, err)
	_, err = w.Write([]byte("data: bb\n\n"))
	require.NoError(t, err)
	w.Flush()
	assert.Nil(t, w.buf, "the buffer goes back to the pool at the flush")
	require.Len(t, conn.writes, 1, "one write per flush")
	assert.Equal(t, "13\r\ndata: a\n\ndata: bb\n\n\r\n", string(conn.writes[0]))

	large := "data: " + strings.Repeat("x", relayBuffer) + "\n\n"
	_, err = w.Write([]byte("data: c\n\n"))
	require.NoError(t, err)
	_, err = w.Write([]byte(large))
	require.NoError(t, err)
	require.NoError(t, w.finish())
	assert.Nil(t, w.buf)

	var all strings.Builder
	for _, b := range conn.writes {
		all.Write(b)
	}
	body, err := io.ReadAll(httputil.NewChunkedReader(strings.NewReader(all.String())))
	require.NoError(t, err, "a valid chunked body, ended by the last chunk")
	assert.Equal(t, "data: a\n\ndata: bb\n\ndata: c\n\n"+large, string(body))
	assert.True(t, strings.HasSuffix(all.String(), "\r\n0\r\n\r\n"))

	// A stream whose last flush left nothing: finish writes the last chunk alone.
	conn2 := &recordingConn{}
	w2 := newChunkedConnWriter(conn2, nil)
	require.NoError(t, w2.finish())
	require.Len(t, conn2.writes, 1)
	assert.Equal(t, "0\r\n\r\n", string(conn2.writes[0]))
}
