// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/consumer/consumertest"
)

// discardResponse is a ResponseWriter and Flusher that drops what it gets.
type discardResponse struct{ h http.Header }

func (d *discardResponse) Header() http.Header         { return d.h }
func (d *discardResponse) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardResponse) WriteHeader(int)             {}
func (d *discardResponse) Flush()                      {}

// BenchmarkProxyRelayEvent is the proxy's own work per SSE event of a
// vLLM chat stream: framing, reading the chunk, writing and flushing it to
// the client, and queueing its token event. Network I/O is not included.
func BenchmarkProxyRelayEvent(b *testing.B) {
	b.Run("breaker=off", func(b *testing.B) { benchmarkRelay(b, 0, false) })
	// The stall breaker on: its timer paused and re-set per read from the
	// upstream.
	b.Run("breaker=on", func(b *testing.B) { benchmarkRelay(b, time.Minute, false) })
	// Relayed off net/http: the proxy's own chunk framing to the client
	// connection (here one that drops what it gets).
	b.Run("hijacked", func(b *testing.B) { benchmarkRelay(b, 0, true) })
}

// discardConn is a client connection that drops what is written to it.
type discardConn struct{ net.Conn }

func (discardConn) Write(p []byte) (int, error) { return len(p), nil }

func benchmarkRelay(b *testing.B, maxGap time.Duration, hijacked bool) {
	chat, _ := fixtureStreams(&testing.T{})
	var stream bytes.Buffer
	const repeats = 100
	// One long stream: the role chunk once, the content chunks many times.
	stream.WriteString(chat[0])
	for range repeats {
		for _, ev := range chat[1:8] {
			stream.WriteString(ev)
		}
	}
	stream.WriteString(chat[len(chat)-1])
	events := 2 + repeats*7
	p := relayOnly(newTestSink(b, componenttest.NewNopTelemetrySettings(), consumertest.NewNop()), testConfig(b, "http://localhost:8000").EventQueueSize)
	defer p.batch.shutdown()
	w := &discardResponse{h: http.Header{}}
	data := stream.String()
	b.ReportAllocs()
	b.SetBytes(int64(stream.Len()))
	for b.Loop() {
		s := &session{p: p, id: "bench", completionTokens: -1, promptTokens: -1}
		ctx, cancel := context.WithCancelCause(context.Background())
		s.breaker = newStallBreaker(maxGap, 0, cancel)
		if hijacked {
			cw := newChunkedConnWriter(discardConn{}, nil)
			s.relayStream(ctx, cw, strings.NewReader(data), false)
			_ = cw.finish()
		} else {
			s.relayStream(ctx, w, strings.NewReader(data), false)
		}
		s.breaker.stop()
		cancel(nil)
	}
	b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N*events), "ns/event")
}

// relayOnly is what sessions relaying a stream need of a Server: its
// batcher, handing to sink, and its counters.
func relayOnly(sink Sink, queueSize int) *shared {
	p := &shared{counters: sink.Counters()}
	p.batch = newEventBatcher(sink, p.counters, queueSize)
	return p
}

// BenchmarkIdleBoundedRead is what stream_idle_timeout adds to each read
// from the upstream: re-arming and stopping its timer.
func BenchmarkIdleBoundedRead(b *testing.B) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	body := &idleBoundedBody{rc: io.NopCloser(zeroReader{}), ctx: ctx, cancel: cancel, idle: time.Minute}
	body.timer = time.AfterFunc(time.Hour, func() { cancel(errIdleTimeout) })
	body.timer.Stop()
	buf := make([]byte, 256)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = body.Read(buf)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { return len(p), nil }

// BenchmarkStallBreakerRead is what the stall breaker adds to each read
// from the upstream that brought a token: pausing its timer while the read
// is relayed, then re-setting it.
func BenchmarkStallBreakerRead(b *testing.B) {
	_, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	br := newStallBreaker(time.Minute, 0, cancel)
	defer br.stop()
	now := time.Now()
	tokens := int64(0)
	b.ReportAllocs()
	for b.Loop() {
		br.pause()
		tokens++
		br.resume(now, tokens, true)
	}
}

// BenchmarkUpstreamStream is the upstream side's cost per SSE event of a
// streamed response over loopback, the upstream's own cost included: the
// observed paths' own client, and http.Transport as it was before it.
func BenchmarkUpstreamStream(b *testing.B) {
	chat, _ := fixtureStreams(&testing.T{})
	const events = 256
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			_, _ = io.WriteString(w, chat[1+i%7])
			w.(http.Flusher).Flush()
		}
	}))
	defer up.Close()
	u, err := url.Parse(up.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg := confighttp.NewDefaultClientConfig()
	cfg.ReadBufferSize = 2 << 10
	direct := newDirectUpstream(&cfg, u, time.Minute, time.Minute)
	defer direct.pool.close()
	transport := &http.Transport{ReadBufferSize: 2 << 10, WriteBufferSize: 2 << 10}
	defer transport.CloseIdleConnections()
	for name, rt := range map[string]http.RoundTripper{"direct": direct, "transport": transport} {
		b.Run(name, func(b *testing.B) {
			buf := make([]byte, sseReadBuffer)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, up.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
				resp, err := rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				for {
					if _, err := resp.Body.Read(buf); err != nil {
						break
					}
				}
				resp.Body.Close()
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N*events), "ns/event")
		})
	}
}

// BenchmarkRelayedStreamHeap is the live heap an open relayed stream
// holds while it waits for the engine's next token: heapB/stream is the
// heap after a forced GC with 100 streams open, less the heap before them,
// over 100. The upstream and the clients are raw connections of this
// process that allocate next to nothing, so what is counted is the proxy's
// (and its pipeline's session), as in bench/proxy's figure.
func BenchmarkRelayedStreamHeap(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	defer ln.Close()
	go heldStreamUpstream(ln, release)
	tp := startTestProxy(b, "http://"+ln.Addr().String(), consumertest.NewNop())
	addr := tp.p.Addr().String()
	const streams = 100
	body := `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`
	req := []byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	var perStream float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		conns := make([]net.Conn, 0, streams)
		for range streams {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(req); err != nil {
				b.Fatal(err)
			}
			var buf [1024]byte
			for got := 0; !bytes.Contains(buf[:got], []byte(`"hi"`)); {
				n, err := c.Read(buf[got:])
				if err != nil {
					b.Fatal(err)
				}
				got += n
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perStream += float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / streams
		for _, c := range conns {
			c.Close()
		}
		// The relays notice their clients left and end.
		for tp.p.streams.Load() > 0 {
			time.Sleep(time.Millisecond)
		}
	}
	b.ReportMetric(perStream/float64(b.N), "heapB/stream")
}

// requestRead reports whether b holds the whole request: its body ends
// with its JSON object, or with the last chunk when the proxy streams it.
func requestRead(b []byte) bool {
	return bytes.Contains(b, []byte(`"stream":true`)) &&
		(bytes.HasSuffix(b, []byte("}")) || bytes.HasSuffix(b, []byte("0\r\n\r\n")))
}

// heldStreamUpstream answers each request on ln with a streamed response
// head and one content event, then holds the stream open until release.
func heldStreamUpstream(ln net.Listener, release chan struct{}) {
	const ev = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var b [4096]byte
			got := 0
			for !requestRead(b[:got]) {
				n, err := c.Read(b[got:])
				if err != nil {
					return
				}
				got += n
			}
			_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev)
			<-release
		}()
	}
}
