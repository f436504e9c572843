// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sse

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tEvent is a copied, comparable Event. Pieces of an oversized event are
// merged into one tEvent.
type tEvent struct {
	Raw       string
	Data      string
	Type      string
	ID        string
	Retry     int64
	HasRetry  bool
	HasData   bool
	Oversized bool
}

type result struct {
	events  []tEvent
	partial string // merged Partial pieces of an unfinished oversized event
	pending string
}

// all returns Raw pieces + Pending in order.
func (r result) all() string {
	var sb strings.Builder
	for _, e := range r.events {
		sb.WriteString(e.Raw)
	}
	sb.WriteString(r.partial)
	sb.WriteString(r.pending)
	return sb.String()
}

// normalize moves an LF that starts a Raw (or the pending bytes) back to the
// previous event when that event's Raw ends with the CR it completes; this is
// where feeding the whole input at once puts it.
func (r result) normalize() result {
	ev := append([]tEvent(nil), r.events...)
	for i := range ev {
		if !strings.HasSuffix(ev[i].Raw, "\r") {
			continue
		}
		switch {
		case i+1 < len(ev):
			if strings.HasPrefix(ev[i+1].Raw, "\n") {
				ev[i].Raw += "\n"
				ev[i+1].Raw = ev[i+1].Raw[1:]
			}
		case r.partial != "":
			if strings.HasPrefix(r.partial, "\n") {
				ev[i].Raw += "\n"
				r.partial = r.partial[1:]
			}
		case strings.HasPrefix(r.pending, "\n"):
			ev[i].Raw += "\n"
			r.pending = r.pending[1:]
		}
	}
	r.events = ev
	return r
}

// feed runs a new parser over the pieces and checks the invariants that
// hold for every split.
func feed(tb testing.TB, maxBytes int, pieces ...[]byte) result {
	tb.Helper()
	p := NewParser(maxBytes)
	var r result
	var partial []byte
	limit := p.max + 1
	for _, piece := range pieces {
		err := p.Feed(piece, func(e *Event) error {
			if e.Partial {
				if !e.Oversized {
					tb.Fatalf("Partial piece not Oversized: %+v", e)
				}
				if len(e.Raw) == 0 {
					tb.Fatalf("empty Partial piece")
				}
				partial = append(partial, e.Raw...)
				return nil
			}
			if len(partial) > 0 && !e.Oversized {
				tb.Fatalf("Partial pieces followed by a non-oversized event %q", e.Raw)
			}
			if e.HasData != (e.Data != nil) {
				tb.Fatalf("HasData %v with Data %q", e.HasData, e.Data)
			}
			raw := string(partial) + string(e.Raw)
			partial = partial[:0]
			r.events = append(r.events, tEvent{
				Raw: raw, Data: string(e.Data), Type: e.Type, ID: string(e.ID),
				Retry: e.Retry, HasRetry: e.HasRetry, HasData: e.HasData, Oversized: e.Oversized,
			})
			return nil
		})
		if err != nil {
			tb.Fatalf("Feed: %v", err)
		}
		if n := len(p.Pending()); n > limit {
			tb.Fatalf("Pending holds %d bytes, bound is %d", n, limit)
		}
	}
	r.partial = string(partial)
	r.pending = string(p.Pending())
	return r
}

// splits returns the ways the tests cut an input: whole, in two at every
// byte boundary, and byte by byte.
func splits(in []byte) map[string][][]byte {
	m := map[string][][]byte{"whole": {in}}
	for i := 1; i < len(in); i++ {
		m[fmt.Sprintf("split@%d", i)] = [][]byte{in[:i], in[i:]}
	}
	bb := make([][]byte, len(in))
	for i := range in {
		bb[i] = in[i : i+1]
	}
	m["bytewise"] = bb
	return m
}

