// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

const (
	benchModel = "meta-llama/Llama-3.1-8B-Instruct"
	// slowGap is the decode gap of the slow share: above the 80 ms TPOT rule of
	// token_session, and long enough that the session's trace outlasts the
	// stock pipeline's latency policy, so both keep the same sessions.
	slowGap = 120 * time.Millisecond
	// stockLatencyThreshold is the stock latency policy: a normal session of
	// 256 tokens at 20–50 ms lasts under 13.2 s, a slow one over 30 s.
	stockLatencyThreshold = 20 * time.Second
)

// workload is the one token stream both pipelines are fed: Waves waves of
// Sessions concurrent sessions of Tokens tokens, as an engine hook sees them.
// Within a wave every session starts, then each decode step gives every
// session one token (20–50 ms apart in engine time, slowGap for SlowShare of
// them), then every session ends. Batches are BatchLines consecutive events,
// so a batch holds BatchLines/Sessions tokens of each session it touches.
type workload struct {
	Sessions   int     `json:"sessions"`
	Tokens     int     `json:"tokens_per_session"`
	Waves      int     `json:"waves"`
	BatchLines int     `json:"batch_events"`
	SlowShare  float64 `json:"slow_share"`
}

func (w workload) tokenEvents() int64 { return int64(w.Sessions) * int64(w.Tokens) * int64(w.Waves) }

type wSession struct {
	id     string
	trace  pcommon.TraceID
	span   pcommon.SpanID
	start  uint64
	last   uint64 // engine time of the latest token (or the start)
	ttft   uint64
	gapMin uint64
	gapMax uint64
	prompt int64
	tokens int
}

// wEvent is one event of the stream; prev is the session's previous event
// time, the start of a token's span in the stock encoding.
type wEvent struct {
	kind tokenevent.Kind
	s    *wSession
	t    uint64
	prev uint64
}

// generator produces the workload's events step by step, so that a run can
// stop in the middle of a wave (sessions in flight) and carry on later.
type generator struct {
	w        workload
	rng      *rand.Rand
	sessions []*wSession
	wave     int
	spanSeq  uint64
}

func newGenerator(w workload, seed uint64) *generator {
	return &generator{w: w, rng: rand.New(rand.NewPCG(seed, 0x6c6c6d))}
}

// newWave opens the next wave's sessions, starting now in engine time.
func (g *generator) newWave() {
	base := uint64(time.Now().UnixNano())
	g.sessions = g.sessions[:0]
	for i := range g.w.Sessions {
		s := &wSession{
			id:     fmt.Sprintf("chatcmpl-%08x%016x%08x", g.wave, g.rng.Uint64(), i),
			start:  base + uint64(i)*uint64(37*time.Microsecond),
			ttft:   uint64(100*time.Millisecond) + g.rng.Uint64N(uint64(250*time.Millisecond)),
			gapMin: uint64(20 * time.Millisecond),
			gapMax: uint64(50 * time.Millisecond),
			prompt: 200 + g.rng.Int64N(600),
		}
		if g.rng.Float64() < g.w.SlowShare {
			s.gapMin, s.gapMax = uint64(slowGap), uint64(slowGap)
		}
		binary.BigEndian.PutUint64(s.trace[:8], g.rng.Uint64())
		binary.BigEndian.PutUint64(s.trace[8:], g.rng.Uint64())
		binary.BigEndian.PutUint64(s.span[:], g.rng.Uint64()|1)
		s.last = s.start
		g.sessions = append(g.sessions, s)
	}
	g.wave++
}

// steps appends the events of steps [from, to) of the current wave to dst:
// step 0 starts every session, steps 1..Tokens give each a token, step
// Tokens+1 ends them.
func (g *generator) steps(dst []wEvent, from, to int) []wEvent {
	for step := from; step < to; step++ {
		for _, s := range g.sessions {
			switch {
			case step == 0:
				dst = append(dst, wEvent{kind: tokenevent.KindStart, s: s, t: s.start})
			case step <= g.w.Tokens:
				t := s.last + s.gapMin
				if s.tokens == 0 {
					t = s.start + s.ttft
				} else if s.gapMax > s.gapMin {
					t += g.rng.Uint64N(s.gapMax - s.gapMin)
				}
				dst = append(dst, wEvent{kind: tokenevent.KindToken, s: s, t: t, prev: s.last})
				s.last, s.tokens = t, s.tokens+1
			default:
				end := s.last + uint64(time.Millisecond)
				dst = append(dst, wEvent{kind: tokenevent.KindEnd, s: s, t: end, prev: s.start})
			}
		}
	}
	return dst
}

