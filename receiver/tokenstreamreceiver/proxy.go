package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/internal/httpserve"
	"github.com/otelcol-llm/otelcol-llm/internal/openaistream"
	"github.com/otelcol-llm/otelcol-llm/internal/sse"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"
)

// Paths the proxy observes; everything else is passed through untouched.
var observedPaths = map[string]string{
	"/v1/chat/completions": tokenevent.OperationChat,
	"/v1/completions":      tokenevent.OperationTextCompletion,
}

// Error types of sessions the proxy ends in error.
const (
	errUpstreamUnreachable = "upstream_unreachable"
	errUpstreamTimeout     = "upstream_timeout"
	errUpstreamIdleTimeout = "upstream_idle_timeout"
	// errBodyTooLarge and errBodyTimeout are the client's fault: the proxy
	// answers 413 or 408 and opens no session, so that the engine's error
	// rate does not carry them.
	errBodyTooLarge = "request_too_large"
	errBodyTimeout  = "request_timeout"
	errStreamBroken = "upstream_stream_broken"
	// errTooManyStreams and errShuttingDown are the proxy's own 503s: no
	// session, the engine is not blamed.
	errTooManyStreams = "too_many_streams"
	errShuttingDown   = "shutting_down"
	finishReasonAbort = "abort"
	// maxNonStreamingBody bounds the copy of a non-streaming response kept
	// to read its usage; the response itself always reaches the client.
	maxNonStreamingBody = 1 << 20
	// sseReadBuffer is the read size from the upstream stream: a few events
	// (a vLLM chunk is ~250 bytes) per read, and little memory per open
	// stream (it is held for the stream's length). An event larger than
	// one read is joined by the SSE parser.
	sseReadBuffer = 2 << 10
)

// proxyServer is a reverse proxy in front of an OpenAI-compatible server
// that turns every completions request into a session.
type proxyServer struct {
	r           *tokenStreamReceiver
	upstream    *url.URL
	engine      string
	client      *http.Client
	passthrough *httputil.ReverseProxy
	batch       *eventBatcher
	// bodyTimeout and sendTimeout bound each read of the client's body and
	// each write to the client (0: unbounded).
	bodyTimeout, sendTimeout time.Duration
	drainTimeout             time.Duration
	maxStreams               int64
	streams                  atomic.Int64 // observed requests open
	// handlers counts the requests being served, pass-through ones too:
	// Shutdown waits for them after it cut the streams.
	handlers sync.WaitGroup
	// draining is closed when Shutdown begins: new observed requests get
	// 503. cut is cancelled when drain_timeout is over, ending the streams
	// still running as shutdown sessions.
	draining  chan struct{}
	drainOnce sync.Once
	cut       context.Context
	cutAll    context.CancelCauseFunc
	httpserve.Server
}

func startProxy(ctx context.Context, cfg *ProxyConfig, r *tokenStreamReceiver, host component.Host) (*proxyServer, error) {
	upstream, err := url.Parse(cfg.Upstream.ClientConfig.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("proxy::upstream::endpoint: %w", err)
	}
	if cfg.Upstream.ClientConfig.Timeout > 0 {
		r.logsLogger.Warn("proxy::upstream::timeout is deprecated and now bounds only the wait for response headers; use proxy::upstream::response_header_timeout")
	}
	clientCfg := cfg.Upstream.ClientConfig
	// http.Client.Timeout would cut every stream longer than it: the
	// proxy's bounds are the transport's (boundedTransport).
	clientCfg.Timeout = 0
	client, err := proxyconn.UpstreamClient(ctx, clientCfg, host, r.settings.TelemetrySettings)
	if err != nil {
		return nil, fmt.Errorf("proxy::upstream: %w", err)
	}
	client.Transport = &boundedTransport{base: client.Transport, header: cfg.Upstream.headerTimeout(), idle: cfg.Upstream.StreamIdleTimeout}
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{
		ReceiverID: r.settings.ID, Transport: "proxy", ReceiverCreateSettings: r.settings,
	})
	if err != nil {
		return nil, err
	}
	p := &proxyServer{
		r: r, upstream: upstream, engine: engineName(upstream), client: client,
		bodyTimeout: cfg.ClientBodyTimeout, sendTimeout: cfg.ClientSendTimeout,
		drainTimeout: cfg.DrainTimeout, maxStreams: int64(cfg.MaxStreams), draining: make(chan struct{}),
	}
	p.cut, p.cutAll = context.WithCancelCause(context.Background())
	p.passthrough = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// ReverseProxy has dropped the hop-by-hop fields and the
			// forwarding ones; Host is the upstream's, as on the observed paths.
			pr.SetURL(upstream)
			setForwardingFields(pr.Out.Header, pr.In)
		},
		Transport:     client.Transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			r.logsLogger.Debug("proxy: pass-through request failed", zap.String("upstream", upstream.Redacted()), zap.Error(err))
			if errors.Is(err, errHeaderTimeout) {
				r.telemetry.ReceiverTokenStreamProxyPassthroughFailures.Add(req.Context(), 1, passthroughTimeout)
				writeProxyError(w, http.StatusGatewayTimeout, errUpstreamTimeout)
				return
			}
			r.telemetry.ReceiverTokenStreamProxyPassthroughFailures.Add(req.Context(), 1, passthroughUnreachable)
			writeProxyError(w, http.StatusBadGateway, errUpstreamUnreachable)
		},
	}
	p.batch = newEventBatcher(r, obs, cfg.EventQueueSize)
	if err := p.Serve(ctx, &cfg.ServerConfig, p, host, r.settings.TelemetrySettings, proxyconn.Listener); err != nil {
		p.batch.shutdown()
		return nil, fmt.Errorf("proxy: %w", err)
	}
	r.logsLogger.Info("Token stream proxy listening", zap.String("endpoint", p.Addr.String()), zap.String("upstream", upstream.Redacted()))
	return p, nil
}

