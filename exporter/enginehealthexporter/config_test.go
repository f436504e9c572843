// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter

import (
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadata"
)

func loadConfig(t *testing.T, name string) (*Config, error) {
	t.Helper()
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)
	id := component.NewID(metadata.Type)
	if name != "" {
		id = component.NewIDWithName(metadata.Type, name)
	}
	sub, err := cm.Sub(id.String())
	require.NoError(t, err)
	cfg := createDefaultConfig()
	if err := sub.Unmarshal(cfg); err != nil {
		return nil, err
	}
	return cfg, confmap.Validate(cfg)
}

func TestConfigStruct(t *testing.T) {
	require.NoError(t, componenttest.CheckConfigStruct(createDefaultConfig()))
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := loadConfig(t, "")
	require.NoError(t, err)
	assert.Equal(t, createDefaultConfig(), cfg)
	assert.Equal(t, "localhost:13140", cfg.ServerConfig.NetAddr.Endpoint)
	assert.Equal(t, 10*time.Second, cfg.Window)
	assert.Equal(t, 5, cfg.MinSessions)
	assert.Equal(t, EjectConfig{
		StallRatio: 0.2, TTFTP99: 2 * time.Second, ErrorRatio: 0.2, BaseTime: 30 * time.Second,
		MaxTime: 300 * time.Second, MaxPercent: 50, KeepLast: true,
	}, cfg.Eject, "saturated_ratio 0: 429s never eject")
	assert.False(t, cfg.Agent.HasValue(), "the agent-check endpoint is off unless configured")
}

func TestConfigCustom(t *testing.T) {
	cfg, err := loadConfig(t, "custom")
	require.NoError(t, err)
	assert.Equal(t, "0.0.0.0:9140", cfg.ServerConfig.NetAddr.Endpoint)
	assert.Equal(t, 30*time.Second, cfg.Window)
	assert.Equal(t, 20, cfg.MinSessions)
	assert.Equal(t, EjectConfig{
		StallRatio: 0.5, TTFTP99: 5 * time.Second, ErrorRatio: 0.1, SaturatedRatio: 0.6,
		BaseTime: 10 * time.Second, MaxTime: time.Minute, MaxPercent: 34, KeepLast: true,
	}, cfg.Eject)
	assert.Equal(t, "0.0.0.0:9141", cfg.Agent.Get().Endpoint)
}

func TestConfigAgentOnWithDefaults(t *testing.T) {
	cfg, err := loadConfig(t, "agent_defaults")
	require.NoError(t, err)
	require.True(t, cfg.Agent.HasValue())
	assert.Equal(t, "localhost:13141", cfg.Agent.Get().Endpoint)
}

func TestConfigInvalidNamesEveryKey(t *testing.T) {
	_, err := loadConfig(t, "invalid")
	require.Error(t, err)
	for _, key := range []string{
		"endpoint:", "window:", "min_sessions:", "eject::stall_ratio:", "eject::ttft_p99:",
		"eject::error_ratio:", "eject::saturated_ratio:", "eject::max_time:", "eject::max_percent:", "agent::endpoint:",
	} {
		assert.Contains(t, err.Error(), key)
	}
}

// A misspelled key fails in every section, named by its path: at the top,
// beside confighttp's server settings, and in eject below it, the
// collector dropped it: an operator who mistyped an ejection threshold ran
// on its default.
func TestConfigUnknownKeyNamedByPath(t *testing.T) {
	for _, tc := range []struct{ key, yaml string }{
		{"windw", "windw: 30s"},
		{"eject::stall_ratoi", "eject: {stall_ratoi: 0.5}"},
		{"eject::ttft_p9", "eject: {ttft_p9: 1s}"},
		{"agent::endpont", "agent: {endpont: 'localhost:1'}"},
		{"tls::key_fil", "tls: {key_fil: k.pem}"},
		{"cors::allowed_origin", "cors: {allowed_origin: [x]}"},
		{"keepalive::idle_timout", "keepalive: {idle_timout: 1s}"},
		{"eject::stall_ratoi, windw", "windw: 30s\neject: {stall_ratoi: 0.5}"}, // every one at once
	} {
		t.Run(tc.key, func(t *testing.T) {
			retrieved, err := confmap.NewRetrievedFromYAML([]byte(tc.yaml))
			require.NoError(t, err)
			conf, err := retrieved.AsConf()
			require.NoError(t, err)
			// As the collector decodes it, for validate and at start-up.
			cfg := NewFactory().CreateDefaultConfig()
			err = conf.Unmarshal(&cfg)
			require.Error(t, err, "an unknown key is refused")
			assert.Regexp(t, `(^|\n)'' has invalid keys: `+regexp.QuoteMeta(tc.key)+`$`, err.Error())
		})
	}
}
