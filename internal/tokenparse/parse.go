// Package tokenparse is the collector's reader of the token event wire
// schema (pkg/tokenevent): NDJSON lines and batches parsed into Events, held
// to the schema's rules and limits, with each rejected line's number, field
// and reason.
package tokenparse // import "github.com/otelcol-llm/otelcol-llm/internal/tokenparse"

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf8"

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

// Bits of the fields a line carried; used for duplicate detection and for
// checking which fields a kind allows.
const (
	fEvent uint32 = 1 << iota
	fSessionID
	fTime
	fTraceID
	fSpanID
	fParentSpanID
	fModel
	fOperation
	fPromptTokens
	fEngine
	fAttributes
	fCount
	fCompletionTokens
	fFinishReason
	fError
	fStream
	fTraceState
	fSeq
	fResponseModel
	fQueueTime
	fPrefillTime
	fDecodeTime
	fEnginePrefill
	fEngineDecode
	fEnergy
)

var fieldNames = [...]string{
	"event", "session_id", "time_unix_nano", "trace_id", "span_id", "parent_span_id", "model", "operation",
	"prompt_tokens", "engine", "attributes", "count", "completion_tokens", "finish_reason", "error",
	"stream", "tracestate", "seq", "response_model", "queue_time_ns", "prefill_time_ns", "decode_time_ns",
	"engine_time_prefill_ns", "engine_time_decode_ns", "energy_mj",
}

const (
	fCommon  = fEvent | fSessionID | fTime
	allowedS = fCommon | fTraceID | fSpanID | fParentSpanID | fModel | fOperation | fPromptTokens | fEngine |
		fAttributes | fStream | fTraceState
	allowedT = fCommon | fCount | fSeq
	allowedE = fCommon | fCompletionTokens | fFinishReason | fError | fResponseModel | fQueueTime | fPrefillTime |
		fDecodeTime | fEnginePrefill | fEngineDecode | fEnergy
)

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

var (
	compactTokenPrefix = []byte(`{"event":"token","session_id":"`)
	compactTokenTime   = []byte(`","time_unix_nano":`)
	compactTokenCount  = []byte(`,"count":`)
	compactTokenSeq    = []byte(`,"seq":`)
)