// oracle is a direct, whole-input transcription of the WHATWG algorithm
// (no size bound), used to cross-check the incremental parser.
func oracle(in []byte) result {
	var r result
	var data, typ, id []byte
	var retry int64
	var hasRetry bool
	pos, evStart := 0, 0
	first := true
	for pos < len(in) {
		j := bytes.IndexAny(in[pos:], "\r\n")
		if j < 0 {
			break
		}
		j += pos
		end := j + 1
		if in[j] == '\r' && end < len(in) && in[end] == '\n' {
			end++
		}
		line := in[pos:j]
		if first {
			line = bytes.TrimPrefix(line, []byte("\xEF\xBB\xBF"))
			first = false
		}
		pos = end
		if len(line) == 0 {
			e := tEvent{Raw: string(in[evStart:end]), Type: string(typ), ID: string(id), Retry: retry, HasRetry: hasRetry}
			if len(data) > 0 {
				e.HasData = true
				e.Data = string(data[:len(data)-1])
			}
			r.events = append(r.events, e)
			evStart = end
			data, typ, retry, hasRetry = nil, nil, 0, false
			continue
		}
		if line[0] == ':' {
			continue
		}
		name, value := string(line), ""
		if c := bytes.IndexByte(line, ':'); c >= 0 {
			name, value = string(line[:c]), strings.TrimPrefix(string(line[c+1:]), " ")
		}
		switch name {
		case "data":
			data = append(append(data, value...), '\n')
		case "event":
			typ = []byte(value)
		case "id":
			if !strings.Contains(value, "\x00") {
				id = []byte(value)
			}
		case "retry":
			var n int64
			ok := value != ""
			for _, c := range []byte(value) {
				if c < '0' || c > '9' || n > (1<<63-1-int64(c-'0'))/10 {
					ok = false
					break
				}
				n = n*10 + int64(c-'0')
			}
			if ok {
				retry, hasRetry = n, true
			}
		}
	}
	r.pending = string(in[evStart:])
	return r
}

// checkAllSplits feeds in at every split and requires the same result as
// want, and Raw + Pending == in.
func checkAllSplits(t *testing.T, maxBytes int, in []byte, want result) {
	t.Helper()
	for name, pieces := range splits(in) {
		got := feed(t, maxBytes, pieces...)
		require.Equal(t, string(in), got.all(), "%s: Raw pieces + Pending must reassemble the input", name)
		got = got.normalize()
		require.Equal(t, want.events, got.events, "%s: events", name)
		require.Equal(t, want.partial, got.partial, "%s: partial", name)
		require.Equal(t, want.pending, got.pending, "%s: pending", name)
	}
}

func data(raw, d string) tEvent { return tEvent{Raw: raw, Data: d, HasData: true} }
func blank(raw string) tEvent   { return tEvent{Raw: raw} }

