// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/sse"
)

const (
	// sseReadBuffer is the read size from the upstream stream: a few events
	// (a vLLM chunk is ~250 bytes) per read, and little memory per open
	// stream (it is held for the stream's length). An event larger than
	// one read is joined by the SSE parser.
	sseReadBuffer = 2 << 10
	// maxNonStreamingBody bounds the copy of a non-streaming response kept
	// to read its usage; the response itself always reaches the client.
	maxNonStreamingBody = 1 << 20
)

// relayStream forwards the upstream's events to the client as they come,
// observing each. The events of one read from the upstream go out in one
// flush: they were all there at once, and a flush is a system call (its
// cost is most of the proxy's per event). whole: the stream was relayed
// whole, and its response may end; otherwise it must not (see cut.go).
func (s *session) relayStream(clientCtx context.Context, w io.Writer, upstream io.Reader, strip bool) (whole bool) {
	r := s.startRelay(w, strip)
	r.run(upstream, make([]byte, sseReadBuffer))
	return s.endStream(clientCtx, r)
}

// startRelay begins relaying the session's stream to w: the relay of its
// first upstream's events, which run or the event loop (relayloop.go)
// feeds, and endStream ends.
func (s *session) startRelay(w io.Writer, strip bool) *eventRelay {
	if mv := s.moves; mv != nil {
		mv.start()
	}
	return s.newEventRelay(w, strip)
}

// endStream ends the stream whose first upstream r relayed: it tells the
// client why it was cut, or moves it (proxy::migrate), and ends the
// session. whole: as relayStream's.
func (s *session) endStream(clientCtx context.Context, r *eventRelay) (whole bool) {
	w, flusher, strip := r.w, r.flusher, r.strip
	mv := s.moves
	e, midEvent := r.finish()
	now := time.Now()
	cut := s.cut(clientCtx, &e)
	if mv != nil {
		e, cut, midEvent = s.heal(w, strip, e, cut, midEvent)
		now = time.Now()
		if len(mv.held) > 0 && !e.clientGone {
			// The engine's error event, held while the stream could move,
			// goes as it came, with what followed it.
			if _, err := w.Write(mv.held); err == nil && flusher != nil {
				flusher.Flush()
			}
		}
	}
	if cut != nil && !e.clientGone {
		// The upstream request is over or cancelled; the client learns
		// why, in the stream, and can retry elsewhere.
		cut.count(&s.p.counters)
		if midEvent {
			_, _ = w.Write(eventEnd)
		}
		if _, err := w.Write(cut.event()); err == nil && flusher != nil {
			flusher.Flush()
		}
	}
	errorType, finishReason := "", s.finishReason
	switch {
	case mv != nil && mv.done > 0:
		// Moved: the session is charged to the engine that failed first,
		// as the cut would have been, however the answer ended.
		errorType = mv.failed
		if !e.done && cut == nil {
			finishReason = finishReasonAbort
		}
	case s.engineError != "":
		// The engine's own error says more than a cut; vLLM ends a failed
		// generation with [DONE] all the same.
		errorType = s.engineError
	case cut != nil:
		errorType = cut.errorType
	case !e.done:
		finishReason = finishReasonAbort
	case !e.chunkRead:
		// [DONE] came, but nothing that was a chunk: not a completion.
		errorType = errStreamMalformed
	}
	s.end(now, errorType, finishReason)
	return e.done
}

// heal moves the stream that ended as e and cut say, as often as its
// triggers and max_moves allow; it returns how the last stream relayed
// ended.
func (s *session) heal(w io.Writer, strip bool, e relayEnd, cut *streamCut, midEvent bool) (relayEnd, *streamCut, bool) {
	mv := s.moves
	ctx := context.Background()
	for !e.clientGone {
		t := mv.trigger(cut, s.engineError)
		if t == 0 {
			break
		}
		failure := s.engineError
		if failure == "" {
			failure = cut.errorType
		}
		if why := mv.refusalNow(s.p.draining, s.chunks); why != "" {
			s.p.counters.Migrations.Add(ctx, 1, moveOutcome(outcomeRefused, t, why))
			break
		}
		e2, cut2, mid2, err := s.move(w, strip, failure)
		if err != nil {
			s.p.counters.Migrations.Add(ctx, 1, moveOutcome(outcomeFailed, t, ""))
			s.p.warn.Warn("proxy: a stream could not be moved to proxy::migrate::endpoint and was ended as before (logged at most once a minute, counted in otelcol_receiver_token_stream_proxy_migrations)",
				zap.String("endpoint", mv.m.cfg.Endpoint.Redacted()), zap.String("trigger", t.name()), zap.Error(err))
			break
		}
		if mv.failed == "" {
			mv.failed = failure
		}
		s.p.counters.Migrations.Add(ctx, 1, moveOutcome(outcomeMoved, t, ""))
		e, cut, midEvent = e2, cut2, mid2
	}
	return e, cut, midEvent
}

