// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenparse // import "github.com/otelcol-llm/otelcol-llm/internal/tokenparse"

import (
	"bytes"
	"encoding/binary"
	"math"

	"github.com/otelcol-llm/otelcol-llm/internal/swar"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// The compact paths read the lines every hook client writes: AppendJSON's
// field order and compact form (the Go client's encoder; the Python client
// writes the same), with plain-ASCII strings. Each reports false, leaving
// the line to the general parser, for anything else, including every
// invalid line and every field it does not read (attributes, "stream":
// true), so that what it takes the general parser takes the same way
// (FuzzParse checks it). A session's start and end lines are as many as
// its token lines in a short session: this keeps them off the general
// parser's key dispatch and per-field checks.

// parseCompact parses line by the compact path of its kind, if it has one.
func (p *Parser) parseCompact(line []byte, ev *tokenevent.Event) bool {
	if len(line) < len(compactStartPrefix) {
		return false
	}
	// `{"event":"` then the kind's first letter decides.
	switch line[len(`{"event":"`)] {
	case 't':
		return p.parseCompactToken(line, ev)
	case 's':
		return p.parseCompactStart(line, ev)
	case 'e':
		return p.parseCompactEnd(line, ev)
	}
	return false
}

var (
	compactStartPrefix = []byte(`{"event":"start","session_id":"`)
	compactEndPrefix   = []byte(`{"event":"end","session_id":"`)
)

// Keys of the optional fields, in AppendJSON's order, each with the comma
// before it and the colon after.
var (
	keyTraceID      = []byte(`,"trace_id":"`)
	keySpanID       = []byte(`,"span_id":"`)
	keyParentSpanID = []byte(`,"parent_span_id":"`)
	keyModel        = []byte(`,"model":"`)
	keyOperation    = []byte(`,"operation":"`)
	keyPromptTokens = []byte(`,"prompt_tokens":`)
	keyEngine       = []byte(`,"engine":"`)
	keyNoStream     = []byte(`,"stream":false`)
	keyTraceState   = []byte(`,"tracestate":"`)

	keyCompletionTokens = []byte(`,"completion_tokens":`)
	keyFinishReason     = []byte(`,"finish_reason":"`)
	keyError            = []byte(`,"error":"`)
	keyResponseModel    = []byte(`,"response_model":"`)
	keyQueueTime        = []byte(`,"queue_time_ns":`)
	keyPrefillTime      = []byte(`,"prefill_time_ns":`)
	keyDecodeTime       = []byte(`,"decode_time_ns":`)
)

// compactCursor reads a line of the compact form; ok turns false at the
// first thing it cannot read, and every read after it is a no-op.
type compactCursor struct {
	line []byte
	k    int
	ok   bool
}

// has steps past key if the line goes on with it.
func (c *compactCursor) has(key []byte) bool {
	if c.ok && bytes.HasPrefix(c.line[c.k:], key) {
		c.k += len(key)
		return true
	}
	return false
}

// plain reads a string's plain-ASCII content up to its closing quote (the
// opening one is the key's) and steps past the quote.
func (c *compactCursor) plain() []byte {
	i := plainEnd(c.line, c.k)
	if i >= len(c.line) || c.line[i] != '"' {
		c.ok = false
		return nil
	}
	s := c.line[c.k:i]
	c.k = i + 1
	return s
}

// uint reads a non-negative integer that fits an int64.
func (c *compactCursor) uint() uint64 {
	v, next, ok := compactUint(c.line, c.k)
	c.ok = c.ok && ok
	c.k = next
	return v
}

// hex reads a string of exactly 2*len(dst) hex digits, not all zeros, into
// dst.
func (c *compactCursor) hex(dst []byte) {
	s := c.plain()
	if !c.ok || len(s) != 2*len(dst) {
		c.ok = false
		return
	}
	var nonZero byte
	for i := range dst {
		hi, lo := unhex(s[2*i]), unhex(s[2*i+1])
		if hi < 0 || lo < 0 {
			c.ok = false
			return
		}
		dst[i] = byte(hi<<4 | lo)
		nonZero |= dst[i]
	}
	c.ok = nonZero != 0
}

// end reports whether the line ends here, with the object.
func (c *compactCursor) end() bool { return c.ok && c.k == len(c.line)-1 && c.line[c.k] == '}' }

// common reads the session ID and time after prefix into ev, which it
// resets first.
func (p *Parser) common(line, prefix []byte, kind tokenevent.Kind, ev *tokenevent.Event) compactCursor {
	c := compactCursor{line: line, k: len(prefix), ok: bytes.HasPrefix(line, prefix)}
	if !c.ok {
		return c
	}
	sid := c.plain()
	if !c.ok || len(sid) == 0 || len(sid) > p.limits.MaxSessionIDBytes || !c.has(compactTokenTime[1:]) {
		c.ok = false
		return c
	}
	t := c.uint()
	if !c.ok || t == 0 {
		c.ok = false
		return c
	}
	ev.Reset()
	ev.Kind, ev.SessionID, ev.TimeUnixNano = kind, p.intern(sid), t
	return c
}

// parseCompactStart is the compact path of a start line.
func (p *Parser) parseCompactStart(line []byte, ev *tokenevent.Event) bool {
	c := p.common(line, compactStartPrefix, tokenevent.KindStart, ev)
	if c.has(keyTraceID) {
		c.hex(ev.TraceID[:])
	}
	if c.has(keySpanID) {
		c.hex(ev.SpanID[:])
	}
	if c.has(keyParentSpanID) {
		c.hex(ev.ParentSpanID[:])
	}
	if c.has(keyModel) {
		ev.Model = p.internValue(c.plain(), tokenevent.MaxValueBytes)
	}
	if c.has(keyOperation) {
		op, err := tokenevent.CheckOperation(c.plain())
		c.ok = c.ok && err == nil
		ev.Operation = op
	}
	if c.has(keyPromptTokens) {
		ev.PromptTokens = int64(c.uint())
	}
	if c.has(keyEngine) {
		ev.Engine = p.internValue(c.plain(), tokenevent.MaxValueBytes)
	}
	ev.NoStream = c.has(keyNoStream)
	if c.has(keyTraceState) {
		ts := c.plain()
		c.ok = c.ok && tokenevent.CheckTraceState(ts) == nil
		ev.TraceState = p.intern(ts)
	}
	return c.end()
}

// parseCompactEnd is the compact path of an end line.
func (p *Parser) parseCompactEnd(line []byte, ev *tokenevent.Event) bool {
	c := p.common(line, compactEndPrefix, tokenevent.KindEnd, ev)
	if c.has(keyCompletionTokens) {
		ev.CompletionTokens = int64(c.uint())
	}
	if c.has(keyFinishReason) {
		ev.FinishReason = p.internValue(c.plain(), tokenevent.MaxValueBytes)
	}
	if c.has(keyError) {
		ev.Error = p.internValue(c.plain(), tokenevent.MaxErrorTypeBytes)
	}
	if c.has(keyResponseModel) {
		ev.ResponseModel = p.internValue(c.plain(), tokenevent.MaxValueBytes)
	}
	for _, t := range [...]struct {
		key []byte
		dst *int64
	}{{keyQueueTime, &ev.QueueTimeNs}, {keyPrefillTime, &ev.PrefillTimeNs}, {keyDecodeTime, &ev.DecodeTimeNs}} {
		if c.has(t.key) {
			*t.dst = int64(c.uint())
			ev.TimingSource = tokenevent.TimingHook
		}
	}
	return c.end()
}

var (
	compactTokenPrefix = []byte(`{"event":"token","session_id":"`)
	compactTokenTime   = []byte(`","time_unix_nano":`)
	compactTokenCount  = []byte(`,"count":`)
	compactTokenSeq    = []byte(`,"seq":`)

	// The words of compactTokenPrefix (31 bytes) and compactTokenTime (19),
	// the last of each overlapping the one before.
	tokenPrefixWords = [4]uint64{
		binary.LittleEndian.Uint64(compactTokenPrefix[0:]), binary.LittleEndian.Uint64(compactTokenPrefix[8:]),
		binary.LittleEndian.Uint64(compactTokenPrefix[16:]), binary.LittleEndian.Uint64(compactTokenPrefix[23:]),
	}
	tokenTimeWords = [3]uint64{
		binary.LittleEndian.Uint64(compactTokenTime[0:]), binary.LittleEndian.Uint64(compactTokenTime[8:]),
		binary.LittleEndian.Uint64(compactTokenTime[11:]),
	}
)

// hasTokenPrefix is bytes.HasPrefix(line, compactTokenPrefix) by words,
// inline: every token line is matched against it, and memequal's call
// cost more than the compare.
func hasTokenPrefix(line []byte) bool {
	return len(line) >= 31 && binary.LittleEndian.Uint64(line[0:8]) == tokenPrefixWords[0] &&
		binary.LittleEndian.Uint64(line[8:16]) == tokenPrefixWords[1] &&
		binary.LittleEndian.Uint64(line[16:24]) == tokenPrefixWords[2] &&
		binary.LittleEndian.Uint64(line[23:31]) == tokenPrefixWords[3]
}

// hasTokenTime is bytes.HasPrefix(b, compactTokenTime), as hasTokenPrefix.
func hasTokenTime(b []byte) bool {
	return len(b) >= 19 && binary.LittleEndian.Uint64(b[0:8]) == tokenTimeWords[0] &&
		binary.LittleEndian.Uint64(b[8:16]) == tokenTimeWords[1] &&
		binary.LittleEndian.Uint64(b[11:19]) == tokenTimeWords[2]
}

// parseCompactToken is the fast path for the line every hook client sends
// most: a token event in the field order and compact form of AppendJSON,
// with a plain-ASCII session ID. It reports false, leaving ev to the
// general parser, for anything else, including every invalid line; so the
// two paths cannot disagree on what they both accept (FuzzParse checks it).
func (p *Parser) parseCompactToken(line []byte, ev *tokenevent.Event) bool {
	if !hasTokenPrefix(line) {
		return false
	}
	i := len(compactTokenPrefix)
	j := plainEnd(line, i)
	if j == i || j-i > p.limits.MaxSessionIDBytes || !hasTokenTime(line[j:]) {
		return false
	}
	sid := line[i:j]
	k := j + len(compactTokenTime)
	t, k, ok := compactUint(line, k)
	if !ok || t == 0 {
		return false
	}
	count := uint64(1)
	if bytes.HasPrefix(line[k:], compactTokenCount) {
		if count, k, ok = compactUint(line, k+len(compactTokenCount)); !ok || count == 0 || count > tokenevent.MaxCount {
			return false
		}
	}
	var seq uint64
	hasSeq := bytes.HasPrefix(line[k:], compactTokenSeq)
	if hasSeq {
		if seq, k, ok = compactUint(line, k+len(compactTokenSeq)); !ok {
			return false
		}
	}
	if k != len(line)-1 || line[k] != '}' {
		return false
	}
	// Copied from a template, then the line's fields set: a composite
	// literal here was built in a temporary and then copied, the Event
	// (over 300 bytes) written twice per token line.
	attrs := ev.Attributes[:0]
	*ev = compactTokenEvent
	ev.SessionID, ev.TimeUnixNano, ev.Count, ev.Seq, ev.HasSeq = p.intern(sid), t, int64(count), seq, hasSeq
	ev.Attributes = attrs
	return true
}

// compactTokenEvent is what parseCompactToken writes before a line's own
// fields: a token event's defaults.
var compactTokenEvent = tokenevent.Event{
	Kind: tokenevent.KindToken, PromptTokens: -1, CompletionTokens: -1, QueueTimeNs: -1, PrefillTimeNs: -1, DecodeTimeNs: -1,
}

// compactUint reads 1 to 19 digits without a leading zero from line[i:],
// fitting an int64 (19 digits cannot overflow the uint64 it sums in);
// anything else is left to the general parser.
func compactUint(line []byte, i int) (v uint64, next int, ok bool) {
	if i+19 <= len(line) {
		// A time_unix_nano (every line has one) is 19 digits: three
		// overlapping words, the third's last three digits.
		x, y, z := binary.LittleEndian.Uint64(line[i:]), binary.LittleEndian.Uint64(line[i+8:]), binary.LittleEndian.Uint64(line[i+11:])
		if swar.EightDigits(x) && swar.EightDigits(y) && swar.EightDigits(z) {
			v = swar.EightDigitsValue(x)*100_000_000_000 + swar.EightDigitsValue(y)*1000 +
				(z>>40&0xF)*100 + (z>>48&0xF)*10 + z>>56&0xF
			if line[i] == '0' || v > math.MaxInt64 {
				return 0, i + 19, false
			}
			return v, i + 19, true
		}
	}
	start := i
	// Eight digits at a time while there are: a time_unix_nano has 19, and
	// reading it a digit at a time was a tenth of the path's cost.
	for i+8 <= len(line) && i-start <= 19-8 {
		x := binary.LittleEndian.Uint64(line[i:])
		if !swar.EightDigits(x) {
			break
		}
		v = v*100_000_000 + swar.EightDigitsValue(x)
		i += 8
	}
	for i < len(line) && i-start < 19 {
		c := line[i] - '0'
		if c > 9 {
			break
		}
		v = v*10 + uint64(c)
		i++
	}
	if i == start || (line[start] == '0' && i-start > 1) || v > math.MaxInt64 {
		return 0, i, false
	}
	return v, i, true
}
