package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/internal/httpserve"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/lograte"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/openaistream"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/sse"
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
	// errStreamBroken: the upstream's stream broke or ended before
	// [DONE]; errStreamMalformed: a 200 text/event-stream held no
	// OpenAI chunk (see cut.go).
	errStreamBroken    = "upstream_stream_broken"
	errStreamMalformed = "upstream_stream_malformed"
	// errTooManyStreams and errShuttingDown are the proxy's own 503s: no
	// session, the engine is not blamed.
	errTooManyStreams = "too_many_streams"
	errShuttingDown   = "shutting_down"
	// errBadStallHeader: the request's StallBreakerHeader is neither on nor
	// off; answered 400 before anything reaches the upstream, no session.
	errBadStallHeader = "invalid_request_error"
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

// Config is what the proxy is started with: the receiver's proxy settings,
// resolved (the upstream parsed, the deprecated timeout read as the header
// bound).
type Config struct {
	// Server is where clients connect.
	Server confighttp.ServerConfig
	// Client is the upstream's client; its Timeout is not used (it would
	// cut every stream longer than it): the proxy's bounds are its own.
	Client   confighttp.ClientConfig
	Upstream *url.URL
	// Engine names the upstream on the sessions, as the vllm scraper names
	// the engine it scrapes.
	Engine string
	// ResponseHeaderTimeout bounds the wait for the upstream's response
	// headers once the request is written; StreamIdleTimeout each wait for
	// its next bytes after them (0: unbounded).
	ResponseHeaderTimeout, StreamIdleTimeout time.Duration
	// ClientBodyTimeout and ClientSendTimeout bound each read of the
	// client's body and each write to the client (0: unbounded).
	ClientBodyTimeout, ClientSendTimeout time.Duration
	// DrainTimeout is how long Shutdown lets running streams finish.
	DrainTimeout time.Duration
	// MaxStreams bounds the observed requests open at once (0: no bound);
	// EventQueueSize the token events waiting for the pipeline.
	MaxStreams, EventQueueSize int
	// StallMaxGap is the stall breaker's longest wait for a stream's next
	// token (0: the breaker is off); StallMinTokens the token events a
	// stream relays before the breaker watches it.
	StallMaxGap    time.Duration
	StallMinTokens int64
	// HeaderAttributes are the request headers copied into the start's
	// attributes.
	HeaderAttributes []HeaderAttribute
}

// HeaderAttribute copies a request header (canonical name) into the
// start's attributes under Attribute, when the request has it.
type HeaderAttribute struct {
	Header, Attribute string
}

// Server is a reverse proxy in front of an OpenAI-compatible server that
// turns every completions request into a session.
type Server struct {
	sink     Sink
	counters Counters
	log      *zap.Logger
	// warn logs what a user must see at the default level (the upstream
	// failing) without flooding the log while it lasts.
	warn     *zap.Logger
	upstream *url.URL
	engine   string
	// headerAttributes are copied from each request into its start.
	headerAttributes []HeaderAttribute
	client           *http.Client
	// direct is the observed paths' own client when the upstream allows it
	// (directEligible); nil: they go through client.
	direct      *directUpstream
	passthrough *httputil.ReverseProxy
	batch       *eventBatcher
	// bodyTimeout and sendTimeout bound each read of the client's body and
	// each write to the client (0: unbounded).
	bodyTimeout, sendTimeout time.Duration
	drainTimeout             time.Duration
	maxStreams               int64
	// stallMaxGap and stallMinTokens are the stall breaker's (stallBreaker);
	// a zero stallMaxGap turns it off.
	stallMaxGap    time.Duration
	stallMinTokens int64
	streams        atomic.Int64 // observed requests open
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
	srv       httpserve.Server
	// listener hands the connections of relayed streams back to srv;
	// hangups tells when their clients leave. With no hangups (not Linux),
	// every stream stays on net/http's connection (see hijack.go).
	listener *handbackListener
	hangups  *proxyconn.HangupWatcher
	// relays are the client connections of the streams relayed off
	// net/http, for Shutdown to close when they outlive the drain; kept
	// those handed back to it that have not started their next request.
	relays, kept relayConns
}

