package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/receiver"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenevent"
)

const (
	typeStr = "token_stream"
	// scopeName names this receiver as the instrumentation scope of what it
	// emits and of its own telemetry.
	scopeName = "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

	defaultHTTPEndpoint      = "localhost:4320"
	defaultHTTPPath          = "/v1/token-events"
	defaultUDPEndpoint       = "localhost:4321"
	defaultProxyEndpoint     = "localhost:8001"
	defaultUpstream          = "http://localhost:8000"
	defaultMaxLinesPerBatch  = 10_000
	defaultMaxRequestBodyMiB = 8
)

var componentType = component.MustNewType(typeStr)

// NewFactory returns the factory of the token_stream receiver.
func NewFactory() receiver.Factory {
	return receiver.NewFactory(componentType, createDefaultConfig,
		receiver.WithLogs(createLogs, component.StabilityLevelDevelopment),
		receiver.WithMetrics(createMetrics, component.StabilityLevelDevelopment))
}

func createDefaultConfig() component.Config {
	httpServer := confighttp.NewDefaultServerConfig()
	httpServer.NetAddr.Endpoint = defaultHTTPEndpoint
	httpServer.MaxRequestBodySize = defaultMaxRequestBodyMiB << 20
	proxyServer := confighttp.NewDefaultServerConfig()
	proxyServer.NetAddr.Endpoint = defaultProxyEndpoint
	// Streams last as long as a completion: no write deadline by default.
	proxyServer.WriteTimeout = 0
	upstream := confighttp.NewDefaultClientConfig()
	upstream.Endpoint = defaultUpstream
	return &Config{
		Proxy: configoptional.Default(ProxyConfig{ServerConfig: proxyServer, Upstream: upstream}),
		VLLM:  configoptional.Default(defaultVLLMConfig()),
		Hooks: HooksConfig{
			HTTP: configoptional.Default(HTTPConfig{ServerConfig: httpServer, Path: defaultHTTPPath}),
			UDP:  configoptional.Default(UDPConfig{Endpoint: defaultUDPEndpoint}),
			Limits: LimitsConfig{
				MaxLineBytes:      tokenevent.DefaultMaxLineBytes,
				MaxLinesPerBatch:  defaultMaxLinesPerBatch,
				MaxSessionIDBytes: tokenevent.DefaultMaxSessionIDBytes,
				MaxAttributes:     tokenevent.DefaultMaxAttributes,
			},
		},
	}
}

// createLogs registers next as the logs consumer of the receiver shared by
// the instances of cfg.
func createLogs(_ context.Context, set receiver.Settings, cfg component.Config, next consumer.Logs) (receiver.Logs, error) {
	r, err := loadOrCreateReceiver(cfg.(*Config), set)
	if err != nil {
		return nil, err
	}
	r.next = next
	return r, nil
}

// createMetrics registers next as the metrics consumer of the receiver
// shared by the instances of cfg.
func createMetrics(_ context.Context, set receiver.Settings, cfg component.Config, next consumer.Metrics) (receiver.Metrics, error) {
	r, err := loadOrCreateReceiver(cfg.(*Config), set)
	if err != nil {
		return nil, err
	}
	r.nextMetrics = next
	return r, nil
}
