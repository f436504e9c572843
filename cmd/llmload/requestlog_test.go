// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readRequestLog(t *testing.T, path string) []RequestRecord {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var recs []RequestRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec RequestRecord
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&rec), sc.Text())
		recs = append(recs, rec)
	}
	require.NoError(t, sc.Err())
	sort.Slice(recs, func(i, j int) bool { return recs[i].Index < recs[j].Index })
	return recs
}

// TestRequestsOut: one line per request, warm-up and failures included and
// flagged, with the same timings the report is built from.
func TestRequestsOut(t *testing.T) {
	u := newUpstream(t, script{
		firstDelay: 40 * time.Millisecond, gap: 10 * time.Millisecond, chunks: 5, usage: 5,
		fail: func(n int64) string {
			if n == 3 {
				return "500"
			}
			return ""
		},
	})
	cfg := baseConfig(u)
	cfg.Requests = 4
	cfg.WarmupRequests = 2
	path := filepath.Join(t.TempDir(), "requests.ndjson")
	cfg.RequestsOut = path
	before := time.Now().UnixNano()
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	after := time.Now().UnixNano()

	recs := readRequestLog(t, path)
	require.Len(t, recs, 6, "2 warm-up + 4 measured")
	var ttfts []float64
	for i, rec := range recs {
		assert.Equal(t, i, rec.Index)
		assert.Equal(t, i < 2, rec.Warmup, "request %d", i)
		assert.Empty(t, rec.TraceID, "no -traceparent")
		wantPrompt := 7 // the upstream's usage
		if i == 3 {
			wantPrompt = 16 // no usage on a failure: the prompt's word count
		}
		assert.Equal(t, wantPrompt, rec.PromptTokens, "request %d", i)
		assert.Greater(t, rec.StartUnixNano, before)
		assert.Less(t, rec.StartUnixNano, after)
		if i == 3 {
			assert.False(t, rec.OK)
			assert.Equal(t, "http 500", rec.Error)
			assert.Zero(t, rec.TTFTms)
			continue
		}
		require.True(t, rec.OK, "request %d: %s", i, rec.Error)
		assert.Empty(t, rec.Error)
		assert.Equal(t, 5, rec.OutputTokens)
		assert.Equal(t, 4, rec.ITLCount)
		assert.Nil(t, rec.ITLms, "no -requests-itl")
		assert.GreaterOrEqual(t, rec.MaxITLms, rec.TPOTms, "the largest gap is at least the mean gap")
		assert.InDelta(t, rec.TTFTms+4*rec.TPOTms, rec.E2Ems, 1e-5, "TPOT = (E2E - TTFT)/(n - 1)")
		if !rec.Warmup {
			ttfts = append(ttfts, rec.TTFTms)
		}
	}
	// The measured lines are exactly what the report summarizes.
	require.NotNil(t, rep.TTFT)
	assert.Equal(t, len(ttfts), rep.TTFT.Count)
	sort.Float64s(ttfts)
	assert.Equal(t, ttfts[0], rep.TTFT.Min)
	assert.Equal(t, ttfts[len(ttfts)-1], rep.TTFT.Max)
}