func TestFraming(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []tEvent
		pending string
	}{
		{
			name: "LF", in: "data: a\n\ndata: b\n\n",
			want: []tEvent{data("data: a\n\n", "a"), data("data: b\n\n", "b")},
		},
		{
			name: "CRLF", in: "data: a\r\n\r\ndata: b\r\n\r\n",
			want: []tEvent{data("data: a\r\n\r\n", "a"), data("data: b\r\n\r\n", "b")},
		},
		{
			name: "CR only", in: "data: a\r\rdata: b\r\r",
			want: []tEvent{data("data: a\r\r", "a"), data("data: b\r\r", "b")},
		},
		{
			name: "mixed line ends", in: "data: a\r\ndata: b\rdata: c\n\r\n",
			want: []tEvent{data("data: a\r\ndata: b\rdata: c\n\r\n", "a\nb\nc")},
		},
		{
			name: "CR CR LF is two line ends", in: "data: a\r\r\n",
			want: []tEvent{data("data: a\r\r\n", "a")},
		},
		{
			name: "LF CR is two line ends", in: "data: a\n\rdata: b\n\n",
			want: []tEvent{data("data: a\n\r", "a"), data("data: b\n\n", "b")},
		},
		{
			name: "BOM ignored", in: "\xEF\xBB\xBFdata: x\n\n",
			want: []tEvent{data("\xEF\xBB\xBFdata: x\n\n", "x")},
		},
		{
			name: "BOM then blank line", in: "\xEF\xBB\xBF\ndata: x\n\n",
			want: []tEvent{blank("\xEF\xBB\xBF\n"), data("data: x\n\n", "x")},
		},
		{
			name: "only one BOM ignored", in: "\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n",
			want: []tEvent{blank("\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n")},
		},
		{
			name: "BOM not at start is data", in: "data: a\n\n\xEF\xBB\xBFdata: b\n\n",
			want: []tEvent{data("data: a\n\n", "a"), blank("\xEF\xBB\xBFdata: b\n\n")},
		},
		{
			name: "comments", in: ": hello\ndata: a\n: mid\n\n:only\n\n",
			want: []tEvent{data(": hello\ndata: a\n: mid\n\n", "a"), blank(":only\n\n")},
		},
		{
			name: "comment with data-like text", in: ":data: x\n\n",
			want: []tEvent{blank(":data: x\n\n")},
		},
		{
			name: "no space after colon", in: "data:a\n\n",
			want: []tEvent{data("data:a\n\n", "a")},
		},
		{
			name: "only one space removed", in: "data:  a \n\n",
			want: []tEvent{data("data:  a \n\n", " a ")},
		},
		{
			name: "tab not removed", in: "data:\ta\n\n",
			want: []tEvent{data("data:\ta\n\n", "\ta")},
		},
		{
			name: "empty data value", in: "data: \n\n",
			want: []tEvent{data("data: \n\n", "")},
		},
		{
			name: "data without colon", in: "data\n\n",
			want: []tEvent{data("data\n\n", "")},
		},
		{
			name: "colon in value", in: "data: a:b: c\n\n",
			want: []tEvent{data("data: a:b: c\n\n", "a:b: c")},
		},
		{
			name: "multi-line data", in: "data: a\ndata:\ndata: c\n\n",
			want: []tEvent{data("data: a\ndata:\ndata: c\n\n", "a\n\nc")},
		},
		{
			name: "trailing empty data line", in: "data: a\ndata\n\n",
			want: []tEvent{data("data: a\ndata\n\n", "a\n")},
		},
		{
			name: "event type", in: "event: add\ndata: x\n\ndata: y\n\n",
			want: []tEvent{{Raw: "event: add\ndata: x\n\n", Data: "x", HasData: true, Type: "add"}, data("data: y\n\n", "y")},
		},
		{
			name: "last event field wins", in: "event: a\nevent: b\ndata: x\n\n",
			want: []tEvent{{Raw: "event: a\nevent: b\ndata: x\n\n", Data: "x", HasData: true, Type: "b"}},
		},
		{
			name: "event without colon is empty type", in: "event: a\nevent\ndata: x\n\n",
			want: []tEvent{data("event: a\nevent\ndata: x\n\n", "x")},
		},
		{
			name: "type without data", in: "event: a\n\n",
			want: []tEvent{{Raw: "event: a\n\n", Type: "a"}},
		},
		{
			name: "id persists", in: "id: 1\ndata: x\n\ndata: y\n\nid\ndata: z\n\n",
			want: []tEvent{
				{Raw: "id: 1\ndata: x\n\n", Data: "x", HasData: true, ID: "1"},
				{Raw: "data: y\n\n", Data: "y", HasData: true, ID: "1"},
				data("id\ndata: z\n\n", "z"),
			},
		},
		{
			name: "id with NUL ignored", in: "id: 1\n\nid: a\x00b\ndata: x\n\n",
			want: []tEvent{{Raw: "id: 1\n\n", ID: "1"}, {Raw: "id: a\x00b\ndata: x\n\n", Data: "x", HasData: true, ID: "1"}},
		},
		{
			name: "id only event", in: "id: 5\n\n",
			want: []tEvent{{Raw: "id: 5\n\n", ID: "5"}},
		},
		{
			name: "retry", in: "retry: 1500\n\nretry: 15a\n\nretry:\n\nretry: 99999999999999999999\n\nretry: 007\ndata: x\n\n",
			want: []tEvent{
				{Raw: "retry: 1500\n\n", Retry: 1500, HasRetry: true},
				blank("retry: 15a\n\n"), blank("retry:\n\n"), blank("retry: 99999999999999999999\n\n"),
				{Raw: "retry: 007\ndata: x\n\n", Retry: 7, HasRetry: true, Data: "x", HasData: true},
			},
		},
		{
			name: "unknown and case-sensitive fields ignored", in: "foo: bar\nData: x\nDATA\n data: y\n\n",
			want: []tEvent{blank("foo: bar\nData: x\nDATA\n data: y\n\n")},
		},
		{
			name: "blank lines only", in: "\n\r\n\r",
			want: []tEvent{blank("\n"), blank("\r\n"), blank("\r")},
		},
		{
			name: "pending line end", in: "data: a\n\ndata: b\n", pending: "data: b\n",
			want: []tEvent{data("data: a\n\n", "a")},
		},
		{
			name: "pending no line end", in: "data: a\n\ndata: b", pending: "data: b",
			want: []tEvent{data("data: a\n\n", "a")},
		},
		{
			name: "pending CR", in: "data: a\r\rdata: b\r", pending: "data: b\r",
			want: []tEvent{data("data: a\r\r", "a")},
		},
		{name: "empty input", in: ""},
		{
			name: "binary and NUL in data", in: "data: \x00\xff\n\n",
			want: []tEvent{data("data: \x00\xff\n\n", "\x00\xff")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := result{events: tt.want, pending: tt.pending}
			require.Equal(t, want, oracle([]byte(tt.in)), "oracle disagrees with the table")
			checkAllSplits(t, 0, []byte(tt.in), want)
		})
	}
}

