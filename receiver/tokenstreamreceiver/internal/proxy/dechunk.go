// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"errors"
	"io"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"
)

// dechunkedBody is an HTTP/1.1 chunked response body read straight from
// the upstream connection into the caller's buffer, its framing (size
// lines, CRLFs, the last chunk and any trailer) taken out in place.
//
// Why not net/http's chunked reader: it reads through a bufio.Reader of
// its own, so every SSE event was copied from the connection into that
// buffer and again into the relay's, through three layers of calls, and
// every open stream held the reader's buffer (2 to 4 KiB) while it waited.
// Here a read is one system call into the relay's buffer and, when framing
// precedes the event in it, one move of the event's bytes within it.
type dechunkedBody struct {
	r io.Reader
	// prefix is what the response head's reader had read past the head:
	// the body's first bytes, consumed before r.
	prefix []byte
	state  dechunkState
	// left is the current chunk's data bytes not yet read (stateData),
	// or its size as far as parsed (stateSize).
	left uint64
	// digits counts the size line's hex digits; lineLen the bytes of its
	// extensions or of a trailer line so far, bounded by maxChunkLine.
	digits, lineLen int
	// extra: bytes followed the body's end, so the connection is not at a
	// request boundary and must not be reused.
	extra bool
	err   error
}

type dechunkState uint8

const (
	stateSize      dechunkState = iota // the size's hex digits
	stateExt                           // a chunk extension, up to CR or LF
	stateSizeLF                        // the LF ending the size line
	stateData                          // left bytes of data
	stateDataCR                        // the CR after the data
	stateDataLF                        // the LF after the data
	stateTrailer                       // a trailer line, or the empty line ending the body
	stateTrailerLF                     // the LF of a trailer line (lineLen == 0: of the last)
	stateDone
)

// maxChunkLine bounds a size line with its extensions, and each trailer
// line: net/http allows 4 KiB.
const maxChunkLine = 4 << 10

var errMalformedChunk = errors.New("proxy: upstream: malformed chunked encoding")

func newDechunkedBody(r io.Reader, prefix []byte) *dechunkedBody {
	return &dechunkedBody{r: r, prefix: prefix}
}

// Read fills p with the body's data. It returns io.EOF once the last
// chunk and the trailer were read, io.ErrUnexpectedEOF when the
// connection ended before them, errMalformedChunk for framing it cannot
// read.
func (d *dechunkedBody) Read(p []byte) (int, error) {
	if d.err != nil {
		return 0, d.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		var n int
		var err error
		if len(d.prefix) > 0 {
			n = copy(p, d.prefix)
			d.prefix = d.prefix[n:]
		} else {
			n, err = d.r.Read(p)
		}
		out, ferr := d.unframe(p[:n])
		if ferr != nil {
			d.err = ferr
			return out, ferr
		}
		if d.state == stateDone {
			d.err = io.EOF
			return out, io.EOF
		}
		if err != nil {
			if errors.Is(err, proxyconn.ErrWouldBlock) {
				// Nothing more to read now (the event loop's reads): the
				// body goes on at the next read.
				return out, err
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			d.err = err
			return out, err
		}
		if out > 0 {
			return out, nil
		}
		// Only framing in this read: read on, as a reader of the body
		// would.
	}
}

// unframe takes the framing out of b in place and returns how many data
// bytes it left at b's start.
func (d *dechunkedBody) unframe(b []byte) (int, error) {
	out := 0
	for i := 0; i < len(b); {
		switch d.state {
		case stateData:
			k := min(uint64(len(b)-i), d.left)
			copy(b[out:], b[i:i+int(k)])
			out += int(k)
			i += int(k)
			if d.left -= k; d.left == 0 {
				d.state = stateDataCR
			}
			continue
		case stateDone:
			d.extra = true
			return out, nil
		}
		c := b[i]
		i++
		switch d.state {
		case stateSize:
			if v, ok := hexDigit(c); ok {
				if d.digits++; d.digits > 15 { // over 2^60 bytes: not a size
					return out, errMalformedChunk
				}
				d.left = d.left<<4 | uint64(v)
			} else if d.digits == 0 {
				return out, errMalformedChunk
			} else {
				switch c {
				case ';', ' ', '\t':
					d.state = stateExt
				case '\r':
					d.state = stateSizeLF
				case '\n':
					d.sizeLineEnd()
				default:
					return out, errMalformedChunk
				}
			}
		case stateExt:
			switch c {
			case '\r':
				d.state = stateSizeLF
			case '\n':
				d.sizeLineEnd()
			default:
				if d.lineLen++; d.lineLen > maxChunkLine {
					return out, errMalformedChunk
				}
			}
		case stateSizeLF:
			if c != '\n' {
				return out, errMalformedChunk
			}
			d.sizeLineEnd()
		case stateDataCR:
			switch c {
			case '\r':
				d.state = stateDataLF
			case '\n': // a bare LF, as net/http accepts
				d.state = stateSize
			default:
				return out, errMalformedChunk
			}
		case stateDataLF:
			if c != '\n' {
				return out, errMalformedChunk
			}
			d.state = stateSize
		case stateTrailer:
			switch c {
			case '\r':
				d.state = stateTrailerLF
			case '\n': // a bare LF, as net/http accepts
				d.trailerLineEnd()
			default:
				if d.lineLen++; d.lineLen > maxChunkLine {
					return out, errMalformedChunk
				}
			}
		case stateTrailerLF:
			if c != '\n' {
				return out, errMalformedChunk
			}
			d.trailerLineEnd()
		}
	}
	return out, nil
}

// sizeLineEnd starts the chunk whose size was read: its data, or the
// trailer after the last chunk.
func (d *dechunkedBody) sizeLineEnd() {
	d.digits, d.lineLen = 0, 0
	if d.left == 0 {
		d.state = stateTrailer
		return
	}
	d.state = stateData
}

// trailerLineEnd ends a trailer line; an empty one ends the body.
func (d *dechunkedBody) trailerLineEnd() {
	if d.lineLen == 0 {
		d.state = stateDone
		return
	}
	d.lineLen, d.state = 0, stateTrailer
}

// reusable reports whether the body ended exactly at the response's end.
func (d *dechunkedBody) reusable() bool { return d.state == stateDone && !d.extra }

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
