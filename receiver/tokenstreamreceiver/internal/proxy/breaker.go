// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// The stall breaker (proxy::stall): a stream whose next token is later than
// max_gap is cut, so that the application or its gateway can retry on
// another replica rather than wait out a freezing engine. engine_health
// ejects such an engine for new requests; the breaker acts on the streams
// already on it.

// errEngineStalled is the error.type of a session the breaker cut, and the
// type of the error event the client gets.
const errEngineStalled = "engine_stalled"

// errStallCut is the cause the breaker cancels the upstream request with.
var errStallCut = errors.New("proxy: no token within proxy::stall::max_gap, stream cut by the stall breaker")

// stallBreakerWanted reads StallBreakerHeader: whether the request lets the
// breaker act, or an error naming the field and the values it takes.
func stallBreakerWanted(h http.Header) (bool, error) {
	vs := h[StallBreakerHeader]
	if len(vs) == 0 {
		return true, nil
	}
	if len(vs) == 1 {
		switch strings.ToLower(strings.TrimSpace(vs[0])) {
		case "on":
			return true, nil
		case "off":
			return false, nil
		}
	}
	return false, errors.New("X-Otelcol-LLM-Stall-Breaker: want one value, on or off")
}

// stallBreaker watches one stream: once it has relayed minTokens token
// events (at least one: the wait for the first token is queue and prefill,
// which TTFT measures, not a decode gap), each token restarts a window of
// maxGap; a window that ends cancels the upstream request with
// errStallCut. The window is paused while the proxy writes to the client,
// whose slowness is not the engine's. One timer per stream, made at the
// first window and re-set per read from the upstream, not per event.
type stallBreaker struct {
	maxGap    time.Duration
	minTokens int64
	cancel    context.CancelCauseFunc
	timer     *time.Timer
	// lastToken is when the read that brought the last token returned.
	lastToken time.Time
}

// newStallBreaker is the breaker of one stream, or nil when it is off.
func newStallBreaker(maxGap time.Duration, minTokens int64, cancel context.CancelCauseFunc) *stallBreaker {
	if maxGap <= 0 {
		return nil
	}
	return &stallBreaker{maxGap: maxGap, minTokens: max(minTokens, 1), cancel: cancel}
}

// pause stops the window while the proxy relays what a read brought.
func (b *stallBreaker) pause() {
	if b != nil && b.timer != nil {
		b.timer.Stop()
	}
}

// resume restarts the window after a read that returned at readAt; tokens
// is the number of token events relayed so far, newToken whether that read
// brought any. A read without a token leaves the window where the last
// token put it.
func (b *stallBreaker) resume(readAt time.Time, tokens int64, newToken bool) {
	if b == nil || tokens < b.minTokens {
		return
	}
	if newToken {
		b.lastToken = readAt
	}
	left := b.maxGap - readAt.Sub(b.lastToken)
	if b.timer == nil {
		b.timer = time.AfterFunc(left, func() { b.cancel(errStallCut) })
		return
	}
	b.timer.Reset(left)
}

// stop ends the watch; the cut, if it came, stays.
func (b *stallBreaker) stop() {
	if b != nil && b.timer != nil {
		b.timer.Stop()
	}
}

// cut is the breaker's cut of its stream (see cut.go): the client gets an
// error event in the shape vLLM ends a generation that failed after its 200
// with (an ErrorResponse; vllm/entrypoints/openai/chat_completion/
// serving.py at vLLM 017e9f4448), so that OpenAI's SDKs raise it and
// clients written for vLLM read it. The code is 504: the proxy, a gateway,
// gave up waiting for the upstream, which a retrying client treats as
// retryable.
func (b *stallBreaker) cut() *streamCut {
	return &streamCut{
		errorType: errEngineStalled, eventType: errEngineStalled, code: http.StatusGatewayTimeout,
		message: fmt.Sprintf("the engine sent no token for %s (proxy::stall::max_gap); the stream was cut so that it can be retried on another replica", b.maxGap),
	}
}

// stallCut reports whether the stall breaker cancelled the exchange of ctx.
func stallCut(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errStallCut) }
