// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"
)

// shared is what the sessions of one proxy share of it: where their
// events go, its counters, its log and its drain.
type shared struct {
	counters Counters
	// warn logs what a user must see at the default level (the upstream
	// failing) without flooding the log while it lasts.
	warn  *zap.Logger
	batch *eventBatcher
	// draining is closed when Shutdown begins: new observed requests get
	// 503, no stream moves, no connection is kept alive.
	draining chan struct{}
}

// finishReasonAbort is the finish reason of a session whose client left
// before its answer was whole.
const finishReasonAbort = "abort"

// session is one observed request.
type session struct {
	p       *shared
	ev      tokenevent.Event
	id      string
	started time.Time
	// what the stream said
	chunks           int64
	completionTokens int64
	promptTokens     int64
	finishReason     string
	// engineError: the upstream reported an error inside its 200 response.
	engineError string
	// timing is the engine's own timing of the request, when it sent one
	// (hasTiming).
	timing    openaistream.RequestTiming
	hasTiming bool
	// firstToken is when the first token event came (zero: none); whole is
	// set when the answer came whole, not streamed: the engine's queue time
	// is derived from them when it does not give it (llama.cpp).
	firstToken time.Time
	whole      bool
	// responseModel is the model the first chunk named; modelRead is set
	// once that chunk was read.
	responseModel string
	modelRead     bool
	// send bounds the writes to the client; nil: unbounded.
	send *sendDeadline
	// breaker cuts the stream when its next token is too late; nil: off.
	breaker *stallBreaker
	// moves continues the stream on another replica when it fails; nil:
	// proxy::migrate is off.
	moves *moves
}

func (s *session) emit(kind tokenevent.Kind, at time.Time, fill func(*tokenevent.Event)) {
	s.ev.Reset()
	s.ev.Kind, s.ev.SessionID, s.ev.TimeUnixNano = kind, s.id, uint64(at.UnixNano())
	if fill != nil {
		fill(&s.ev)
		// The values that become keys, bounded as the hooks' parser
		// bounds them: one string, one key, whichever way it came.
		if cut := s.ev.CutValues(); cut > 0 {
			s.p.counters.TruncatedValues.Add(context.Background(), int64(cut), truncatedProxy)
		}
	}
	s.p.batch.add(&s.ev)
}

// truncatedProxy is the attribute set of the proxy's TruncatedValues.
var truncatedProxy = metric.WithAttributeSet(attribute.NewSet(attribute.String("transport", "proxy")))

func (s *session) token(at time.Time) {
	if s.chunks == 0 {
		s.firstToken = at
	}
	if s.moves != nil && s.moves.pending.set {
		s.moved() // before the continuation's first token
	}
	s.chunks++
	s.emit(tokenevent.KindToken, at, nil)
}

// moved emits the event of the move under way (moves.pending), once: where
// it went (the migrate endpoint, named as the proxy names engines), why and
// the tokens carried, at the time it began.
func (s *session) moved() {
	mv := s.moves
	pm := mv.pending
	if !pm.set {
		return
	}
	mv.pending = pendingMove{}
	s.emit(tokenevent.KindMove, pm.at, func(ev *tokenevent.Event) {
		ev.Engine, ev.Error, ev.Count = mv.m.cfg.Engine, pm.reason, pm.carried
	})
}

func (s *session) end(at time.Time, errorType, finishReason string) {
	s.emit(tokenevent.KindEnd, at, func(ev *tokenevent.Event) {
		ev.Error, ev.FinishReason = errorType, finishReason
		if s.completionTokens >= 0 {
			ev.CompletionTokens = s.completionTokens
		} else if s.chunks > 0 {
			ev.CompletionTokens = s.chunks
		}
		ev.PromptTokens = s.promptTokens
		ev.ResponseModel = s.responseModel
		if s.moves != nil {
			ev.Migrations = int64(s.moves.done)
		}
		if t := s.timing; s.hasTiming {
			if t.Source == tokenevent.TimingLlamaCpp {
				t.QueueMs = s.derivedQueueMs(at, t)
			}
			ev.QueueTimeNs, ev.PrefillTimeNs, ev.DecodeTimeNs = msToNs(t.QueueMs), msToNs(t.PrefillMs), msToNs(t.DecodeMs)
			ev.TimingSource = t.Source
		}
	})
}

