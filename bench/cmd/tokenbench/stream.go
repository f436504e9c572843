// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"
)

// streamSender writes NDJSON batches on Unix socket connections to our
// collector's hooks::unix, one writer goroutine a connection, as engines
// running the hook clients' default transport do, and counts what the
// acknowledgements say.
type streamSender struct {
	path string
}

// streamConn is one connection and what its acknowledgements counted.
type streamConn struct {
	conn     net.Conn
	mu       sync.Mutex
	acked    int64 // events the acknowledgements covered
	accepted int64
	rejected int64
	refused  int64
	done     chan struct{}
	covered  *sync.Cond
}

func dialStream(path string) (*streamConn, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	sc := &streamConn{conn: c, done: make(chan struct{})}
	sc.covered = sync.NewCond(&sc.mu)
	go sc.readAcks()
	return sc, nil
}

func (sc *streamConn) readAcks() {
	defer close(sc.done)
	r := bufio.NewReaderSize(sc.conn, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			break
		}
		var a struct{ Accepted, Rejected, Refused int64 }
		if json.Unmarshal(line, &a) != nil {
			break
		}
		sc.mu.Lock()
		sc.accepted += a.Accepted
		sc.rejected += a.Rejected
		sc.refused += a.Refused
		sc.acked += a.Accepted + a.Rejected + a.Refused
		sc.covered.Broadcast()
		sc.mu.Unlock()
	}
	sc.mu.Lock()
	sc.acked = -1 // ended: wait no more
	sc.covered.Broadcast()
	sc.mu.Unlock()
}

// waitAcked waits until the acknowledgements cover events, or the
// connection ended, or limit passed.
func (sc *streamConn) waitAcked(events int64, limit time.Duration) error {
	timer := time.AfterFunc(limit, func() { _ = sc.conn.Close() })
	defer timer.Stop()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for sc.acked >= 0 && sc.acked < events {
		sc.covered.Wait()
	}
	if sc.acked < 0 {
		return fmt.Errorf("connection ended before its %d events were acknowledged", events)
	}
	return nil
}

// send writes the batches next returns on workers connections, pacing each
// batch to its offset from the start (at: 0 for as fast as the collector
// reads), then waits for every event's acknowledgement; what they counted
// is the result.
func (s streamSender) send(ctx context.Context, workers int, next func(worker int) (batch, time.Duration, bool)) (sendResult, error) {
	var (
		res  sendResult
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make(chan error, workers)
	)
	start := time.Now()
	for w := range workers {
		sc, err := dialStream(s.path)
		if err != nil {
			return res, err
		}
		wg.Go(func() {
			defer sc.conn.Close()
			var events, tokens, writes int64
			for ctx.Err() == nil {
				b, at, ok := next(w)
				if !ok {
					break
				}
				if wait := time.Until(start.Add(at)); wait > 0 {
					time.Sleep(wait)
				}
				if _, err := sc.conn.Write(b.body); err != nil {
					errs <- err
					return
				}
				events += int64(b.events)
				tokens += int64(b.tokens)
				writes++
			}
			if err := sc.waitAcked(events, time.Minute); err != nil {
				errs <- err
			}
			sc.mu.Lock()
			defer sc.mu.Unlock()
			mu.Lock()
			defer mu.Unlock()
			res.Requests += writes
			res.Events += events
			res.Tokens += tokens
			res.Accepted += sc.accepted
			res.Rejected += sc.rejected
			res.Failed += sc.refused
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	close(errs)
	if err, ok := <-errs; ok {
		res.FirstErr = err.Error()
		return res, err
	}
	if res.Rejected+res.Failed > 0 {
		return res, fmt.Errorf("%d events rejected, %d refused", res.Rejected, res.Failed)
	}
	return res, nil
}

// sendAll writes every batch, shared by workers connections, as fast as
// the collector reads them.
func (s streamSender) sendAll(ctx context.Context, batches []batch, workers int) func() (sendResult, error) {
	return func() (sendResult, error) {
		var mu sync.Mutex
		i := 0
		return s.send(ctx, workers, func(int) (batch, time.Duration, bool) {
			mu.Lock()
			defer mu.Unlock()
			if i >= len(batches) {
				return batch{}, 0, false
			}
			i++
			return batches[i-1], 0, true
		})
	}
}