// shutdown drains the proxy: the listener closes at once, running streams
// may finish within drain_timeout (or ctx, if it ends first), and those
// still running then are cut, their sessions ended as shutdown. The
// collector calls it on a reload as on a stop, so a reload refuses new
// connections for at most that long.
func (p *proxyServer) shutdown(ctx context.Context) error {
	p.drainOnce.Do(func() { close(p.draining) })
	drainCtx, cancel := context.WithTimeout(ctx, p.drainTimeout)
	err := p.HTTP.Shutdown(drainCtx)
	cancel()
	if err != nil {
		// Streams outlived the drain: end them, give their handlers a
		// moment to send the end event and close the response, then close
		// the connections of any still blocked on a write.
		p.cutAll(errProxyShutdown)
		if !waitGroupWithin(&p.handlers, ctx, shutdownGrace) {
			_ = p.HTTP.Close()
		}
		err = nil
		if ctx.Err() != nil {
			err = ctx.Err()
		}
	}
	p.handlers.Wait()
	p.Wait()
	p.cutAll(nil)
	p.batch.shutdown()
	return err
}

// shutdownGrace is how long cut streams get to end before their
// connections are closed.
const shutdownGrace = time.Second

// waitGroupWithin waits for wg, at most d or until ctx ends; it reports
// whether wg was done.
func waitGroupWithin(wg *sync.WaitGroup, ctx context.Context, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

var errProxyShutdown = errors.New("proxy: drain_timeout over, stream cut at shutdown")

func (p *proxyServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	p.handlers.Add(1)
	defer p.handlers.Done()
	op, ok := observedPaths[req.URL.Path]
	if !ok || req.Method != http.MethodPost {
		p.passthrough.ServeHTTP(w, req)
		return
	}
	select {
	case <-p.draining:
		// A request on a connection kept alive since before the drain.
		w.Header().Set("Connection", "close")
		writeProxyError(w, http.StatusServiceUnavailable, errShuttingDown)
		p.r.telemetry.ReceiverTokenStreamProxyRefusedRequests.Add(req.Context(), 1, refusalShutdown)
		return
	default:
	}
	if n := p.streams.Add(1); p.maxStreams > 0 && n > p.maxStreams {
		p.streams.Add(-1)
		writeProxyError(w, http.StatusServiceUnavailable, errTooManyStreams)
		p.r.telemetry.ReceiverTokenStreamProxyRefusedRequests.Add(req.Context(), 1, refusalMaxStreams)
		return
	}
	defer p.streams.Add(-1)
	p.observe(w, req, op)
}

// proxySession is one observed request.
type proxySession struct {
	p       *proxyServer
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
	// timing is the engine's per-request metrics, when it sent them
	// (hasTiming).
	timing    openaistream.RequestTiming
	hasTiming bool
	// responseModel is the model the first chunk named; modelRead is set
	// once that chunk was read.
	responseModel string
	modelRead     bool
	// send bounds the writes to the client; nil: unbounded.
	send *sendDeadline
}

func (s *proxySession) emit(kind tokenevent.Kind, at time.Time, fill func(*tokenevent.Event)) {
	s.ev.Reset()
	s.ev.Kind, s.ev.SessionID, s.ev.TimeUnixNano = kind, s.id, uint64(at.UnixNano())
	if fill != nil {
		fill(&s.ev)
	}
	s.p.batch.add(&s.ev)
}

func (s *proxySession) token(at time.Time) {
	s.chunks++
	s.emit(tokenevent.KindToken, at, nil)
}

func (s *proxySession) end(at time.Time, errorType, finishReason string) {
	s.emit(tokenevent.KindEnd, at, func(ev *tokenevent.Event) {
		ev.Error, ev.FinishReason = errorType, finishReason
		if s.completionTokens >= 0 {
			ev.CompletionTokens = s.completionTokens
		} else if s.chunks > 0 {
			ev.CompletionTokens = s.chunks
		}
		ev.PromptTokens = s.promptTokens
		ev.ResponseModel = s.responseModel
		if t := s.timing; s.hasTiming {
			ev.QueueTimeNs, ev.PrefillTimeNs, ev.DecodeTimeNs = msToNs(t.QueueMs), msToNs(t.PrefillMs), msToNs(t.DecodeMs)
			ev.TimingSource = tokenevent.TimingResponse
		}
	})
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
func (s *proxySession) read(f *openaistream.ChunkFacts, data []byte) {
	if !s.modelRead {
		s.modelRead = true
		s.responseModel = openaistream.ResponseModel(data)
	}
	if f.Timing.Known() {
		s.timing, s.hasTiming = f.Timing, true
	}
}

func (p *proxyServer) observe(w http.ResponseWriter, req *http.Request, op string) {
	s := &proxySession{p: p, id: newSessionID(), started: time.Now(), completionTokens: -1, promptTokens: -1}
	traceID, parentSpanID, traceState := parseTraceContext(req.Header)
	var spanID pcommon.SpanID
	_, _ = rand.Read(spanID[:])

	// The body streams to the upstream through the scanner.
	rc := http.NewResponseController(w)
	limited := &bodyLimitReader{r: req.Body, rc: rc, timeout: p.bodyTimeout}
	if p.sendTimeout > 0 {
		s.send = &sendDeadline{rc: rc, timeout: p.sendTimeout}
		defer s.send.clear()
	}
	body := openaistream.NewScannedBody(limited)
	// The upstream exchange ends with the client's request or when the
	// drain is over.
	ctx, cancel := context.WithCancelCause(req.Context())
	defer cancel(nil)
	defer context.AfterFunc(p.cut, func() { cancel(context.Cause(p.cut)) })()
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, p.upstreamURL(req.URL), body)
	if err != nil {
		writeProxyError(w, http.StatusBadRequest, "invalid_request")
		return
	}
	out.Header = forwardedRequestHeader(req)
	out.Header["Traceparent"] = []string{traceparent(traceID, spanID)}
	if traceState != "" {
		out.Header.Set("tracestate", traceState)
	}
	resp, err := p.client.Do(out)
	model, stream, injected := body.Stop()
	if limited.timedOut.Load() {
		if err == nil {
			resp.Body.Close()
		}
		// The rest of the body will not come: the connection cannot be
		// reused.
		w.Header().Set("Connection", "close")
		writeProxyError(w, http.StatusRequestTimeout, errBodyTimeout)
		p.r.telemetry.ReceiverTokenStreamProxyRefusedRequests.Add(req.Context(), 1, refusalBodyTimeout)
		return
	}
	if limit := limited.exceeded.Load(); limit > 0 {
		// Whatever the upstream made of the cut body, the request was the
		// client's error.
		if err == nil {
			resp.Body.Close()
		}
		writeProxyError(w, http.StatusRequestEntityTooLarge, errBodyTooLarge)
		p.r.telemetry.ReceiverTokenStreamProxyRefusedRequests.Add(req.Context(), 1, refusalBodyTooLarge)
		p.r.logsLogger.Debug("proxy: request body over max_request_body_size", zap.Int64("limit", limit))
		return
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
		// A request answered whole (or, failing, that did not ask for a
		// stream) has one response: no first token or gaps to time.
		ev.NoStream = !stream
		// The caller's tracestate (rv, th) takes part in the sampling; one
		// the wire would reject is left out rather than losing the start.
		if tokenevent.CheckTraceState(traceState) == nil {
			ev.TraceState = traceState
		}
	})
	if err != nil {
		if context.Cause(ctx) == errProxyShutdown {
			writeProxyError(w, http.StatusServiceUnavailable, errShuttingDown)
			s.end(time.Now(), tokenevent.ErrorShutdown, "")
			return
		}
		if req.Context().Err() != nil {
			s.end(time.Now(), "", finishReasonAbort)
			return
		}
		p.r.logsLogger.Debug("proxy: upstream request failed", zap.String("upstream", p.upstream.Redacted()), zap.Error(err))
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			writeProxyError(w, http.StatusGatewayTimeout, errUpstreamTimeout)
			s.end(time.Now(), errUpstreamTimeout, "")
			return
		}
		writeProxyError(w, http.StatusBadGateway, errUpstreamUnreachable)
		s.end(time.Now(), errUpstreamUnreachable, "")
		return
	}
	defer resp.Body.Close()

	h := w.Header()
	copyResponseHeader(h, resp.Header)
	if streaming && injected {
		h.Del("Content-Length") // the usage chunk is taken out
	}
	w.WriteHeader(resp.StatusCode)
	switch {
	case resp.StatusCode != http.StatusOK:
		_, _ = io.Copy(armedWriter{w, s.send}, resp.Body)
		s.end(time.Now(), strconv.Itoa(resp.StatusCode), "")
	case streaming:
		s.relayStream(w, ctx, resp.Body, injected)
	default:
		s.relayResponse(w, ctx, resp.Body)
	}
}