// derivedQueueMs is the queue time of an engine that gives its prefill and
// decode but not its queue (llama.cpp): what the proxy waited for the first
// token, less the prefill; for an answer that came whole (ended at end),
// what it waited for the answer, less prefill and decode. Whatever else
// the wait held (the way to the engine and back, the engine's HTTP and
// tokenization) is counted as queue. Never below 0 (the two clocks round
// differently); -1 when the wait or a part is not known. The wait is read
// on the wall clock, as the events' times are (Round(0) drops the
// monotonic reading): queue and prefill then add up to the session's TTFT
// even when the wall clock was stepped during the wait.
func (s *session) derivedQueueMs(end time.Time, t openaistream.RequestTiming) float64 {
	started := s.started.Round(0)
	wait, engine := s.firstToken.Round(0).Sub(started), t.PrefillMs
	switch {
	case s.whole:
		wait, engine = end.Round(0).Sub(started), t.PrefillMs+t.DecodeMs
		if t.DecodeMs < 0 {
			return -1
		}
	case s.firstToken.IsZero():
		return -1
	}
	if t.PrefillMs < 0 {
		return -1
	}
	return max(float64(wait)/float64(time.Millisecond)-engine, 0)
}

// msToNs converts an engine time in ms to ns, -1 staying -1 (absent); an
// hour bounds it, far from an overflow, as no request waits that long.
func msToNs(ms float64) int64 {
	if ms < 0 {
		return -1
	}
	return int64(min(ms, 3_600_000) * float64(time.Millisecond))
}

// read takes what a chunk (or a whole response) says about the session.
func (s *session) read(f *openaistream.ChunkFacts, data []byte) {
	if !s.modelRead {
		s.modelRead = true
		s.responseModel = openaistream.ResponseModel(data)
	}
	if f.Timing.Known() && (s.moves == nil || !s.moves.continuing) {
		// A continuation's timing is another engine's, of another request.
		s.timing, s.hasTiming = f.Timing, true
	}
}

func newSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "proxy-" + hex.EncodeToString(b[:])
}

// cut says why a stream that ended as e says was not relayed whole; nil
// when it was, or when its client left (there is no one to tell).
// exchange is the context of its upstream exchange, whose cause says who
// ended it.
func (s *session) cut(exchange context.Context, e *relayEnd) *streamCut {
	switch {
	case e.done:
		return nil
	case stallCut(exchange) && !e.clientGone:
		return s.breaker.cut()
	case errors.Is(context.Cause(exchange), errProxyShutdown):
		return &cutShutdown
	case e.clientGone || exchange.Err() != nil:
		return nil
	case errors.Is(e.readErr, errIdleTimeout):
		return &cutIdleTimeout
	case e.readErr != nil:
		return &cutBroken
	case !e.chunkRead:
		return &cutMalformed
	default:
		// The upstream ended its answer before [DONE]: the OpenAI API,
		// vLLM, SGLang and llama.cpp end every whole stream with it.
		return &cutBroken
	}
}

// exchange is what an observed request holds until its stream ends.
type exchange struct {
	// cancel ends the exchange; upCancel, with proxy::migrate, the first
	// upstream request alone (nil: cancel does).
	cancel, upCancel context.CancelCauseFunc
	stopCut          func() bool
	send             *sendDeadline
	body             io.ReadCloser // the upstream's response body, once it came
}

// end releases them: the upstream request is over.
func (x *exchange) end(s *session) {
	if x.body != nil {
		x.body.Close()
	}
	s.breaker.stop()
	x.send.clear()
	x.stopCut()
	if x.upCancel != nil {
		x.upCancel(nil)
	}
	x.cancel(nil)
}