// TestCRLFAcrossFeeds pins where the LF of a CRLF split across two Feed
// calls goes.
func TestCRLFAcrossFeeds(t *testing.T) {
	// CR ends the blank line at the end of a Feed: dispatched at once, the
	// LF starts the next event.
	r := feed(t, 0, []byte("data: a\r\n\r"), []byte("\ndata: b\r\n\r\n"))
	assert.Equal(t, []tEvent{data("data: a\r\n\r", "a"), data("\ndata: b\r\n\r\n", "b")}, r.events)
	// CR ends a field line: the LF stays in the same event and is not a
	// blank line.
	r = feed(t, 0, []byte("data: a\r"), []byte("\ndata: b\r\n\r\n"))
	assert.Equal(t, []tEvent{data("data: a\r\ndata: b\r\n\r\n", "a\nb")}, r.events)
	// Feeding an empty slice between them changes nothing.
	r = feed(t, 0, []byte("data: a\r"), nil, []byte("\n\r\n"))
	assert.Equal(t, []tEvent{data("data: a\r\n\r\n", "a")}, r.events)
}

func TestZeroCopyWithinOneRead(t *testing.T) {
	in := []byte("data: a\n\ndata: b\n\ndata: c")
	p := NewParser(0)
	var raws [][]byte
	require.NoError(t, p.Feed(in, func(e *Event) error { raws = append(raws, e.Raw); return nil }))
	require.Len(t, raws, 2)
	assert.Same(t, &in[0], &raws[0][0], "Raw aliases the fed slice")
	assert.Same(t, &in[9], &raws[1][0])
	assert.Equal(t, "data: c", string(p.Pending()))
}

// readFixture reads the project's copy of shared/fixtures/vllm/sse-streams.txt.
func readFixture(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile("../../../../testdata/fixtures/vllm/sse-streams.txt")
	require.NoError(tb, err)
	return b
}

