// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package proxyconn holds the token_stream proxy's sockets, on both sides:
// per SSE event the proxy makes one read from the upstream and one write to
// the client, with the process idle in between, and the plain net.Conn
// calls cost a wake-up of the runtime's sysmon thread per event on top (a
// fifth of the proxy's CPU in the bench). Its connections make raw system
// calls instead (conn_linux.go; elsewhere they are the plain ones). Its
// Loop (loop_linux.go) is the event loop the proxy relays streams in, with
// the sockets it watches taken out of the runtime's poller (Detach).
//
// It is kept apart so that it can go whole. The upstream's connections are
// put under confighttp's transport by a client middleware injected for the
// purpose, because confighttp (v0.161.0) offers no other way to reach the
// transport's dialer: ClientConfig.ToClient takes no options. A confighttp
// release whose ToClient takes a dialer (or a transport wrapper) lets the
// middleware go; the connections themselves go when the Go runtime no
// longer wakes sysmon for a socket call on an idle process, and then the
// proxy uses ToClient and ToListener as they are.
package proxyconn // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"

import (
	"context"
	"errors"
	"maps"
	"net"
	"net/http"
	"slices"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configmiddleware"
	"go.opentelemetry.io/collector/extension/extensionmiddleware"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// Listener hands out the proxy's connections for those ln accepts.
func Listener(ln net.Listener) net.Listener { return listener{ln} }

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return wrap(c), nil
}

// middlewareID names the client middleware through which the proxy puts
// its connections under the upstream transport: the innermost middleware
// gets the *http.Transport itself, before any request.
var middlewareID = component.NewIDWithName(metadata.Type, "proxy_conn")

type middleware struct {
	component.StartFunc
	component.ShutdownFunc
}

var _ extensionmiddleware.HTTPClient = middleware{}

func (middleware) GetHTTPRoundTripper(context.Context) (extensionmiddleware.WrapHTTPRoundTripperFunc, error) {
	return func(_ context.Context, rt http.RoundTripper) (http.RoundTripper, error) {
		t, ok := rt.(*http.Transport)
		if !ok {
			return rt, nil
		}
		dial := t.DialContext
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return wrap(c), nil
		}
		return rt, nil
	}, nil
}

// UpstreamClient is cfg.ToClient with the proxy's connections under its
// transport; everything else (TLS, auth, headers, user middlewares,
// timeouts) is confighttp's.
func UpstreamClient(ctx context.Context, cfg confighttp.ClientConfig, host component.Host, set component.TelemetrySettings) (*http.Client, error) {
	exts := maps.Clone(host.GetExtensions())
	if exts == nil {
		exts = map[component.ID]component.Component{}
	}
	exts[middlewareID] = middleware{}
	// Last in the list, so applied first: it gets the *http.Transport.
	cfg.Middlewares = append(slices.Clone(cfg.Middlewares), configmiddleware.Config{ID: middlewareID})
	return cfg.ToClient(ctx, exts, set)
}

// dialer is http.DefaultTransport's: the same connect timeout and TCP
// keep-alive as the upstream's connections had under confighttp.
var dialer = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}

// Dial connects to addr as the upstream's transport would, and hands out
// the proxy's connection for it.
func Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return wrap(c), nil
}

// ErrWouldBlock is TryWrite's error when the socket is full, and a
// Socket's Read's when there is nothing to read.
var ErrWouldBlock = errors.New("proxyconn: the operation would block")

var errNoTry = errors.New("proxyconn: not a connection of this package")