// move sends the continuation for the failure (its error type) and relays
// its stream. An error: it failed before anything of it reached the
// client, and the stream is as the failed one left it.
func (s *session) move(w io.Writer, strip bool, failure string) (relayEnd, *streamCut, bool, error) {
	mv := s.moves
	at := time.Now()
	tokens := s.chunks
	body, err := mv.continuation(tokens)
	if err != nil {
		return relayEnd{}, nil, false, err
	}
	ctx, cancel := context.WithCancelCause(mv.scope)
	defer cancel(nil)
	resp, err := mv.send(ctx, body)
	if err != nil {
		return relayEnd{}, nil, false, err
	}
	defer resp.Body.Close()
	if b := s.breaker; b != nil {
		// The new stream's wait for its first token is a prefill of the
		// whole context: watched from its first token on, as any stream.
		b.stop()
		s.breaker = newStallBreaker(b.maxGap, tokens+1, cancel)
	}
	held, engineError, carried, continuing := mv.held, s.engineError, mv.carried, mv.continuing
	mv.held, mv.holding, s.engineError, mv.carried, mv.continuing = nil, false, "", tokens, true
	mv.done++
	mv.pending = pendingMove{set: true, at: at, reason: failure, carried: tokens}
	e, mid := s.relayEvents(w, resp.Body, strip)
	if !e.wrote && !e.clientGone {
		mv.held, s.engineError, mv.carried, mv.continuing = held, engineError, carried, continuing
		mv.done--
		mv.pending = pendingMove{}
		if c := s.cut(ctx, &e); c != nil {
			return relayEnd{}, nil, false, fmt.Errorf("the continuation ended before its first token: %s", c.errorType)
		}
		return relayEnd{}, nil, false, errors.New("the continuation ended before its first token")
	}
	s.moved() // made, though it relayed no token
	return e, s.cut(ctx, &e), mid, nil
}

// relayEvents relays the events of one upstream stream to the client, as
// they come, and says how the stream ended; midEvent: the last bytes
// relayed are a piece of an oversized event.
func (s *session) relayEvents(w io.Writer, upstream io.Reader, strip bool) (_ relayEnd, midEvent bool) {
	r := s.newEventRelay(w, strip)
	r.run(upstream, make([]byte, sseReadBuffer))
	return r.finish()
}

// eventRelay relays the events of one upstream stream to the client: what
// the relay knows between two reads from the upstream. Whoever reads the
// upstream (run, on the stream's goroutine, or the event loop) hands each
// read's bytes to feed and the read's error to readEnd; finish ends it.
type eventRelay struct {
	s       *session
	w       io.Writer
	flusher http.Flusher
	strip   bool
	parser  *sse.Parser
	onEvent func(*sse.Event) error // r.event, bound once
	// e.done: the upstream sent [DONE], so the generation is whole. A
	// client that closes the stream after that (many stop reading at
	// [DONE]) did not abort anything.
	e   relayEnd
	now time.Time // when the read holding the event returned
	// midEvent: the last bytes relayed are a piece of an oversized event.
	midEvent, unflushed bool
	oversized           int64
	// unread: the read brought a piece of an oversized event, whose tokens
	// are not read; the stall breaker takes it, and bytes added to an event
	// still arriving (pending), for a token: the engine is sending.
	unread bool
	// held: the finish chunk, kept back while the proxy waits for the
	// usage chunk it asked for (see heldFinish); release sends it.
	held heldFinish
	// over: the relay stopped reading (the client is gone, or the stream
	// ended).
	over bool
}

func (s *session) newEventRelay(w io.Writer, strip bool) *eventRelay {
	r := &eventRelay{s: s, w: w, strip: strip, parser: sse.NewParser(0)}
	r.flusher, _ = w.(http.Flusher)
	r.onEvent = r.event
	return r
}

// run reads upstream into buf until the stream ends or the client leaves.
func (r *eventRelay) run(upstream io.Reader, buf []byte) {
	for !r.over {
		n, err := upstream.Read(buf)
		if n > 0 {
			r.feed(buf[:n])
		}
		if err != nil {
			r.readEnd(err)
		}
	}
}

