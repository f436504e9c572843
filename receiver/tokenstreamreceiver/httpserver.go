package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/config/confighttp"
)

// httpServer is a confighttp server that runs until shutdown: the hook
// endpoint's and the proxy's.
type httpServer struct {
	server *http.Server
	addr   net.Addr // where it listens; tests start it on port 0
	done   sync.WaitGroup
}

// serve starts serving handler as cfg says, on the listener that wrap (when
// not nil) makes of cfg's. Serve ending other than by shutdown is a fatal
// error of the component.
func (s *httpServer) serve(ctx context.Context, cfg *confighttp.ServerConfig, handler http.Handler, host component.Host,
	set component.TelemetrySettings, wrap func(net.Listener) net.Listener, opts ...confighttp.ToServerOption,
) error {
	var err error
	s.server, err = cfg.ToServer(ctx, host.GetExtensions(), set, handler, opts...)
	if err != nil {
		return err
	}
	ln, err := cfg.ToListener(ctx)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.NetAddr.Endpoint, err)
	}
	s.addr = ln.Addr()
	if wrap != nil {
		ln = wrap(ln)
	}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		if err := s.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			componentstatus.ReportStatus(host, componentstatus.NewFatalErrorEvent(err))
		}
	}()
	return nil
}

func (s *httpServer) shutdown(ctx context.Context) error {
	err := s.server.Shutdown(ctx)
	s.done.Wait()
	return err
}
