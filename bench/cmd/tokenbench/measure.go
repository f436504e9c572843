// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/otlpsink"
)

// cpuRun is the collector's CPU time over one fed workload.
type cpuRun struct {
	Path               string          `json:"path"`
	TokenEvents        int64           `json:"token_events"`
	CPUSeconds         float64         `json:"cpu_seconds"`
	IdleCPUSeconds     float64         `json:"idle_cpu_seconds_subtracted"`
	WallSeconds        float64         `json:"wall_seconds"`
	TokensPerCPUSecond float64         `json:"tokens_per_cpu_second"`
	CPUSecPerMTokens   float64         `json:"cpu_seconds_per_million_tokens"`
	Send               sendResult      `json:"send"`
	Sink               otlpsink.Counts `json:"sink_received"`
}

// measureCPU feeds the collector with send, waits with settle until it has
// finished the work (exported, decided), and charges it the CPU time it used
// meanwhile minus what it uses idle (its timers) over the same wall time.
func measureCPU(c *collector, sk *otlpsink.Sink, path string, send func() (sendResult, error), settle func()) (cpuRun, error) {
	c.waitIdle(10 * time.Second)
	i0 := c.cpuSeconds()
	time.Sleep(time.Second)
	idleRate := c.cpuSeconds() - i0

	before := sk.Counts()
	t0, w0 := c.cpuSeconds(), time.Now()
	res, err := send()
	if err != nil {
		return cpuRun{}, err
	}
	settle()
	t1, wall := c.cpuSeconds(), time.Since(w0).Seconds()
	after := sk.Counts()
	idle := idleRate * wall
	cpu := t1 - t0 - idle
	r := cpuRun{
		Path: path, TokenEvents: res.Tokens, CPUSeconds: cpu, IdleCPUSeconds: idle, WallSeconds: wall, Send: res,
		Sink: otlpsink.Counts{LogRecords: after.LogRecords - before.LogRecords, Spans: after.Spans - before.Spans, Points: after.Points - before.Points},
	}
	if cpu > 0 {
		r.TokensPerCPUSecond = float64(res.Tokens) / cpu
		r.CPUSecPerMTokens = cpu / float64(res.Tokens) * 1e6
	}
	log.Printf("%s: %d tokens, %.2f CPU-s (idle %.2f subtracted), %.0f tokens/CPU-s, wall %.1fs, failed requests %d, sink %+v",
		path, res.Tokens, cpu, idle, r.TokensPerCPUSecond, wall, res.Failed, r.Sink)
	return r, nil
}

// settleHTTP: a hook request is answered after the pipeline consumed it, so
// only the exporter's queue may still be working.
func settleHTTP(c *collector) func() { return func() { c.waitIdle(10 * time.Second) } }

// settleAccepted waits until the receiver has counted want more accepted
// events over transport than before (UDP has no answer), then until idle.
func settleAccepted(c *collector, transport string, before float64, want int64) func() {
	return func() {
		deadline := time.Now().Add(30 * time.Second)
		last, stable := -1.0, 0
		for time.Now().Before(deadline) {
			m, err := c.metrics()
			if err == nil {
				got := m.sum("otelcol_receiver_token_stream_accepted_events", map[string]string{"transport": transport}) - before
				if int64(got) >= want {
					break
				}
				// Datagrams the kernel dropped never arrive: stop once the
				// count stops moving.
				if got == last {
					if stable++; stable >= 4 {
						break
					}
				} else {
					stable = 0
				}
				last = got
			}
			time.Sleep(250 * time.Millisecond)
		}
		c.waitIdle(10 * time.Second)
	}
}

// settleStock waits out decision_wait (the sampling decisions and exports of
// the last traces happen then), and until the collector is idle.
func settleStock(c *collector) func() {
	return func() {
		time.Sleep(6 * time.Second)
		c.waitIdle(30 * time.Second)
	}
}

