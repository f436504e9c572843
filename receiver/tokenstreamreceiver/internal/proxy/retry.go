// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// An upstream may close a kept-alive connection whenever it likes, and
// some close it right after every answer while still advertising
// keep-alive (llama.cpp's server, 3 to 44 µs after a streamed answer's
// last chunk). A request sent on such a connection before its close
// arrived fails before any byte of the answer: the upstream never saw it.
// Such a request is sent again, once, on a new connection; one whose
// answer had begun never is (its bytes may have reached the client, and
// the engine did answer it), nor one that failed on a new connection (a
// real failure), nor one that timed out. net/http's Transport retries
// only idempotent requests that way, not a completions POST.

// maxReplayBody bounds the request body kept for a retry: a request on a
// kept-alive connection holds a copy of what it sent until the answer's
// head comes. A longer body is not sent again; the proxy's own client
// sends one whose length the client gave on a new connection instead.
const maxReplayBody = 1 << 20

// bodyGrowth is more than the proxy adds to a body it forwards (the
// include_usage member, 40 bytes).
const bodyGrowth = 64

// replayBody is an upstream request's body that keeps a copy of what was
// read from it while a retry may need it, and reads it again for the
// retry before going on with the rest.
//
// The transport may still be reading it after the response came (an
// upstream may answer before the whole body), so its state is under mu;
// the read from the source is not (it waits for the client).
type replayBody struct {
	src io.Reader
	// size is the body's length when the client gave it, -1 otherwise.
	size int64

	mu sync.Mutex
	// kept is what was read, while keeping; nil once settled.
	kept    []byte
	keeping bool
	// over: more was read than maxReplayBody allows to keep (or the
	// source failed): the body cannot be sent again.
	over bool
	// replay is what a retry reads before the source again.
	replay []byte
}

// newReplayBody returns src's replayBody; size is its length, -1 if
// unknown.
func newReplayBody(src io.Reader, size int64) *replayBody {
	return &replayBody{src: src, size: size}
}

// replayBodyOf is req's body as a replayBody (nil when it has none).
func replayBodyOf(req *http.Request) *replayBody {
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	if b, ok := req.Body.(*replayBody); ok {
		return b
	}
	size := req.ContentLength
	if size == 0 {
		size = -1 // a body of unknown length, as http.Request has it
	}
	return newReplayBody(req.Body, size)
}

// fits reports whether the whole body can be kept for a retry.
func (b *replayBody) fits() bool { return b == nil || b.size <= maxReplayBody }

// keep starts keeping what is read, for a retry: the request goes on a
// reused connection.
func (b *replayBody) keep() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.fits() {
		b.over = true
		return
	}
	b.keeping = true
}

func (b *replayBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if len(b.replay) > 0 {
		n := copy(p, b.replay)
		b.replay = b.replay[n:]
		b.mu.Unlock()
		return n, nil
	}
	b.mu.Unlock()
	n, err := b.src.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil && !errors.Is(err, io.EOF) {
		// The client's body failed: the request is not the upstream's to fail.
		b.over = true
	}
	if b.keeping && !b.over {
		switch {
		case len(b.kept)+n > maxReplayBody+bodyGrowth:
			b.over, b.kept = true, nil
		case b.kept == nil && b.size >= 0:
			// One allocation when the length is known.
			b.kept = append(make([]byte, 0, b.size+bodyGrowth), p[:n]...)
		default:
			b.kept = append(b.kept, p[:n]...)
		}
	}
	return n, err
}

// Close does nothing: the sources' Close do nothing either (the scanned
// body, ReverseProxy's wrapper of the client's), and a retry reads on.
func (*replayBody) Close() error { return nil }

// rewind makes the next reads start again from the body's beginning, for
// the retry; false: the body was not kept whole and cannot be sent again.
func (b *replayBody) rewind() bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.over || !b.keeping {
		return false
	}
	b.replay, b.kept, b.keeping = b.kept, nil, false
	return true
}

// settle drops the copy: the answer came, or the request failed for good.
func (b *replayBody) settle() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.kept, b.keeping = nil, false
	b.mu.Unlock()
}

// retryable reports whether err, a request's failure before any byte of
// its answer on a reused connection, may be retried: not a timeout (the
// upstream may be working on it) nor the exchange cancelled (the client
// left, the drain is over).
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// retryCounter counts the retries by outcome; nil counts nothing.
type retryCounter struct{ c metric.Int64Counter }

var (
	// retrySucceeded: the retry got an answer; retryFailed: it failed
	// too; retryBodyTooLarge: no retry, the body was not kept whole.
	retrySucceeded    = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "succeeded")))
	retryFailed       = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "failed")))
	retryBodyTooLarge = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "body_too_large")))
)

func (r retryCounter) add(outcome metric.AddOption) {
	if r.c != nil {
		r.c.Add(context.Background(), 1, outcome)
	}
}

// retried counts a retry by whether it got an answer.
func (r retryCounter) retried(err error) {
	if err == nil {
		r.add(retrySucceeded)
	} else {
		r.add(retryFailed)
	}
}

// retryingTransport sends a request through base and, when its reused
// connection failed before any byte of the answer, once more through
// fresh, which makes a new connection for every request.
type retryingTransport struct {
	base, fresh http.RoundTripper
	retries     retryCounter
}

func (t *retryingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	body := replayBodyOf(req)
	// The connection of the last attempt http.Transport made (it retries
	// some requests itself), and whether any answer byte came.
	var reused, answered atomic.Bool
	trace := &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			reused.Store(info.Reused)
			if info.Reused {
				body.keep()
			}
		},
		GotFirstResponseByte: func() { answered.Store(true) },
	}
	first := req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	if body != nil {
		// Without GetBody, http.Transport does not rewind the body itself.
		first.Body, first.GetBody = body, nil
	}
	resp, err := t.base.RoundTrip(first)
	if err == nil || !reused.Load() || answered.Load() || !retryable(req.Context(), err) {
		body.settle()
		return resp, err
	}
	if !body.rewind() {
		t.retries.add(retryBodyTooLarge)
		body.settle()
		return nil, err
	}
	again := req.Clone(req.Context())
	if body != nil {
		again.Body, again.GetBody = body, nil
	}
	resp, err = t.fresh.RoundTrip(again)
	body.settle()
	t.retries.retried(err)
	return resp, err
}