// relayStream forwards the upstream's events to the client as they come,
// observing each. The events of one read from the upstream go out in one
// flush: they were all there at once, and a flush is a system call (its
// cost is most of the proxy's per event).
func (s *proxySession) relayStream(w http.ResponseWriter, clientCtx context.Context, upstream io.Reader, strip bool) {
	flusher, _ := w.(http.Flusher)
	parser := sse.NewParser(0)
	buf := make([]byte, sseReadBuffer)
	clientGone := false
	// finished: the upstream sent [DONE], so the generation is whole. A
	// client that closes the stream after that (many stop reading at
	// [DONE]) did not abort anything.
	finished := false
	var now time.Time // when the read holding the event returned
	unflushed := false
	oversized := int64(0)
	onEvent := func(ev *sse.Event) error {
		if ev.Oversized && !ev.Partial {
			oversized++
		}
		if ev.HasData && !ev.Oversized {
			if openaistream.IsDone(ev.Data) {
				finished = true
			} else if f, ok := openaistream.InspectChunk(ev.Data); ok {
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
					s.token(now)
				}
				if strip && f.UsageOnly {
					return nil
				}
			}
		}
		if _, err := w.Write(ev.Raw); err != nil {
			clientGone = true
			return err
		}
		unflushed = true
		return nil
	}
	var readErr error
	for {
		n, err := upstream.Read(buf)
		if n > 0 {
			now = time.Now()
			s.send.arm(now)
			if ferr := parser.Feed(buf[:n], onEvent); ferr != nil {
				break
			}
			if unflushed && flusher != nil {
				flusher.Flush()
			}
			unflushed = false
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				readErr = err
			}
			if rest := parser.Pending(); len(rest) > 0 && !clientGone {
				_, _ = w.Write(rest)
			}
			break
		}
	}
	now = time.Now()
	if oversized > 0 {
		s.p.r.telemetry.ReceiverTokenStreamProxyOversizedEvents.Add(context.Background(), oversized)
	}
	switch {
	case s.engineError != "":
		// vLLM ends a failed generation with [DONE] all the same.
		s.end(now, s.engineError, s.finishReason)
	case finished:
		s.end(now, "", s.finishReason)
	case context.Cause(clientCtx) == errProxyShutdown:
		s.end(now, tokenevent.ErrorShutdown, s.finishReason)
	case clientGone || clientCtx.Err() != nil:
		s.end(now, "", finishReasonAbort)
	case errors.Is(readErr, errIdleTimeout):
		s.end(now, errUpstreamIdleTimeout, s.finishReason)
	case readErr != nil:
		s.end(now, errStreamBroken, s.finishReason)
	default:
		s.end(now, "", s.finishReason)
	}
}

