// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package sse is an incremental Server-Sent Events parser for a proxy that
// forwards an upstream text/event-stream byte-for-byte while observing each
// event.
//
// Framing follows the WHATWG "Interpreting an event stream" rules
// (https://html.spec.whatwg.org/multipage/server-sent-events.html):
//
//   - Lines end with CRLF, LF or CR. A CR that is the last byte of one Feed
//     followed by an LF at the start of the next Feed is one line end.
//   - One UTF-8 BOM at the very start of the stream is ignored (it stays in
//     Raw, it is only dropped when the first line is interpreted).
//   - A line starting with ':' is a comment.
//   - "field:value" sets field to value, one space after the colon is
//     removed; a line without a colon is a field with an empty value.
//   - data: the value plus "\n" is appended to the data buffer (the final
//     "\n" is removed at dispatch); event: sets the event type; id: sets
//     the last event ID unless the value contains NUL; retry: is used only
//     if the value is one or more ASCII digits; other fields are ignored.
//   - A blank line ends (dispatches) the event.
//
// Bytes are not UTF-8 decoded or validated: field values are reported as
// the raw bytes received.
//
// Every byte fed to the parser ends up, in order, in exactly one Event.Raw
// or in Pending: concatenating the Raw of every delivered Event followed by
// Pending() reproduces the input exactly. Unlike an EventSource, the parser
// delivers an Event for every blank line, even when the data buffer is empty
// (HasData reports whether a browser would have fired a message event), so
// a proxy can forward every byte as soon as the event it belongs to ends.
package sse

import (
	"bytes"
	"math"
)

// DefaultMaxEventBytes is the event size bound used when NewParser is given
// a value <= 0.
const DefaultMaxEventBytes = 1 << 20

// Event is one event (or, for an oversized event, one piece of it). All
// slices alias the parser's buffers or the slice passed to Feed, and are
// valid only during the callback.
type Event struct {
	// Raw is the exact bytes of the event as received: every line of it,
	// comments and ignored fields included, and the blank line that ended
	// it. Line terminators are kept as received. One exception in where a
	// byte is attributed: when the blank line ending an event is terminated
	// by a CR that is the last byte of a Feed, the event is dispatched at
	// once and an LF that starts the next Feed (completing that CRLF)
	// becomes the first byte of the next event's Raw.
	Raw []byte
	// Data is the data buffer at dispatch: the values of the event's data
	// lines joined with "\n". Nil when the event has no data line.
	Data []byte
	// Type is the value of the last event field of the event, "" if none
	// (defaulting to "message" is the caller's business).
	Type string
	// ID is the last event ID at dispatch, as an EventSource reports it in
	// lastEventId: it is set by an id field (not containing NUL) in this or
	// an earlier event and persists across events; an "id" field with an
	// empty value clears it. Nil when empty.
	ID []byte
	// Retry is the value of the last valid retry field (milliseconds) seen
	// in this event; HasRetry reports whether there was one. Values that do
	// not fit in an int64 are ignored.
	Retry    int64
	HasRetry bool
	// HasData reports whether the data buffer was non-empty at dispatch,
	// i.e. whether the event had at least one data line. An EventSource
	// fires a message event exactly for these.
	HasData bool
	// Oversized marks an event whose size passed the parser's
	// maxEventBytes; see Parser.
	Oversized bool
	// Partial is set on every piece of an oversized event except the last
	// one (the one holding the blank line that ends it).
	Partial bool
}

// lfState says what an LF at the start of the next Feed means.
const (
	lfNone      = iota
	lfSameEvent // completes a CR line end inside the current event
	lfPrevEvent // completes the CR of the blank line that ended the previous event
)

