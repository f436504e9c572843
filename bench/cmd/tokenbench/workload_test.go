// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"bytes"
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.uber.org/goleak"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenparse"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The hook side of the workload must be valid wire schema v1 with every
// session started, given Tokens tokens in time order, and ended.
func TestWorkloadNDJSONIsValidAndComplete(t *testing.T) {
	w := workload{Sessions: 7, Tokens: 5, Waves: 2, BatchLines: 10, SlowShare: 0.5}
	evs := newGenerator(w, 1).all()
	batches := chunk(evs, w.BatchLines, ndjson)
	type state struct {
		started, ended bool
		tokens         int
		last           uint64
	}
	sessions := map[string]*state{}
	p := tokenparse.NewParser(tokenevent.Limits{})
	tokens := 0
	for _, b := range batches {
		tokens += b.tokens
		lines := 0
		p.ParseBatch(b.body, 0, func(ev *tokenevent.Event) {
			lines++
			s := sessions[ev.SessionID]
			switch ev.Kind {
			case tokenevent.KindStart:
				if s != nil {
					t.Fatalf("%s started twice", ev.SessionID)
				}
				sessions[ev.SessionID] = &state{started: true, last: ev.TimeUnixNano}
			case tokenevent.KindToken:
				if s == nil || s.ended || ev.TimeUnixNano <= s.last {
					t.Fatalf("%s: token out of place", ev.SessionID)
				}
				s.tokens++
				s.last = ev.TimeUnixNano
			case tokenevent.KindEnd:
				if s == nil || s.ended || ev.CompletionTokens != int64(s.tokens) {
					t.Fatalf("%s: end out of place or with %d tokens, want %d", ev.SessionID, ev.CompletionTokens, s.tokens)
				}
				s.ended = true
			}
		}, func(le *tokenparse.LineError) { t.Fatal(le) })
		if lines != b.events {
			t.Fatalf("batch of %d events parsed into %d", b.events, lines)
		}
	}
	if len(sessions) != w.Sessions*w.Waves {
		t.Fatalf("%d sessions, want %d", len(sessions), w.Sessions*w.Waves)
	}
	for id, s := range sessions {
		if !s.ended || s.tokens != w.Tokens {
			t.Fatalf("%s: ended %v with %d tokens, want %d", id, s.ended, s.tokens, w.Tokens)
		}
	}
	if int64(tokens) != w.tokenEvents() {
		t.Fatalf("batches count %d tokens, want %d", tokens, w.tokenEvents())
	}
}

// The stock side carries the same stream: a span per token, parented by its
// session's span, and the session's span at its end.
func TestWorkloadSpansMatchTokens(t *testing.T) {
	w := workload{Sessions: 3, Tokens: 4, Waves: 1, BatchLines: 5}
	g := newGenerator(w, 2)
	evs := g.all()
	spans, roots := 0, 0
	for _, b := range chunk(evs, w.BatchLines, g.otlpSpans) {
		req := ptraceotlp.NewExportRequest()
		if err := req.UnmarshalProto(b.body); err != nil {
			t.Fatal(err)
		}
		ss := req.Traces().ResourceSpans().At(0).ScopeSpans().At(0).Spans()
		for i := range ss.Len() {
			sp := ss.At(i)
			if sp.ParentSpanID().IsEmpty() {
				roots++
				continue
			}
			spans++
			if sp.EndTimestamp() <= sp.StartTimestamp() {
				t.Fatalf("token span %d: end %d not after start %d", i, sp.EndTimestamp(), sp.StartTimestamp())
			}
		}
	}
	if spans != w.Sessions*w.Tokens || roots != w.Sessions {
		t.Fatalf("%d token spans and %d request spans, want %d and %d", spans, roots, w.Sessions*w.Tokens, w.Sessions)
	}
}

func TestDatagramsSplitAtLineEnds(t *testing.T) {
	body := []byte("aaaa\nbb\ncccccc\nd\n")
	grams := datagrams(body, 8)
	if got := bytes.Join(grams, nil); !bytes.Equal(got, body) {
		t.Fatalf("datagrams rejoin to %q", got)
	}
	for _, g := range grams {
		if len(g) > 8 || g[len(g)-1] != '\n' {
			t.Fatalf("datagram %q: over 8 bytes or not ending a line", g)
		}
	}
}

// The saturation stream opens every session once, then gives tokens round
// robin with rising times.
func TestTokenStream(t *testing.T) {
	ts := newTokenStream("t", 3)
	p := tokenparse.NewParser(tokenevent.Limits{})
	var kinds []tokenevent.Kind
	last := map[string]uint64{}
	for _, n := range []int{2, 4, 3} {
		b := ts.batch(n)
		p.ParseBatch(b.body, 0, func(ev *tokenevent.Event) {
			kinds = append(kinds, ev.Kind)
			if ev.Kind == tokenevent.KindToken && ev.TimeUnixNano <= last[ev.SessionID] {
				t.Fatalf("%s: token time does not rise", ev.SessionID)
			}
			last[ev.SessionID] = ev.TimeUnixNano
		}, func(le *tokenparse.LineError) { t.Fatal(le) })
	}
	want := []tokenevent.Kind{1, 1, 1, 2, 2, 2, 2, 2, 2}
	if len(kinds) != len(want) {
		t.Fatalf("kinds %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("kinds %v, want %v", kinds, want)
		}
	}
}