// Start starts the proxy on cfg.Server; what it observes goes to sink.
func Start(ctx context.Context, cfg *Config, sink Sink, host component.Host, set component.TelemetrySettings) (*Server, error) {
	clientCfg := cfg.Client
	// http.Client.Timeout would cut every stream longer than it: the
	// proxy's bounds are the transport's (boundedTransport).
	clientCfg.Timeout = 0
	client, err := proxyconn.UpstreamClient(ctx, clientCfg, host, set)
	if err != nil {
		return nil, fmt.Errorf("proxy::upstream: %w", err)
	}
	// The retries' client (retry.go): the same, but a new connection for
	// every request.
	freshCfg := clientCfg
	freshCfg.Keepalive = configoptional.None[confighttp.KeepaliveClientConfig]()
	freshCfg.DisableKeepAlives = true //nolint:staticcheck // what ToClient reads when Keepalive is None
	fresh, err := proxyconn.UpstreamClient(ctx, freshCfg, host, set)
	if err != nil {
		return nil, fmt.Errorf("proxy::upstream: %w", err)
	}
	counters := sink.Counters()
	retries := retryCounter{counters.UpstreamRetries}
	client.Transport = &retryingTransport{
		base:    &boundedTransport{base: client.Transport, header: cfg.ResponseHeaderTimeout, idle: cfg.StreamIdleTimeout},
		fresh:   &boundedTransport{base: fresh.Transport, header: cfg.ResponseHeaderTimeout, idle: cfg.StreamIdleTimeout},
		retries: retries,
	}
	upstream := cfg.Upstream
	p := &Server{
		sink: sink, counters: counters, log: sink.Logger(), warn: lograte.OncePerMinute(sink.Logger()),
		upstream: upstream, engine: cfg.Engine, client: client, headerAttributes: cfg.HeaderAttributes,
		bodyTimeout: cfg.ClientBodyTimeout, sendTimeout: cfg.ClientSendTimeout,
		drainTimeout: cfg.DrainTimeout, maxStreams: int64(cfg.MaxStreams), draining: make(chan struct{}),
		stallMaxGap: cfg.StallMaxGap, stallMinTokens: cfg.StallMinTokens,
	}
	if directEligible(&cfg.Client, upstream) {
		p.direct = newDirectUpstream(&cfg.Client, upstream, cfg.ResponseHeaderTimeout, cfg.StreamIdleTimeout)
		p.direct.retries = retries
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
			p.warn.Warn("proxy: upstream request failed; the client got an error (logged at most once a minute, counted in otelcol_receiver_token_stream_proxy_passthrough_failures)",
				zap.String("upstream", upstream.Redacted()), zap.Error(err))
			if errors.Is(err, errHeaderTimeout) {
				p.counters.PassthroughFailures.Add(req.Context(), 1, passthroughTimeout)
				writeProxyError(w, http.StatusGatewayTimeout, errUpstreamTimeout)
				return
			}
			p.counters.PassthroughFailures.Add(req.Context(), 1, passthroughUnreachable)
			writeProxyError(w, http.StatusBadGateway, errUpstreamUnreachable)
		},
	}
	p.batch = newEventBatcher(sink, p.counters, cfg.EventQueueSize)
	if w, err := proxyconn.NewHangupWatcher(); err == nil {
		p.hangups = w
	} else {
		p.log.Debug("proxy: streams stay on net/http's connections", zap.Error(err))
	}
	wrap := func(ln net.Listener) net.Listener {
		// Called by Serve once it made the server and before it serves:
		// the last moment to watch the connections' states (kept).
		connState := p.srv.HTTP.ConnState
		p.srv.HTTP.ConnState = func(c net.Conn, st http.ConnState) {
			if st != http.StateNew {
				p.kept.remove(c)
			}
			if connState != nil {
				connState(c, st)
			}
		}
		p.listener = newHandbackListener(proxyconn.Listener(ln))
		return p.listener
	}
	if err := p.srv.Serve(ctx, &cfg.Server, p, host, set, wrap); err != nil {
		p.batch.shutdown()
		if p.hangups != nil {
			p.hangups.Close()
		}
		return nil, fmt.Errorf("proxy: %w", err)
	}
	p.log.Info("Token stream proxy listening", zap.String("endpoint", p.srv.Addr.String()), zap.String("upstream", upstream.Redacted()))
	return p, nil
}