// Parser is an incremental SSE parser. The zero value is not usable; use
// NewParser. A Parser is not safe for concurrent use.
//
// Size bound. The size of an event is the number of its Raw bytes, not
// counting a leading LF that completes the previous event's CRLF (see
// Event.Raw). A line is interpreted only if the event's size up to and
// including the first byte of its line end (the CR of a CRLF) is at most
// maxEventBytes. Once the event's size passes maxEventBytes the event is
// oversized:
//
//   - its data and event type buffers are dropped and its remaining lines
//     are not interpreted (fields from lines interpreted before that point,
//     such as id and retry, keep their effect);
//   - the bytes assembled so far are delivered at once as an Event with
//     Oversized and Partial set (and Data nil, HasData false, Type "");
//   - further bytes are delivered as they arrive, at the end of each Feed,
//     as more Partial pieces, without being buffered;
//   - the blank line that ends it is delivered in a final piece with
//     Oversized set and Partial false, carrying ID and Retry like a normal
//     event. An oversized event that is complete within one Feed is
//     delivered as that single final piece.
//
// So the parser never holds more than maxEventBytes+1 bytes of raw event
// data (plus the data, type and id buffers, each smaller than that), and a
// proxy forwards every piece's Raw and counts an oversized event on the
// piece with Oversized && !Partial. Which lines are interpreted, and whether
// an event is oversized, do not depend on how the input is split into Feed
// calls; only the cutting of an oversized event into Partial pieces does.
type Parser struct {
	max int

	// buf holds the raw bytes of the current event received in earlier
	// Feed calls (never used while skipping an oversized event).
	buf []byte
	// lineStart is the offset in buf of the current unterminated line;
	// len(buf) when no line is open.
	lineStart int
	// n is the size (see Parser) of the current event so far.
	n int

	skipLF   int  // lfNone, lfSameEvent or lfPrevEvent
	skipping bool // the current event is oversized
	// lineHasContent: while skipping, whether the open line has bytes.
	lineHasContent bool
	started        bool // the first line of the stream was seen (BOM check)

	data     []byte
	typ      []byte
	typStr   string // cached string(typ) of the last dispatched type
	lastID   []byte
	retry    int64
	hasRetry bool

	ev Event
}

// NewParser returns a parser that holds at most maxEventBytes of one event
// while assembling it (DefaultMaxEventBytes when maxEventBytes <= 0).
func NewParser(maxEventBytes int) *Parser {
	if maxEventBytes <= 0 {
		maxEventBytes = DefaultMaxEventBytes
	}
	return &Parser{max: maxEventBytes}
}

// Reset makes p ready for a new stream (forgetting pending bytes and the
// last event ID) and keeps its buffers.
func (p *Parser) Reset() {
	*p = Parser{
		max:    p.max,
		buf:    p.buf[:0],
		data:   p.data[:0],
		typ:    p.typ[:0],
		lastID: p.lastID[:0],
		typStr: p.typStr,
	}
}

// Pending returns the bytes of the event being assembled: bytes already fed
// that are not yet part of a delivered Event because no blank line has
// ended their event. At end of stream a proxy forwards them as they are
// (an EventSource discards an unterminated event). While an oversized event
// is being skipped its bytes are delivered as Partial pieces and Pending is
// empty. The slice is valid until the next call on p.
func (p *Parser) Pending() []byte { return p.buf }

// LastEventID returns the last event ID buffer (valid until the next Feed).
func (p *Parser) LastEventID() []byte { return p.lastID }

var bom = []byte("\xEF\xBB\xBF")

