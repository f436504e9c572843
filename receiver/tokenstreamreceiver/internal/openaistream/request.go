// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package openaistream // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"unicode/utf8"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// maxModelBytes bounds the model name the request scanner (and
// ResponseModel) reports, in bytes of UTF-8 once decoded: a rune over
// tokenevent.MaxValueBytes, so that the proxy, which cuts each event's
// values to their bound (tokenevent.CutValues), sees that a longer name
// was longer and counts the cut. maxModelRawBytes bounds what the scanner
// keeps of the JSON string, enough for maxModelBytes written as \uXXXX
// escapes.
const (
	maxModelBytes    = tokenevent.MaxValueBytes + utf8.UTFMax
	maxModelRawBytes = 6 * maxModelBytes
)

// includeUsageMember is what the proxy adds to a streaming request that did
// not ask for usage, so that the upstream reports the output token count.
var includeUsageMember = []byte(`"stream_options":{"include_usage":true}`)

// requestScanner watches the JSON body of a completions request while it
// streams to the upstream, byte by byte, without holding it: it notes the
// top-level "model", "stream" and "stream_options" members, and holds back
// only the object's closing brace (and what follows it), so that
// include_usage can still be added before it. A prompt of megabytes passes
// through it in the reads it came in.
type requestScanner struct {
	depth    int
	inString bool
	escape   bool
	// members counts the top-level members seen, to know whether an
	// added member needs a comma.
	members int
	// The top-level key just read, and whether the next value belongs to it.
	key        []byte
	readingKey bool
	afterColon bool
	keyDone    bool
	// What was found.
	model         []byte
	modelFull     bool
	stream        bool
	hasStreamOpts bool
	includeUsage  bool
	// capture collects the value of the member being watched: "model" (a
	// string), "stream" (a literal or a string: literalString), or the key
	// inside stream_options.
	capturing     capture
	literal       []byte
	literalString bool
	innerKey      []byte
	readingIKey   bool
	innerColon    bool
	innerTarget   bool
	// inPrompt: the member being read is "messages" or "prompt";
	// promptBytes counts the bytes of the strings in them, keys inside
	// included (the prompt's size, for the GPU time's estimate of its
	// tokens; no byte of it is kept).
	inPrompt    bool
	promptBytes int64
	// closed: the top-level object ended; held holds the bytes from its
	// closing brace on.
	closed  bool
	held    []byte
	release []byte
	broken  bool
}

type capture uint8

const (
	captureNone capture = iota
	captureModel
	captureStream
)

// maxHeldBytes bounds the whitespace held after the object's closing brace:
// a body with more, or with anything else after it, is not one JSON object
// and is forwarded unchanged, nothing held.
const maxHeldBytes = 4 << 10

// scan processes p and returns the prefix of p that can be forwarded now.
// Bytes held back earlier that can go after all are left in release, to be
// forwarded before anything else.
func (s *requestScanner) scan(p []byte) []byte {
	if s.broken {
		return p
	}
	if s.closed {
		for _, c := range p {
			if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
				s.giveUp(p)
				return nil
			}
		}
		if len(s.held)+len(p) > maxHeldBytes {
			s.giveUp(p)
			return nil
		}
		s.held = append(s.held, p...)
		return nil
	}
	for i, c := range p {
		if s.step(c) {
			s.closed = true
			s.held = append(s.held, c)
			if rest := s.scan(p[i+1:]); len(rest) > 0 || len(s.release) > 0 {
				// Not one object after all: forward it all, in order.
				s.release = append(s.release[:0], p[i:]...)
				s.held = s.held[:0]
			}
			return p[:i]
		}
	}
	return p
}

// giveUp ends the scan of a body that is not one JSON object: what was held
// is released, followed by p.
func (s *requestScanner) giveUp(p []byte) {
	s.broken = true
	s.release = append(append(s.release, s.held...), p...)
	s.held = s.held[:0]
}