// Addr is where the proxy listens.
func (p *Server) Addr() net.Addr { return p.srv.Addr }

// Shutdown drains the proxy: the listener closes at once, running streams
// may finish within drain_timeout (or ctx, if it ends first), and those
// still running then are cut, their sessions ended as shutdown. The
// collector calls it on a reload as on a stop, so a reload refuses new
// connections for at most that long.
func (p *Server) Shutdown(ctx context.Context) error {
	p.drainOnce.Do(func() { close(p.draining) })
	// The connections handed back idle are closed as http.Server closes
	// its idle ones (it would wait 5 s for a new one's first request).
	p.kept.closeAll()
	drainCtx, cancel := context.WithTimeout(ctx, p.drainTimeout)
	err := p.srv.HTTP.Shutdown(drainCtx)
	if err == nil && !waitGroupWithin(drainCtx, &p.handlers, p.drainTimeout) {
		// The streams relayed off net/http's connections, which its
		// Shutdown does not see, outlived the drain. (Not drainCtx's
		// error: the timer may fire before drainCtx is marked done.)
		err = errDrainOver
	}
	cancel()
	if err != nil {
		// Streams outlived the drain: end them, give their handlers a
		// moment to send the end event and close the response, then close
		// the connections of any still blocked on a write.
		p.cutAll(errProxyShutdown)
		if !waitGroupWithin(ctx, &p.handlers, shutdownGrace) {
			_ = p.srv.HTTP.Close()
			p.relays.closeAll()
		}
		err = nil
		if ctx.Err() != nil {
			err = ctx.Err()
		}
	}
	p.handlers.Wait()
	p.srv.Wait()
	if p.hangups != nil {
		p.hangups.Close()
	}
	p.cutAll(nil)
	if p.direct != nil {
		p.direct.pool.close()
	}
	p.batch.shutdown()
	return err
}

var errDrainOver = errors.New("proxy: drain_timeout over with streams running")

// shutdownGrace is how long cut streams get to end before their
// connections are closed.
const shutdownGrace = time.Second

// waitGroupWithin waits for wg, at most d or until ctx ends; it reports
// whether wg was done.
func waitGroupWithin(ctx context.Context, wg *sync.WaitGroup, d time.Duration) bool {
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

func (p *Server) ServeHTTP(w http.ResponseWriter, req *http.Request) {
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
		p.counters.RefusedRequests.Add(req.Context(), 1, refusalShutdown)
		return
	default:
	}
	if n := p.streams.Add(1); p.maxStreams > 0 && n > p.maxStreams {
		p.streams.Add(-1)
		writeProxyError(w, http.StatusServiceUnavailable, errTooManyStreams)
		p.counters.RefusedRequests.Add(req.Context(), 1, refusalMaxStreams)
		return
	}
	relayed := false
	defer func() {
		if !relayed {
			p.streams.Add(-1)
		}
	}()
	// A stream relayed off net/http holds its slot until it ends.
	relayed = p.observe(w, req, op)
}

// session is one observed request.
type session struct {
	p       *Server
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
	s.chunks++
	s.emit(tokenevent.KindToken, at, nil)
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
	if f.Timing.Known() {
		s.timing, s.hasTiming = f.Timing, true
	}
}

