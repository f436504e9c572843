// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

import (
	"errors"
	"fmt"
	"net"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelcol-llm/otelcol-llm/internal/strictconfig"
)

// Config is the configuration of the engine_health exporter.
type Config struct {
	// ServerConfig is the HTTP endpoint the verdicts are served on
	// (GET /engines, GET /engines/{engine}/health).
	ServerConfig confighttp.ServerConfig `mapstructure:",squash"`
	// Window is how far back each engine's sessions are judged.
	Window time.Duration `mapstructure:"window"`
	// MinSessions is the fewest sessions in the window an engine is judged on.
	MinSessions int `mapstructure:"min_sessions"`
	// Engines are known from the start, served as healthy with an empty
	// window until their sessions say otherwise, and never forgotten: a
	// sidecar names the engine it fronts, so that a router reading its
	// gauges sees the engine from the first scrape after a restart, and
	// while it is idle.
	Engines []string    `mapstructure:"engines"`
	Eject   EjectConfig `mapstructure:"eject"`
	// Agent serves HAProxy's agent-check protocol on a TCP endpoint.
	Agent configoptional.Optional[AgentConfig] `mapstructure:"agent"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// EjectConfig is when an engine is ejected, and for how long.
type EjectConfig struct {
	// StallRatio ejects an engine when this share of its sessions stalled.
	StallRatio float64 `mapstructure:"stall_ratio"`
	// TTFTP99 ejects an engine whose TTFT p99 reaches it.
	TTFTP99 time.Duration `mapstructure:"ttft_p99"`
	// ErrorRatio ejects an engine when this share of its sessions ended by a
	// fault of the engine (not of the request, not a refusal for load).
	ErrorRatio float64 `mapstructure:"error_ratio"`
	// SaturatedRatio ejects an engine when this share of its requests was
	// refused for load (429); 0, the default, never: a saturated engine is
	// busy, not broken, and taking it out loads the others more.
	SaturatedRatio float64 `mapstructure:"saturated_ratio"`
	// BaseTime × the number of times an engine has been ejected is how long
	// it stays out, at most MaxTime.
	BaseTime time.Duration `mapstructure:"base_time"`
	MaxTime  time.Duration `mapstructure:"max_time"`
	// MaxPercent bounds the share of the engines in play (with traffic in
	// the window, or ejected) ejected at once.
	MaxPercent float64 `mapstructure:"max_percent"`
	// KeepLast keeps the last engine with traffic in, whatever MaxPercent
	// says. Off only where the balancer keeps one in itself and this
	// exporter sees one engine of many: the llm-d endpoint picker
	// (fallbackOnEmpty) beside a per-pod sidecar.
	KeepLast bool `mapstructure:"keep_last"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// AgentConfig is the TCP endpoint of the agent-check protocol.
type AgentConfig struct {
	Endpoint string `mapstructure:"endpoint"`

	// prevent unkeyed literal initialization
	_ struct{}
}

const (
	defaultEndpoint      = "localhost:13140"
	defaultAgentEndpoint = "localhost:13141"
)

func createDefaultConfig() *Config {
	server := confighttp.NewDefaultServerConfig()
	server.NetAddr.Endpoint = defaultEndpoint
	return &Config{
		ServerConfig: server,
		Window:       10 * time.Second,
		MinSessions:  5,
		Eject: EjectConfig{
			StallRatio: 0.2, TTFTP99: 2 * time.Second, ErrorRatio: 0.2, BaseTime: 30 * time.Second,
			MaxTime: 300 * time.Second, MaxPercent: 50, KeepLast: true,
		},
		Agent: configoptional.Default(AgentConfig{Endpoint: defaultAgentEndpoint}),
	}
}

func (cfg *Config) judgeConfig() judgeConfig {
	return judgeConfig{
		window: cfg.Window, minSessions: cfg.MinSessions, stallRatio: cfg.Eject.StallRatio,
		ttftP99: cfg.Eject.TTFTP99, errorRatio: cfg.Eject.ErrorRatio, saturatedRatio: cfg.Eject.SaturatedRatio,
		baseTime: cfg.Eject.BaseTime, maxTime: cfg.Eject.MaxTime, maxPercent: cfg.Eject.MaxPercent,
		keepLast: cfg.Eject.KeepLast, engines: cfg.Engines,
	}
}

var _ confmap.Unmarshaler = (*Config)(nil)

// Unmarshal decodes the configuration as the collector does and refuses
// every key no section knows, naming its section (internal/strictconfig:
// the collector drops them in sections with confighttp's settings).
func (cfg *Config) Unmarshal(conf *confmap.Conf) error {
	return strictconfig.Unmarshal(conf, cfg)
}

var _ confmap.Validator = (*Config)(nil)

// Validate reports every invalid setting at once, by its key.
func (cfg *Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(cfg.ServerConfig.NetAddr.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("endpoint: %w", err))
	}
	if cfg.Window <= 0 {
		errs = append(errs, fmt.Errorf("window: must be positive, got %s", cfg.Window))
	}
	for i, name := range cfg.Engines {
		if normalized, tooLong := normalizeEngine(name); tooLong || normalized == "" {
			errs = append(errs, fmt.Errorf("engines[%d]: an engine name of 1 to %d bytes, got %d", i, maxEngineName, len(name)))
		}
	}
	if len(cfg.Engines) > maxEngines {
		errs = append(errs, fmt.Errorf("engines: at most %d, got %d", maxEngines, len(cfg.Engines)))
	}
	if cfg.MinSessions < 1 {
		errs = append(errs, fmt.Errorf("min_sessions: must be at least 1, got %d", cfg.MinSessions))
	}
	ratio := func(key string, v float64) {
		if !(v > 0 && v <= 1) {
			errs = append(errs, fmt.Errorf("eject::%s: must be within (0, 1], got %v", key, v))
		}
	}
	ratio("stall_ratio", cfg.Eject.StallRatio)
	ratio("error_ratio", cfg.Eject.ErrorRatio)
	if cfg.Eject.SaturatedRatio != 0 { // 0: off
		ratio("saturated_ratio", cfg.Eject.SaturatedRatio)
	}
	if cfg.Eject.TTFTP99 <= 0 {
		errs = append(errs, fmt.Errorf("eject::ttft_p99: must be positive, got %s", cfg.Eject.TTFTP99))
	}
	if cfg.Eject.BaseTime <= 0 {
		errs = append(errs, fmt.Errorf("eject::base_time: must be positive, got %s", cfg.Eject.BaseTime))
	}
	if cfg.Eject.MaxTime < cfg.Eject.BaseTime {
		errs = append(errs, fmt.Errorf("eject::max_time: must be at least eject::base_time (%s), got %s", cfg.Eject.BaseTime, cfg.Eject.MaxTime))
	}
	if !(cfg.Eject.MaxPercent >= 0 && cfg.Eject.MaxPercent <= 100) {
		errs = append(errs, fmt.Errorf("eject::max_percent: must be within [0, 100], got %v", cfg.Eject.MaxPercent))
	}
	if a := cfg.Agent.Get(); a != nil && cfg.Agent.HasValue() {
		if _, _, err := net.SplitHostPort(a.Endpoint); err != nil {
			errs = append(errs, fmt.Errorf("agent::endpoint: %w", err))
		}
	}
	return errors.Join(errs...)
}
