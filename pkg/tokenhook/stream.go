// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook

import (
	"bufio"
	"encoding/json"
	"net"
	"sync"
	"time"
)

// The Unix socket transport (hooks::unix): one stream connection, whole
// lines written as they are batched, and the receiver's acknowledgements
// read back on the same connection by a goroutine of the connection's own.
// A line written is in flight until an acknowledgement covers it: as sent
// (accepted), rejected, or failed (the pipeline refused it). When the
// connection ends, the lines in flight that no acknowledgement covered
// count as failed: a collector restart loses at most those, and counts
// them. Then the next batch dials again, after a backoff while dialing
// fails; the batches meanwhile fail at once, so the engine never waits.

// Reconnection backoff: doubled from the first to the last after each
// failed dial, reset by a successful one.
const (
	firstRedial = 100 * time.Millisecond
	lastRedial  = 5 * time.Second
)

// streamSender writes batches on a Unix stream connection.
type streamSender struct {
	path    string
	timeout time.Duration // connecting, each write, Close's wait for acknowledgements
	c       *settled      // the Client's counters, which the acknowledgements settle

	// conn, backoff and nextDial are the sending goroutine's; mu guards
	// conn against abort, called from another.
	mu       sync.Mutex
	conn     *streamConn
	aborted  bool
	backoff  time.Duration
	nextDial time.Time
}

func newStreamSender(path string, timeout time.Duration, c *settled) *streamSender {
	return &streamSender{path: path, timeout: timeout, c: c}
}

// streamConn is one connection and the lines in flight on it.
type streamConn struct {
	conn *net.UnixConn
	mu   sync.Mutex
	// inFlight counts the lines written and not yet acknowledged; ended
	// is set once the acknowledgement reader has counted them failed, after
	// which no line may be added.
	inFlight int
	ended    bool
	done     chan struct{} // closed when the reader has ended
}

func (s *streamSender) send(batch []byte, events int) sendResult {
	sc := s.connection()
	if sc == nil || !sc.take(events) {
		return sendResult{reuse: true}
	}
	_ = sc.conn.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := sc.conn.Write(batch); err != nil {
		// Some of the lines may have arrived; those acknowledged count as
		// the acknowledgement says, the others fail when the reader ends.
		s.drop(sc)
	}
	return sendResult{inFlight: events, reuse: true}
}

// connection returns the open connection, dialing one when there is none
// and the backoff allows; nil when there is none to write on.
func (s *streamSender) connection() *streamConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		return nil
	}
	if s.conn != nil {
		select {
		case <-s.conn.done:
			s.conn = nil // the collector closed it: dial again
		default:
			return s.conn
		}
	}
	now := time.Now()
	if now.Before(s.nextDial) {
		return nil
	}
	d := net.Dialer{Timeout: s.timeout}
	conn, err := d.Dial("unix", s.path)
	if err != nil {
		s.backoff = min(max(2*s.backoff, firstRedial), lastRedial)
		s.nextDial = now.Add(s.backoff)
		return nil
	}
	s.backoff = 0
	s.conn = &streamConn{conn: conn.(*net.UnixConn), done: make(chan struct{})}
	go s.conn.readAcks(s.c)
	return s.conn
}

// drop gives sc up after a failed write. Only its write side is closed:
// the receiver may have taken and acknowledged lines before the failure
// (it stops at a collector's shutdown), and the reader still reads those
// acknowledgements, until the receiver closes or the timeout ends it; the
// lines none covers then count as failed. Closing it whole lost the
// acknowledgements not read yet, and counted lines the receiver took as
// failed.
func (s *streamSender) drop(sc *streamConn) {
	_ = sc.conn.CloseWrite()
	_ = sc.conn.SetReadDeadline(time.Now().Add(s.timeout))
	s.mu.Lock()
	if s.conn == sc {
		s.conn = nil
	}
	s.mu.Unlock()
}

// take counts n lines about to be written as in flight; false if the
// connection has ended.
func (sc *streamConn) take(n int) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.ended {
		return false
	}
	sc.inFlight += n
	return true
}

// streamAck is the receiver's acknowledgement of a batch of lines.
type streamAck struct {
	Accepted int `json:"accepted"`
	Rejected int `json:"rejected"`
	Refused  int `json:"refused"`
}

// maxAckBytes bounds an acknowledgement line: ten errors of a few hundred
// bytes each.
const maxAckBytes = 64 << 10

// readAcks settles the lines in flight as the acknowledgements come, and
// the rest as failed when the connection ends.
func (sc *streamConn) readAcks(c *settled) {
	defer close(sc.done)
	r := bufio.NewReaderSize(sc.conn, maxAckBytes)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			break
		}
		var a streamAck
		if json.Unmarshal(line, &a) != nil || a.Accepted < 0 || a.Rejected < 0 || a.Refused < 0 {
			break // not our receiver: what is in flight cannot be told
		}
		sc.mu.Lock()
		// An acknowledgement covers no more than is in flight.
		n := min(a.Accepted+a.Rejected+a.Refused, sc.inFlight)
		sc.inFlight -= n
		sent := min(a.Accepted, n)
		rejected := min(a.Rejected, n-sent)
		sc.mu.Unlock()
		c.sent.Add(uint64(sent))
		c.rejected.Add(uint64(rejected))
		c.failed.Add(uint64(n - sent - rejected))
	}
	_ = sc.conn.Close()
	sc.mu.Lock()
	sc.ended = true
	lost := sc.inFlight
	sc.inFlight = 0
	sc.mu.Unlock()
	c.failed.Add(uint64(lost))
}

// abort fails the write under way and the lines in flight, and all later
// sends.
func (s *streamSender) abort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aborted = true
	if s.conn != nil {
		_ = s.conn.conn.Close()
	}
}

// close ends the stream: the write side is closed, so the receiver hands
// over what it has read, acknowledges it and closes; close waits for that
// at most the timeout, then what is still in flight counts as failed.
func (s *streamSender) close() {
	s.mu.Lock()
	sc := s.conn
	s.mu.Unlock()
	if sc == nil {
		return
	}
	_ = sc.conn.CloseWrite()
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case <-sc.done:
	case <-t.C:
		_ = sc.conn.Close()
		<-sc.done
	}
}