// observe serves an observed request; relayed: its streamed answer is
// being relayed off net/http by a goroutine of its own (relayOffServer),
// which ends the stream.
func (p *Server) observe(w http.ResponseWriter, req *http.Request, op string) (relayed bool) {
	breakerWanted, err := stallBreakerWanted(req.Header)
	if err != nil {
		writeProxyError(w, http.StatusBadRequest, errBadStallHeader)
		p.counters.RefusedRequests.Add(req.Context(), 1, refusalInvalidHeader)
		return false
	}
	s := &session{p: p, id: newSessionID(), started: time.Now(), completionTokens: -1, promptTokens: -1}
	traceID, parentSpanID, traceState := parseTraceContext(req.Header)
	var spanID pcommon.SpanID
	_, _ = rand.Read(spanID[:])

	// The body streams to the upstream through the scanner.
	rc := http.NewResponseController(w)
	limited := &bodyLimitReader{r: req.Body, rc: rc, timeout: p.bodyTimeout}
	if p.sendTimeout > 0 {
		s.send = &sendDeadline{rc: rc, timeout: p.sendTimeout}
	}
	body := openaistream.NewScannedBody(limited)
	// The upstream exchange ends with the client's request or when the
	// drain is over. Its context is not the request's, which net/http
	// cancels when the handler returns: a stream relayed off net/http
	// outlives the handler, and is cancelled when its client leaves by
	// the hang-up watcher instead.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(req.Context()))
	stopClientWatch := context.AfterFunc(req.Context(), func() { cancel(context.Cause(req.Context())) })
	x := &exchange{cancel: cancel, stopCut: context.AfterFunc(p.cut, func() { cancel(context.Cause(p.cut)) }), send: s.send}
	defer func() {
		if !relayed {
			stopClientWatch()
			x.end(s)
		}
	}()
	if breakerWanted {
		s.breaker = newStallBreaker(p.stallMaxGap, p.stallMinTokens, cancel)
	}
	// A copy of what is sent is kept while the request may be sent again
	// (retry.go); the client's length tells whether it fits.
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, p.upstreamURL(req.URL), newReplayBody(body, req.ContentLength)) //nolint:gosec // G704: the upstream is the operator's configured engine, only the path comes from the client
	if err != nil {
		writeProxyError(w, http.StatusBadRequest, "invalid_request")
		return false
	}
	out.Header = forwardedRequestHeader(req)
	out.Header["Traceparent"] = []string{traceparent(traceID, spanID)}
	if traceState != "" {
		out.Header.Set("tracestate", traceState)
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
		if p.relayOffServer(ctx, w, req, limited, s, x, injected, stopClientWatch) {
			return true
		}
		if !s.relayStream(ctx, w, resp.Body, injected) {
			abortResponse()
		}
	default:
		if !s.relayResponse(ctx, w, resp.Body) {
			abortResponse()
		}
	}
	return false
}

// exchange is what an observed request holds until its stream ends.
type exchange struct {
	cancel  context.CancelCauseFunc
	stopCut func() bool
	send    *sendDeadline
	body    io.ReadCloser // the upstream's response body, once it came
}

// end releases them: the upstream request is over.
func (x *exchange) end(s *session) {
	if x.body != nil {
		x.body.Close()
	}
	s.breaker.stop()
	x.send.clear()
	x.stopCut()
	x.cancel(nil)
}

// relayOffServer takes the client connection from net/http, the response
// head written, and relays the stream on a goroutine of its own (see
// hijack.go); false: the stream stays on net/http (HTTP/2, TLS, no hang-up
// watcher, or the connection could not be taken).
func (p *Server) relayOffServer(ctx context.Context, w http.ResponseWriter, req *http.Request, body *bodyLimitReader, s *session,
	x *exchange, strip bool, stopClientWatch func() bool,
) bool {
	if p.hangups == nil || req.ProtoMajor != 1 || req.ProtoMinor < 1 || req.TLS != nil {
		// HTTP/1.0 has no chunks; TLS hides the socket from the watcher.
		return false
	}
	rc := http.NewResponseController(w)
	conn, brw, err := rc.Hijack()
	if err != nil {
		return false
	}
	var prefix []byte
	if pc, ok := conn.(*prefixedConn); ok {
		// A connection handed back with a pipelined request: what is left
		// of its bytes comes after those net/http buffered.
		conn, prefix = pc.Conn, pc.prefix
	}
	if _, ok := conn.(syscall.Conn); !ok {
		// Not a socket the watcher can see (a listener of another kind):
		// the head is out, the relay goes on, a client that left is
		// noticed by the next write, and the connection closed after.
		p.relays.add(conn)
		p.handlers.Add(1)
		go p.relayHijacked(ctx, s, x, conn, nil, false, nil, strip)
		stopClientWatch()
		return true
	}
	// The connection is kept alive after the stream when the client asked
	// for it and its request was read whole, as net/http would have.
	keepAlive := !req.Close && body.whole.Load()
	prefix = append(unreadBytes(brw.Reader), prefix...)
	p.relays.add(conn)
	stopHangup, watched := p.hangups.Watch(conn, func() { x.cancel(errClientLeft) })
	if !watched {
		stopHangup = func() {}
	}
	// Until here a client that left cancelled the exchange through the
	// request's context, which ends when the handler returns.
	stopClientWatch()
	if req.Context().Err() != nil {
		x.cancel(context.Cause(req.Context()))
	}
	p.handlers.Add(1)
	go p.relayHijacked(ctx, s, x, conn, prefix, keepAlive, stopHangup, strip)
	return true
}

