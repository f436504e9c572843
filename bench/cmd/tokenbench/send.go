// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// sendResult is what the driver saw of one run of requests.
type sendResult struct {
	Requests int64         `json:"requests"`
	Failed   int64         `json:"failed_requests"`
	Tokens   int64         `json:"tokens_sent"`
	Events   int64         `json:"events_sent"`
	Accepted int64         `json:"events_accepted"`
	Rejected int64         `json:"events_rejected"`
	Elapsed  time.Duration `json:"-"`
	FirstErr string        `json:"first_error,omitempty"`
}

// poster sends request bodies over keep-alive connections from a fixed number
// of workers, as a fleet of hook clients (or OTLP SDKs) would.
type poster struct {
	client      *http.Client
	url         string
	contentType string
	hookAnswer  bool // the body is a hook batch: read accepted/rejected from the answer
}

func newPoster(url, contentType string, workers int, hookAnswer bool) *poster {
	tr := &http.Transport{MaxIdleConns: workers, MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers, DisableCompression: true}
	return &poster{client: &http.Client{Transport: tr, Timeout: 60 * time.Second}, url: url, contentType: contentType, hookAnswer: hookAnswer}
}

func (p *poster) close() { p.client.CloseIdleConnections() }

func (p *poster) post(ctx context.Context, b batch, res *sendResult, mu *sync.Mutex) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(b.body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", p.contentType)
	resp, err := p.client.Do(req)
	var answer struct {
		Accepted int64 `json:"accepted"`
		Rejected int64 `json:"rejected"`
	}
	failed := err != nil
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode != http.StatusOK:
			failed = true
			err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
		case p.hookAnswer:
			if jerr := json.Unmarshal(body, &answer); jerr != nil {
				failed, err = true, jerr
			}
		default:
			answer.Accepted = int64(b.events)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	res.Requests++
	res.Tokens += int64(b.tokens)
	res.Events += int64(b.events)
	res.Accepted += answer.Accepted
	res.Rejected += answer.Rejected
	if failed {
		res.Failed++
		if res.FirstErr == "" {
			res.FirstErr = err.Error()
		}
	}
}

// run posts every batch from workers goroutines, as fast as the collector
// answers.
func (p *poster) run(ctx context.Context, batches []batch, workers int) sendResult {
	i := atomic.Int64{}
	return p.paced(ctx, workers, 0, 0, func() (batch, bool) {
		n := i.Add(1) - 1
		if n >= int64(len(batches)) {
			return batch{}, false
		}
		return batches[n], true
	})
}

// sendAll is a measured run's send: every batch posted (run), a failed
// request an error.
func (p *poster) sendAll(ctx context.Context, batches []batch, workers int) func() (sendResult, error) {
	return func() (sendResult, error) {
		r := p.run(ctx, batches, workers)
		return r, failed(r)
	}
}

// paced posts the batches next returns, offering rate events/s (0: as fast as
// the workers get answers) for at most limit (0: until next is done). When the
// collector falls behind, the workers are all busy and the achieved rate drops
// below the offered one; nothing is queued beyond the workers.
func (p *poster) paced(ctx context.Context, workers int, rate float64, limit time.Duration, next func() (batch, bool)) sendResult {
	var (
		res  sendResult
		mu   sync.Mutex
		wg   sync.WaitGroup
		work = make(chan batch)
	)
	for range workers {
		wg.Go(func() {
			for b := range work {
				p.post(ctx, b, &res, &mu)
			}
		})
	}
	start := time.Now()
	offered := 0
	for (limit <= 0 || time.Since(start) < limit) && ctx.Err() == nil {
		b, ok := next()
		if !ok {
			break
		}
		if rate > 0 {
			if wait := time.Until(start.Add(time.Duration(float64(offered) / rate * float64(time.Second)))); wait > 0 {
				time.Sleep(wait)
			}
		}
		offered += b.events
		work <- b
	}
	close(work)
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res
}

// sendUDP sends the datagrams at rate events/s (each datagram's share of its
// batch's events), since UDP has no back-pressure: beyond what the collector
// reads, the kernel drops them.
func sendUDP(ctx context.Context, addr string, batches []batch, rate float64) (sendResult, error) {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return sendResult{}, err
	}
	defer conn.Close()
	var res sendResult
	start := time.Now()
	sent := 0.0
	for _, b := range batches {
		grams := datagrams(b.body, 60000)
		for _, d := range grams {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			if wait := time.Until(start.Add(time.Duration(sent / rate * float64(time.Second)))); wait > 0 {
				time.Sleep(wait)
			}
			if _, err := conn.Write(d); err != nil {
				res.Failed++
				if res.FirstErr == "" {
					res.FirstErr = err.Error()
				}
			}
			res.Requests++
			sent += float64(b.events) / float64(len(grams))
		}
		res.Tokens += int64(b.tokens)
		res.Events += int64(b.events)
	}
	res.Elapsed = time.Since(start)
	return res, nil
}