// parseCompactToken is the fast path for the line every hook client sends
// most: a token event in the field order and compact form of AppendJSON,
// with a plain-ASCII session ID. It reports false, leaving ev to the
// general parser, for anything else, including every invalid line; so the
// two paths cannot disagree on what they both accept (FuzzParse checks it).
func (p *Parser) parseCompactToken(line []byte, ev *tokenevent.Event) bool {
	if !bytes.HasPrefix(line, compactTokenPrefix) {
		return false
	}
	i := len(compactTokenPrefix)
	j := plainEnd(line, i)
	if j == i || j-i > p.limits.MaxSessionIDBytes || !bytes.HasPrefix(line[j:], compactTokenTime) {
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

func validate(seen uint32, ev *tokenevent.Event) error {
	if seen&fEvent == 0 {
		return &tokenevent.FieldError{Field: "event", Reason: "missing"}
	}
	if seen&fSessionID == 0 {
		return &tokenevent.FieldError{Field: "session_id", Reason: "missing"}
	}
	if seen&fTime == 0 {
		return &tokenevent.FieldError{Field: "time_unix_nano", Reason: "missing"}
	}
	allowed := allowedS
	switch ev.Kind {
	case tokenevent.KindToken:
		allowed = allowedT
	case tokenevent.KindEnd:
		allowed = allowedE
	}
	if extra := seen &^ allowed; extra != 0 {
		for i, name := range fieldNames {
			if extra&(1<<i) != 0 {
				return &tokenevent.FieldError{Field: name, Reason: "not allowed on a " + ev.Kind.String() + " event"}
			}
		}
	}
	return nil
}

func (p *Parser) syntax(want string) error {
	if p.i >= len(p.b) {
		return &tokenevent.FieldError{Reason: "invalid JSON: want " + want + ", got end of line"}
	}
	return &tokenevent.FieldError{Reason: fmt.Sprintf("invalid JSON at byte %d: want %s, got %q", p.i+1, want, p.b[p.i])}
}

func (p *Parser) skipSpace() {
	// Compact JSON has no spaces: one comparison decides the common case.
	for p.i < len(p.b) && p.b[p.i] <= ' ' && isSpace(p.b[p.i]) {
		p.i++
	}
}

// object parses the top-level object into ev and returns the fields seen.
func (p *Parser) object(ev *tokenevent.Event) (uint32, error) {
	p.skipSpace()
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return 0, p.syntax("'{'")
	}
	p.i++
	var seen uint32
	for first := true; ; first = false {
		key, done, err := p.member(first, "")
		if err != nil {
			return 0, err
		}
		if done {
			break
		}
		bit, ok := fieldBit(key)
		if !ok {
			// A line that is not JSON at all is reported as such, not as
			// a schema error about the part read before the syntax broke.
			unknown := &tokenevent.FieldError{Field: tokenevent.Excerpt(key), Reason: "unknown field"}
			if err := p.skipRest(); err != nil {
				return 0, err
			}
			return 0, unknown
		}
		if seen&bit != 0 {
			return 0, &tokenevent.FieldError{Field: fieldName(bit), Reason: "duplicate field"}
		}
		present, err := p.value(bit, ev)
		if err != nil {
			return 0, err
		}
		if present {
			seen |= bit
		}
	}
	return seen, p.end()
}

// end checks that nothing but spaces follows the object.
func (p *Parser) end() error {
	p.skipSpace()
	if p.i != len(p.b) {
		return &tokenevent.FieldError{Reason: fmt.Sprintf("invalid JSON at byte %d: data after the object", p.i+1)}
	}
	return nil
}

// member steps to the next member of the object whose '{' has been read:
// past the ',' before it unless first, its key and its ':'. It reports
// done, with the cursor after the '}', at the end of the object. field
// names the object for errors about a key that is not a string; empty
// means the top-level object. The key is valid until the next read.
func (p *Parser) member(first bool, field string) (key []byte, done bool, err error) {
	if done, err = p.next(first, '}'); done || err != nil {
		return nil, done, err
	}
	if key, err = p.str(field); err != nil {
		return nil, false, err
	}
	p.skipSpace()
	if p.i >= len(p.b) || p.b[p.i] != ':' {
		return nil, false, p.syntax("':'")
	}
	p.i++
	p.skipSpace()
	return key, false, nil
}

// next steps to the next entry of an object or array closed by end: past
// the ',' before it unless first. It reports done, with the cursor after
// end, when there is none.
func (p *Parser) next(first bool, end byte) (done bool, err error) {
	p.skipSpace()
	if p.i < len(p.b) && p.b[p.i] == end {
		p.i++
		return true, nil
	}
	if !first {
		if p.i >= len(p.b) || p.b[p.i] != ',' {
			return false, p.syntax("',' or '" + string(end) + "'")
		}
		p.i++
		p.skipSpace()
	}
	return false, nil
}

// skipRest checks the syntax of the rest of the top-level object, from the
// value of a member on: the values, the members after it, the end.
func (p *Parser) skipRest() error {
	for first := true; ; first = false {
		if !first {
			_, done, err := p.member(false, "")
			if err != nil {
				return err
			}
			if done {
				return p.end()
			}
		}
		if err := p.skipValue(0); err != nil {
			return err
		}
	}
}

// maxSkipDepth bounds the nesting skipValue follows, and with it its stack.
const maxSkipDepth = 64

// skipValue checks the syntax of any JSON value at the cursor and steps
// past it.
func (p *Parser) skipValue(depth int) error {
	if p.i >= len(p.b) {
		return p.syntax("a value")
	}
	switch c := p.b[p.i]; c {
	case '"':
		_, err := p.str("")
		return err
	case '{', '[':
		if depth >= maxSkipDepth {
			return &tokenevent.FieldError{Reason: fmt.Sprintf("invalid JSON at byte %d: nested deeper than %d", p.i+1, maxSkipDepth)}
		}
		p.i++
		if c == '{' {
			for first := true; ; first = false {
				_, done, err := p.member(first, "")
				if err != nil || done {
					return err
				}
				if err := p.skipValue(depth + 1); err != nil {
					return err
				}
			}
		}
		for first := true; ; first = false {
			if done, err := p.next(first, ']'); done || err != nil {
				return err
			}
			if err := p.skipValue(depth + 1); err != nil {
				return err
			}
		}
	case 't', 'f', 'n':
		for _, lit := range [...]string{"true", "false", "null"} {
			if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit {
				p.i += len(lit)
				return nil
			}
		}
		return p.syntax("a value")
	default:
		return p.number()
	}
}

// number checks the syntax of a JSON number at the cursor and steps past
// it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *Parser) number() error {
	b, i := p.b, p.i
	digits := func() int {
		start := i
		for i < len(b) && b[i]-'0' <= 9 {
			i++
		}
		return i - start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch n := digits(); {
	case n == 0:
		p.i = i
		return p.syntax("a value")
	case n > 1 && b[i-n] == '0':
		return &tokenevent.FieldError{Reason: fmt.Sprintf("invalid JSON at byte %d: number with a leading zero", i-n+1)}
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			p.i = i
			return p.syntax("a digit")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			p.i = i
			return p.syntax("a digit")
		}
	}
	p.i = i
	return nil
}