func TestVLLMFixture(t *testing.T) {
	in := readFixture(t)
	for _, variant := range []struct {
		name string
		nl   string
	}{{"LF", "\n"}, {"CRLF", "\r\n"}, {"CR", "\r"}} {
		t.Run(variant.name, func(t *testing.T) {
			s := bytes.ReplaceAll(in, []byte("\n"), []byte(variant.nl))
			want := oracle(s)
			for name, pieces := range splits(s) {
				got := feed(t, 0, pieces...)
				require.Equal(t, string(s), got.all(), name)
				got = got.normalize()
				require.Equal(t, want, got, name)
			}
			got := feed(t, 0, s)
			var payloads []string
			for _, e := range got.events {
				if e.HasData {
					payloads = append(payloads, e.Data)
				}
				assert.Empty(t, e.Type)
				assert.Empty(t, e.ID)
			}
			// Chat stream: role chunk, 7 content chunks, finish chunk,
			// usage chunk, [DONE]; completions: 3 chunks, usage, [DONE].
			require.Len(t, payloads, 16)
			assert.Equal(t, "[DONE]", payloads[10])
			assert.Equal(t, "[DONE]", payloads[len(payloads)-1])
			for i, d := range payloads {
				if d == "[DONE]" {
					continue
				}
				assert.True(t, json.Valid([]byte(d)), "payload %d is JSON: %s", i, d)
			}
			assert.Contains(t, payloads[0], `"delta":{"role":"assistant","content":""}`)
			assert.Contains(t, payloads[9], `"usage":{"prompt_tokens":42,"total_tokens":50,"completion_tokens":8}`)
			assert.Contains(t, payloads[14], `"usage":{"prompt_tokens":6,"total_tokens":9,"completion_tokens":3}`)
			// The comment header travels in the first event's Raw.
			assert.True(t, strings.HasPrefix(got.events[0].Raw, ": ----"))
			assert.Empty(t, got.pending)
		})
	}
}

func TestOversized(t *testing.T) {
	const maxBytes = 16
	big := "data: 0123456789abcdef\n\n" // 24 bytes
	in := "id: 7\n" + big + "data: ok\n\n" + "data: 012345678\n\n" + "data: 01234567890123456789"
	want := result{
		events: []tEvent{
			// The id line is interpreted before the bound is passed.
			{Raw: "id: 7\n" + big, ID: "7", Oversized: true},
			{Raw: "data: ok\n\n", Data: "ok", HasData: true, ID: "7"},
			// 16 bytes through the data line's LF: the line is
			// interpreted, but the blank line is the 17th byte.
			{Raw: "data: 012345678\n\n", ID: "7", Oversized: true},
		},
		partial: "data: 01234567890123456789",
	}
	checkAllSplits(t, maxBytes, []byte(in), want)

	// Exactly at the bound (16 bytes with the blank line) is fine.
	checkAllSplits(t, maxBytes, []byte("data: 01234567\n\n"), result{events: []tEvent{data("data: 01234567\n\n", "01234567")}})
	// A CRLF line end counts its CR at the line and its LF afterwards; the
	// LF completing an event's final CRLF does not count toward the next
	// event even when a Feed boundary puts it there (each event is 16
	// bytes up to its last CR, 17 with the LF).
	checkAllSplits(t, maxBytes, []byte("data: 0123456\r\n\r\ndata: 0123456\r\n\r\n"), result{events: []tEvent{
		data("data: 0123456\r\n\r\n", "0123456"), data("data: 0123456\r\n\r\n", "0123456"),
	}})
	checkAllSplits(t, maxBytes, []byte("data: 01234567\r\n\r\n"), result{events: []tEvent{{Raw: "data: 01234567\r\n\r\n", Oversized: true}}})

	// The pieces as delivered for one particular split.
	p := NewParser(maxBytes)
	var got []Event
	rec := func(e *Event) error {
		c := *e
		c.Raw = bytes.Clone(e.Raw)
		got = append(got, c)
		return nil
	}
	require.NoError(t, p.Feed([]byte("data: 01234"), rec))
	assert.Empty(t, got)
	assert.Equal(t, "data: 01234", string(p.Pending()))
	require.NoError(t, p.Feed([]byte("56789abcdef\nmore"), rec))
	require.NoError(t, p.Feed([]byte(" stuff\n"), rec))
	assert.Empty(t, p.Pending())
	require.NoError(t, p.Feed([]byte("\ndata: x\n\n"), rec))
	want2 := []Event{
		{Raw: []byte("data: 01234"), Oversized: true, Partial: true},
		{Raw: []byte("56789abcdef\nmore"), Oversized: true, Partial: true},
		{Raw: []byte(" stuff\n"), Oversized: true, Partial: true},
		{Raw: []byte("\n"), Oversized: true},
		{Raw: []byte("data: x\n\n"), Data: []byte("x"), HasData: true},
	}
	assert.Equal(t, want2, got)
}