// step advances over one byte; it reports true on the top-level closing brace.
func (s *requestScanner) step(c byte) bool {
	if s.inString {
		switch {
		case s.escape:
			s.escape = false
		case c == '\\':
			s.escape = true
		case c == '"':
			s.inString = false
			s.stringEnded()
			return false
		}
		s.stringByte(c)
		return false
	}
	switch c {
	case '"':
		s.inString = true
		s.stringStarted()
	case '{', '[':
		s.depth++
		if s.depth == 2 && c == '{' && s.currentKey("stream_options") {
			s.hasStreamOpts = true
		}
	case '}', ']':
		if s.depth == 2 && c == '}' {
			s.valueEnded() // the last member of a nested object
		}
		s.depth--
		if s.depth == 0 {
			return c == '}' && !s.broken
		}
		if s.depth < 0 {
			s.broken = true
		}
	case ':':
		if s.depth == 1 {
			s.afterColon = true
			s.members++
			s.inPrompt = s.currentKey("messages") || s.currentKey("prompt")
			switch {
			case s.currentKey("model"):
				s.capturing = captureModel
			case s.currentKey("stream"):
				s.capturing, s.literal, s.literalString = captureStream, s.literal[:0], false
			}
		}
		if s.depth == 2 && s.hasStreamOpts && s.currentKey("stream_options") {
			s.innerColon = true
			s.innerTarget = string(s.innerKey) == "include_usage"
			s.literal = s.literal[:0]
		}
	case ',':
		s.valueEnded()
	case ' ', '\t', '\r', '\n':
	default:
		if s.depth == 1 && s.capturing == captureStream {
			s.captureLiteral(c)
		}
		if s.depth == 2 && s.innerColon && s.innerTarget {
			s.literal = append(s.literal, c)
		}
	}
	return false
}

func (s *requestScanner) currentKey(k string) bool { return s.keyDone && string(s.key) == k }

func (s *requestScanner) stringStarted() {
	switch {
	case s.depth == 1 && !s.afterColon:
		s.readingKey, s.keyDone, s.key = true, false, s.key[:0]
		s.capturing = captureNone
	case s.depth == 1 && s.capturing == captureModel:
		s.model = s.model[:0]
	case s.depth == 1 && s.capturing == captureStream:
		s.literalString = true
	case s.depth == 2 && s.hasStreamOpts && s.currentKey("stream_options") && !s.innerColon:
		s.readingIKey, s.innerKey = true, s.innerKey[:0]
	}
}

func (s *requestScanner) stringByte(c byte) {
	if s.inPrompt && !s.readingKey {
		s.promptBytes++
	}
	switch {
	case s.readingKey:
		if len(s.key) < 64 {
			s.key = append(s.key, c)
		}
	case s.readingIKey:
		if len(s.innerKey) < 64 {
			s.innerKey = append(s.innerKey, c)
		}
	case s.depth == 1 && s.capturing == captureModel:
		if len(s.model) < maxModelRawBytes {
			s.model = append(s.model, c)
		}
	case s.depth == 1 && s.capturing == captureStream:
		s.captureLiteral(c)
	}
}

// maxLiteralBytes bounds the captured value of "stream": any longer one is
// none of the values LaxBool takes (written with escapes, "false" is 30
// bytes), so it is kept cut, and read as no bool.
const maxLiteralBytes = 64

func (s *requestScanner) captureLiteral(c byte) {
	if len(s.literal) <= maxLiteralBytes {
		s.literal = append(s.literal, c)
	}
}

// streamValue is the request's "stream" as vLLM reads it (LaxBool).
func (s *requestScanner) streamValue() bool {
	if len(s.literal) > maxLiteralBytes {
		return false
	}
	if s.literalString {
		v, ok := LaxBool(DecodeString(s.literal, maxLiteralBytes), true)
		return ok && v
	}
	v, ok := LaxBool(string(s.literal), false)
	return ok && v
}

func (s *requestScanner) stringEnded() {
	switch {
	case s.readingKey:
		s.readingKey, s.keyDone = false, true
	case s.readingIKey:
		s.readingIKey = false
	case s.depth == 1 && s.capturing == captureModel:
		s.modelFull = true
	}
}

// valueEnded closes the member whose value a ',' just ended.
func (s *requestScanner) valueEnded() {
	switch s.depth {
	case 1:
		if s.capturing == captureStream {
			s.stream = s.streamValue()
		}
		s.capturing, s.afterColon, s.keyDone, s.inPrompt = captureNone, false, false, false
	case 2:
		if s.innerColon && s.innerTarget {
			s.includeUsage = bytes.Equal(s.literal, []byte("true"))
		}
		s.innerColon, s.innerTarget = false, false
	}
}

