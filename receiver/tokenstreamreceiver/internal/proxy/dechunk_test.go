// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http/httputil"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chunked encodes pieces as net/http's chunked writer does, ended by the
// last chunk and an empty trailer.
func chunked(t *testing.T, pieces ...string) []byte {
	var b bytes.Buffer
	w := httputil.NewChunkedWriter(&b)
	for _, p := range pieces {
		_, err := w.Write([]byte(p))
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	b.WriteString("\r\n")
	return b.Bytes()
}

// readAllWith reads d to its end in reads of bufSize bytes.
func readAllWith(d *dechunkedBody, bufSize int) ([]byte, error) {
	var out []byte
	buf := make([]byte, bufSize)
	for {
		n, err := d.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out, err
		}
	}
}

// The body comes out whole whatever the reads from the connection, the
// relay's buffer size and the bytes the head's reader had read past the
// head, and the connection is left at the response's end.
func TestDechunkedBodyReadsWhatTheChunkedWriterWrote(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		var pieces []string
		var want strings.Builder
		for range rng.IntN(8) {
			p := strings.Repeat(string(rune('a'+rng.IntN(26))), 1+rng.IntN(3000))
			pieces = append(pieces, p)
			want.WriteString(p)
		}
		wire := chunked(t, pieces...)
		split := rng.IntN(len(wire) + 1)
		var r io.Reader = bytes.NewReader(wire[split:])
		switch round % 3 {
		case 0:
			r = iotest.OneByteReader(r)
		case 1:
			r = iotest.HalfReader(r)
		}
		d := newDechunkedBody(r, wire[:split])
		got, err := readAllWith(d, 1+rng.IntN(4096))
		require.ErrorIs(t, err, io.EOF, "round %d", round)
		require.Equal(t, want.String(), string(got), "round %d", round)
		assert.True(t, d.reusable(), "round %d", round)
		n, err := d.Read(make([]byte, 8))
		assert.Zero(t, n)
		assert.ErrorIs(t, err, io.EOF, "EOF again")
	}
}

func TestDechunkedBodyExtensionsTrailersAndBareLF(t *testing.T) {
	wire := "5;name=value\r\nhello\r\n6 \r\n world\r\n3\nabc\n0\r\nX-Trailer: v\r\nY: w\r\n\r\n"
	d := newDechunkedBody(strings.NewReader(wire), nil)
	got, err := readAllWith(d, 7)
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, "hello worldabc", string(got))
	assert.True(t, d.reusable())
}

// Bytes after the body's end (a misbehaving upstream) are not read as
// data, and the connection is not reused.
func TestDechunkedBodyBytesAfterTheEnd(t *testing.T) {
	wire := string(chunked(t, "data: x\n\n")) + "HTTP/1.1 200 OK\r\n"
	d := newDechunkedBody(strings.NewReader(wire), nil)
	got, err := readAllWith(d, 4096)
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, "data: x\n\n", string(got))
	assert.False(t, d.reusable())
}

func TestDechunkedBodyBadFraming(t *testing.T) {
	for name, tc := range map[string]struct {
		wire string
		want error
		data string
	}{
		"not a size":            {"zz\r\n", errMalformedChunk, ""},
		"empty size":            {"\r\n", errMalformedChunk, ""},
		"size too large":        {"1000000000000000\r\n", errMalformedChunk, ""},
		"no CRLF after data":    {"5\r\nhelloXX", errMalformedChunk, "hello"},
		"CR without LF":         {"5\rX", errMalformedChunk, ""},
		"overlong extension":    {"5;" + strings.Repeat("x", maxChunkLine+1), errMalformedChunk, ""},
		"overlong trailer":      {"0\r\n" + strings.Repeat("x", maxChunkLine+1), errMalformedChunk, ""},
		"cut in the data":       {"5\r\nhel", io.ErrUnexpectedEOF, "hel"},
		"cut before last chunk": {"3\r\nabc\r\n", io.ErrUnexpectedEOF, "abc"},
		"cut in the trailer":    {"0\r\nX: y\r\n", io.ErrUnexpectedEOF, ""},
		"nothing":               {"", io.ErrUnexpectedEOF, ""},
	} {
		t.Run(name, func(t *testing.T) {
			d := newDechunkedBody(iotest.OneByteReader(strings.NewReader(tc.wire)), nil)
			got, err := readAllWith(d, 64)
			require.ErrorIs(t, err, tc.want)
			assert.Equal(t, tc.data, string(got))
			assert.False(t, d.reusable())
			_, again := d.Read(make([]byte, 8))
			assert.ErrorIs(t, again, tc.want, "the error stays")
		})
	}
}

// A read straight into the relay's buffer, with framing before the event,
// moves the event within the buffer and allocates nothing.
func TestDechunkedBodyAllocatesNothing(t *testing.T) {
	event := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
	one := chunked(t, event)
	one = one[:len(one)-len("0\r\n\r\n")] // a chunk, the stream going on
	r := bytes.NewReader(one)
	d := newDechunkedBody(r, nil)
	buf := make([]byte, 2048)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(one)
		n, err := d.Read(buf)
		if err != nil || string(buf[:n]) != event {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
	})
	assert.Zero(t, allocs)
}