func TestDefaultMax(t *testing.T) {
	assert.Equal(t, DefaultMaxEventBytes, NewParser(0).max)
	assert.Equal(t, DefaultMaxEventBytes, NewParser(-1).max)
	big := "data: " + strings.Repeat("x", DefaultMaxEventBytes) + "\n\n"
	r := feed(t, 0, []byte(big[:100]), []byte(big[100:]))
	require.Len(t, r.events, 1)
	assert.True(t, r.events[0].Oversized)
	assert.Equal(t, big, r.events[0].Raw)
}

func TestCallbackError(t *testing.T) {
	errStop := errors.New("stop")
	in := []byte("data: a\n\ndata: b\n\ndata: c\n\n")
	for name, pieces := range splits(in) {
		p := NewParser(0)
		var seen []string
		var err error
		for _, piece := range pieces {
			err = p.Feed(piece, func(e *Event) error {
				seen = append(seen, string(e.Data))
				if string(e.Data) == "b" {
					return errStop
				}
				return nil
			})
			if err != nil {
				break
			}
		}
		require.ErrorIs(t, err, errStop, name)
		assert.Equal(t, []string{"a", "b"}, seen, name)
	}

	// An error from an oversized piece stops Feed too.
	p := NewParser(4)
	calls := 0
	err := p.Feed([]byte("data: toolong\n\ndata: x\n\n"), func(*Event) error { calls++; return errStop })
	require.ErrorIs(t, err, errStop)
	assert.Equal(t, 1, calls)
	p = NewParser(4)
	calls = 0
	err = p.Feed([]byte("data: toolong"), func(*Event) error { calls++; return errStop })
	require.ErrorIs(t, err, errStop)
	assert.Equal(t, 1, calls)

	// Reset makes the parser usable again.
	p = NewParser(0)
	require.ErrorIs(t, p.Feed([]byte("id: 9\n\ndata: partial"), func(*Event) error { return errStop }), errStop)
	p.Reset()
	assert.Empty(t, p.Pending())
	r := []string{}
	require.NoError(t, p.Feed([]byte("id: 1\n\ndata: y\n\n"), func(e *Event) error { r = append(r, string(e.Data)+"/"+string(e.ID)); return nil }))
	assert.Equal(t, []string{"/1", "y/1"}, r)
	p.Reset()
	assert.Empty(t, p.LastEventID())
}

func TestSteadyStateAllocs(t *testing.T) {
	chunk := vllmChunk(t)
	typed := []byte("event: response.output_text.delta\nid: 42\ndata: {\"delta\":\"x\"}\n\n")
	p := NewParser(0)
	fn := func(*Event) error { return nil }
	for _, in := range [][]byte{chunk, typed} {
		require.NoError(t, p.Feed(in, fn))
		assert.Zero(t, testing.AllocsPerRun(100, func() { _ = p.Feed(in, fn) }), "whole events")
		assert.Zero(t, testing.AllocsPerRun(100, func() {
			_ = p.Feed(in[:37], fn)
			_ = p.Feed(in[37:], fn)
		}), "split events")
	}
}