// Feed consumes b, one read from upstream, and calls fn for each event (or
// oversized-event piece) completed by it, in stream order. The Event and the
// slices in it are only valid during fn. Bytes of an incomplete event are
// kept (copied) for the next Feed; events wholly inside b are delivered with
// Raw aliasing b, without copying.
//
// If fn returns an error, Feed returns it at once: the rest of b is dropped
// and p must be Reset before it is used again.
func (p *Parser) Feed(b []byte, fn func(*Event) error) error {
	if len(b) == 0 {
		return nil
	}
	seg := 0       // b[seg:] is neither delivered nor copied into p.buf
	cnt0 := 0      // bytes of b before cnt0 do not count toward the event size
	carried := p.n // size of the current event from earlier Feeds
	ls := 0        // start in b of the current line; -1 if it began in p.buf
	if p.lineStart < len(p.buf) {
		ls = -1
	}
	i := 0
	if p.skipLF != lfNone {
		if b[0] == '\n' {
			i, ls = 1, 1
			if p.skipLF == lfPrevEvent {
				cnt0 = 1
			}
		}
		p.skipLF = lfNone
	}

	nl, cr := -2, -2 // cached positions of the next LF / CR at or after i; -1: none
	for {
		if nl != -1 && nl < i {
			if k := bytes.IndexByte(b[i:], '\n'); k >= 0 {
				nl = i + k
			} else {
				nl = -1
			}
		}
		if cr != -1 && cr < i {
			if k := bytes.IndexByte(b[i:], '\r'); k >= 0 {
				cr = i + k
			} else {
				cr = -1
			}
		}
		j := nl
		if cr >= 0 && (j < 0 || cr < j) {
			j = cr
		}
		if j < 0 {
			break
		}
		end := j + 1
		crAtEnd := false
		if b[j] == '\r' {
			if end < len(b) {
				if b[end] == '\n' {
					end++
				}
			} else {
				crAtEnd = true
			}
		}
		i = end

		if !p.skipping && carried+j+1-cnt0 > p.max {
			// The event passes the bound at this line: do not interpret it.
			lineLen := j - ls
			if ls < 0 {
				lineLen = len(p.buf) - p.lineStart + j
			}
			if err := p.startSkipping(lineLen > 0, fn); err != nil {
				return err
			}
			ls = j
		}

		if p.skipping {
			p.started = true
			blank := !p.lineHasContent && j == ls
			p.lineHasContent = false
			ls = end
			if !blank {
				if crAtEnd {
					p.skipLF = lfSameEvent
				}
				continue
			}
			p.skipping = false
			ev := &p.ev
			*ev = Event{Raw: b[seg:end], Oversized: true, Retry: p.retry, HasRetry: p.hasRetry}
			if len(p.lastID) > 0 {
				ev.ID = p.lastID
			}
			seg, cnt0, carried = end, end, 0
			p.retry, p.hasRetry = 0, false
			if crAtEnd {
				p.skipLF = lfPrevEvent
			}
			if err := fn(ev); err != nil {
				return err
			}
			continue
		}

		// Normal mode.
		if len(p.buf) > 0 {
			p.buf = append(p.buf, b[seg:end]...)
			seg = end
		}
		var line []byte
		if ls < 0 {
			line = p.buf[p.lineStart : len(p.buf)-(end-j)]
		} else {
			line = b[ls:j]
		}
		ls = end
		p.lineStart = len(p.buf)
		if !p.started {
			p.started = true
			line = bytes.TrimPrefix(line, bom)
		}
		if len(line) > 0 {
			p.processLine(line)
			if crAtEnd {
				p.skipLF = lfSameEvent
			}
			continue
		}

		// Blank line: dispatch.
		ev := &p.ev
		*ev = Event{Retry: p.retry, HasRetry: p.hasRetry}
		if len(p.buf) > 0 {
			ev.Raw = p.buf
		} else {
			ev.Raw = b[seg:end]
			seg = end
		}
		if len(p.data) > 0 {
			ev.HasData = true
			ev.Data = p.data[:len(p.data)-1]
		}
		if len(p.typ) > 0 {
			if string(p.typ) != p.typStr {
				p.typStr = string(p.typ)
			}
			ev.Type = p.typStr
		}
		if len(p.lastID) > 0 {
			ev.ID = p.lastID
		}
		// Reset the event state; the backing arrays are not written before
		// fn returns.
		p.buf, p.lineStart = p.buf[:0], 0
		p.data, p.typ = p.data[:0], p.typ[:0]
		p.retry, p.hasRetry = 0, false
		cnt0, carried = end, 0
		if crAtEnd {
			p.skipLF = lfPrevEvent
		}
		if err := fn(ev); err != nil {
			return err
		}
	}

	// No line end in b[i:]: the rest of b belongs to the current event.
	if !p.skipping {
		size := carried + len(b) - cnt0
		if size <= p.max {
			if ls >= 0 {
				p.lineStart = len(p.buf) + ls - seg
			}
			p.buf = append(p.buf, b[seg:]...)
			p.n = size
			return nil
		}
		lineLen := len(b) - ls
		if ls < 0 {
			lineLen = len(p.buf) - p.lineStart + len(b)
		}
		if err := p.startSkipping(lineLen > 0, fn); err != nil {
			return err
		}
		ls = len(b) // lineHasContent already describes the open line
	}
	if ls < len(b) {
		p.lineHasContent = true
	}
	if seg < len(b) {
		ev := &p.ev
		*ev = Event{Raw: b[seg:], Oversized: true, Partial: true}
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

// startSkipping turns the current event into an oversized one, delivering
// the bytes held in p.buf as a Partial piece.
func (p *Parser) startSkipping(lineHasContent bool, fn func(*Event) error) error {
	p.skipping = true
	p.lineHasContent = lineHasContent
	p.data, p.typ = p.data[:0], p.typ[:0]
	p.n = 0
	if len(p.buf) == 0 {
		p.lineStart = 0
		return nil
	}
	ev := &p.ev
	*ev = Event{Raw: p.buf, Oversized: true, Partial: true}
	p.buf, p.lineStart = p.buf[:0], 0
	return fn(ev)
}

func (p *Parser) processLine(line []byte) {
	if line[0] == ':' {
		return
	}
	name, value := line, []byte(nil)
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		name, value = line[:c], line[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) {
	case "data":
		p.data = append(p.data, value...)
		p.data = append(p.data, '\n')
	case "event":
		p.typ = append(p.typ[:0], value...)
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			p.lastID = append(p.lastID[:0], value...)
		}
	case "retry":
		if v, ok := parseDigits(value); ok {
			p.retry, p.hasRetry = v, true
		}
	}
}

func parseDigits(v []byte) (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}