// fieldBit returns the bit of the field named key, or false for an unknown
// field.
func fieldBit(key []byte) (uint32, bool) {
	// A switch on string(key) compiles to a comparison without allocating.
	switch string(key) {
	case "event":
		return fEvent, true
	case "session_id":
		return fSessionID, true
	case "time_unix_nano":
		return fTime, true
	case "count":
		return fCount, true
	case "trace_id":
		return fTraceID, true
	case "span_id":
		return fSpanID, true
	case "parent_span_id":
		return fParentSpanID, true
	case "model":
		return fModel, true
	case "operation":
		return fOperation, true
	case "prompt_tokens":
		return fPromptTokens, true
	case "engine":
		return fEngine, true
	case "attributes":
		return fAttributes, true
	case "completion_tokens":
		return fCompletionTokens, true
	case "finish_reason":
		return fFinishReason, true
	case "error":
		return fError, true
	case "stream":
		return fStream, true
	case "tracestate":
		return fTraceState, true
	case "seq":
		return fSeq, true
	case "response_model":
		return fResponseModel, true
	case "queue_time_ns":
		return fQueueTime, true
	case "prefill_time_ns":
		return fPrefillTime, true
	case "decode_time_ns":
		return fDecodeTime, true
	case "engine_time_prefill_ns":
		return fEnginePrefill, true
	case "engine_time_decode_ns":
		return fEngineDecode, true
	case "energy_mj":
		return fEnergy, true
	}
	return 0, false
}

func fieldName(bit uint32) string { return fieldNames[bits.TrailingZeros32(bit)] }

// value parses the value of one field. It reports false for an optional
// field given as null, which counts as absent.
func (p *Parser) value(bit uint32, ev *tokenevent.Event) (bool, error) {
	name := fieldName(bit)
	if p.null() {
		switch bit {
		case fEvent, fSessionID, fTime:
			return false, &tokenevent.FieldError{Field: name, Reason: "must not be null"}
		}
		return false, nil
	}
	switch bit {
	case fEvent:
		s, err := p.str(name)
		if err != nil {
			return false, err
		}
		switch string(s) {
		case "start":
			ev.Kind = tokenevent.KindStart
		case "token":
			ev.Kind = tokenevent.KindToken
		case "end":
			ev.Kind = tokenevent.KindEnd
		default:
			return false, &tokenevent.FieldError{Field: name, Reason: fmt.Sprintf("want start, token or end, got %q", tokenevent.Excerpt(s))}
		}
	case fSessionID:
		s, err := p.str(name)
		if err != nil {
			return false, err
		}
		if err := tokenevent.CheckSessionID(s, p.limits.MaxSessionIDBytes); err != nil {
			return false, err
		}
		ev.SessionID = p.intern(s)
	case fTime:
		v, err := p.uint(name)
		if err != nil {
			return false, err
		}
		if err := tokenevent.CheckTime(v); err != nil {
			return false, err
		}
		ev.TimeUnixNano = v
	case fCount:
		v, err := p.uint(name)
		if err != nil {
			return false, err
		}
		if err := tokenevent.CheckCount(int64(v)); err != nil {
			return false, err
		}
		ev.Count = int64(v)
	case fSeq:
		v, err := p.uint(name)
		ev.Seq, ev.HasSeq = v, err == nil
		return true, err
	case fStream:
		switch {
		case p.literal("true"):
		case p.literal("false"):
			ev.NoStream = true
		default:
			return false, &tokenevent.FieldError{Field: name, Reason: "want true or false"}
		}
	case fTraceState:
		s, err := p.str(name)
		if err != nil {
			return false, err
		}
		if err := tokenevent.CheckTraceState(s); err != nil {
			return false, err
		}
		ev.TraceState = p.intern(s)
	case fPromptTokens:
		v, err := p.uint(name)
		ev.PromptTokens = int64(v)
		return true, err
	case fCompletionTokens:
		v, err := p.uint(name)
		ev.CompletionTokens = int64(v)
		return true, err
	case fQueueTime, fPrefillTime, fDecodeTime:
		v, err := p.uint(name)
		switch bit {
		case fQueueTime:
			ev.QueueTimeNs = int64(v)
		case fPrefillTime:
			ev.PrefillTimeNs = int64(v)
		default:
			ev.DecodeTimeNs = int64(v)
		}
		ev.TimingSource = tokenevent.TimingHook
		return true, err
	case fEnginePrefill, fEngineDecode, fEnergy:
		v, err := p.uint(name)
		switch bit {
		case fEnginePrefill:
			ev.EngineTimePrefillNs, ev.HasEngineTime = int64(v), true
		case fEngineDecode:
			ev.EngineTimeDecodeNs, ev.HasEngineTime = int64(v), true
		default:
			ev.EnergyMilliJ, ev.HasEnergy = int64(v), true
		}
		return true, err
	case fResponseModel:
		return true, p.valueStr(name, &ev.ResponseModel, tokenevent.MaxValueBytes)
	case fTraceID:
		return true, p.hex(name, ev.TraceID[:])
	case fSpanID:
		return true, p.hex(name, ev.SpanID[:])
	case fParentSpanID:
		return true, p.hex(name, ev.ParentSpanID[:])
	case fOperation:
		s, err := p.str(name)
		if err != nil {
			return false, err
		}
		op, ferr := tokenevent.CheckOperation(s)
		if ferr != nil {
			return false, ferr
		}
		ev.Operation = op
	case fModel:
		return true, p.valueStr(name, &ev.Model, tokenevent.MaxValueBytes)
	case fEngine:
		return true, p.valueStr(name, &ev.Engine, tokenevent.MaxValueBytes)
	case fFinishReason:
		return true, p.valueStr(name, &ev.FinishReason, tokenevent.MaxValueBytes)
	case fError:
		return true, p.valueStr(name, &ev.Error, tokenevent.MaxErrorTypeBytes)
	case fAttributes:
		return true, p.attributes(ev)
	}
	return true, nil
}