// relayResponse forwards a non-streaming response: its first token is the
// whole response, its tokens come from usage.
func (s *proxySession) relayResponse(w http.ResponseWriter, clientCtx context.Context, upstream io.Reader) {
	var kept limitedBuffer
	kept.limit = maxNonStreamingBody
	_, err := io.Copy(io.MultiWriter(armedWriter{w, s.send}, &kept), upstream)
	now := time.Now()
	if err != nil {
		switch {
		case context.Cause(clientCtx) == errProxyShutdown:
			s.end(now, tokenevent.ErrorShutdown, "")
		case clientCtx.Err() != nil:
			s.end(now, "", finishReasonAbort)
		case errors.Is(err, errIdleTimeout):
			s.end(now, errUpstreamIdleTimeout, "")
		default:
			s.end(now, errStreamBroken, "")
		}
		return
	}
	if f, ok := openaistream.InspectChunk(kept.b); ok {
		s.read(&f, kept.b)
		s.completionTokens, s.promptTokens, s.finishReason = f.CompletionTokens, f.PromptTokens, f.FinishReason
		if f.ErrorType != "" {
			s.end(now, f.ErrorType, "")
			return
		}
	}
	// One token event for the whole response; its count is capped as the
	// wire's is (the end's completion_tokens carries the true total).
	count := min(max(s.completionTokens, 1), tokenevent.MaxCount)
	s.chunks = count
	s.emit(tokenevent.KindToken, now, func(ev *tokenevent.Event) { ev.Count = count })
	s.end(now, "", s.finishReason)
}

