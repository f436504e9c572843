// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want []string // every one must be in the error
	}{
		{Config{Endpoint: "unix://host/run/x.sock"}, []string{"a unix:// endpoint is an absolute path only"}},
		{Config{Endpoint: "unix://"}, []string{"missing the socket's path"}},
		{Config{Endpoint: "unix:///" + strings.Repeat("x", 120)}, []string{"a socket path holds at most 107"}},
		{Config{Endpoint: "unix:///run/x.sock", Headers: map[string]string{"Authorization": "x"}}, []string{"Headers: set, but a unix:// endpoint sends no headers"}},
		{Config{Endpoint: "unix:///run/x.sock", HTTPClient: http.DefaultClient}, []string{"HTTPClient: set, but the endpoint is unix://"}},
		{Config{Endpoint: "localhost:4321"}, []string{`Endpoint "localhost:4321": scheme "localhost" not supported`}},
		{Config{Endpoint: "tcp://127.0.0.1:4321"}, []string{`scheme "tcp" not supported, want unix:///path, udp://host:port or http://host:port/v1/token-events`}},
		{Config{Endpoint: "udp://"}, []string{`Endpoint "udp://": missing host`}},
		{Config{Endpoint: "http:///v1/token-events"}, []string{"missing host"}},
		{Config{Endpoint: "udp://127.0.0.1:notaport"}, []string{"Endpoint:", "invalid port"}},
		{Config{Endpoint: "udp://127.0.0.1:70000"}, []string{`port "70000" out of range 1-65535`}},
		{Config{Endpoint: "http://127.0.0.1:0"}, []string{`port "0" out of range`}},
		{Config{Endpoint: "udp://127.0.0.1:4321/v1/token-events"}, []string{"a udp:// endpoint is host and port only"}},
		{Config{Endpoint: "http://a b"}, []string{"Endpoint:"}},
		{Config{Endpoint: "udp://127.0.0.1", QueueSize: -1}, []string{"QueueSize: must not be negative, got -1"}},
		{Config{Endpoint: "udp://127.0.0.1", MaxBatchBytes: -1}, []string{"MaxBatchBytes: must not be negative"}},
		{Config{Endpoint: "udp://127.0.0.1", MaxBatchBytes: 70000}, []string{"MaxBatchBytes: 70000 does not fit a UDP datagram, limit is 65507"}},
		{Config{Endpoint: "http://127.0.0.1", MaxBatchLines: -1}, []string{"MaxBatchLines: must not be negative, got -1"}},
		{Config{Endpoint: "udp://127.0.0.1", FlushInterval: -time.Second}, []string{"FlushInterval: must not be negative"}},
		{Config{Endpoint: "udp://127.0.0.1", Headers: map[string]string{"Authorization": "x"}}, []string{"Headers: set, but a udp:// endpoint sends no headers"}},
		{Config{Endpoint: "udp://127.0.0.1", HTTPClient: http.DefaultClient}, []string{"HTTPClient: set, but the endpoint is udp://"}},
		{Config{Endpoint: "udp://127.0.0.1", Timeout: time.Second}, []string{"Timeout: set, but a udp:// endpoint has no requests to time"}},
		{Config{Endpoint: "http://127.0.0.1", Timeout: -time.Second}, []string{"Timeout: must not be negative, got -1s"}},
		{Config{Endpoint: "http://127.0.0.1", Timeout: time.Second, HTTPClient: http.DefaultClient}, []string{"Timeout: set, but HTTPClient brings its own"}},
		{Config{Endpoint: "http://127.0.0.1", Headers: map[string]string{"Bad Name": "x"}}, []string{`Headers: invalid header name "Bad Name"`}},
		{Config{Endpoint: "http://127.0.0.1", Headers: map[string]string{"X-A": "a\r\nX-B: b"}}, []string{"Headers: X-A: value holds a line break"}},
		{
			Config{Endpoint: "ftp://x", QueueSize: -1, FlushInterval: -1},
			[]string{"tokenhook: invalid Config", `scheme "ftp"`, "QueueSize", "FlushInterval"},
		},
	} {
		t.Run(tc.cfg.Endpoint, func(t *testing.T) {
			c, err := New(tc.cfg)
			require.Error(t, err)
			assert.Nil(t, c)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		want     settings
	}{
		{"udp://127.0.0.1", settings{udp: true, addr: "127.0.0.1:4321", maxBatchBytes: DefaultUDPMaxBatchBytes}},
		{"udp://[::1]:9000/", settings{udp: true, addr: "[::1]:9000", maxBatchBytes: DefaultUDPMaxBatchBytes}},
		{"http://collector", settings{url: "http://collector:4320/v1/token-events", maxBatchBytes: DefaultHTTPMaxBatchBytes}},
		{"https://collector/", settings{url: "https://collector:4320/v1/token-events", maxBatchBytes: DefaultHTTPMaxBatchBytes}},
		{"http://collector:8080/hooks?tenant=a", settings{url: "http://collector:8080/hooks?tenant=a", maxBatchBytes: DefaultHTTPMaxBatchBytes}},
		{"unix:///run/otelcol-llm/hooks.sock", settings{unix: "/run/otelcol-llm/hooks.sock", maxBatchBytes: DefaultUnixMaxBatchBytes}},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			s, err := Config{Endpoint: tc.endpoint}.resolve()
			require.NoError(t, err)
			tc.want.queueSize = DefaultQueueSize
			tc.want.maxBatchLines = DefaultMaxBatchLines
			tc.want.flushInterval = DefaultFlushInterval
			if !tc.want.udp {
				tc.want.timeout = DefaultHTTPTimeout
			}
			assert.Equal(t, tc.want, s)
		})
	}

	s, err := Config{Endpoint: "udp://127.0.0.1", QueueSize: 8, MaxBatchBytes: 512, MaxBatchLines: 500, FlushInterval: time.Second}.resolve()
	require.NoError(t, err)
	assert.Equal(t, settings{udp: true, addr: "127.0.0.1:4321", queueSize: 8, maxBatchBytes: 512, maxBatchLines: 500, flushInterval: time.Second}, s)

	s, err = Config{Endpoint: "http://collector", Timeout: time.Second}.resolve()
	require.NoError(t, err)
	assert.Equal(t, time.Second, s.timeout)
	// An empty endpoint is the node's collector: its socket where the
	// node offers one.
	s, err = Config{}.resolve()
	require.NoError(t, err)
	if _, serr := os.Stat(filepath.Dir(DefaultUnixSocket)); serr == nil {
		assert.Equal(t, DefaultUnixSocket, s.unix)
	} else {
		assert.Equal(t, "127.0.0.1:4321", s.addr)
		assert.True(t, s.udp)
	}
	s, err = Config{Endpoint: "http://collector", HTTPClient: http.DefaultClient}.resolve()
	require.NoError(t, err)
	assert.Equal(t, time.Duration(0), s.timeout, "HTTPClient brings its own")
}

// The client of its own neither takes a proxy from the environment nor
// follows redirects (the redirect itself is in TestHTTPStatus). Go's
// ProxyFromEnvironment never proxies loopback and reads the environment
// once per process, so this looks at the transport rather than sending.
func TestOwnHTTPClientUsesNoProxy(t *testing.T) {
	c := newHTTPClient(time.Second)
	tr, ok := c.Transport.(*http.Transport)
	require.True(t, ok)
	assert.Nil(t, tr.Proxy)
	assert.Equal(t, time.Second, c.Timeout)
	assert.Equal(t, http.ErrUseLastResponse, c.CheckRedirect(nil, nil))
}
