// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package httpserve runs a confighttp server until shutdown (the
// token_stream receiver's hook endpoint and proxy, the engine_health
// exporter's verdicts, the token_session live view), and routes the
// GET-only endpoints of the last two (GetOnly).
package httpserve // import "github.com/otelcol-llm/otelcol-llm/internal/httpserve"

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

// Server is a confighttp server that runs until shutdown.
type Server struct {
	HTTP *http.Server
	Addr net.Addr // where it listens; tests start it on port 0
	done sync.WaitGroup
}

// Serve starts serving handler as cfg says, on the listener that wrap (when
// not nil) makes of cfg's. Serve ending other than by shutdown is a fatal
// error of the component.
func (s *Server) Serve(ctx context.Context, cfg *confighttp.ServerConfig, handler http.Handler, host component.Host,
	set component.TelemetrySettings, wrap func(net.Listener) net.Listener, opts ...confighttp.ToServerOption,
) error {
	var err error
	s.HTTP, err = cfg.ToServer(ctx, host.GetExtensions(), set, handler, opts...)
	if err != nil {
		return err
	}
	ln, err := cfg.ToListener(ctx)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.NetAddr.Endpoint, err)
	}
	s.Addr = ln.Addr()
	if wrap != nil {
		ln = wrap(ln)
	}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		if err := s.HTTP.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			componentstatus.ReportStatus(host, componentstatus.NewFatalErrorEvent(err))
		}
	}()
	return nil
}

// Wait waits for Serve's goroutine to end (after HTTP's Shutdown or Close).
func (s *Server) Wait() { s.done.Wait() }

// Shutdown shuts the server down gracefully, as http.Server's Shutdown, and
// waits for Serve's goroutine.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.HTTP.Shutdown(ctx)
	s.done.Wait()
	return err
}