// memRun is the memory a collector holds for K sessions in flight.
type memRun struct {
	Path             string  `json:"path"`
	Sessions         int     `json:"sessions"`
	TokensHeld       int     `json:"tokens_per_session_so_far"`
	IdleRSS          int64   `json:"fresh_rss_bytes"`
	RSS              int64   `json:"rss_bytes"`
	IdleHeap         int64   `json:"idle_heap_after_gc_bytes"`
	Heap             int64   `json:"heap_after_gc_bytes"`
	RSSPerSession    float64 `json:"rss_bytes_per_session"`
	HeapPerSession   float64 `json:"heap_bytes_per_session"`
	SecondsToMeasure float64 `json:"seconds_from_first_event_to_measurement"`
	// LogsMeanwhile is what the pipeline exported while the sessions were
	// opened: no session has ended, so for ours these are stall alerts,
	// which would mean stall records in the sessions; it should be 0.
	LogsMeanwhile int64 `json:"log_records_exported_meanwhile"`
}

// measureMemory opens K sessions (their starts and first tokens tokens each,
// as fast as the collector takes them), measures RSS and the heap left after a
// forced GC against the idle figures (and writes a heap profile if asked),
// then ends the sessions.
func measureMemory(ctx context.Context, c *collector, sk *otlpsink.Sink, path string, k, tokens int, sendFn func([]batch) sendResult, enc func(*generator) func([]wEvent) []byte, settle func(), heapProfile string) (memRun, error) {
	// RSS: growth from the fresh process, the runtime's working memory
	// included (an upper bound of what the sessions cost). Heap: warm up
	// first, with a few sessions that end, so that what grows once (buffer
	// pools, the exporter's queue, connections) is in the idle figure and
	// not charged to the sessions.
	idleRSS := c.rssBytes()
	// Few sessions, so that the session table (whose slots are reused)
	// is not grown in advance.
	warm := newGenerator(workload{Sessions: 64, Tokens: tokens, Waves: 1, BatchLines: 1024}, uint64(k)+3)
	warm.newWave()
	for i := range warm.sessions {
		warm.sessions[i].id = "w" + warm.sessions[i].id[1:]
	}
	if res := sendFn(chunk(warm.steps(nil, 0, tokens+2), 1024, enc(warm))); res.Failed > 0 {
		return memRun{}, fmt.Errorf("%s warm-up: %d requests failed: %s", path, res.Failed, res.FirstErr)
	}
	settle()
	idleHeap, err := c.heapAfterGC()
	if err != nil {
		return memRun{}, err
	}
	g := newGenerator(workload{Sessions: k, Tokens: tokens, Waves: 1, BatchLines: 1024}, uint64(k)+7)
	g.newWave()
	open := chunk(g.steps(nil, 0, tokens+1), 1024, enc(g))
	logs0 := sk.Counts().LogRecords
	t0 := time.Now()
	if res := sendFn(open); res.Failed > 0 {
		return memRun{}, fmt.Errorf("%s: %d requests failed: %s", path, res.Failed, res.FirstErr)
	}
	heap, err := c.heapAfterGC()
	if err != nil {
		return memRun{}, err
	}
	rss := c.rssBytes()
	m := memRun{
		Path: path, Sessions: k, TokensHeld: tokens, IdleRSS: idleRSS, RSS: rss, IdleHeap: idleHeap, Heap: heap,
		RSSPerSession: float64(rss-idleRSS) / float64(k), HeapPerSession: float64(heap-idleHeap) / float64(k),
		SecondsToMeasure: time.Since(t0).Seconds(), LogsMeanwhile: sk.Counts().LogRecords - logs0,
	}
	log.Printf("%s: %d sessions × %d tokens in flight: RSS %.0f B/session, heap %.0f B/session (measured %.1fs after the first event)",
		path, k, tokens, m.RSSPerSession, m.HeapPerSession, m.SecondsToMeasure)
	if heapProfile != "" {
		if err := c.heapProfile(heapProfile); err != nil {
			return m, err
		}
	}
	sendFn(chunk(g.steps(nil, tokens+1, tokens+2), 1024, enc(g)))
	// What the ended sessions produce belongs to this run, not the next.
	settle()
	return m, ctx.Err()
}
