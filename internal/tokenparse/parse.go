// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package tokenparse is the collector's reader of the token event wire
// schema (pkg/tokenevent): NDJSON lines and batches parsed into Events, held
// to the schema's rules and limits, with each rejected line's number, field
// and reason.
package tokenparse // import "github.com/otelcol-llm/otelcol-llm/internal/tokenparse"

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// Parse parses one line (without its newline) into ev, which it resets first.
// The error, if any, is a *FieldError.
func (p *Parser) Parse(line []byte, ev *tokenevent.Event) error {
	p.lineCuts = 0
	if len(line) > p.limits.MaxLineBytes {
		ev.Reset()
		return &tokenevent.FieldError{Reason: fmt.Sprintf("line is %d bytes, limit is %d", len(line), p.limits.MaxLineBytes)}
	}
	if p.parseCompact(line, ev) {
		return nil
	}
	p.lineCuts = 0 // what the compact path cut before it gave up
	return p.parseObject(line, ev)
}

// parseObject is the general parser: any valid JSON object, any key order.
func (p *Parser) parseObject(line []byte, ev *tokenevent.Event) error {
	ev.Reset()
	p.b, p.i = line, 0
	seen, err := p.object(ev)
	p.b = nil
	if err != nil {
		return err
	}
	return validate(seen, ev)
}

// ParseBatch parses an NDJSON body line by line. It calls onEvent for each
// valid line and onError for each invalid one; blank lines are skipped but
// counted, so line numbers match the body. Lines after the first maxLines
// non-blank ones are not read (maxLines <= 0: no limit): one error, at the
// first of them, stands for them all (its Unread counts the others). The Event passed to
// onEvent is reused: copy what must outlive the call.
func (p *Parser) ParseBatch(body []byte, maxLines int, onEvent func(*tokenevent.Event), onError func(*LineError)) {
	ev := &p.batchEvent
	lineNo, taken := 0, 0
	for len(body) > 0 {
		var line []byte
		if j := bytes.IndexByte(body, '\n'); j >= 0 {
			line, body = body[:j], body[j+1:]
		} else {
			line, body = body, nil
		}
		lineNo++
		line = trimSpace(line)
		if len(line) == 0 {
			continue
		}
		if maxLines > 0 && taken >= maxLines {
			// One error for the rest: an abusive body of millions of lines
			// costs one count of its newlines, not an error per line.
			unread := countLines(body)
			onError(&LineError{Line: lineNo, Unread: unread, FieldError: tokenevent.FieldError{
				Reason: fmt.Sprintf("batch holds more than %d lines: this line and the %d after it not read", maxLines, unread),
			}})
			return
		}
		taken++
		if err := p.Parse(line, ev); err != nil {
			var fe *tokenevent.FieldError
			errors.As(err, &fe) // Parse's errors are all *FieldError
			onError(&LineError{Line: lineNo, FieldError: *fe})
			continue
		}
		p.cuts += p.lineCuts
		onEvent(ev)
	}
}
