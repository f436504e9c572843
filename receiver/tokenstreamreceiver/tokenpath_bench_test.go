// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !windows

// The token path benchmarks read their CPU time with getrusage(2), which
// Windows does not have.

package tokenstreamreceiver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// tokenPathWorkload is one round of hook traffic cut into NDJSON batches:
// inFlight sessions streaming at once, each replaced by a new one when it
// ends, then all drained, so that a round leaves no session open. The
// session IDs carry a round number at fixed offsets so that a round can be
// replayed as new sessions (the processor remembers ended IDs).
type tokenPathWorkload struct {
	bodies  [][]byte
	counts  []int   // events in each body
	tags    [][]int // offsets of the round number in each body
	events  int
	batches int
}

const roundDigits = 6

// newTokenPathWorkload writes about total events: sessions of 50–349
// tokens (a chunk of 3 tokens now and then, as with speculative decoding),
// one token per session every 20 ms, first token 100 ms after the start:
// what an engine hook sends, in the clients' compact form. Batches hold
// perBatch events, as a hook client flushing on size would send them.
func newTokenPathWorkload(inFlight, total, perBatch int) *tokenPathWorkload {
	return newTokenPathWorkloadOf(inFlight, total, perBatch, 50, 300)
}

// newTokenPathWorkloadOf is newTokenPathWorkload with sessions of minTokens
// to minTokens+spread-1 token events.
func newTokenPathWorkloadOf(inFlight, total, perBatch, minTokens, spread int) *tokenPathWorkload {
	rng := rand.New(rand.NewPCG(1, 2))
	type live struct {
		ev   tokenevent.Event
		left int
		sent int
	}
	w := &tokenPathWorkload{}
	var body []byte
	var tags []int
	inBatch := 0
	emit := func(ev *tokenevent.Event) {
		line := tokenevent.AppendJSON(nil, ev)
		tags = append(tags, len(body)+bytes.Index(line, []byte(`"session_id":"r`))+len(`"session_id":"r`))
		body = append(body, line...)
		w.events++
		if inBatch++; inBatch == perBatch {
			w.bodies, w.tags, w.counts = append(w.bodies, body), append(w.tags, tags), append(w.counts, inBatch)
			body, tags, inBatch = nil, nil, 0
		}
	}
	t := uint64(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC).UnixNano())
	next := 0
	start := func(at uint64) *live {
		next++
		s := &live{left: minTokens + rng.IntN(spread)}
		s.ev = tokenevent.Event{
			Kind: tokenevent.KindStart, SessionID: fmt.Sprintf("r%0*d-s%07d", roundDigits, 0, next),
			TimeUnixNano: at, Model: "llama-3.1-8b", Operation: tokenevent.OperationChat, PromptTokens: int64(100 + rng.IntN(2000)),
			Engine: "vllm-0", Count: 1, CompletionTokens: -1,
		}
		binaryRand(rng, s.ev.TraceID[:])
		binaryRand(rng, s.ev.SpanID[:])
		emit(&s.ev)
		return s
	}
	sessions := make([]*live, inFlight)
	for i := range sessions {
		sessions[i] = start(t)
	}
	t += uint64(100 * time.Millisecond)
	for open := inFlight; open > 0; t += uint64(20 * time.Millisecond) {
		for i, s := range sessions {
			if s == nil {
				continue
			}
			tok := tokenevent.Event{
				Kind: tokenevent.KindToken, SessionID: s.ev.SessionID, TimeUnixNano: t + uint64(i)*1000,
				Count: 1, PromptTokens: -1, CompletionTokens: -1,
			}
			if rng.IntN(20) == 0 {
				tok.Count = 3
			}
			emit(&tok)
			s.sent += int(tok.Count)
			if s.left--; s.left > 0 {
				continue
			}
			end := tokenevent.Event{
				Kind: tokenevent.KindEnd, SessionID: s.ev.SessionID, TimeUnixNano: tok.TimeUnixNano + 1000,
				CompletionTokens: int64(s.sent), FinishReason: "stop", PromptTokens: -1, Count: 1,
			}
			emit(&end)
			if w.events < total {
				sessions[i] = start(end.TimeUnixNano + 1000)
			} else {
				sessions[i] = nil
				open--
			}
		}
	}
	if inBatch > 0 {
		w.bodies, w.tags, w.counts = append(w.bodies, body), append(w.tags, tags), append(w.counts, inBatch)
	}
	w.batches = len(w.bodies)
	return w
}

