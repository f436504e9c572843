package testbin

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// ServeGRPC serves a gRPC server on addr until the test ends, with the
// services register puts on it, and returns the address it listens on (addr
// may give port 0).
func ServeGRPC(t *testing.T, addr string, register func(*grpc.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv := grpc.NewServer()
	register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return ln.Addr().String()
}
