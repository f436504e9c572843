package tokensessionprocessor

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
)

func loadConfig(t *testing.T, name string) (*Config, error) {
	t.Helper()
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)
	id := component.NewID(componentType)
	if name != "" {
		id = component.NewIDWithName(componentType, name)
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
	assert.Equal(t, PassNone, cfg.PassTokenEvents)
	assert.Equal(t, 10, cfg.Window)
	assert.Equal(t, StallConfig{Gap: 150 * time.Millisecond, Consecutive: 3, MaxRecords: 8, CheckInterval: 50 * time.Millisecond}, cfg.Stall)
	assert.Equal(t, SessionConfig{IdleTimeout: 5 * time.Minute, MaxActive: 100000, EndedMemory: 16384}, cfg.Session)
	assert.Equal(t, SamplingConfig{TTFT: 500 * time.Millisecond, TPOT: 80 * time.Millisecond, Stalls: true, Errors: true, NormalPercent: 1}, cfg.Sampling)
	assert.Equal(t, 15*time.Second, cfg.Metrics.FlushInterval)
	assert.Equal(t, 2000, cfg.Metrics.CardinalityLimit)
	assert.Equal(t, sessionmetrics.Cumulative, cfg.Metrics.Temporality)
	assert.Equal(t, TracesConfig{MaxHeldSpans: 100000, MaxHold: 5 * time.Minute, VerdictCacheSize: 100000}, cfg.Traces)
}

func TestConfigCustom(t *testing.T) {
	cfg, err := loadConfig(t, "custom")
	require.NoError(t, err)
	assert.Equal(t, PassAll, cfg.PassTokenEvents)
	assert.Equal(t, "sglang", cfg.ProviderName)
	assert.Equal(t, 20, cfg.Window)
	assert.Equal(t, StallConfig{Gap: 200 * time.Millisecond, Consecutive: 4, MaxRecords: 2, CheckInterval: 100 * time.Millisecond}, cfg.Stall)
	assert.Equal(t, SessionConfig{IdleTimeout: time.Minute, MaxActive: 5000, EndedMemory: 1000}, cfg.Session)
	assert.Equal(t, SamplingConfig{TTFT: time.Second, TPOT: 100 * time.Millisecond, Stalls: false, Errors: true, NormalPercent: 5}, cfg.Sampling)
	assert.Equal(t, MetricsConfig{FlushInterval: 30 * time.Second, Dimensions: []string{"quantization", "tenant"}, CardinalityLimit: 500,
		Temporality: sessionmetrics.Delta, Histogram: sessionmetrics.Exponential, ExponentialMaxSize: 80}, cfg.Metrics)
	assert.Equal(t, TracesConfig{MaxHeldSpans: 1000, MaxHold: time.Minute, VerdictCacheSize: 2000}, cfg.Traces)
}

// Every problem is reported at once, each named by its YAML key path; the
// spellings of temporality and histogram are checked with the others, not
// at decoding, where they would hide them.
func TestConfigInvalidReportsEveryProblem(t *testing.T) {
	_, err := loadConfig(t, "invalid")
	require.Error(t, err)
	want := []string{
		`pass_token_events: want none, sampled or all, got "some"`,
		"provider_name: must not be empty",
		"window: must be positive, got 0",
		"stall::consecutive: must be positive, got -1",
		"stall::check_interval: must be positive, got 0s",
		"sampling::normal_percent: must be within [0, 100], got 150",
		"metrics::flush_interval: must be positive, got -1s",
		"metrics::cardinality_limit: want at least 2 (one regular series plus the overflow series), got 1",
		`metrics::dimensions::0: "gen_ai.request.model" is set by the aggregator itself`,
		`metrics::temporality: want cumulative or delta, got "weekly"`,
		`metrics::histogram: want explicit or exponential, got "linear"`,
		"traces::max_held_spans: must be positive, got 0",
		"traces::max_hold: must be positive, got 0s",
	}
	for _, w := range want {
		assert.Contains(t, err.Error(), w)
	}
	assert.Len(t, strings.Split(err.Error(), "\n"), len(want), "one line per problem:\n%v", err)
}

func TestConfigBadTemporality(t *testing.T) {
	cm := confmap.NewFromStringMap(map[string]any{"metrics": map[string]any{"temporality": "sometimes"}})
	cfg := createDefaultConfig()
	require.NoError(t, cm.Unmarshal(cfg), "checked by Validate, with every other problem")
	require.EqualError(t, cfg.Validate(), `metrics::temporality: want cumulative or delta, got "sometimes"`)
}