// limitedBuffer keeps the first limit bytes written to it.
type limitedBuffer struct {
	b     []byte
	limit int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.limit - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (p *proxyServer) upstreamURL(in *url.URL) string {
	u := *p.upstream
	u.Path = strings.TrimSuffix(p.upstream.Path, "/") + in.Path
	u.RawQuery = in.RawQuery
	return u.String()
}

// The header policy of both paths (RFC 9110, section 7.6.1): the
// hop-by-hop fields, those the Connection field names and
// Proxy-Authorization (the proxy's own credentials, were it to ask for any)
// are not forwarded, either way. Upstream, the client's address is appended
// to X-Forwarded-For, X-Forwarded-Host and X-Forwarded-Proto say what the
// client asked for, and Host is the upstream's (as nginx's proxy_pass does:
// an upstream behind a virtual host or TLS needs its own name). Forwarded
// is dropped rather than left unchecked: the X-Forwarded-* fields say the
// same, from the proxy.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// notForwarded are the request fields the proxy sets itself: the
// forwarding fields on both paths (setForwardingFields); on the observed
// paths (observedOnly) also the body's length (the usage member may be
// added), Accept-Encoding (the proxy reads the stream, so the transport
// negotiates its own compression) and the trace context (the upstream's
// parent is the session span).
var notForwarded = map[string]bool{
	"Forwarded": true, "X-Forwarded-For": true, "X-Forwarded-Host": true, "X-Forwarded-Proto": true,
}

var observedOnly = map[string]bool{
	"Content-Length": true, "Accept-Encoding": true, "Traceparent": true, "Tracestate": true,
}

// connectionNamed is the set of fields in's Connection field names.
func connectionNamed(h http.Header) map[string]bool {
	var named map[string]bool
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				if named == nil {
					named = map[string]bool{}
				}
				named[textproto.CanonicalMIMEHeaderKey(f)] = true
			}
		}
	}
	return named
}

// forwardedRequestHeader is the header of the upstream request made for
// in on an observed path: what httputil.ReverseProxy does on the others.
func forwardedRequestHeader(in *http.Request) http.Header {
	named := connectionNamed(in.Header)
	out := make(http.Header, len(in.Header)+3)
	for k, vs := range in.Header {
		if hopHeaders[k] || named[k] || notForwarded[k] || observedOnly[k] {
			continue
		}
		out[k] = append([]string(nil), vs...)
	}
	setForwardingFields(out, in)
	return out
}