// errClientLeft is the cause of a relayed stream's end when its client
// closed or reset the connection.
var errClientLeft = errors.New("proxy: the client closed the connection")

// relayHijacked relays a stream to its hijacked client connection, then
// hands the connection back to the server or closes it.
func (p *Server) relayHijacked(ctx context.Context, s *session, x *exchange, conn net.Conn, prefix []byte,
	keepAlive bool, stopHangup func(), strip bool,
) {
	defer p.handlers.Done()
	defer p.streams.Add(-1)
	if s.send != nil {
		s.send = &sendDeadline{rc: conn, timeout: s.send.timeout}
		x.send = s.send
	}
	cw := newChunkedConnWriter(conn, s.send)
	whole := s.relayStream(ctx, cw, x.body, strip)
	if whole {
		whole = cw.finish() == nil
	} else {
		cw.release() // no last chunk: the connection is closed below
	}
	if stopHangup != nil {
		stopHangup()
	}
	clientLeft := errors.Is(context.Cause(ctx), errClientLeft)
	x.end(s)
	p.relays.remove(conn)
	select {
	case <-p.draining:
		keepAlive = false
	default:
	}
	if !whole || !keepAlive || clientLeft || stopHangup == nil {
		conn.Close()
		return
	}
	_ = conn.SetWriteDeadline(time.Time{})
	if len(prefix) > 0 {
		conn = &prefixedConn{Conn: conn, prefix: prefix}
	}
	if p.kept.add(conn) {
		p.listener.handBack(conn)
	}
}

