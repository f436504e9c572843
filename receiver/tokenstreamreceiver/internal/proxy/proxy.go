// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/internal/httpserve"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/lograte"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"
)

// Paths the proxy observes; everything else is passed through untouched.
var observedPaths = map[string]string{
	"/v1/chat/completions": tokenevent.OperationChat,
	"/v1/completions":      tokenevent.OperationTextCompletion,
}

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
	// Migrate moves a failing stream to another replica; nil: off.
	Migrate *MigrateConfig
}

// Server is a reverse proxy in front of an OpenAI-compatible server that
// turns every completions request into a session.
type Server struct {
	// observedServer serves the observed paths; the rest is the server's own.
	observedServer
	sink         Sink
	passthrough  *httputil.ReverseProxy
	drainTimeout time.Duration
	maxStreams   int64
	drainOnce    sync.Once
	// cutAll cancels cut when drain_timeout is over, ending the streams
	// still running as shutdown sessions.
	cutAll context.CancelCauseFunc
	srv    httpserve.Server
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
		observedServer: observedServer{
			offServer: offServer{shared: shared{
				counters: counters, warn: lograte.OncePerMinute(sink.Logger()), draining: make(chan struct{}),
			}},
			log: sink.Logger(), upstream: upstream, engine: cfg.Engine, client: client, headerAttributes: cfg.HeaderAttributes,
			bodyTimeout: cfg.ClientBodyTimeout, sendTimeout: cfg.ClientSendTimeout,
			stallMaxGap: cfg.StallMaxGap, stallMinTokens: cfg.StallMinTokens,
		},
		sink: sink, drainTimeout: cfg.DrainTimeout, maxStreams: int64(cfg.MaxStreams),
	}
	if m := cfg.Migrate; m != nil {
		mcfg := m.Client
		mcfg.Timeout = 0
		mc, err := proxyconn.UpstreamClient(ctx, mcfg, host, set)
		if err != nil {
			return nil, fmt.Errorf("proxy::migrate: %w", err)
		}
		mc.Transport = &boundedTransport{base: mc.Transport, header: cfg.ResponseHeaderTimeout, idle: cfg.StreamIdleTimeout}
		p.migrate = &migrator{cfg: *m, client: mc}
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
		if l, err := newRelayLoop(); err == nil {
			p.loop = l
		} else {
			p.log.Debug("proxy: streams are relayed each on a goroutine of its own", zap.Error(err))
		}
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
		if p.loop != nil {
			p.loop.close()
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
	if p.loop != nil {
		// Every stream has left it: they hold a handler until they end.
		p.loop.close()
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

var (
	passthroughUnreachable = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "unreachable")))
	passthroughTimeout     = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "timeout")))
)

var (
	refusalMaxStreams = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "max_streams")))
	refusalShutdown   = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "shutdown")))
)