// feed relays the events that b, one read from the upstream, completes;
// the relay is over when a write to the client failed.
func (r *eventRelay) feed(b []byte) {
	s := r.s
	r.now = time.Now()
	s.send.arm(r.now)
	var tokens int64
	var pending int
	if s.breaker != nil {
		s.breaker.pause()
		tokens, pending, r.unread = s.chunks, len(r.parser.Pending()), false
	}
	if ferr := r.parser.Feed(b, r.onEvent); ferr != nil {
		r.over = true
		return
	}
	if r.unflushed && r.flusher != nil {
		r.flusher.Flush()
	}
	r.unflushed = false
	if s.breaker != nil {
		s.breaker.resume(r.now, s.chunks, s.chunks != tokens || r.unread || len(r.parser.Pending()) > pending)
	}
}

// readEnd ends the reads with err, their error (io.EOF: the upstream's
// end).
func (r *eventRelay) readEnd(err error) {
	if r.over {
		return
	}
	r.over = true
	if !errors.Is(err, io.EOF) {
		r.e.readErr = err
	}
	// What follows [DONE] goes as it came; an event left unfinished by a
	// cut does not (see cut.go).
	if rest := r.parser.Pending(); len(rest) > 0 && !r.e.clientGone && r.e.done {
		if mv := r.s.moves; mv != nil && mv.holding {
			_ = mv.hold(rest, r.write)
		} else {
			_, _ = r.w.Write(rest)
		}
	}
}

// finish sends what the relay held back and says how the stream ended.
func (r *eventRelay) finish() (_ relayEnd, midEvent bool) {
	if !r.e.clientGone && r.release() == nil && r.flusher != nil {
		// A finish chunk whose usage chunk never came: the stream ended
		// or was cut right after it.
		r.flusher.Flush()
	}
	if r.oversized > 0 {
		r.s.p.counters.OversizedEvents.Add(context.Background(), r.oversized)
		r.oversized = 0
	}
	return r.e, r.midEvent
}

// write sends an event to the client: raw, then rest.
func (r *eventRelay) write(raw, rest []byte) error {
	_, err := r.w.Write(raw)
	if err == nil && len(rest) > 0 {
		_, err = r.w.Write(rest)
	}
	if err != nil {
		r.e.clientGone = true
		return err
	}
	r.unflushed, r.e.wrote = true, true
	return nil
}

// release sends the held finish chunk.
func (r *eventRelay) release() error {
	if !r.held.ok {
		return nil
	}
	r.held.ok = false
	return r.write(r.held.raw, nil)
}

// event relays one event and observes it.
func (r *eventRelay) event(ev *sse.Event) error {
	s, mv, strip := r.s, r.s.moves, r.strip
	if mv != nil && mv.holding {
		// After the engine's error event: held with it (heal).
		r.e.done = r.e.done || (ev.HasData && openaistream.IsDone(ev.Data))
		return mv.hold(ev.Raw, r.write)
	}
	r.midEvent = ev.Partial
	if ev.Oversized {
		r.unread = true
		if !ev.Partial {
			r.oversized++
			r.e.chunkRead = true
		}
		if mv != nil {
			mv.unmovable = refuseUnreadable
		}
	}
	if ev.HasData && !ev.Oversized {
		if openaistream.IsDone(ev.Data) {
			r.e.done = true
		} else if f, ok := openaistream.InspectChunk(ev.Data); ok {
			r.e.chunkRead = true
			if mv != nil && mv.continuing {
				var keep bool
				if ev, f, keep = mv.rewrite(ev, f); !keep {
					return nil
				}
			}
			s.read(&f, ev.Data)
			if f.CompletionTokens >= 0 {
				s.completionTokens = f.CompletionTokens
			}
			if f.PromptTokens >= 0 {
				s.promptTokens = f.PromptTokens
			}
			if f.FinishReason != "" {
				s.finishReason = f.FinishReason
			}
			if f.ErrorType != "" && s.engineError == "" {
				s.engineError = f.ErrorType
			}
			if f.Content {
				s.token(r.now)
			}
			if mv != nil {
				if f.ErrorType != "" && mv.holdsErrors() {
					if err := r.release(); err != nil {
						return err
					}
					mv.holding = true
					return mv.hold(ev.Raw, r.write)
				}
				mv.delivered(&f, ev.Data)
			}
			switch {
			case strip && f.UsageOnly:
				// The usage the proxy asked for is the proxy's; what
				// else the engine put on the chunk is the client's,
				// on the finish chunk where it can (see heldFinish).
				if r.held.fold(ev) {
					return r.write(r.held.folded, nil)
				}
				if err := r.release(); err != nil {
					return err
				}
				head, tail, keep := withoutUsage(ev)
				if !keep {
					return nil
				}
				return r.write(head, tail)
			case strip && f.FinishReason != "":
				if err := r.release(); err != nil {
					return err
				}
				r.held.hold(ev)
				return nil
			}
		}
	}
	if err := r.release(); err != nil {
		return err
	}
	return r.write(ev.Raw, nil)
}