// FuzzFeed: for any input, bound and split, no panic, the Raw pieces plus
// Pending reassemble the input, and the events equal those of feeding the
// whole input at once (and, without a binding bound, the oracle's).
func FuzzFeed(f *testing.F) {
	f.Add([]byte("data: a\r\n\r\ndata: b\rdata: c\n\n"), []byte{3, 1, 7}, uint16(0))
	f.Add([]byte("\xEF\xBB\xBFid: 1\nevent: x\nretry: 10\n: c\ndata\n\n"), []byte{1}, uint16(8))
	f.Add([]byte("data: 0123456789abcdef\r\n\r\ndata: ok\r\r"), []byte{5, 9}, uint16(12))
	fix := readFixture(f)
	start := bytes.Index(fix, []byte("\ndata: ")) + 1
	f.Add(fix[start:start+800], []byte{200, 17, 64}, uint16(300))
	f.Fuzz(fuzzBody)
}

func fuzzBody(t *testing.T, in []byte, cuts []byte, max16 uint16) {
	if len(in) > 4096 {
		// Long inputs add nothing the framing can't show in 4 KiB, and they
		// make the fuzzer's minimization of new inputs crawl.
		in = in[:4096]
	}
	{
		maxBytes := int(max16 % 64)
		if max16 >= 1024 {
			maxBytes = 0 // default bound
		}
		var pieces [][]byte
		rest := in
		for k := 0; len(rest) > 0; k++ {
			n := len(rest)
			if len(cuts) > 0 {
				n = 1 + int(cuts[k%len(cuts)])%(len(in)+1)
			}
			n = min(n, len(rest))
			pieces = append(pieces, rest[:n])
			rest = rest[n:]
		}
		whole := feed(t, maxBytes, in)
		got := feed(t, maxBytes, pieces...)
		if got.all() != string(in) {
			t.Fatalf("reassembled %q, input %q", got.all(), in)
		}
		if whole.all() != string(in) {
			t.Fatalf("whole: reassembled %q, input %q", whole.all(), in)
		}
		if n := whole.normalize(); !equalResults(n, whole) {
			t.Fatalf("whole-input result not normal: %+v", whole)
		}
		require.Equal(t, whole, got.normalize())
		if maxBytes == 0 && len(in) < DefaultMaxEventBytes {
			require.Equal(t, oracle(in), whole)
		}
	}
}

func equalResults(a, b result) bool {
	if a.partial != b.partial || a.pending != b.pending || len(a.events) != len(b.events) {
		return false
	}
	for i := range a.events {
		if a.events[i] != b.events[i] {
			return false
		}
	}
	return true
}

// vllmChunk is a typical vLLM chat completion chunk event (~250 bytes).
func vllmChunk(testing.TB) []byte {
	return []byte(`data: {"id":"chatcmpl-3f2b9c4e7a1d4e6f8b0c2d4e6f8a0b1c","object":"chat.completion.chunk","created":1754000123,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" capital"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
}

func BenchmarkFeedVLLMChunk(b *testing.B) {
	chunk := vllmChunk(b)
	p := NewParser(0)
	events := 0
	fn := func(e *Event) error {
		if e.HasData {
			events++
		}
		return nil
	}
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Feed(chunk, fn); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}

// BenchmarkFeedVLLMSplitReads feeds a stream of vLLM chunk events in
// 100-byte reads, so most events straddle two or three reads.
func BenchmarkFeedVLLMSplitReads(b *testing.B) {
	chunk := vllmChunk(b)
	stream := bytes.Repeat(chunk, 64)
	const readSize = 100
	p := NewParser(0)
	events := 0
	fn := func(e *Event) error {
		if e.HasData {
			events++
		}
		return nil
	}
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		for off := 0; off < len(stream); off += readSize {
			if err := p.Feed(stream[off:min(off+readSize, len(stream))], fn); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}