func (p *Parser) null() bool { return p.literal("null") }

// literal steps past lit, a JSON literal, if the cursor is at it.
func (p *Parser) literal(lit string) bool {
	if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit && (p.i+len(lit) == len(p.b) || isDelim(p.b[p.i+len(lit)])) {
		p.i += len(lit)
		return true
	}
	return false
}

// valueStr parses a string value into dst, cut to limit bytes (see
// tokenevent.CutValues, which names the fields and their bounds).
func (p *Parser) valueStr(name string, dst *string, limit int) error {
	s, err := p.str(name)
	if err != nil {
		return err
	}
	*dst = p.internValue(s, limit)
	return nil
}

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

func (p *Parser) attributes(ev *tokenevent.Event) error {
	const name = "attributes"
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return &tokenevent.FieldError{Field: name, Reason: "want an object of strings"}
	}
	p.i++
	for first := true; ; first = false {
		k, done, err := p.member(first, name)
		if err != nil || done {
			return err
		}
		var key string
		if len(k) > tokenevent.MaxAttributeKeyBytes {
			key = string(k) // rejected below: not worth a place in the intern table
		} else {
			key = p.intern(k)
		}
		if err := tokenevent.CheckAttribute(ev.Attributes, key, p.limits.MaxAttributes); err != nil {
			return err
		}
		v, err := p.str(name + "." + key)
		if err != nil {
			return err
		}
		ev.Attributes = append(ev.Attributes, tokenevent.Attribute{Key: key, Value: p.internValue(v, tokenevent.MaxValueBytes)})
	}
}

// plainByte marks the bytes a string may hold without a closer look: printable
// ASCII other than '"' and '\\'.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str parses a JSON string. The result aliases the line when the string has
// no escapes, or the parser's scratch buffer when it has; either way it is
// valid only until the next call. field names the field for errors; empty
// means an object key is being read.
func (p *Parser) str(field string) ([]byte, error) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		if field == "" {
			return nil, p.syntax("a string key")
		}
		return nil, &tokenevent.FieldError{Field: field, Reason: "want a string"}
	}
	p.i++
	start := p.i
	b := p.b
	i := plainEnd(b, p.i)
	ascii := true
	for ; i < len(b); i++ {
		c := b[i]
		switch {
		case plainByte[c]:
		case c == '"':
			p.i = i + 1
			s := b[start:i]
			if !ascii && !utf8.Valid(s) {
				return nil, &tokenevent.FieldError{Field: field, Reason: "invalid UTF-8"}
			}
			return s, nil
		case c == '\\':
			p.i = i
			return p.strEscaped(field, start)
		case c < 0x20:
			return nil, &tokenevent.FieldError{Field: field, Reason: "control character in string"}
		default:
			ascii = false
		}
	}
	p.i = i
	return nil, &tokenevent.FieldError{Field: field, Reason: "unterminated string"}
}