// withoutUsage is the usage chunk ev as the client gets it when the proxy
// asked for the usage: the engine's bytes without the "usage" member (and
// its comma), in two pieces; keep is false when nothing else of the
// engine's is left on it (vLLM's), and the client gets nothing. An event
// whose data is not on one line (no engine sends one) goes as it came,
// usage and all: nothing of the engine's is lost.
func withoutUsage(ev *sse.Event) (head, tail []byte, keep bool) {
	from, to, extras, ok := openaistream.UsageMember(ev.Data)
	if ok && !extras {
		return nil, nil, false
	}
	at := bytes.Index(ev.Raw, ev.Data)
	if !ok || at < 0 {
		return ev.Raw, nil, true
	}
	return ev.Raw[:at+from], ev.Raw[at+to:], true
}

// heldFinish keeps back a stream's finish chunk (one with a
// finish_reason) when the proxy asked for the usage, until the next event
// comes: if that is the usage chunk, what the engine put on it beyond the
// usage is folded onto the finish chunk, and the client gets the one chunk.
// That is the stream the client would have had without the proxy's
// request: llama.cpp (since b6508) moves its timings from the finish chunk
// to the usage chunk when asked for usage, and a client that did not ask
// never sees a chunk with "choices":[], on which one that reads choices[0]
// fails. Anything else next, or the stream's end, sends the finish chunk
// as it came.
type heldFinish struct {
	raw    []byte // the event, a copy
	at     int    // where its data begins in raw; -1: not on one line
	size   int    // the data's length
	ok     bool   // raw holds an event not yet sent
	folded []byte // the event fold made
}

func (h *heldFinish) hold(ev *sse.Event) {
	h.raw = append(h.raw[:0], ev.Raw...)
	h.at, h.size, h.ok = bytes.Index(ev.Raw, ev.Data), len(ev.Data), true
}

// fold makes h.folded of the held finish chunk and the usage chunk ev,
// and reports whether it could (see openaistream.FoldExtras).
func (h *heldFinish) fold(usage *sse.Event) bool {
	if !h.ok || h.at < 0 || !bytes.Contains(usage.Raw, usage.Data) {
		return false
	}
	end := h.at + h.size
	out, ok := openaistream.FoldExtras(append(h.folded[:0], h.raw[:h.at]...), h.raw[h.at:end], usage.Data)
	if !ok {
		return false
	}
	h.folded, h.ok = out, false
	h.folded = append(h.folded, h.raw[end:]...)
	return true
}

// relayResponse forwards a non-streaming response: its first token is the
// whole response, its tokens come from usage. whole: the response was
// relayed whole, and may end.
func (s *session) relayResponse(clientCtx context.Context, w http.ResponseWriter, upstream io.Reader) (whole bool) {
	var kept limitedBuffer
	kept.limit = maxNonStreamingBody
	_, err := io.Copy(io.MultiWriter(armedWriter{w, s.send}, &kept), upstream)
	now := time.Now()
	if err != nil {
		// What came goes out before the response is cut.
		_ = http.NewResponseController(w).Flush()
		switch {
		case errors.Is(context.Cause(clientCtx), errProxyShutdown):
			s.end(now, tokenevent.ErrorShutdown, "")
		case clientCtx.Err() != nil:
			s.end(now, "", finishReasonAbort)
		case errors.Is(err, errIdleTimeout):
			s.end(now, errUpstreamIdleTimeout, "")
		default:
			s.end(now, errStreamBroken, "")
		}
		return false
	}
	s.whole = true
	if f, ok := openaistream.InspectChunk(kept.b); ok {
		s.read(&f, kept.b)
		s.completionTokens, s.promptTokens, s.finishReason = f.CompletionTokens, f.PromptTokens, f.FinishReason
		if f.ErrorType != "" {
			s.end(now, f.ErrorType, "")
			return true
		}
	}
	// One token event for the whole response; its count is capped as the
	// wire's is (the end's completion_tokens carries the true total).
	count := min(max(s.completionTokens, 1), tokenevent.MaxCount)
	s.chunks = count
	s.emit(tokenevent.KindToken, now, func(ev *tokenevent.Event) { ev.Count = count })
	s.end(now, "", s.finishReason)
	return true
}
