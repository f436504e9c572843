// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook

import (
	"context"
	"net"
	"testing"
	"time"
)

// benchClient sends to a loopback UDP socket nobody reads: the kernel
// discards what does not fit its buffer, so only the client is measured.
// It reports the share of events dropped, which tells whether a benchmark
// measured the queueing path or the (cheaper) dropping one.
func benchClient(b *testing.B, cfg Config) *Client {
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	cfg.Endpoint = "udp://" + conn.LocalAddr().String()
	c, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = c.Close(context.Background())
		_ = conn.Close()
		s := c.Stats()
		b.ReportMetric(float64(s.Dropped)/float64(max(s.Sent+s.Dropped+s.Failed, 1)), "dropped/op")
	})
	return c
}

// BenchmarkToken measures Token when the event is queued: the clock stops
// while the background goroutine catches up, so the queue never fills.
func BenchmarkToken(b *testing.B) {
	const queue = 1 << 16
	c := benchClient(b, Config{QueueSize: queue, FlushInterval: time.Millisecond})
	t := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%(queue/2) == queue/2-1 {
			b.StopTimer()
			for len(c.queue) > 0 {
				time.Sleep(100 * time.Microsecond)
			}
			b.StartTimer()
		}
		if err := c.Token("chatcmpl-5f1c2a9e", t, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTokenParallel measures Token from every P at once, faster than
// one background goroutine can send: most events find the queue full and
// are dropped, which is the cost under overload.
func BenchmarkTokenParallel(b *testing.B) {
	c := benchClient(b, Config{})
	t := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.Token("chatcmpl-5f1c2a9e", t, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