// relayStream forwards the upstream's events to the client as they come,
// observing each. The events of one read from the upstream go out in one
// flush: they were all there at once, and a flush is a system call (its
// cost is most of the proxy's per event). whole: the stream was relayed
// whole, and its response may end; otherwise it must not (see cut.go).
func (s *session) relayStream(clientCtx context.Context, w io.Writer, upstream io.Reader, strip bool) (whole bool) {
	flusher, _ := w.(http.Flusher)
	parser := sse.NewParser(0)
	buf := make([]byte, sseReadBuffer)
	// e.done: the upstream sent [DONE], so the generation is whole. A
	// client that closes the stream after that (many stop reading at
	// [DONE]) did not abort anything.
	var e relayEnd
	// midEvent: the last bytes relayed are a piece of an oversized event.
	midEvent := false
	var now time.Time // when the read holding the event returned
	unflushed := false
	oversized := int64(0)
	// unread: the read brought a piece of an oversized event, whose tokens
	// are not read; the stall breaker takes it, and bytes added to an event
	// still arriving (pending), for a token: the engine is sending.
	unread := false
	// write sends an event to the client: raw, then rest.
	write := func(raw, rest []byte) error {
		_, err := w.Write(raw)
		if err == nil && len(rest) > 0 {
			_, err = w.Write(rest)
		}
		if err != nil {
			e.clientGone = true
			return err
		}
		unflushed = true
		return nil
	}
	// held: the finish chunk, kept back while the proxy waits for the
	// usage chunk it asked for (see heldFinish); release sends it.
	var held heldFinish
	release := func() error {
		if !held.ok {
			return nil
		}
		held.ok = false
		return write(held.raw, nil)
	}
	onEvent := func(ev *sse.Event) error {
		midEvent = ev.Partial
		if ev.Oversized {
			unread = true
			if !ev.Partial {
				oversized++
				e.chunkRead = true
			}
		}
		if ev.HasData && !ev.Oversized {
			if openaistream.IsDone(ev.Data) {
				e.done = true
			} else if f, ok := openaistream.InspectChunk(ev.Data); ok {
				e.chunkRead = true
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
				switch {
				case strip && f.UsageOnly:
					// The usage the proxy asked for is the proxy's; what
					// else the engine put on the chunk is the client's,
					// on the finish chunk where it can (see heldFinish).
					if held.fold(ev) {
						return write(held.folded, nil)
					}
					if err := release(); err != nil {
						return err
					}
					head, tail, keep := withoutUsage(ev)
					if !keep {
						return nil
					}
					return write(head, tail)
				case strip && f.FinishReason != "":
					if err := release(); err != nil {
						return err
					}
					held.hold(ev)
					return nil
				}
			}
		}
		if err := release(); err != nil {
			return err
		}
		return write(ev.Raw, nil)
	}
	for {
		n, err := upstream.Read(buf)
		if n > 0 {
			now = time.Now()
			s.send.arm(now)
			var tokens int64
			var pending int
			if s.breaker != nil {
				s.breaker.pause()
				tokens, pending, unread = s.chunks, len(parser.Pending()), false
			}
			if ferr := parser.Feed(buf[:n], onEvent); ferr != nil {
				break
			}
			if unflushed && flusher != nil {
				flusher.Flush()
			}
			unflushed = false
			if s.breaker != nil {
				s.breaker.resume(now, s.chunks, s.chunks != tokens || unread || len(parser.Pending()) > pending)
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				e.readErr = err
			}
			// What follows [DONE] goes as it came; an event left
			// unfinished by a cut does not (see cut.go).
			if rest := parser.Pending(); len(rest) > 0 && !e.clientGone && e.done {
				_, _ = w.Write(rest)
			}
			break
		}
	}
	now = time.Now()
	if !e.clientGone && release() == nil && flusher != nil {
		// A finish chunk whose usage chunk never came: the stream ended
		// or was cut right after it.
		flusher.Flush()
	}
	if oversized > 0 {
		s.p.counters.OversizedEvents.Add(context.Background(), oversized)
	}
	cut := s.cut(clientCtx, &e)
	if cut != nil && !e.clientGone {
		// The upstream request is over or cancelled; the client learns
		// why, in the stream, and can retry elsewhere.
		s.p.countCut(cut)
		if midEvent {
			_, _ = w.Write(eventEnd)
		}
		if _, err := w.Write(cut.event()); err == nil && flusher != nil {
			flusher.Flush()
		}
	}
	errorType, finishReason := "", s.finishReason
	switch {
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
	if !h.ok || h.at < 0 || bytes.Index(usage.Raw, usage.Data) < 0 {
		return false
	}
	end := h.at + h.size
	out, ok := openaistream.FoldExtras(append(h.folded[:0], h.raw[:h.at]...), h.raw[h.at:end], usage.Data)
	if !ok {
		return false
	}
	h.folded, h.ok = append(out, h.raw[end:]...), false
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

func (p *Server) upstreamURL(in *url.URL) string {
	u := *p.upstream
	u.Path = strings.TrimSuffix(p.upstream.Path, "/") + in.Path
	u.RawQuery = in.RawQuery
	return u.String()
}

func newSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "proxy-" + hex.EncodeToString(b[:])
}

var (
	passthroughUnreachable = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "unreachable")))
	passthroughTimeout     = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "timeout")))
)

var refusalBodyTimeout = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "body_timeout")))

var refusalBodyTooLarge = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "body_too_large")))

var (
	refusalMaxStreams    = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "max_streams")))
	refusalShutdown      = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "shutdown")))
	refusalInvalidHeader = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "invalid_header")))
)

// stallCut reports whether the stall breaker cancelled the exchange of ctx.
func stallCut(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errStallCut) }