// setForwardingFields sets the X-Forwarded-* fields of the upstream
// request made for in, on both paths.
func setForwardingFields(out http.Header, in *http.Request) {
	out.Del("Forwarded")
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := in.Header["X-Forwarded-For"]; len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		out["X-Forwarded-For"] = []string{ip}
	} else {
		out.Del("X-Forwarded-For")
	}
	out["X-Forwarded-Host"] = []string{in.Host}
	proto := "http"
	if in.TLS != nil {
		proto = "https"
	}
	out["X-Forwarded-Proto"] = []string{proto}
}

// copyResponseHeader copies the upstream's response fields but the
// hop-by-hop ones, which were about the upstream's connection.
func copyResponseHeader(dst, src http.Header) {
	named := connectionNamed(src)
	for k, vs := range src {
		if !hopHeaders[k] && !named[k] {
			dst[k] = vs
		}
	}
}

// parseTraceContext reads a W3C traceparent: the caller's trace and span
// become the session's trace and parent. Without a valid one, a new trace
// starts.
func parseTraceContext(h http.Header) (trace pcommon.TraceID, parent pcommon.SpanID, state string) {
	tp := h.Get("traceparent")
	// version-traceid-parentid-flags: 2+1+32+1+16+1+2
	if len(tp) >= 55 && tp[2] == '-' && tp[35] == '-' && tp[52] == '-' && tp[:2] != "ff" {
		_, err1 := hex.Decode(trace[:], []byte(tp[3:35]))
		_, err2 := hex.Decode(parent[:], []byte(tp[36:52]))
		if err1 == nil && err2 == nil && !trace.IsEmpty() && !parent.IsEmpty() {
			// Several tracestate fields are one list (W3C Trace Context).
			return trace, parent, strings.Join(h.Values("tracestate"), ",")
		}
	}
	_, _ = rand.Read(trace[:])
	return trace, pcommon.SpanID{}, ""
}

// traceparent is the W3C header naming span as the parent, sampled.
func traceparent(trace pcommon.TraceID, span pcommon.SpanID) string {
	var b [55]byte
	copy(b[:], "00-")
	hex.Encode(b[3:35], trace[:])
	b[35] = '-'
	hex.Encode(b[36:52], span[:])
	copy(b[52:], "-01")
	return string(b[:])
}

func newSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "proxy-" + hex.EncodeToString(b[:])
}

// proxyError is the body of an answer the proxy gives itself, in the shape
// of OpenAI's (and vLLM's) error responses, so that clients' SDKs read it.
type proxyError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// bodyLimitReader notes that the client's body went over
// max_request_body_size (confighttp's MaxBytesReader ends it with an error
// the transport reports as its own failure).
//
// It also bounds each wait for the client's next bytes with a read
// deadline on the client's connection, cleared once the body is read.
type bodyLimitReader struct {
	r        io.Reader
	rc       *http.ResponseController
	timeout  time.Duration
	exceeded atomic.Int64 // the limit, once it was hit
	timedOut atomic.Bool
}

func (b *bodyLimitReader) Read(p []byte) (int, error) {
	if b.timeout > 0 {
		if b.rc.SetReadDeadline(time.Now().Add(b.timeout)) != nil {
			b.timeout = 0 // not supported by this connection
		}
	}
	n, err := b.r.Read(p)
	if err == nil {
		return n, nil
	}
	if b.timeout > 0 && errors.Is(err, io.EOF) {
		// Whole: the connection's reads are the server's again. (After a
		// timeout the deadline stays, so that the server gives up on the
		// rest of the body too.)
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		b.exceeded.Store(max(mbe.Limit, 1))
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		b.timedOut.Store(true)
	}
	return n, err
}

// sendDeadline bounds the writes to the client with a write deadline on
// its connection, armed before each batch of writes.
type sendDeadline struct {
	rc       *http.ResponseController
	timeout  time.Duration
	deadline time.Time // the deadline set last
	off      bool      // the connection does not support deadlines
}

// deadlineSlack is how much further than timeout a deadline is set, as a
// fraction of it. Setting one is a timer update through the response
// writer's wrappers, 5% of the proxy's CPU when done before every event;
// with the slack, it is re-set at most every timeout/16, and each write
// gets between timeout and 1/16 more.
const deadlineSlack = 16

// arm makes sure the writes that follow have at least timeout to finish.
func (d *sendDeadline) arm(now time.Time) {
	if d == nil || d.off || d.deadline.Sub(now) >= d.timeout {
		return
	}
	d.deadline = now.Add(d.timeout + d.timeout/deadlineSlack)
	if d.rc.SetWriteDeadline(d.deadline) != nil {
		d.off = true
	}
}

