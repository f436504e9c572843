// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	textType = "text/plain; version=0.0.4; charset=utf-8"
	omType   = "application/openmetrics-text; version=1.0.0; charset=utf-8"
)

// fakeEngine is a vLLM /metrics endpoint on loopback: it serves an
// exposition (or passes the scrape on to a live engine, upstream), and
// counts the scrapes and when the first one came.
type fakeEngine struct {
	exp      exposition
	upstream string // a live engine's /metrics URL; exp is unused then
	// negotiate answers as prometheus_client (vLLM's /metrics) does:
	// OpenMetrics when the Accept header lists it, gzip when the
	// Accept-Encoding header does; otherwise always plain text.
	negotiate bool
	// gzipped bodies, compressed once so that the engine's own cost stays
	// out of the way.
	textGz, omGz []byte

	ln     net.Listener
	srv    *http.Server
	client *http.Client

	scrapes atomic.Int64
	first   atomic.Int64 // Unix ns of the first scrape, 0 before

	mu     sync.Mutex
	accept string         // the Accept and Accept-Encoding headers of the first scrape
	served map[string]int // answers by media type
}

func startEngine(exp exposition, negotiate bool, upstream string) (*fakeEngine, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e := &fakeEngine{
		exp: exp, upstream: upstream, negotiate: negotiate, ln: ln,
		client: &http.Client{Timeout: 5 * time.Second}, served: map[string]int{},
		textGz: gzipped(exp.text), omGz: gzipped(exp.om),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", e.metrics)
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = e.srv.Serve(ln) }()
	return e, nil
}

func (e *fakeEngine) addr() string { return e.ln.Addr().String() }

func (e *fakeEngine) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = e.srv.Shutdown(ctx)
}

// firstScrape is when the first scrape came, or the zero time.
func (e *fakeEngine) firstScrape() time.Time {
	if ns := e.first.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// wantsOpenMetrics is prometheus_client's choice (exposition.choose_encoder):
// OpenMetrics whenever the Accept header lists it, whatever its q.
func wantsOpenMetrics(accept string) bool {
	for a := range strings.SplitSeq(accept, ",") {
		mt, _, _ := strings.Cut(a, ";")
		if strings.TrimSpace(mt) == "application/openmetrics-text" {
			return true
		}
	}
	return false
}

func (e *fakeEngine) metrics(w http.ResponseWriter, r *http.Request) {
	if e.scrapes.Add(1) == 1 {
		e.first.Store(time.Now().UnixNano())
		e.mu.Lock()
		e.accept = "Accept: " + r.Header.Get("Accept") + "; Accept-Encoding: " + r.Header.Get("Accept-Encoding")
		e.mu.Unlock()
	}
	ct, body, gz := textType, e.exp.text, e.textGz
	if e.upstream != "" {
		var err error
		if ct, body, err = e.fetchUpstream(r.Context(), r.Header.Get("Accept")); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		gz = nil
	} else if e.negotiate && wantsOpenMetrics(r.Header.Get("Accept")) {
		ct, body, gz = omType, e.exp.om, e.omGz
	}
	mt, _, _ := strings.Cut(ct, ";")
	w.Header().Set("Content-Type", ct)
	if e.negotiate && gz != nil && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		mt += " (gzip)"
		body = gz
		w.Header().Set("Content-Encoding", "gzip")
	}
	e.mu.Lock()
	e.served[mt]++
	e.mu.Unlock()
	_, _ = w.Write(body)
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(b)
	_ = zw.Close()
	return buf.Bytes()
}

func (e *fakeEngine) fetchUpstream(ctx context.Context, accept string) (string, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.upstream, http.NoBody)
	if err != nil {
		return "", nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := e.client.Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.Header.Get("Content-Type"), body, err
}

// answers returns the Accept headers of the first scrape and the media
// types answered.
func (e *fakeEngine) answers() (string, map[string]int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	served := make(map[string]int, len(e.served))
	for k, v := range e.served {
		served[k] = v
	}
	return e.accept, served
}
