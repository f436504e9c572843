// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenparse

import (
	"bytes"
	"strconv"

	"github.com/otelcol-llm/otelcol-llm/internal/swar"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// LineError is a FieldError with the 1-based line number of an NDJSON batch.
type LineError struct {
	Line int
	tokenevent.FieldError
	// Unread is, for the error that cuts a batch at its line limit, the
	// number of non-blank lines after Line that were not read either; the
	// error stands for 1+Unread lines. 0 for any other error.
	Unread int
}

func (e *LineError) Error() string {
	return "line " + strconv.Itoa(e.Line) + ": " + e.FieldError.Error()
}

// maxInterned and maxInternedBytes bound the parser's table of repeated
// strings (session IDs, models, engines) in entries and in bytes; when
// either is reached it is cleared and refilled. Each string is bounded too
// (the line's limits, tokenevent's value bounds): the bytes bound holds
// when max_session_id_bytes is raised far.
const (
	maxInterned      = 8192
	maxInternedBytes = 1 << 20
)

// Parser parses NDJSON token event lines. It is not safe for concurrent use;
// keep one per goroutine (or in a sync.Pool).
//
// Steady-state token lines parse without allocating: the session ID of a
// session already seen is looked up in an intern table instead of copied.
type Parser struct {
	limits   tokenevent.Limits
	scratch  []byte
	interned map[string]string
	// internedBytes is the length of the strings in interned.
	internedBytes int
	// recent caches interned strings by IDSlot, in front of interned: a
	// hit costs a few loads and one comparison instead of the map's hash
	// and probe, and with a few hundred sessions in flight nearly every
	// token line hits.
	recent [swar.IDSlots]string

	// cursor over the current line
	b []byte
	i int

	batchEvent tokenevent.Event

	// lineCuts counts the values of the line being parsed cut to their
	// bound (tokenevent.CutValue); cuts those of the lines ParseBatch
	// took, until TakeCuts.
	lineCuts, cuts int
}

// NewParser returns a Parser enforcing limits.
func NewParser(limits tokenevent.Limits) *Parser {
	return &Parser{limits: limits.WithDefaults(), interned: make(map[string]string, 256)}
}

// TakeCuts returns how many values of the lines ParseBatch took were cut to
// their bound (tokenevent.CutValues' fields) since the last call.
func (p *Parser) TakeCuts() int {
	n := p.cuts
	p.cuts = 0
	return n
}

// countLines counts the non-blank lines of body.
func countLines(body []byte) int {
	n := 0
	for len(body) > 0 {
		var line []byte
		if j := bytes.IndexByte(body, '\n'); j >= 0 {
			line, body = body[:j], body[j+1:]
		} else {
			line, body = body, nil
		}
		if len(trimSpace(line)) > 0 {
			n++
		}
	}
	return n
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// internValue interns b cut to limit bytes, counting the cut.
func (p *Parser) internValue(b []byte, limit int) string {
	b, cut := tokenevent.CutValue(b, limit)
	if cut {
		p.lineCuts++
	}
	return p.intern(b)
}

// intern returns b as a string, reusing the string of an earlier equal value.
func (p *Parser) intern(b []byte) string {
	slot := &p.recent[swar.IDSlot(b)]
	if *slot == string(b) {
		return *slot
	}
	s, ok := p.interned[string(b)]
	if !ok {
		if len(p.interned) >= maxInterned || p.internedBytes+len(b) > maxInternedBytes {
			clear(p.interned)
			p.internedBytes = 0
		}
		s = string(b)
		p.interned[s] = s
		p.internedBytes += len(s)
	}
	*slot = s
	return s
}