func binaryRand(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// setRound rewrites the round number in every session ID.
func (w *tokenPathWorkload) setRound(round int) {
	var digits [roundDigits]byte
	s := strconv.Itoa(round % 1_000_000)
	for i := range digits {
		digits[i] = '0'
	}
	copy(digits[roundDigits-len(s):], s)
	for i, body := range w.bodies {
		for _, off := range w.tags[i] {
			copy(body[off:off+roundDigits], digits[:])
		}
	}
}

// newTokenPath builds the collector's token path in process: the
// token_stream receiver (hooks over HTTP) into a token_session processor in
// a logs, a metrics and a traces pipeline, each ending in a nop exporter.
func newTokenPath(b *testing.B) *tokenStreamReceiver {
	ctx := context.Background()
	pf := tokensessionprocessor.NewFactory()
	pcfg := pf.CreateDefaultConfig()
	pset := processortest.NewNopSettings(pf.Type())
	lp, err := pf.CreateLogs(ctx, pset, pcfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	mp, err := pf.CreateMetrics(ctx, pset, pcfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	tp, err := pf.CreateTraces(ctx, pset, pcfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []processor.Logs{lp} {
		if err := p.Start(ctx, componenttest.NewNopHost()); err != nil {
			b.Fatal(err)
		}
	}
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	r, err := newTokenStreamReceiver(cfg, receivertest.NewNopSettings(metadata.Type), lp)
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(ctx, componenttest.NewNopHost()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, c := range []component.Component{r, lp, mp, tp} {
			if err := c.Shutdown(ctx); err != nil {
				b.Error(err)
			}
		}
	})
	return r
}

// statusRecorder is the handler's response writer in the in-process
// benchmark: headers kept (the handler sets them), body discarded.
type statusRecorder struct {
	header http.Header
	status int
}

func (d *statusRecorder) Header() http.Header         { return d.header }
func (d *statusRecorder) Write(p []byte) (int, error) { return len(p), nil }
func (d *statusRecorder) WriteHeader(status int)      { d.status = status }

func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkTokenPathHTTP measures the whole token path per event: NDJSON
// batches of 1000 events (100 sessions in flight, starts and ends
// interleaved with the tokens) through the hooks HTTP handler, the
// token_session processor (logs, metrics and traces pipelines) and nop
// exporters. handler calls the receiver's http.Handler in process;
// loopback posts over a loopback TCP connection with net/http, the client's
// cost included. cpu-ns/event is the process's CPU time (user + system, GC
// included) per event, the figure the events per CPU-second target is
// about; ns/event is wall time.
func BenchmarkTokenPathHTTP(b *testing.B) {
	benchmarkTokenPathHTTP(b, newTokenPathWorkload(100, 100_000, 1000))
}

// BenchmarkTokenPathHTTPSmallBatches is the same path with batches of 42
// events, one session's worth of make bench's "1 session per batch" shape
// (the worst of the shapes): the per-request cost, over few events.
func BenchmarkTokenPathHTTPSmallBatches(b *testing.B) {
	benchmarkTokenPathHTTP(b, newTokenPathWorkload(1, 50_000, 42))
}

// BenchmarkTokenPathHTTPShortSessions: sessions of 10 tokens, 10 in flight,
// batches of 120 events (make bench's "10 tokens per session" shape): the
// per-session cost (start and end lines, the session's outputs).
func BenchmarkTokenPathHTTPShortSessions(b *testing.B) {
	benchmarkTokenPathHTTP(b, newTokenPathWorkloadOf(10, 50_000, 120, 10, 1))
}

// BenchmarkTokenPathHTTPOneTokenPerSession: 1000 sessions in flight,
// batches of 1000 events, so each batch holds about one token of each
// session: a record per token event, what a hook flushing every few
// milliseconds sends at high concurrency (and make bench's 100 000-session
// shape). The per-record cost.
func BenchmarkTokenPathHTTPOneTokenPerSession(b *testing.B) {
	benchmarkTokenPathHTTP(b, newTokenPathWorkload(1000, 200_000, 1000))
}

// floorServer is what any net/http server costs for the same requests: a
// handler that reads the body and answers as the hook does, nothing else (no
// confighttp middleware, no parse, no pipeline). The loopback mode's figure
// minus this one is what the collector adds per request.
func floorServer(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		writeAccepted(w, int(n/64))
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + defaultHTTPPath
}

// benchmarkTokenPathHTTP runs w in three modes: handler (the receiver's
// handler called in process), loopback (posted over loopback TCP) and
// floor (posted over loopback to floorServer).
func benchmarkTokenPathHTTP(b *testing.B, w *tokenPathWorkload) {
	for _, mode := range []string{"handler", "loopback", "floor"} {
		b.Run(mode, func(b *testing.B) {
			r := newTokenPath(b)
			url := "http://" + r.http.Addr.String() + defaultHTTPPath
			if mode == "floor" {
				url = floorServer(b)
			}
			resp := &statusRecorder{header: http.Header{}}
			reader := bytes.NewReader(nil)
			req, err := http.NewRequest(http.MethodPost, url, reader)
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/x-ndjson")
			client := &http.Client{}
			post := func(body []byte) {
				if mode == "handler" {
					reader.Reset(body)
					req.Body = io.NopCloser(reader)
					clear(resp.header)
					r.http.ServeHTTP(resp, req)
					if resp.status != http.StatusOK {
						b.Fatalf("status %d", resp.status)
					}
					return
				}
				hr, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				hr.Header.Set("Content-Type", "application/x-ndjson")
				res, err := client.Do(hr)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
				if res.StatusCode != http.StatusOK {
					b.Fatalf("status %d", res.StatusCode)
				}
			}
			round, i, events := 0, 0, 0
			var setup int64 // CPU time spent renumbering rounds, not measured
			w.setRound(round)
			b.ReportAllocs()
			cpu0 := cpuNanos()
			for b.Loop() {
				if i == w.batches {
					b.StopTimer()
					c := cpuNanos()
					round++
					w.setRound(round)
					i = 0
					setup += cpuNanos() - c
					b.StartTimer()
				}
				post(w.bodies[i])
				events += w.counts[i]
				i++
			}
			cpu := cpuNanos() - cpu0 - setup
			client.CloseIdleConnections()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
			b.ReportMetric(float64(cpu)/float64(events), "cpu-ns/event")
			b.ReportMetric(float64(events)/(float64(cpu)/1e9), "events/cpu-s")
			b.ReportMetric(float64(events)/float64(b.N), "events/op")
		})
	}
}

// BenchmarkTokenPathUnix is BenchmarkTokenPathHTTP's path through the Unix
// socket hook, the clients' default transport where the node offers it:
// each workload body is what one batch window of one connection holds.
// stream feeds the connection's line cutter, decoder, pipeline and
// acknowledgement in process, no system call (the streaming equivalent of
// handler); socket writes the bodies on a real connection to the started
// listener and reads the acknowledgements, the client's cost included.
func BenchmarkTokenPathUnix(b *testing.B) {
	for _, tc := range []struct {
		name string
		w    func() *tokenPathWorkload
	}{
		{"batch1000", func() *tokenPathWorkload { return newTokenPathWorkload(100, 100_000, 1000) }},
		{"short_sessions", func() *tokenPathWorkload { return newTokenPathWorkloadOf(10, 50_000, 120, 10, 1) }},
		{"one_token_per_session", func() *tokenPathWorkload { return newTokenPathWorkload(1000, 200_000, 1000) }},
	} {
		b.Run(tc.name, func(b *testing.B) { benchmarkTokenPathUnix(b, tc.w()) })
	}
}

func benchmarkTokenPathUnix(b *testing.B, w *tokenPathWorkload) {
	for _, mode := range []string{"stream", "socket"} {
		b.Run(mode, func(b *testing.B) {
			r := newTokenPath(b)
			sink, err := r.newLogsSink(transportUnix, "ndjson")
			if err != nil {
				b.Fatal(err)
			}
			var post func(body []byte, events int)
			switch mode {
			case "stream":
				lines := newLineStream(r.cfg.Hooks.Limits.MaxLineBytes)
				reader := bytes.NewReader(nil)
				var ack []byte
				warn := r.logsLogger
				post = func(body []byte, _ int) {
					reader.Reset(body)
					d := sink.decoder()
					d.begin(time.Now(), false)
					for {
						_, err := lines.read(reader)
						lines.take(d)
						if err != nil {
							break
						}
					}
					d.finish()
					ack, _ = deliverStreamBatch(sink, warn, d, ack[:0])
					sink.release(d)
					if d.rejected > 0 {
						b.Fatalf("rejected: %s", ack)
					}
				}
			case "socket":
				u := &UnixConfig{Endpoint: filepath.Join(b.TempDir(), "s.sock"), BatchWindow: 0, SocketMode: defaultUnixSocketMode, DirectoryMode: defaultUnixDirectoryMode}
				perm, errs := u.permissions()
				if len(errs) > 0 {
					b.Fatal(errs)
				}
				l, err := startHooksUnix(u, perm, r.cfg.Hooks.Limits, sink)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = l.shutdown() })
				conn, err := net.Dial("unix", l.path)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = conn.Close() })
				acks := bufio.NewReader(conn)
				post = func(body []byte, events int) {
					if _, err := conn.Write(body); err != nil {
						b.Fatal(err)
					}
					// Wait for the body's acknowledgements: one batch at a
					// time, as a client flushing on its interval sends.
					for events > 0 {
						line, err := acks.ReadSlice('\n')
						if err != nil {
							b.Fatal(err)
						}
						var a unixAck
						if err := json.Unmarshal(line, &a); err != nil || a.Rejected+a.Refused > 0 {
							b.Fatalf("acknowledgement %s: %v", line, err)
						}
						events -= a.Accepted
					}
				}
			}
			round, i, events := 0, 0, 0
			var setup int64
			w.setRound(round)
			b.ReportAllocs()
			cpu0 := cpuNanos()
			for b.Loop() {
				if i == w.batches {
					b.StopTimer()
					c := cpuNanos()
					round++
					w.setRound(round)
					i = 0
					setup += cpuNanos() - c
					b.StartTimer()
				}
				post(w.bodies[i], w.counts[i])
				events += w.counts[i]
				i++
			}
			cpu := cpuNanos() - cpu0 - setup
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
			b.ReportMetric(float64(cpu)/float64(events), "cpu-ns/event")
			b.ReportMetric(float64(events)/(float64(cpu)/1e9), "events/cpu-s")
			b.ReportMetric(float64(events)/float64(b.N), "events/op")
		})
	}
}
