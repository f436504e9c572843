// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// A stream the proxy could not relay whole (the upstream broke, or ended
// before [DONE], or sent no OpenAI chunk, or went silent for
// stream_idle_timeout; the drain ran out; the stall breaker cut it) ends,
// for its client, with an error event in OpenAI's shape, and then without
// the end of the response: no last chunk on HTTP/1.1 (the connection is
// closed), a reset stream on HTTP/2. Each reaches a different client:
//   - OpenAI's SDKs raise on an event whose data has an "error" member
//     (openai-node's Stream.fromSSEResponse, openai-python's Stream), so
//     the application gets the reason, typed, and may retry;
//   - any client reading the body through an HTTP library (Node's fetch,
//     httpx, requests, Go's net/http) gets an error at its end, even one
//     that never looks at "error" members.
//
// No [DONE] follows the error event: [DONE] says the generation is whole,
// and a client that stops at it without reading "error" would take the cut
// answer for a whole one (vLLM sends one after its own error event: there
// the engine ended the generation; here it was cut).
//
// An event the upstream left unfinished is not relayed: an SSE client
// drops an unterminated event at the end of a stream anyway, and relaying
// it would make the error event part of it. Only the pieces of an event
// over the parser's bound go out before it ends; cut within one, the proxy
// ends it with a blank line first, so that the error event parses on its
// own (the SDKs then fail on the piece's JSON, still an error).

// streamCut is why the proxy ended a stream it could not relay whole.
type streamCut struct {
	// errorType is the session's error.type; eventType the error event's
	// type (the same, but for the drain: the session ends shutdown, and
	// the client is told shutting_down, as the proxy's 503s say).
	errorType, eventType string
	// code is the error event's code: the HTTP status the proxy would
	// have answered with, had the head not gone out (502, 503, 504:
	// retryable).
	code    int
	message string
	// reason is the cut_streams reason; nil for the stall breaker's cut,
	// counted in stalled_streams.
	reason metric.MeasurementOption
}

// Error types of the sessions whose stream was cut: errStreamBroken, the
// upstream's stream broke or ended before [DONE]; errStreamMalformed, a 200
// text/event-stream held no OpenAI chunk; errUpstreamIdleTimeout, the
// upstream sent nothing for stream_idle_timeout.
const (
	errStreamBroken        = "upstream_stream_broken"
	errStreamMalformed     = "upstream_stream_malformed"
	errUpstreamIdleTimeout = "upstream_idle_timeout"
)

// errProxyShutdown is the cause the drain cancels the streams still running
// with when drain_timeout is over (cutShutdown).
var errProxyShutdown = errors.New("proxy: drain_timeout over, stream cut at shutdown")

var (
	cutBroken = streamCut{
		errorType: errStreamBroken, eventType: errStreamBroken, code: http.StatusBadGateway,
		message: "the upstream's stream broke or ended before [DONE]; the answer is incomplete",
		reason:  cutReason("broken"),
	}
	cutMalformed = streamCut{
		errorType: errStreamMalformed, eventType: errStreamMalformed, code: http.StatusBadGateway,
		message: "the upstream answered 200 text/event-stream without an OpenAI chunk in it",
		reason:  cutReason("malformed"),
	}
	cutIdleTimeout = streamCut{
		errorType: errUpstreamIdleTimeout, eventType: errUpstreamIdleTimeout, code: http.StatusGatewayTimeout,
		message: "the upstream sent nothing for proxy::upstream::stream_idle_timeout; the stream was cut and the answer is incomplete",
		reason:  cutReason("idle_timeout"),
	}
	cutShutdown = streamCut{
		errorType: tokenevent.ErrorShutdown, eventType: errShuttingDown, code: http.StatusServiceUnavailable,
		message: "the proxy is shutting down and its drain_timeout is over; the stream was cut and the answer is incomplete; retry",
		reason:  cutReason("shutdown"),
	}
)

func cutReason(r string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", r)))
}

// event is the error event the client gets: data is an OpenAI error object,
// as vLLM's error event and the proxy's own error answers have it.
func (c *streamCut) event() []byte {
	var e proxyError
	e.Error.Message, e.Error.Type, e.Error.Code = c.message, c.eventType, c.code
	body, _ := json.Marshal(&e)
	return append(append([]byte("data: "), body...), "\n\n"...)
}

// relayEnd is what relayStream saw of a stream when its reads ended.
type relayEnd struct {
	// done: the upstream sent [DONE], the generation is whole.
	done bool
	// chunkRead: an event was an OpenAI chunk (or too large to be read).
	chunkRead bool
	// clientGone: a write to the client failed; wrote: a write was made.
	clientGone, wrote bool
	// readErr is the read's error, io.EOF left out.
	readErr error
}

// count counts the cut, its error event gone to the client.
func (c *streamCut) count(counters *Counters) {
	if c.reason == nil {
		counters.StalledStreams.Add(context.Background(), 1)
		return
	}
	counters.CutStreams.Add(context.Background(), 1, c.reason)
}

// eventEnd ends an event whose pieces were relayed, when a cut comes
// within it: a line end and a blank line whatever the piece ended with (a
// CR the next LF completes, an LF, part of a line).
var eventEnd = []byte("\n\n")

// abortResponse ends the handler without ending its response: net/http
// closes the HTTP/1.1 connection without the last chunk, and resets the
// HTTP/2 stream, so that the client sees the response was cut.
// http.ErrAbortHandler is net/http's way (httputil.ReverseProxy's too),
// logged by no one.
func abortResponse() {
	panic(http.ErrAbortHandler)
}
