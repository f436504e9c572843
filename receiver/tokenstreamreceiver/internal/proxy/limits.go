// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// bodyLimitReader notes that the client's body went over
// max_request_body_size (confighttp's MaxBytesReader ends it with an error
// the transport reports as its own failure).
//
// It also bounds each wait for the client's next bytes with a read
// deadline on the client's connection, cleared once the body is read.
type bodyLimitReader struct {
	r        io.Reader
	rc       *http.ResponseController
	timeout  time.Duration
	exceeded atomic.Int64 // the limit, once it was hit
	timedOut atomic.Bool
	// whole: the body was read to its end, so the client's next request
	// starts right after it on the connection.
	whole atomic.Bool
}

func (b *bodyLimitReader) Read(p []byte) (int, error) {
	if b.timeout > 0 {
		if b.rc.SetReadDeadline(time.Now().Add(b.timeout)) != nil {
			b.timeout = 0 // not supported by this connection
		}
	}
	n, err := b.r.Read(p)
	if err == nil {
		return n, nil
	}
	if errors.Is(err, io.EOF) {
		b.whole.Store(true)
	}
	if b.timeout > 0 && errors.Is(err, io.EOF) {
		// Whole: the connection's reads are the server's again. (After a
		// timeout the deadline stays, so that the server gives up on the
		// rest of the body too.)
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		b.exceeded.Store(max(mbe.Limit, 1))
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		b.timedOut.Store(true)
	}
	return n, err
}

// sendDeadline bounds the writes to the client with a write deadline on
// its connection, armed before each batch of writes.
type sendDeadline struct {
	// rc is the response's controller, or the client connection once the
	// stream is relayed off net/http.
	rc       writeDeadliner
	timeout  time.Duration
	deadline time.Time // the deadline set last
	off      bool      // the connection does not support deadlines
}

type writeDeadliner interface {
	SetWriteDeadline(time.Time) error
}

// deadlineSlack is how much further than timeout a deadline is set, as a
// fraction of it. Setting one is a timer update through the response
// writer's wrappers, 5% of the proxy's CPU when done before every event;
// with the slack, it is re-set at most every timeout/16, and each write
// gets between timeout and 1/16 more.
const deadlineSlack = 16

// arm makes sure the writes that follow have at least timeout to finish.
func (d *sendDeadline) arm(now time.Time) {
	if d == nil || d.off || d.deadline.Sub(now) >= d.timeout {
		return
	}
	d.deadline = now.Add(d.timeout + d.timeout/deadlineSlack)
	if d.rc.SetWriteDeadline(d.deadline) != nil {
		d.off = true
	}
}

func (d *sendDeadline) clear() {
	if d != nil && !d.off {
		_ = d.rc.SetWriteDeadline(time.Time{})
	}
}

// armedWriter arms the send deadline before each write.
type armedWriter struct {
	w    io.Writer
	send *sendDeadline
}

func (a armedWriter) Write(p []byte) (int, error) {
	a.send.arm(time.Now())
	return a.w.Write(p)
}

// limitedBuffer keeps the first limit bytes written to it.
type limitedBuffer struct {
	b     []byte
	limit int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.limit - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// timeoutError is the error of a bound the proxy put on the upstream.
type timeoutError string

func (e timeoutError) Error() string { return string(e) }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

var (
	errHeaderTimeout = timeoutError("proxy: no response headers from the upstream within proxy::upstream::response_header_timeout")
	errIdleTimeout   = timeoutError("proxy: upstream idle longer than proxy::upstream::stream_idle_timeout")
)

// boundedTransport puts the proxy's time bounds on every upstream exchange,
// on both paths: header bounds the wait for the response headers once the
// request is written, idle each
// wait for the body's next bytes. Nothing bounds a stream's length, and the
// time the proxy spends writing to a slow client is not the upstream's.
type boundedTransport struct {
	base   http.RoundTripper
	header time.Duration
	idle   time.Duration
}

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	// As http.Transport's ResponseHeaderTimeout, the wait starts once the
	// request is written: a slow upload is the client's, not the upstream's.
	var fired atomic.Bool
	timer := time.AfterFunc(time.Hour, func() {
		fired.Store(true)
		cancel(errHeaderTimeout)
	})
	timer.Stop()
	// The body may still be being written after the response came: then
	// the timer must not start any more.
	var mu sync.Mutex
	answered := false
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) {
			mu.Lock()
			if !answered {
				timer.Reset(t.header)
			}
			mu.Unlock()
		},
	})
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	mu.Lock()
	answered = true
	timer.Stop()
	mu.Unlock()
	if fired.Load() {
		if err == nil {
			resp.Body.Close()
		}
		cancel(nil)
		return nil, errHeaderTimeout
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	b := &idleBoundedBody{rc: resp.Body, ctx: ctx, cancel: cancel, idle: t.idle}
	if t.idle > 0 {
		b.timer = time.AfterFunc(time.Hour, func() { cancel(errIdleTimeout) })
		b.timer.Stop()
	}
	resp.Body = b
	return resp, nil
}

// idleBoundedBody is an upstream body whose every Read must bring bytes
// within idle; the exchange's context ends when it is closed.
type idleBoundedBody struct {
	rc     io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   time.Duration
	timer  *time.Timer
}

func (b *idleBoundedBody) Read(p []byte) (int, error) {
	if b.timer == nil {
		return b.rc.Read(p)
	}
	b.timer.Reset(b.idle)
	n, err := b.rc.Read(p)
	b.timer.Stop()
	if err != nil && !errors.Is(err, io.EOF) && errors.Is(context.Cause(b.ctx), errIdleTimeout) {
		err = errIdleTimeout
	}
	return n, err
}

func (b *idleBoundedBody) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	err := b.rc.Close()
	b.cancel(nil)
	return err
}