// TestRequestsITL: with -requests-itl each line has its gaps, in order,
// which add up to the time from the first chunk to the last.
func TestRequestsITL(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 5 * time.Millisecond, gap: 3 * time.Millisecond, chunks: 6, usage: 6})
	cfg := baseConfig(u)
	cfg.Requests = 3
	cfg.RequestsOut = filepath.Join(t.TempDir(), "requests.ndjson")
	cfg.RequestsITL = true
	_, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	for _, rec := range readRequestLog(t, cfg.RequestsOut) {
		require.Len(t, rec.ITLms, rec.ITLCount)
		var sum float64
		for _, gap := range rec.ITLms {
			sum += gap
		}
		assert.InDelta(t, rec.E2Ems-rec.TTFTms, sum, 1e-3)
		assert.Equal(t, rec.MaxITLms, slices.Max(rec.ITLms))
	}
}

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`)

// TestTraceparent: each request carries its own sampled traceparent, and
// the trace ID recorded for the request is the one sent.
func TestTraceparent(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 5 * time.Millisecond, gap: 2 * time.Millisecond, chunks: 2, usage: 2})
	cfg := baseConfig(u)
	cfg.Requests = 5
	cfg.Traceparent = true
	cfg.RequestsOut = filepath.Join(t.TempDir(), "requests.ndjson")
	_, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)

	recs := readRequestLog(t, cfg.RequestsOut)
	require.Len(t, recs, 5)
	u.mu.Lock()
	sent := append([]string(nil), u.traceparent...)
	u.mu.Unlock()
	require.Len(t, sent, 5)
	seen := map[string]bool{}
	for i, h := range sent {
		m := traceparentRE.FindStringSubmatch(h)
		require.NotNil(t, m, "header %q", h)
		assert.NotEqual(t, "00000000000000000000000000000000", m[1])
		assert.NotEqual(t, "0000000000000000", m[2])
		assert.False(t, seen[m[1]], "trace ID repeated")
		seen[m[1]] = true
		// Concurrency 1: requests arrive in index order.
		assert.Equal(t, m[1], recs[i].TraceID, "request %d", i)
	}

	// Without the flag no header is sent.
	u2 := newUpstream(t, script{firstDelay: 5 * time.Millisecond, gap: 2 * time.Millisecond, chunks: 2, usage: 2})
	cfg = baseConfig(u2)
	_, err = Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{""}, u2.traceparent)
}

func TestRequestsOutUnwritable(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 5 * time.Millisecond, chunks: 1, usage: 1})
	cfg := baseConfig(u)
	cfg.RequestsOut = filepath.Join(t.TempDir(), "missing-dir", "requests.ndjson")
	_, err := Run(context.Background(), cfg, nil)
	require.Error(t, err)
	assert.EqualValues(t, 0, u.requests.Load(), "nothing is sent when the file cannot be created")
}

func TestParseFlagsRequestsOutAndTraceparent(t *testing.T) {
	cfg, err := ParseFlags([]string{"-model", "m", "-requests-out", "r.ndjson", "-traceparent"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "r.ndjson", cfg.RequestsOut)
	assert.True(t, cfg.Traceparent)
}

// TestRampUp: the closed loop's workers start evenly over -ramp-up; the
// requests are long enough that no worker starts a second one meanwhile.
func TestRampUp(t *testing.T) {
	u := newUpstream(t, script{firstDelay: 500 * time.Millisecond, chunks: 1, usage: 1})
	cfg := baseConfig(u)
	cfg.Concurrency = 4
	cfg.Requests = 4
	cfg.RampUp = 400 * time.Millisecond
	cfg.RequestsOut = filepath.Join(t.TempDir(), "requests.ndjson")
	retryTiming(t, func(a *assert.Assertions) {
		_, err := Run(context.Background(), cfg, nil)
		require.NoError(t, err)
		recs := readRequestLog(t, cfg.RequestsOut)
		require.Len(t, recs, 4)
		starts := make([]float64, len(recs))
		for i, rec := range recs {
			starts[i] = float64(rec.StartUnixNano) / 1e6
		}
		sort.Float64s(starts)
		// Timers never fire early, so the lower bound is firm (bar worker
		// 0's own start being late); the upper one allows for scheduling.
		for i := range starts {
			a.GreaterOrEqual(starts[i]-starts[0], float64(i)*100-20, "worker %d starts at its share of the ramp", i)
			a.Less(starts[i]-starts[0], float64(i)*100+100, "worker %d", i)
		}
	})

	cfg.Rate = 5
	assert.Error(t, cfg.Validate(), "-ramp-up is for the closed loop only")
}

// TestConnectionReuse: the body is read to its end after [DONE], so the
// connection goes back to the pool: sequential requests share one.
func TestConnectionReuse(t *testing.T) {
	var conns atomic.Int64
	u := &upstream{sc: script{firstDelay: 5 * time.Millisecond, gap: 2 * time.Millisecond, chunks: 3, usage: 3}}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(u.handle))
	u.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	u.Start()
	t.Cleanup(u.Close)
	cfg := baseConfig(u)
	cfg.Requests = 8
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, 8, rep.Completed)
	assert.EqualValues(t, 1, conns.Load(), "one connection for 8 sequential requests")
}
