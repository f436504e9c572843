// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"
)

// HeaderAttribute copies a request header (canonical name) into the
// start's attributes under Attribute, when the request has it.
type HeaderAttribute struct {
	Header, Attribute string
}

// observedServer serves the observed paths: what an observed request needs of
// its Server.
type observedServer struct {
	offServer
	log      *zap.Logger
	upstream *url.URL
	engine   string
	// headerAttributes are copied from each request into its start.
	headerAttributes []HeaderAttribute
	client           *http.Client
	// direct is the observed paths' own client when the upstream allows it
	// (directEligible); nil: they go through client.
	direct *directUpstream
	// bodyTimeout and sendTimeout bound each read of the client's body and
	// each write to the client (0: unbounded).
	bodyTimeout, sendTimeout time.Duration
	// stallMaxGap and stallMinTokens are the stall breaker's (stallBreaker);
	// a zero stallMaxGap turns it off.
	stallMaxGap    time.Duration
	stallMinTokens int64
	// migrate continues failing streams elsewhere; nil: off.
	migrate *migrator
	// cut is cancelled when drain_timeout is over, ending the streams still
	// running as shutdown sessions.
	cut context.Context
}

// observe serves an observed request; relayed: its streamed answer is
// being relayed off net/http by a goroutine of its own (relayOffServer),
// which ends the stream.
func (p *observedServer) observe(w http.ResponseWriter, req *http.Request, op string) (relayed bool) {
	breakerWanted, err := stallBreakerWanted(req.Header)
	if err != nil {
		writeProxyError(w, http.StatusBadRequest, errBadStallHeader)
		p.counters.RefusedRequests.Add(req.Context(), 1, refusalInvalidHeader)
		return false
	}
	s := &session{p: &p.shared, id: newSessionID(), started: time.Now(), completionTokens: -1, promptTokens: -1}
	traceID, parentSpanID, traceState := parseTraceContext(req.Header)
	var spanID pcommon.SpanID
	_, _ = rand.Read(spanID[:])

	// The body streams to the upstream through the scanner.
	rc := http.NewResponseController(w)
	limited := &bodyLimitReader{r: req.Body, rc: rc, timeout: p.bodyTimeout}
	if p.sendTimeout > 0 {
		s.send = &sendDeadline{rc: rc, timeout: p.sendTimeout}
	}
	var src io.Reader = limited
	var reqCopy *requestCopy
	if p.migrate != nil {
		// The request is kept to be sent again, should its stream move.
		reqCopy = &requestCopy{r: limited, limit: p.migrate.cfg.MaxRequestBytes}
		src = reqCopy
	}
	body := openaistream.NewScannedBody(src)
	// The upstream exchange ends with the client's request or when the
	// drain is over. Its context is not the request's, which net/http
	// cancels when the handler returns: a stream relayed off net/http
	// outlives the handler, and is cancelled when its client leaves by
	// the hang-up watcher instead.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(req.Context()))
	stopClientWatch := context.AfterFunc(req.Context(), func() { cancel(context.Cause(req.Context())) })
	x := &exchange{cancel: cancel, stopCut: context.AfterFunc(p.cut, func() { cancel(context.Cause(p.cut)) }), send: s.send}
	// upCtx is the upstream request's: the breaker cancels it. With
	// proxy::migrate it is apart from ctx, which the continuations of a
	// moved stream take (migrate.go).
	upCtx, upCancel := ctx, cancel
	if p.migrate != nil {
		upCtx, upCancel = context.WithCancelCause(ctx)
		x.upCancel = upCancel
		s.moves = &moves{m: p.migrate, scope: ctx, copy: reqCopy, path: req.URL, chat: op == tokenevent.OperationChat}
	}
	defer func() {
		if !relayed {
			stopClientWatch()
			x.end(s)
		}
	}()
	if breakerWanted {
		s.breaker = newStallBreaker(p.stallMaxGap, p.stallMinTokens, upCancel)
	}
	// A copy of what is sent is kept while the request may be sent again
	// (retry.go); the client's length tells whether it fits.
	out, err := http.NewRequestWithContext(upCtx, http.MethodPost, p.upstreamURL(req.URL), newReplayBody(body, req.ContentLength)) //nolint:gosec // G704: the upstream is the operator's configured engine, only the path comes from the client
	if err != nil {
		writeProxyError(w, http.StatusBadRequest, "invalid_request")
		return false
	}
	out.Header = forwardedRequestHeader(req)
	out.Header["Traceparent"] = []string{traceparent(traceID, spanID)}
	if traceState != "" {
		out.Header.Set("tracestate", traceState)
	}
	if s.moves != nil {
		s.moves.header = out.Header.Clone()
	}
	var resp *http.Response
	if p.direct != nil {
		resp, err = p.direct.RoundTrip(out)
	} else {
		resp, err = p.client.Do(out) //nolint:gosec // G704: as above, the configured upstream
	}
	model, stream, injected := body.Stop()
	if limited.timedOut.Load() {
		if err == nil {
			resp.Body.Close()
		}
		// The rest of the body will not come: the connection cannot be
		// reused.
		w.Header().Set("Connection", "close")
		writeProxyError(w, http.StatusRequestTimeout, errBodyTimeout)
		p.counters.RefusedRequests.Add(req.Context(), 1, refusalBodyTimeout)
		return false
	}
	if limit := limited.exceeded.Load(); limit > 0 {
		// Whatever the upstream made of the cut body, the request was the
		// client's error.
		if err == nil {
			resp.Body.Close()
		}
		writeProxyError(w, http.StatusRequestEntityTooLarge, errBodyTooLarge)
		p.counters.RefusedRequests.Add(req.Context(), 1, refusalBodyTooLarge)
		p.log.Debug("proxy: request body over max_request_body_size", zap.Int64("limit", limit))
		return false
	}
	// The engine decides what a 200 is: an SSE answer is a stream, any
	// other one response whose tokens all come at once, whatever the
	// request asked. An error answer keeps what the request asked.
	streaming := false
	if err == nil {
		mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		streaming = mediaType == "text/event-stream" && resp.StatusCode == http.StatusOK
		if resp.StatusCode == http.StatusOK {
			stream = streaming
		}
	}
	s.emit(tokenevent.KindStart, s.started, func(ev *tokenevent.Event) {
		ev.TraceID, ev.SpanID, ev.ParentSpanID = tokenevent.TraceID(traceID), tokenevent.SpanID(spanID), tokenevent.SpanID(parentSpanID)
		ev.Model, ev.Operation, ev.Engine = model, op, p.engine
		// The prompt's tokens come with the usage at the end; its size now
		// is what the GPU time's estimate has until then.
		ev.PromptBytes = body.PromptBytes()
		// A request answered whole (or, failing, that did not ask for a
		// stream) has one response: no first token or gaps to time.
		ev.NoStream = !stream
		// The caller's tracestate (rv, th) takes part in the sampling; one
		// the wire would reject is left out rather than losing the start.
		if tokenevent.CheckTraceState(traceState) == nil {
			ev.TraceState = traceState
		}
		for _, h := range p.headerAttributes {
			if v := req.Header.Get(h.Header); v != "" {
				// A header may hold any byte (obs-text); telemetry's
				// strings are UTF-8, as the hooks' are.
				ev.Attributes = append(ev.Attributes, tokenevent.Attribute{Key: h.Attribute, Value: strings.ToValidUTF8(v, "\uFFFD")})
			}
		}
	})
	if err != nil {
		if errors.Is(context.Cause(ctx), errProxyShutdown) {
			writeProxyError(w, http.StatusServiceUnavailable, errShuttingDown)
			s.end(time.Now(), tokenevent.ErrorShutdown, "")
			return false
		}
		if req.Context().Err() != nil {
			s.end(time.Now(), "", finishReasonAbort)
			return false
		}
		p.warn.Warn("proxy: upstream request failed; the client got an error (logged at most once a minute, the session ends with its error.type)",
			zap.String("upstream", p.upstream.Redacted()), zap.Error(err))
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			writeProxyError(w, http.StatusGatewayTimeout, errUpstreamTimeout)
			s.end(time.Now(), errUpstreamTimeout, "")
			return false
		}
		writeProxyError(w, http.StatusBadGateway, errUpstreamUnreachable)
		s.end(time.Now(), errUpstreamUnreachable, "")
		return false
	}
	x.body = resp.Body

	h := w.Header()
	copyResponseHeader(h, resp.Header)
	if streaming {
		// The usage the proxy asked for is taken out, an unfinished
		// event left out and an error event added when the stream is cut
		// (cut.go): the upstream's length is not the client's.
		h.Del("Content-Length")
	}
	w.WriteHeader(resp.StatusCode)
	switch {
	case resp.StatusCode != http.StatusOK:
		_, _ = io.Copy(armedWriter{w, s.send}, resp.Body)
		s.end(time.Now(), strconv.Itoa(resp.StatusCode), "")
	case streaming:
		if p.relayOffServer(upCtx, w, req, limited, s, x, injected, stopClientWatch) {
			return true
		}
		if !s.relayStream(upCtx, w, resp.Body, injected) {
			abortResponse()
		}
	default:
		if !s.relayResponse(upCtx, w, resp.Body) {
			abortResponse()
		}
	}
	return false
}

func (p *observedServer) upstreamURL(in *url.URL) string {
	u := *p.upstream
	u.Path = strings.TrimSuffix(p.upstream.Path, "/") + in.Path
	u.RawQuery = in.RawQuery
	return u.String()
}

var (
	refusalBodyTimeout   = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "body_timeout")))
	refusalBodyTooLarge  = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "body_too_large")))
	refusalInvalidHeader = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "invalid_header")))
)