// finish is called at the end of the body: it writes what was held back
// to w, adding include_usage when inject is set and the request can take it.
// It reports whether the member was added.
func (s *requestScanner) finish(w io.Writer, inject bool) (bool, error) {
	if s.closed && !s.broken {
		// The member that the closing brace ended.
		if s.capturing == captureStream {
			s.stream = s.streamValue()
		}
	}
	added := false
	if inject && s.closed && !s.broken && s.stream && !s.hasStreamOpts {
		member := includeUsageMember
		if s.members > 0 {
			if _, err := w.Write([]byte{','}); err != nil {
				return false, err
			}
		}
		if _, err := w.Write(member); err != nil {
			return false, err
		}
		added = true
	}
	_, err := w.Write(s.held)
	return added, err
}

// requestInfo is what the scanner found, once the body has been read.
func (s *requestScanner) requestInfo() (model string, stream, usageRequested bool) {
	if s.modelFull {
		// Telemetry gets the name decoded, valid UTF-8 and cut on a rune
		// boundary: strict backends reject a batch over one bad string.
		model = DecodeString(s.model, maxModelBytes)
	}
	return model, s.stream, s.hasStreamOpts && s.includeUsage
}

// ScannedBody is the upstream request's body: the client's body passed
// through the scanner as the transport reads it, in the reads it comes in,
// with include_usage added at its end when the request streams without
// asking for usage. (A pipe and a copying goroutine per request did the same
// at a higher price.)
//
// The transport reads it on a goroutine of its own, and may still be
// reading when the response has come (an upstream can answer before the
// whole body is sent), so Stop ends it and reads what the scanner found
// under the lock that the reads take.
type ScannedBody struct {
	src io.Reader

	mu      sync.Mutex
	s       requestScanner
	tail    bytes.Buffer // what the scanner held back, and the added member
	eof     bool         // src has ended: only tail is left to send
	added   bool
	started bool // the transport has begun reading src
	stopped bool
}

// unsentScanBytes is how much of a body that was never sent (the upstream
// unreachable) Stop still reads to find the model.
const unsentScanBytes = 32 << 10

// NewScannedBody returns the body that forwards src.
func NewScannedBody(src io.Reader) *ScannedBody { return &ScannedBody{src: src} }

// ErrBodyStopped is what a Read returns after Stop.
var ErrBodyStopped = errors.New("the response came: request body no longer forwarded")

func (b *ScannedBody) Read(p []byte) (int, error) {
	for {
		b.mu.Lock()
		switch {
		case b.stopped:
			b.mu.Unlock()
			return 0, ErrBodyStopped
		case len(b.s.release) > 0:
			n := copy(p, b.s.release)
			b.s.release = b.s.release[n:]
			b.mu.Unlock()
			return n, nil
		case b.eof:
			n, err := b.tail.Read(p)
			b.mu.Unlock()
			return n, err // io.EOF once the tail is sent
		}
		b.started = true
		b.mu.Unlock()

		// Not under the lock: this waits for the client.
		n, err := b.src.Read(p)

		b.mu.Lock()
		if b.stopped {
			b.mu.Unlock()
			return 0, ErrBodyStopped
		}
		fwd := len(b.s.scan(p[:n]))
		if errors.Is(err, io.EOF) {
			b.eof = true
			b.added, _ = b.s.finish(&b.tail, true)
			err = nil
		}
		b.mu.Unlock()
		if fwd > 0 || err != nil {
			return fwd, err
		}
	}
}

// Close does nothing: the client's body is the server's to close.
func (b *ScannedBody) Close() error { return nil }

// Stop ends the body and reports the request's model, whether it asked for
// a stream ("stream": true, or a value vLLM takes for true: LaxBool; absent
// is false, as in the OpenAI API) and
// whether include_usage was added. When the transport never read the body,
// the start of it is read here for the model; no read of the transport's
// can be under way then, and none will start.
func (b *ScannedBody) Stop() (model string, stream, injected bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	if !b.started {
		var buf [4096]byte
		for read := 0; read < unsentScanBytes && !b.s.modelFull; {
			n, err := b.src.Read(buf[:])
			b.s.scan(buf[:n])
			read += n
			if err != nil {
				break
			}
		}
	}
	model, stream, _ = b.s.requestInfo()
	return model, stream, b.added
}

// PromptBytes is the size of the prompt the body carried, in bytes of its
// strings under "messages" or "prompt" (as written, escapes included): 0
// when the body was not one JSON object read to its end, or carried none.
// Call it after Stop.
func (b *ScannedBody) PromptBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.s.closed || b.s.broken {
		return 0
	}
	return b.s.promptBytes
}
