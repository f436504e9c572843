package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"maps"
	"net"
	"net/http"
	"slices"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configmiddleware"
	"go.opentelemetry.io/collector/extension/extensionmiddleware"
)

// The proxy's sockets, on both sides, are the connections of proxyConn
// (proxy_conn_linux.go): per SSE event the proxy makes one read from the
// upstream and one write to the client, with the process idle in between,
// and the plain net.Conn calls cost a wake-up of the runtime's sysmon
// thread per event on top (a fifth of the proxy's CPU in the bench).

// connListener hands out the proxy's connections.
type connListener struct{ net.Listener }

func (l connListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return proxyConn(c), nil
}

// connMiddlewareID names the client middleware through which the proxy puts
// its connections under the upstream transport. confighttp offers no other
// way to reach the transport's dialer without a feature gate; the innermost
// middleware gets the *http.Transport itself, before any request.
var connMiddlewareID = component.NewIDWithName(componentType, "proxy_conn")

type connMiddleware struct {
	component.StartFunc
	component.ShutdownFunc
}

var _ extensionmiddleware.HTTPClient = connMiddleware{}

func (connMiddleware) GetHTTPRoundTripper(context.Context) (extensionmiddleware.WrapHTTPRoundTripperFunc, error) {
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
			return proxyConn(c), nil
		}
		return rt, nil
	}, nil
}

// upstreamClient is cfg.ToClient with the proxy's connections under its
// transport; everything else (TLS, auth, headers, user middlewares,
// timeouts) is confighttp's.
func upstreamClient(ctx context.Context, cfg confighttp.ClientConfig, host component.Host, set component.TelemetrySettings) (*http.Client, error) {
	exts := maps.Clone(host.GetExtensions())
	if exts == nil {
		exts = map[component.ID]component.Component{}
	}
	exts[connMiddlewareID] = connMiddleware{}
	// Last in the list, so applied first: it gets the *http.Transport.
	cfg.Middlewares = append(slices.Clone(cfg.Middlewares), configmiddleware.Config{ID: connMiddlewareID})
	return cfg.ToClient(ctx, exts, set)
}