func (d *sendDeadline) clear() {
	if d != nil && !d.off {
		_ = d.rc.SetWriteDeadline(time.Time{})
	}
}

// armedWriter arms the send deadline before each write.
type armedWriter struct {
	w    io.Writer
	send *sendDeadline
}

func (a armedWriter) Write(p []byte) (int, error) {
	a.send.arm(time.Now())
	return a.w.Write(p)
}

var (
	passthroughUnreachable = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "unreachable")))
	passthroughTimeout     = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "timeout")))
)

var refusalBodyTimeout = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "body_timeout")))

var refusalBodyTooLarge = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "body_too_large")))

var (
	refusalMaxStreams = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "max_streams")))
	refusalShutdown   = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "shutdown")))
)

var proxyErrorMessages = map[string]string{
	errBodyTooLarge:        "the request body is larger than the proxy's max_request_body_size",
	errBodyTimeout:         "the request body stalled for longer than the proxy's client_body_timeout",
	errUpstreamTimeout:     "the upstream sent no response headers in time",
	errUpstreamUnreachable: "the upstream could not be reached",
	errTooManyStreams:      "the proxy has proxy::max_streams requests open; retry later",
	errShuttingDown:        "the proxy is shutting down; retry",
}

func writeProxyError(w http.ResponseWriter, status int, errType string) {
	var e proxyError
	e.Error.Message, e.Error.Type, e.Error.Code = proxyErrorMessages[errType], errType, status
	if e.Error.Message == "" {
		e.Error.Message = http.StatusText(status)
	}
	body, _ := json.Marshal(&e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// timeoutError is the error of a bound the proxy put on the upstream.
type timeoutError string

func (e timeoutError) Error() string { return string(e) }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

var (
	errHeaderTimeout = timeoutError("proxy: no response headers from the upstream within proxy::upstream::response_header_timeout")
	errIdleTimeout   = timeoutError("proxy: upstream idle longer than proxy::upstream::stream_idle_timeout")
)

// boundedTransport puts the proxy's time bounds on every upstream exchange,
// on both paths: header bounds the wait for the response headers once the
// request is written, idle each
// wait for the body's next bytes. Nothing bounds a stream's length, and the
// time the proxy spends writing to a slow client is not the upstream's.
type boundedTransport struct {
	base   http.RoundTripper
	header time.Duration
	idle   time.Duration
}

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	// As http.Transport's ResponseHeaderTimeout, the wait starts once the
	// request is written: a slow upload is the client's, not the upstream's.
	var fired atomic.Bool
	timer := time.AfterFunc(time.Hour, func() {
		fired.Store(true)
		cancel(errHeaderTimeout)
	})
	timer.Stop()
	// The body may still be being written after the response came: then
	// the timer must not start any more.
	var mu sync.Mutex
	answered := false
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) {
			mu.Lock()
			if !answered {
				timer.Reset(t.header)
			}
			mu.Unlock()
		},
	})
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	mu.Lock()
	answered = true
	timer.Stop()
	mu.Unlock()
	if fired.Load() {
		if err == nil {
			resp.Body.Close()
		}
		cancel(nil)
		return nil, errHeaderTimeout
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	b := &idleBoundedBody{rc: resp.Body, ctx: ctx, cancel: cancel, idle: t.idle}
	if t.idle > 0 {
		b.timer = time.AfterFunc(time.Hour, func() { cancel(errIdleTimeout) })
		b.timer.Stop()
	}
	resp.Body = b
	return resp, nil
}

// idleBoundedBody is an upstream body whose every Read must bring bytes
// within idle; the exchange's context ends when it is closed.
type idleBoundedBody struct {
	rc     io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   time.Duration
	timer  *time.Timer
}

func (b *idleBoundedBody) Read(p []byte) (int, error) {
	if b.timer == nil {
		return b.rc.Read(p)
	}
	b.timer.Reset(b.idle)
	n, err := b.rc.Read(p)
	b.timer.Stop()
	if err != nil && !errors.Is(err, io.EOF) && context.Cause(b.ctx) == errIdleTimeout {
		err = errIdleTimeout
	}
	return n, err
}

func (b *idleBoundedBody) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	err := b.rc.Close()
	b.cancel(nil)
	return err
}
