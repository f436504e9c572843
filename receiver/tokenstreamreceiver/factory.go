// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/receiver"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

const (
	defaultHTTPEndpoint  = "localhost:4320"
	defaultHTTPPath      = "/v1/token-events"
	defaultUDPEndpoint   = "localhost:4321"
	defaultProxyEndpoint = "localhost:8001"
	defaultUpstream      = "http://localhost:8000"
	// defaultUpstreamBufferBytes is the upstream connections' read and
	// write buffer (Go's default is 4 KiB each).
	defaultUpstreamBufferBytes = 2 << 10
	// defaultMaxMoves: one move per request; a stream that fails on the
	// healthy replica too is cut.
	defaultMaxMoves = 1
	// defaultMigrateRequestBytes bounds the copy of a request kept to be
	// sent again, as the retries' copy (retry.go).
	defaultMigrateRequestBytes = 1 << 20
	// defaultUDPBatchWindow: a hook client fills a datagram (8 KiB) in a few
	// ms at high rates, so a batch then spans several; the delay is far
	// below a token gap, let alone a stall.
	defaultUDPBatchWindow    = 5 * time.Millisecond
	defaultMaxRequestBodyMiB = 8
	// defaultUnixEndpoint is where node agents' sockets conventionally
	// live; the DaemonSet mounts its directory from the host.
	defaultUnixEndpoint = "/run/otelcol-llm/hooks.sock"
	// defaultUnixBatchWindow: a hook client writes what it queued every
	// FlushInterval (100 ms), which arrives in one read or a few: the
	// window gathers them into one batch, as for UDP.
	defaultUnixBatchWindow = 5 * time.Millisecond
	// The socket's permissions: its owner (the collector) and its group
	// (socket_group, the engines') may connect, no one else.
	defaultUnixSocketMode    = "0660"
	defaultUnixDirectoryMode = "0750"
	// A non-streaming completion's headers come when it is whole, and a
	// loaded engine queues requests: minutes, not seconds.
	defaultResponseHeaderTimeout = 5 * time.Minute
	// Envoy's stream_idle_timeout default; an engine under preemption
	// pauses a stream for seconds, never minutes.
	defaultStreamIdleTimeout = 5 * time.Minute
	// nginx's client_body_timeout and send_timeout.
	defaultClientBodyTimeout = time.Minute
	defaultClientSendTimeout = time.Minute
	// Below Kubernetes' default grace period (30 s), which has the exporters'
	// last flush to cover too; also how long a reload refuses connections at
	// most.
	defaultDrainTimeout = 20 * time.Second
	// About 150 kB per open stream: 1024 streams is ~150 MB, and more than a
	// few engines' worth of concurrent sequences (vLLM's max_num_seqs is 256
	// by default).
	defaultMaxStreams = 1024
	// A second or so of the heaviest load the proxy carries (~50 k events/s)
	// waiting for a slow pipeline, about 14 MB at ~210 B per event.
	defaultEventQueueSize = 65_536
)

// NewFactory returns the factory of the token_stream receiver.
func NewFactory() receiver.Factory {
	return receiver.NewFactory(metadata.Type, createDefaultConfig,
		receiver.WithLogs(createLogs, metadata.LogsStability),
		receiver.WithMetrics(createMetrics, metadata.MetricsStability))
}

func createDefaultConfig() component.Config {
	httpServer := confighttp.NewDefaultServerConfig()
	httpServer.NetAddr.Endpoint = defaultHTTPEndpoint
	httpServer.MaxRequestBodySize = defaultMaxRequestBodyMiB << 20
	proxyServer := confighttp.NewDefaultServerConfig()
	proxyServer.NetAddr.Endpoint = defaultProxyEndpoint
	// Streams last as long as a completion: no write deadline by default.
	proxyServer.WriteTimeout = 0
	upstream := UpstreamConfig{
		ClientConfig:          confighttp.NewDefaultClientConfig(),
		ResponseHeaderTimeout: defaultResponseHeaderTimeout,
		StreamIdleTimeout:     defaultStreamIdleTimeout,
	}
	upstream.ClientConfig.Endpoint = defaultUpstream
	// Buffers sized for SSE, not for bulk HTTP: each open stream holds them
	// for its whole length, and an event is a few hundred bytes.
	upstream.ClientConfig.ReadBufferSize = defaultUpstreamBufferBytes
	upstream.ClientConfig.WriteBufferSize = defaultUpstreamBufferBytes
	migrate := MigrateConfig{
		ClientConfig: confighttp.NewDefaultClientConfig(), MaxMoves: defaultMaxMoves,
		Triggers: []string{"stall", "idle_timeout", "broken", "engine_error"}, MaxRequestBytes: defaultMigrateRequestBytes,
	}
	migrate.ClientConfig.ReadBufferSize = defaultUpstreamBufferBytes
	migrate.ClientConfig.WriteBufferSize = defaultUpstreamBufferBytes
	return &Config{
		Proxy: configoptional.Default(ProxyConfig{
			ServerConfig: proxyServer, Upstream: upstream, Migrate: migrate,
			ClientBodyTimeout: defaultClientBodyTimeout, ClientSendTimeout: defaultClientSendTimeout,
			DrainTimeout: defaultDrainTimeout, MaxStreams: defaultMaxStreams, EventQueueSize: defaultEventQueueSize,
		}),
		VLLM: configoptional.Default(defaultVLLMConfig()),
		Hooks: HooksConfig{
			HTTP: configoptional.Default(HTTPConfig{ServerConfig: httpServer, Path: defaultHTTPPath}),
			UDP:  configoptional.Default(UDPConfig{Endpoint: defaultUDPEndpoint, BatchWindow: defaultUDPBatchWindow}),
			Unix: configoptional.Default(UnixConfig{
				Endpoint: defaultUnixEndpoint, BatchWindow: defaultUnixBatchWindow,
				SocketMode: defaultUnixSocketMode, DirectoryMode: defaultUnixDirectoryMode,
			}),
			Limits: LimitsConfig{
				MaxLineBytes:      tokenevent.DefaultMaxLineBytes,
				MaxLinesPerBatch:  tokenevent.DefaultMaxLinesPerBatch,
				MaxSessionIDBytes: tokenevent.DefaultMaxSessionIDBytes,
				MaxAttributes:     tokenevent.DefaultMaxAttributes,
			},
		},
	}
}

func createLogs(_ context.Context, set receiver.Settings, cfg component.Config, next consumer.Logs) (receiver.Logs, error) {
	return withConsumer[receiver.Logs](cfg, set, func(r *tokenStreamReceiver) { r.next = next })
}

func createMetrics(_ context.Context, set receiver.Settings, cfg component.Config, next consumer.Metrics) (receiver.Metrics, error) {
	return withConsumer[receiver.Metrics](cfg, set, func(r *tokenStreamReceiver) { r.nextMetrics = next })
}

// withConsumer registers a signal's consumer with the receiver shared by the
// instances of cfg, creating it for the first one.
func withConsumer[T component.Component](cfg component.Config, set receiver.Settings, register func(*tokenStreamReceiver)) (T, error) {
	r, err := loadOrCreateReceiver(cfg.(*Config), set)
	if err != nil {
		var none T
		return none, err
	}
	register(r)
	return any(r).(T), nil
}
