// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
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
	assert.Equal(t, PassNone, cfg.PassTokenEvents)
	assert.Equal(t, 10, cfg.Window)
	assert.Equal(t, session.StallConfig{
		Gap: 150 * time.Millisecond, Consecutive: 3, MaxRecords: 8, CheckInterval: 50 * time.Millisecond,
		DeliverySlack: 500 * time.Millisecond,
	}, cfg.Stall)
	assert.Equal(t, session.TableConfig{IdleTimeout: 5 * time.Minute, MaxActive: 100000, EndedMemory: 16384, MaxFutureSkew: time.Minute}, cfg.Session)
	assert.Equal(t, LimitsConfig{MaxSessionIDBytes: 256, MaxAttributes: 32}, cfg.Limits)
	assert.Equal(t, session.SamplingConfig{TTFT: 500 * time.Millisecond, TPOT: 80 * time.Millisecond, Stalls: true, Errors: true, NormalPercent: 1}, cfg.Sampling)
	assert.Equal(t, 15*time.Second, cfg.Metrics.FlushInterval)
	assert.Equal(t, 2000, cfg.Metrics.CardinalityLimit)
	assert.Equal(t, sessionmetrics.Cumulative, cfg.Metrics.Temporality)
	assert.Equal(t, heldspans.Config{MaxHeldSpans: 100000, MaxHold: 5 * time.Minute, VerdictCacheSize: 100000, PhaseSpans: true}, cfg.Traces)
	assert.Equal(t, EngineTimingConfig{Wait: 6 * time.Second, MaxSessions: 20000}, cfg.EngineTiming)
}

func TestConfigCustom(t *testing.T) {
	cfg, err := loadConfig(t, "custom")
	require.NoError(t, err)
	assert.Equal(t, PassAll, cfg.PassTokenEvents)
	assert.Equal(t, "sglang", cfg.ProviderName)
	assert.Equal(t, 20, cfg.Window)
	assert.Equal(t, session.StallConfig{
		Gap: 200 * time.Millisecond, Consecutive: 4, MaxRecords: 2, CheckInterval: 100 * time.Millisecond,
		DeliverySlack: time.Second,
	}, cfg.Stall)
	assert.Equal(t, session.TableConfig{IdleTimeout: time.Minute, MaxActive: 5000, EndedMemory: 1000, MaxFutureSkew: 10 * time.Second}, cfg.Session)
	assert.Equal(t, LimitsConfig{MaxSessionIDBytes: 512, MaxAttributes: 8}, cfg.Limits)
	assert.Equal(t, session.SamplingConfig{TTFT: time.Second, TPOT: 100 * time.Millisecond, Stalls: false, Errors: true, NormalPercent: 5}, cfg.Sampling)
	assert.Equal(t, sessionmetrics.Config{
		FlushInterval: 30 * time.Second, Dimensions: []string{"quantization", "tenant"}, CardinalityLimit: 500,
		Temporality: sessionmetrics.Delta, Histogram: sessionmetrics.Exponential, ExponentialMaxSize: 80, MaxModels: 20,
		MaxEngines: 10, ForgetAfter: 30 * time.Minute,
	}, cfg.Metrics)
	assert.Equal(t, heldspans.Config{MaxHeldSpans: 1000, MaxHold: time.Minute, VerdictCacheSize: 2000}, cfg.Traces)
	assert.Equal(t, EngineTimingConfig{Wait: 10 * time.Second, MaxSessions: 500, ExpectSpans: true}, cfg.EngineTiming)
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
		"stall::delivery_slack: must not be negative, got -1s",
		"session::max_future_skew: must be positive, got 0s",
		"limits::max_session_id_bytes: must be positive, got 0",
		"limits::max_attributes: must be positive, got -1",
		"sampling::normal_percent: must be within [0, 100], got 150",
		"metrics::flush_interval: must be positive, got -1s",
		"metrics::cardinality_limit: want at least 2 (one regular series plus the overflow series), got 1",
		"metrics::max_models: must not be negative (0: no bound), got -3",
		"metrics::max_engines: must not be negative (0: no bound), got -1",
		"metrics::forget_after: must not be negative (0: never), got -1m0s",
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

// readmeBlocks returns the fenced blocks of the README whose info string
// is lang ("yaml", or "" for plain ones).
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	var (
		blocks []string
		cur    *strings.Builder
		keep   bool
	)
	for line := range strings.Lines(string(b)) {
		fence, isFence := strings.CutPrefix(strings.TrimRight(line, "\n"), "```")
		switch {
		case isFence && cur == nil:
			cur, keep = new(strings.Builder), fence == lang
		case isFence:
			if keep {
				blocks = append(blocks, cur.String())
			}
			cur = nil
		case cur != nil:
			cur.WriteString(line)
		}
	}
	require.Nil(t, cur, "unclosed block")
	return blocks
}