// strEscaped finishes a string that contains escapes, decoding it into scratch.
func (p *Parser) strEscaped(field string, start int) ([]byte, error) {
	out := append(p.scratch[:0], p.b[start:p.i]...) //nolint:gocritic // decodes into scratch; p.scratch = out keeps the grown buffer
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			p.scratch = out
			if !utf8.Valid(out) {
				return nil, &tokenevent.FieldError{Field: field, Reason: "invalid UTF-8"}
			}
			return out, nil
		case c < 0x20:
			return nil, &tokenevent.FieldError{Field: field, Reason: "control character in string"}
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		p.i++
		if p.i >= len(p.b) {
			break
		}
		e := p.b[p.i]
		p.i++
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return nil, &tokenevent.FieldError{Field: field, Reason: `invalid \u escape`}
			}
			if r >= 0xD800 && r < 0xDC00 {
				// A high surrogate must be followed by an escaped low one.
				if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
					p.i += 2
					lo, ok := p.hex4()
					if !ok || lo < 0xDC00 || lo >= 0xE000 {
						return nil, &tokenevent.FieldError{Field: field, Reason: `invalid \u escape`}
					}
					r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				} else {
					r = utf8.RuneError
				}
			} else if r >= 0xDC00 && r < 0xE000 {
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, &tokenevent.FieldError{Field: field, Reason: fmt.Sprintf("invalid escape \\%c", e)}
		}
	}
	p.scratch = out
	return nil, &tokenevent.FieldError{Field: field, Reason: "unterminated string"}
}

func (p *Parser) hex4() (rune, bool) {
	if len(p.b)-p.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		v := unhex(c)
		if v < 0 {
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	p.i += 4
	return r, true
}

// unhex is the value of hex digit c, -1 for any other byte.
func unhex(c byte) int { return int(hexValue[c]) }

// hexValue maps each byte to its hex digit's value, -1 for the others: a
// trace ID is 32 digits, and a lookup beats a comparison chain per digit.
var hexValue = func() (t [256]int8) {
	for c := range t {
		switch {
		case '0' <= c && c <= '9':
			t[c] = int8(c - '0')
		case 'a' <= c && c <= 'f':
			t[c] = int8(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			t[c] = int8(c - 'A' + 10)
		default:
			t[c] = -1
		}
	}
	return t
}()

// uint parses a non-negative JSON integer that fits an int64.
func (p *Parser) uint(field string) (uint64, error) {
	b, start := p.b, p.i
	end := min(len(b), start+20)
	var v uint64
	i := start
	// At most 20 digits are read; 19 cannot overflow a uint64, so the range
	// is checked once at the end.
	for ; i < end; i++ {
		c := b[i] - '0'
		if c > 9 {
			break
		}
		v = v*10 + uint64(c)
	}
	p.i = i
	n := i - start
	if n > 19 || v > math.MaxInt64 {
		return 0, &tokenevent.FieldError{Field: field, Reason: "integer out of range"}
	}
	if n == 0 || (n > 1 && b[start] == '0') || (i < len(b) && !isDelim(b[i])) {
		return 0, &tokenevent.FieldError{Field: field, Reason: "want a non-negative integer"}
	}
	return v, nil
}

func isDelim(c byte) bool { return c == ',' || c == '}' || isSpace(c) }

// hex parses a string of exactly 2*len(dst) hex digits into dst.
func (p *Parser) hex(field string, dst []byte) error {
	s, err := p.str(field)
	if err != nil {
		return err
	}
	want := 2 * len(dst)
	if len(s) != want {
		return &tokenevent.FieldError{Field: field, Reason: fmt.Sprintf("want %d hex digits, got %d", want, len(s))}
	}
	nonZero := false
	for i := range dst {
		hi, lo := unhex(s[2*i]), unhex(s[2*i+1])
		if hi < 0 || lo < 0 {
			return &tokenevent.FieldError{Field: field, Reason: fmt.Sprintf("want %d hex digits, got %q", want, tokenevent.Excerpt(s))}
		}
		dst[i] = byte(hi<<4 | lo)
		nonZero = nonZero || dst[i] != 0
	}
	if !nonZero {
		return &tokenevent.FieldError{Field: field, Reason: "must not be all zeros"}
	}
	return nil
}
