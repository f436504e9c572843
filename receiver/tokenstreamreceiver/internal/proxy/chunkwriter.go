// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"
)

// relayBuffer is the room for the events of one read from the upstream
// (sseReadBuffer) and their chunk framing: they leave in one write.
const relayBuffer = sseReadBuffer + chunkHeaderRoom + len("\r\n") + len(lastChunk)

// chunkHeaderRoom is kept free before a chunk's data for its size line
// (at most 8 hex digits and CRLF here: a chunk is at most relayBuffer, or
// one event written on its own).
const chunkHeaderRoom = 10

const lastChunk = "0\r\n\r\n"

// chunkedConnWriter writes HTTP/1.1 chunks to a hijacked client
// connection: what Write gets is gathered until Flush, which frames it as
// one chunk and writes it in one system call. The first failed write
// fails every later one.
//
// Its buffer is taken from relayBuffers at the first Write after a flush
// and given back by the flush: a stream spends nearly all its life waiting
// for the engine's next token, and holds no buffer while it waits (2 KiB
// less per open stream).
type chunkedConnWriter struct {
	c    net.Conn
	send *sendDeadline
	// buf holds chunkHeaderRoom bytes for the size line, then the data;
	// nil between flushes. pooled is where it came from.
	buf    []byte
	pooled *[]byte
	err    error
	// noWait: the event loop writes (relayloop.go), and must not wait for
	// the client: what the socket does not take at once is kept in
	// backlog, with everything written after it, for wait to write.
	noWait  bool
	backlog []byte
}

// relayBuffers are the chunk writers' buffers, in use from a read of the
// upstream to the write of its events.
var relayBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, relayBuffer)
	return &b
}}

func newChunkedConnWriter(c net.Conn, send *sendDeadline) *chunkedConnWriter {
	return &chunkedConnWriter{c: c, send: send}
}

func (w *chunkedConnWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.buf == nil {
		w.pooled = relayBuffers.Get().(*[]byte)
		w.buf = (*w.pooled)[:chunkHeaderRoom]
	}
	if len(w.buf)+len(p)+len("\r\n")+len(lastChunk) > cap(w.buf) {
		w.Flush()
		if w.err != nil {
			return 0, w.err
		}
		if chunkHeaderRoom+len(p)+len("\r\n")+len(lastChunk) > relayBuffer {
			// Larger than the buffer (an event joined from several reads,
			// an oversized one's piece): a chunk of its own, unbuffered.
			return w.writeLarge(p)
		}
		return w.Write(p)
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *chunkedConnWriter) writeLarge(p []byte) (int, error) {
	w.send.arm(time.Now())
	head := strconv.AppendInt(make([]byte, 0, chunkHeaderRoom), int64(len(p)), 16)
	head = append(head, "\r\n"...)
	if w.err = w.put(head); w.err != nil {
		return 0, w.err
	}
	if w.err = w.put(p); w.err != nil {
		return 0, w.err
	}
	w.err = w.put(crlf)
	return len(p), w.err
}

// put writes b to the connection; without waiting (noWait), what the
// socket does not take goes to the backlog.
func (w *chunkedConnWriter) put(b []byte) error {
	if !w.noWait {
		_, err := w.c.Write(b)
		return err
	}
	if len(w.backlog) > 0 {
		w.backlog = append(w.backlog, b...)
		return nil
	}
	n, err := proxyconn.TryWrite(w.c, b)
	if errors.Is(err, proxyconn.ErrWouldBlock) {
		w.backlog = append(w.backlog, b[n:]...)
		return nil
	}
	return err
}

// blocked reports whether a write waits in the backlog.
func (w *chunkedConnWriter) blocked() bool { return len(w.backlog) > 0 }

// wait ends noWait: the backlog is written, waiting for the client as
// every later write will.
func (w *chunkedConnWriter) wait() error {
	w.noWait = false
	if len(w.backlog) > 0 && w.err == nil {
		w.send.arm(time.Now())
		_, w.err = w.c.Write(w.backlog)
	}
	w.backlog = nil
	return w.err
}

var (
	crlf           = []byte("\r\n")
	lastChunkBytes = []byte(lastChunk)
)

// Flush writes what was gathered as one chunk.
func (w *chunkedConnWriter) Flush() {
	if w.buf == nil {
		return
	}
	if w.err != nil || len(w.buf) == chunkHeaderRoom {
		w.release()
		return
	}
	w.write(w.frame())
}

// frame puts the gathered data's size line before it and CRLF after it,
// and returns the chunk.
func (w *chunkedConnWriter) frame() []byte {
	var head [chunkHeaderRoom]byte
	h := strconv.AppendInt(head[:0], int64(len(w.buf)-chunkHeaderRoom), 16)
	h = append(h, "\r\n"...)
	start := chunkHeaderRoom - len(h)
	copy(w.buf[start:], h)
	w.buf = append(w.buf, "\r\n"...)
	return w.buf[start:]
}

// write writes b, a chunk framed in the buffer, and gives the buffer back.
func (w *chunkedConnWriter) write(b []byte) {
	w.send.arm(time.Now())
	w.err = w.put(b)
	w.release()
}

func (w *chunkedConnWriter) release() {
	if w.pooled != nil {
		relayBuffers.Put(w.pooled)
	}
	w.buf, w.pooled = nil, nil
}

// finish writes what was gathered and the last chunk, in one write: the
// response is whole.
func (w *chunkedConnWriter) finish() error {
	if w.err != nil {
		w.release()
		return w.err
	}
	if w.buf == nil || len(w.buf) == chunkHeaderRoom {
		w.release()
		w.send.arm(time.Now())
		w.err = w.put(lastChunkBytes)
		return w.err
	}
	b := append(w.frame(), lastChunk...)
	w.write(b)
	return w.err
}
