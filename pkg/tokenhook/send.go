// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// sender delivers batches for the background goroutine.
// settled counts the events whose batches were answered: sent (taken),
// failed (lost on the way or refused whole) and rejected (lines the
// receiver refused). The Client holds them; a sender that learns the
// answers later (the Unix stream's acknowledgements) settles them itself.
type settled struct {
	sent     atomic.Uint64
	failed   atomic.Uint64
	rejected atomic.Uint64
}

type sender interface {
	// send delivers batch, which holds events whole lines, and returns how
	// many of them were delivered, how many the receiver rejected and how
	// many are in flight, to be counted by the sender once acknowledged
	// (the rest failed), the limits the receiver's answer stated, and
	// whether batch may be overwritten now (false when a transport may
	// still read it).
	send(batch []byte, events int) sendResult
	// abort makes the send under way and all later ones fail at once. It
	// is called from another goroutine.
	abort()
	// close releases the socket or connections; called once, last.
	close()
}

// sendResult is what became of a batch's events at send.
type sendResult struct {
	sent, rejected, inFlight int
	stated                   receiverLimits
	reuse                    bool
}

// udpSender writes each batch as one datagram on a connected socket.
type udpSender struct {
	conn net.Conn
}

func (s *udpSender) send(batch []byte, events int) sendResult {
	if _, err := s.conn.Write(batch); err != nil {
		return sendResult{reuse: true}
	}
	return sendResult{sent: events, reuse: true}
}

// abort sets a write deadline in the past, which fails pending and later
// writes.
func (s *udpSender) abort() { _ = s.conn.SetWriteDeadline(time.Unix(1, 0)) }

func (s *udpSender) close() { _ = s.conn.Close() }

// maxRetryAfter is the longest Retry-After of a 503 that is waited for
// before the one retry; a longer one fails the batch, since events keep
// queueing (and dropping) meanwhile.
const maxRetryAfter = time.Second

// maxResponseBytes bounds how much of a response body is read.
const maxResponseBytes = 64 << 10

// receiverLimits are the "limits" of a receiver's answer, which it states
// when a batch broke one of them; a field not stated is zero.
type receiverLimits struct {
	MaxLinesPerBatch   int   `json:"max_lines_per_batch"`
	MaxLineBytes       int   `json:"max_line_bytes"` // newline excluded
	MaxRequestBodySize int64 `json:"max_request_body_size"`
}

// verdict is what the client reads of the receiver's answer,
// {"accepted":N,"rejected":M,"errors":[...],"limits":{...}}.
type verdict struct {
	Rejected int
	Limits   receiverLimits
}

// httpSender POSTs each batch as an application/x-ndjson body.
type httpSender struct {
	ctx     context.Context // canceled by abort
	client  *http.Client
	owned   bool // client was made by New, so its idle connections are ours to close
	url     string
	headers http.Header
	resp    bytes.Buffer
}

// send posts batch and counts the receiver's verdict: the lines its answer
// names as rejected are rejected, whatever the status; the others are
// delivered on a 2xx and failed otherwise, as after a transport error. A
// 503 with a Retry-After of at most one second is retried once after that
// delay.
func (s *httpSender) send(batch []byte, events int) sendResult {
	reuse := true
	for attempt := 0; ; attempt++ {
		status, retryAfter, v, held, err := s.post(batch)
		reuse = reuse && !held
		rejected := min(max(v.Rejected, 0), events)
		switch {
		case err != nil:
			return sendResult{reuse: reuse}
		case status >= 200 && status < 300:
			return sendResult{sent: events - rejected, rejected: rejected, stated: v.Limits, reuse: reuse}
		case status == http.StatusServiceUnavailable && attempt == 0 && retryAfter >= 0 && retryAfter <= maxRetryAfter:
			t := time.NewTimer(retryAfter)
			select {
			case <-t.C:
			case <-s.ctx.Done():
				t.Stop()
				return sendResult{rejected: rejected, stated: v.Limits, reuse: reuse}
			}
		default:
			return sendResult{rejected: rejected, stated: v.Limits, reuse: reuse}
		}
	}
}

// post makes one request. retryAfter is -1 when the response has no
// Retry-After in seconds; v is the receiver's answer, zero when the body is
// not one; held reports that the transport may still read batch.
func (s *httpSender) post(batch []byte) (status int, retryAfter time.Duration, v verdict, held bool, err error) {
	body := &requestBody{Reader: bytes.NewReader(batch), closed: make(chan struct{})}
	req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, s.url, body)
	if err != nil {
		return 0, -1, verdict{}, false, err
	}
	req.ContentLength = int64(len(batch))
	req.GetBody = func() (io.ReadCloser, error) {
		// A redirect or a retry of the transport (of a Config.HTTPClient:
		// our own follows no redirects) reads batch again, out of our
		// sight.
		body.copied.Store(true)
		return io.NopCloser(bytes.NewReader(batch)), nil
	}
	for k, v := range s.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := s.client.Do(req)
	defer func() {
		// The transport closes the body once done with it, which may be
		// after Do returns (the server answered early).
		select {
		case <-body.closed:
			held = body.copied.Load()
		default:
			held = true
		}
	}()
	if err != nil {
		return 0, -1, verdict{}, false, err
	}
	s.resp.Reset()
	_, err = s.resp.ReadFrom(io.LimitReader(resp.Body, maxResponseBytes))
	_ = resp.Body.Close()
	if err != nil {
		return 0, -1, verdict{}, false, err
	}
	retryAfter = -1
	if secs, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && secs >= 0 {
		retryAfter = time.Duration(min(secs, 3600)) * time.Second
	}
	// The receiver answers {"accepted":N,"rejected":M,"errors":[...]},
	// also with a 400 when no line was valid; any other body means no line
	// was rejected. Limits it cannot read do not void the count.
	var answer struct {
		Rejected int             `json:"rejected"`
		Limits   json.RawMessage `json:"limits"`
	}
	if json.Unmarshal(s.resp.Bytes(), &answer) == nil {
		v.Rejected = answer.Rejected
		if len(answer.Limits) > 0 && json.Unmarshal(answer.Limits, &v.Limits) != nil {
			v.Limits = receiverLimits{}
		}
	}
	return resp.StatusCode, retryAfter, v, false, nil
}

// abort needs nothing more: Close cancels s.ctx, which ends the request.
func (s *httpSender) abort() {}

func (s *httpSender) close() {
	if s.owned {
		s.client.CloseIdleConnections()
	}
}

// requestBody tells when the transport is done with a request body.
type requestBody struct {
	*bytes.Reader
	once   sync.Once
	closed chan struct{}
	copied atomic.Bool
}

func (b *requestBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}