// all is the whole workload's event stream.
func (g *generator) all() []wEvent {
	var evs []wEvent
	for range g.w.Waves {
		g.newWave()
		evs = g.steps(evs, 0, g.w.Tokens+2)
	}
	return evs
}

// batch is one request body (or, for UDP, one set of datagrams) and the
// number of token events in it.
type batch struct {
	body   []byte
	tokens int
	events int
}

func tokensIn(evs []wEvent) int {
	n := 0
	for _, e := range evs {
		if e.kind == tokenevent.KindToken {
			n++
		}
	}
	return n
}

// chunk splits evs into batches of n events, each encoded by enc.
func chunk(evs []wEvent, n int, enc func([]wEvent) []byte) []batch {
	var out []batch
	for len(evs) > 0 {
		k := min(n, len(evs))
		out = append(out, batch{body: enc(evs[:k]), tokens: tokensIn(evs[:k]), events: k})
		evs = evs[k:]
	}
	return out
}

// ndjson encodes events in wire schema v1, as the hook clients send them.
func ndjson(evs []wEvent) []byte {
	var ev tokenevent.Event
	buf := make([]byte, 0, len(evs)*100)
	for _, e := range evs {
		ev.Reset()
		ev.Kind, ev.SessionID, ev.TimeUnixNano = e.kind, e.s.id, e.t
		switch e.kind {
		case tokenevent.KindStart:
			ev.TraceID, ev.SpanID = tokenevent.TraceID(e.s.trace), tokenevent.SpanID(e.s.span)
			ev.Model, ev.Operation, ev.PromptTokens, ev.Engine = benchModel, tokenevent.OperationChat, e.s.prompt, "vllm-0"
		case tokenevent.KindEnd:
			ev.CompletionTokens, ev.FinishReason = int64(e.s.tokens), "length"
		}
		buf = tokenevent.AppendJSON(buf, &ev)
	}
	return buf
}

// otlpSpans encodes events the way a stock instrumentation does it: each token
// a child span of the request's span (from the previous token to this one, so
// spanmetrics' duration histogram is the inter-token latency), and the
// request's span, with its GenAI attributes, when the request ends. A start
// produces nothing: the SDK exports a span when it ends.
func (g *generator) otlpSpans(evs []wEvent) []byte {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "vllm")
	rs.Resource().Attributes().PutStr("service.instance.id", "vllm-0")
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName("vllm.tokens")
	spans := ss.Spans()
	spans.EnsureCapacity(len(evs))
	var id pcommon.SpanID
	for _, e := range evs {
		switch e.kind {
		case tokenevent.KindToken:
			sp := spans.AppendEmpty()
			g.spanSeq++
			binary.BigEndian.PutUint64(id[:], g.spanSeq)
			sp.SetTraceID(e.s.trace)
			sp.SetSpanID(id)
			sp.SetParentSpanID(e.s.span)
			sp.SetName("gen_ai.token")
			sp.SetKind(ptrace.SpanKindInternal)
			sp.SetStartTimestamp(pcommon.Timestamp(e.prev))
			sp.SetEndTimestamp(pcommon.Timestamp(e.t))
		case tokenevent.KindEnd:
			sp := spans.AppendEmpty()
			sp.SetTraceID(e.s.trace)
			sp.SetSpanID(e.s.span)
			sp.SetName("chat " + benchModel)
			sp.SetKind(ptrace.SpanKindServer)
			sp.SetStartTimestamp(pcommon.Timestamp(e.s.start))
			sp.SetEndTimestamp(pcommon.Timestamp(e.t))
			a := sp.Attributes()
			a.PutStr("gen_ai.operation.name", "chat")
			a.PutStr("gen_ai.request.model", benchModel)
			a.PutInt("gen_ai.usage.input_tokens", e.s.prompt)
			a.PutInt("gen_ai.usage.output_tokens", int64(e.s.tokens))
			a.PutStr("llm.session.id", e.s.id)
		}
	}
	b, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		panic(err)
	}
	return b
}

// datagrams splits an NDJSON body at line ends into UDP payloads of at most
// maxBytes bytes.
func datagrams(body []byte, maxBytes int) [][]byte {
	var out [][]byte
	for len(body) > 0 {
		if len(body) <= maxBytes {
			return append(out, body)
		}
		cut := maxBytes
		for cut > 0 && body[cut-1] != '\n' {
			cut--
		}
		out = append(out, body[:cut])
		body = body[cut:]
	}
	return out
}
