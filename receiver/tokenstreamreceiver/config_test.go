package tokenstreamreceiver

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"
)

func loadConfig(t *testing.T, id component.ID) (*Config, error) {
	t.Helper()
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)
	sub, err := cm.Sub(id.String())
	require.NoError(t, err)
	cfg := createDefaultConfig().(*Config)
	require.NoError(t, sub.Unmarshal(cfg))
	return cfg, confmap.Validate(cfg)
}

func TestConfigStruct(t *testing.T) {
	require.NoError(t, componenttest.CheckConfigStruct(createDefaultConfig()))
}

func TestConfigNoSource(t *testing.T) {
	_, err := loadConfig(t, component.NewID(componentType))
	require.EqualError(t, err, "no source configured: set at least one of hooks::http, hooks::udp and proxy")
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := loadConfig(t, component.NewIDWithName(componentType, "defaults"))
	require.NoError(t, err)
	h := cfg.Hooks.HTTP.Get()
	require.NotNil(t, h)
	assert.Equal(t, "localhost:4320", h.ServerConfig.NetAddr.Endpoint)
	assert.Equal(t, "/v1/token-events", h.Path)
	assert.Equal(t, int64(8<<20), h.ServerConfig.MaxRequestBodySize)
	u := cfg.Hooks.UDP.Get()
	require.NotNil(t, u)
	assert.Equal(t, "localhost:4321", u.Endpoint)
	assert.Equal(t, LimitsConfig{MaxLineBytes: 16384, MaxLinesPerBatch: 10000, MaxSessionIDBytes: 256, MaxAttributes: 32}, cfg.Hooks.Limits)
}

func TestConfigCustom(t *testing.T) {
	cfg, err := loadConfig(t, component.NewIDWithName(componentType, "custom"))
	require.NoError(t, err)
	h := cfg.Hooks.HTTP.Get()
	assert.Equal(t, "0.0.0.0:14320", h.ServerConfig.NetAddr.Endpoint)
	assert.Equal(t, "/hooks", h.Path)
	assert.Equal(t, int64(1<<20), h.ServerConfig.MaxRequestBodySize)
	u := cfg.Hooks.UDP.Get()
	assert.Equal(t, "0.0.0.0:14321", u.Endpoint)
	assert.Equal(t, 4<<20, u.SocketBufferSize)
	assert.Equal(t, LimitsConfig{MaxLineBytes: 4096, MaxLinesPerBatch: 500, MaxSessionIDBytes: 64, MaxAttributes: 8}, cfg.Hooks.Limits)
}

func TestConfigInvalidReportsEveryProblem(t *testing.T) {
	_, err := loadConfig(t, component.NewIDWithName(componentType, "invalid"))
	require.Error(t, err)
	for _, want := range []string{
		`hooks::http::path: must start with '/', got "hooks"`,
		`hooks::udp::endpoint: address no-port: missing port in address`,
		`hooks::udp::socket_buffer_size: must not be negative, got -1`,
		`hooks::limits::max_lines_per_batch: must be positive, got 0`,
		`hooks::limits::max_line_bytes: 100000 exceeds the largest UDP datagram (65507)`,
	} {
		assert.Contains(t, err.Error(), want)
	}
}