// The README's configuration examples are true to the code: every
// token_session in them validates, and the one with every key at its
// default is the default config.
func TestReadmeConfigs(t *testing.T) {
	var defaults, checked int
	for _, block := range readmeBlocks(t, "yaml") {
		retrieved, err := confmap.NewRetrievedFromYAML([]byte(block))
		require.NoError(t, err, block)
		conf, err := retrieved.AsConf()
		require.NoError(t, err, block)
		procs, _ := conf.ToStringMap()["processors"].(map[string]any)
		for id := range procs {
			if !strings.HasPrefix(id, "token_session") {
				continue
			}
			checked++
			sub, err := conf.Sub("processors::" + id)
			require.NoError(t, err)
			cfg := createDefaultConfig()
			require.NoError(t, sub.Unmarshal(cfg), id)
			require.NoError(t, cfg.Validate(), id)
			if strings.Contains(block, "pass_token_events: none") {
				defaults++
				if len(cfg.Metrics.Dimensions) == 0 {
					cfg.Metrics.Dimensions = nil // dimensions: [] as the default's nil
				}
				if len(cfg.Live.Attributes) == 0 {
					cfg.Live.Attributes = nil
				}
				assert.Equal(t, createDefaultConfig(), cfg, "the README's every key at its default")
			}
		}
	}
	assert.Equal(t, 1, defaults)
	assert.GreaterOrEqual(t, checked, 4)
}

// Every key of the configuration is in the README: in the block with every
// key at its default, and with a row of its own in the table of keys. The
// live view's HTTP server settings are confighttp's, which the README
// names as a whole.
func TestReadmeEveryKey(t *testing.T) {
	conf := confmap.New()
	require.NoError(t, conf.Marshal(createDefaultConfig()))
	server := confmap.New()
	require.NoError(t, server.Marshal(confighttp.NewDefaultServerConfig()))
	confighttpKeys := map[string]bool{}
	for _, k := range server.AllKeys() {
		confighttpKeys[strings.SplitN(k, "::", 2)[0]] = true
	}
	var defaults *confmap.Conf
	for _, block := range readmeBlocks(t, "yaml") {
		if strings.Contains(block, "pass_token_events: none") {
			retrieved, err := confmap.NewRetrievedFromYAML([]byte(block))
			require.NoError(t, err)
			all, err := retrieved.AsConf()
			require.NoError(t, err)
			defaults, err = all.Sub("processors::token_session")
			require.NoError(t, err)
		}
	}
	require.NotNil(t, defaults)
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, key := range conf.AllKeys() {
		if section, field, _ := strings.Cut(key, "::"); section == "live" && confighttpKeys[strings.SplitN(field, "::", 2)[0]] {
			continue
		}
		assert.True(t, defaults.IsSet(key), "%s is in the block of every key at its default", key)
		assert.Contains(t, string(readme), "| `"+key+"` |", "%s has a row in the table of keys", key)
	}
}

// The README's example of a config error is what Validate says (the
// collector puts the component's key before the first line).
func TestReadmeConfigError(t *testing.T) {
	var example string
	for _, block := range readmeBlocks(t, "") {
		if strings.HasPrefix(block, "Error: ") {
			example = block
		}
	}
	require.NotEmpty(t, example)
	cfg := createDefaultConfig()
	cfg.Stall.CheckInterval = 0
	cfg.Metrics.Temporality = "weekly"
	cfg.Traces.MaxHeldSpans = 0
	assert.Equal(t, strings.TrimPrefix(example, "Error: processors::token_session: "), cfg.Validate().Error()+"\n")
}

// A misspelled key fails in every section, named by its path: in live,
// which has confighttp's server settings, the collector dropped it.
func TestConfigUnknownKeyNamedByPath(t *testing.T) {
	for _, tc := range []struct{ key, yaml string }{
		{"pass_token_event", "pass_token_event: all"},
		{"stall::gpa", "stall: {gpa: 1s}"},
		{"session::idle_timout", "session: {idle_timout: 1m}"},
		{"sampling::ttf", "sampling: {ttf: 1s}"},
		{"metrics::dimension", "metrics: {dimension: [tenant]}"},
		{"traces::max_held_span", "traces: {max_held_span: 10}"},
		{"limits::max_attribute", "limits: {max_attribute: 4}"},
		{"engine_timing::expect_span", "engine_timing: {expect_span: true}"},
		{"live::bogus", "live: {endpoint: 'localhost:0', bogus: 1}"},
		{"live::max_viewer", "live: {endpoint: 'localhost:0', max_viewer: 2}"},
		{"live::tls::cert_fil", "live: {endpoint: 'localhost:0', tls: {cert_fil: c.pem}}"},
		{"live::auth::authenticatr", "live: {endpoint: 'localhost:0', auth: {authenticatr: basicauth}}"},
		{"attribution::tenant_attribut", "attribution: {tenant_attribut: tenant.id}"},
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
