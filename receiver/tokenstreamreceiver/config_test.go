// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver

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
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"
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
	_, err := loadConfig(t, component.NewID(metadata.Type))
	require.EqualError(t, err, "no source configured: set at least one of hooks::http, hooks::udp, hooks::unix, proxy and vllm")
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, "defaults"))
	require.NoError(t, err)
	h := cfg.Hooks.HTTP.Get()
	require.NotNil(t, h)
	assert.Equal(t, "localhost:4320", h.ServerConfig.NetAddr.Endpoint)
	assert.Equal(t, "/v1/token-events", h.Path)
	assert.Equal(t, int64(8<<20), h.ServerConfig.MaxRequestBodySize)
	u := cfg.Hooks.UDP.Get()
	require.NotNil(t, u)
	assert.Equal(t, "localhost:4321", u.Endpoint)
	assert.Equal(t, 5*time.Millisecond, u.BatchWindow)
	x := cfg.Hooks.Unix.Get()
	require.NotNil(t, x)
	assert.Equal(t, "/run/otelcol-llm/hooks.sock", x.Endpoint)
	assert.Equal(t, 5*time.Millisecond, x.BatchWindow)
	perm, errs := x.permissions()
	assert.Empty(t, errs)
	assert.Equal(t, unixPermissions{socketMode: 0o660, directoryMode: 0o750, gid: -1}, perm, "the collector's user and group only")
	assert.Equal(t, LimitsConfig{MaxLineBytes: 16384, MaxLinesPerBatch: 10000, MaxSessionIDBytes: 256, MaxAttributes: 32}, cfg.Hooks.Limits)
}

func TestConfigCustom(t *testing.T) {
	cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, "custom"))
	require.NoError(t, err)
	h := cfg.Hooks.HTTP.Get()
	assert.Equal(t, "0.0.0.0:14320", h.ServerConfig.NetAddr.Endpoint)
	assert.Equal(t, "/hooks", h.Path)
	assert.Equal(t, int64(1<<20), h.ServerConfig.MaxRequestBodySize)
	u := cfg.Hooks.UDP.Get()
	assert.Equal(t, "0.0.0.0:14321", u.Endpoint)
	assert.Equal(t, 4<<20, u.SocketBufferSize)
	assert.Equal(t, 20*time.Millisecond, u.BatchWindow)
	x := cfg.Hooks.Unix.Get()
	assert.Equal(t, "/var/run/llm/hooks.sock", x.Endpoint)
	assert.Equal(t, 10*time.Millisecond, x.BatchWindow)
	perm, errs := x.permissions()
	assert.Empty(t, errs)
	assert.Equal(t, unixPermissions{socketMode: 0o600, directoryMode: 0o700, gid: 4242}, perm)
	assert.Equal(t, LimitsConfig{MaxLineBytes: 4096, MaxLinesPerBatch: 500, MaxSessionIDBytes: 64, MaxAttributes: 8}, cfg.Hooks.Limits)
}

func TestConfigInvalidReportsEveryProblem(t *testing.T) {
	_, err := loadConfig(t, component.NewIDWithName(metadata.Type, "invalid"))
	require.Error(t, err)
	for _, want := range []string{
		`hooks::http::path: must start with '/', got "hooks"`,
		`hooks::http::max_request_body_size: must not be negative, got -1`,
		`hooks::udp::endpoint: address no-port: missing port in address`,
		`hooks::udp::socket_buffer_size: must not be negative, got -1`,
		`hooks::udp::batch_window: want 0 to 100ms, got 1s`,
		`hooks::unix::endpoint: want the socket's path, got none`,
		`hooks::unix::batch_window: want 0 to 100ms, got -1ms`,
		`hooks::unix::socket_mode: want a permission in octal, at most "0777" (quoted, as YAML would read 0660 as a number), got "0666x"`,
		`hooks::unix::directory_mode: want a permission in octal, at most "0777" (quoted, as YAML would read 0660 as a number), got "1777"`,
		`hooks::unix::socket_group: want a group name or numeric ID: group: unknown group no-such-group-otelcol-llm`,
		`hooks::limits::max_lines_per_batch: must be positive, got 0`,
		`hooks::limits::max_line_bytes: 100000 exceeds the largest UDP datagram (65507)`,
	} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestConfigVLLMDefaults(t *testing.T) {
	cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, "vllm_defaults"))
	require.NoError(t, err)
	assert.False(t, cfg.Hooks.HTTP.HasValue())
	assert.False(t, cfg.Proxy.HasValue())
	v := cfg.VLLM.Get()
	require.NotNil(t, v)
	assert.Equal(t, []string{"http://localhost:8000/metrics"}, v.Targets)
	assert.Equal(t, 5*time.Second, v.Interval)
	assert.Equal(t, time.Duration(0), v.Timeout)
	assert.Equal(t, 5*time.Second, v.scrapeTimeout(), "timeout defaults to the interval")
	assert.Equal(t, int64(16<<20), v.MaxBodyBytes)
	assert.Empty(t, v.Client.Endpoint)
}

func TestConfigVLLMCustom(t *testing.T) {
	cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, "vllm_custom"))
	require.NoError(t, err)
	v := cfg.VLLM.Get()
	require.NotNil(t, v)
	assert.Equal(t, []string{"http://10.0.0.1:8000/metrics", "https://engine-b/metrics"}, v.Targets)
	assert.Equal(t, 10*time.Second, v.Interval)
	assert.Equal(t, 3*time.Second, v.scrapeTimeout())
	assert.Equal(t, int64(1<<20), v.MaxBodyBytes)
	require.Len(t, v.Client.Headers, 1)
	assert.Equal(t, "Authorization", v.Client.Headers[0].Name)
	assert.Equal(t, "Bearer secret", string(v.Client.Headers[0].Value))
	assert.True(t, v.Client.TLS.InsecureSkipVerify)
}

func TestConfigVLLMInvalid(t *testing.T) {
	_, err := loadConfig(t, component.NewIDWithName(metadata.Type, "vllm_invalid"))
	require.Error(t, err)
	for _, want := range []string{
		`vllm::targets[1]: want an http(s) URL, got "x"`,
		`vllm::targets[2]: want an http(s) URL, got "ftp://engine/metrics"`,
		`vllm::targets[3]: duplicate of vllm::targets[0] ("http://engine:8000/metrics")`,
		`vllm::timeout: 5s exceeds vllm::interval (2s)`,
		`vllm::max_body_bytes: must be positive, got 0`,
		`vllm::client::endpoint: not used, list the /metrics URLs in vllm::targets (got "http://engine:8000")`,
	} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NotContains(t, err.Error(), "no source configured")

	_, err = loadConfig(t, component.NewIDWithName(metadata.Type, "vllm_no_targets"))
	require.Error(t, err)
	for _, want := range []string{
		`vllm::targets: at least one target is required`,
		`vllm::interval: must be positive, got 0s`,
		`vllm::timeout: must not be negative, got -1s`,
	} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestConfigProxyDefaults(t *testing.T) {
	cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, "proxy_defaults"))
	require.NoError(t, err)
	assert.False(t, cfg.Hooks.HTTP.HasValue())
	assert.False(t, cfg.VLLM.HasValue())
	p := cfg.Proxy.Get()
	require.NotNil(t, p)
	assert.Equal(t, "localhost:8001", p.ServerConfig.NetAddr.Endpoint)
	assert.Equal(t, time.Duration(0), p.ServerConfig.WriteTimeout, "streams last as long as a completion")
	assert.Equal(t, "http://localhost:8000", p.Upstream.ClientConfig.Endpoint)
	assert.Equal(t, 5*time.Minute, p.Upstream.ResponseHeaderTimeout)
	assert.Equal(t, 5*time.Minute, p.Upstream.StreamIdleTimeout)
	assert.Equal(t, time.Minute, p.ClientBodyTimeout)
	assert.Equal(t, time.Minute, p.ClientSendTimeout)
	assert.Equal(t, 20*time.Second, p.DrainTimeout)
	assert.Equal(t, 1024, p.MaxStreams)
	assert.Equal(t, 65536, p.EventQueueSize)
	assert.Equal(t, time.Duration(0), p.Upstream.ClientConfig.Timeout, "no bound on a stream's length")
	assert.Equal(t, StallConfig{}, p.Stall, "the stall breaker is off by default")
	assert.Empty(t, p.Migrate.ClientConfig.Endpoint, "migration is off by default")
	sources, errs := cfg.resolve()
	require.Empty(t, errs)
	assert.Nil(t, sources.proxy.Migrate)
}

func TestConfigProxy(t *testing.T) {
	cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, "proxy"))
	require.NoError(t, err)
	require.True(t, cfg.Hooks.HTTP.HasValue())
	p := cfg.Proxy.Get()
	require.NotNil(t, p)
	assert.Equal(t, "0.0.0.0:8001", p.ServerConfig.NetAddr.Endpoint)
	assert.Equal(t, 5*time.Second, p.ServerConfig.ReadHeaderTimeout)
	assert.Equal(t, "https://vllm-0.example:8000/engine", p.Upstream.ClientConfig.Endpoint)
	assert.Equal(t, 2*time.Minute, p.Upstream.ResponseHeaderTimeout)
	assert.Equal(t, 30*time.Second, p.Upstream.StreamIdleTimeout)
	assert.Equal(t, 20*time.Second, p.ClientBodyTimeout)
	assert.Equal(t, 2*time.Minute, p.ClientSendTimeout)
	assert.Equal(t, 10*time.Second, p.DrainTimeout)
	assert.Equal(t, 256, p.MaxStreams)
	assert.Equal(t, 10000, p.EventQueueSize)
	assert.Equal(t, 2*time.Second, p.Stall.MaxGap)
	assert.Equal(t, 16, p.Stall.MinTokens)
	require.Len(t, p.Upstream.ClientConfig.Headers, 1)
	assert.Equal(t, "Authorization", p.Upstream.ClientConfig.Headers[0].Name)
	assert.Equal(t, "/etc/otelcol/engine-ca.pem", p.Upstream.ClientConfig.TLS.CAFile)

	// What the proxy is started with, read from those keys in one place.
	sources, errs := cfg.resolve()
	require.Empty(t, errs)
	pc := sources.proxy
	require.NotNil(t, pc)
	assert.Equal(t, "https://vllm-0.example:8000/engine", pc.Upstream.String())
	assert.Equal(t, "vllm-0.example:8000", pc.Engine, "named as the scraper names it")
	assert.Equal(t, p.ServerConfig, pc.Server)
	assert.Equal(t, p.Upstream.ClientConfig, pc.Client)
	assert.Equal(t, 2*time.Minute, pc.ResponseHeaderTimeout)
	assert.Equal(t, 30*time.Second, pc.StreamIdleTimeout)
	assert.Equal(t, 20*time.Second, pc.ClientBodyTimeout)
	assert.Equal(t, 2*time.Minute, pc.ClientSendTimeout)
	assert.Equal(t, 10*time.Second, pc.DrainTimeout)
	assert.Equal(t, 256, pc.MaxStreams)
	assert.Equal(t, 10000, pc.EventQueueSize)
	assert.Equal(t, 2*time.Second, pc.StallMaxGap)
	assert.Equal(t, int64(16), pc.StallMinTokens)
	assert.Equal(t, []proxy.HeaderAttribute{{Header: "X-Team", Attribute: "team"}, {Header: "X-Tenant-Id", Attribute: "tenant.id"}}, pc.HeaderAttributes,
		"canonical header names, in a fixed order")
	// Two lines turn migration on, with its defaults.
	require.NotNil(t, pc.Migrate)
	assert.Equal(t, "http://vllm.serving.svc:8000", pc.Migrate.Endpoint.String())
	assert.Equal(t, "vllm.serving.svc:8000", pc.Migrate.Engine)
	assert.Equal(t, 1, pc.Migrate.MaxMoves)
	assert.Equal(t, proxy.TriggerStall|proxy.TriggerIdleTimeout|proxy.TriggerBroken|proxy.TriggerEngineError, pc.Migrate.On)
	assert.Equal(t, 1<<20, pc.Migrate.MaxRequestBytes)
}

// Every problem is reported at once, each named by its YAML key path.
func TestConfigProxyInvalid(t *testing.T) {
	_, err := loadConfig(t, component.NewIDWithName(metadata.Type, "proxy_invalid"))
	require.Error(t, err)
	assert.ElementsMatch(t, []string{
		`hooks::http::endpoint: address no-port: missing port in address`,
		`hooks::http::path: must start with '/', got "events"`,
		`proxy::endpoint: address localhost: missing port in address`,
		`proxy::max_request_body_size: must not be negative, got -5`,
		`proxy::client_send_timeout: must not be negative, got -1s`,
		`proxy::drain_timeout: must not be negative, got -1s`,
		`proxy::max_streams: must not be negative (0: no bound), got -1`,
		`proxy::event_queue_size: must be positive, got 0`,
		`proxy::stall::max_gap: must not be negative, got -1s`,
		`proxy::stall::min_tokens: must not be negative, got -2`,
		`proxy::migrate::endpoint: want an http(s) URL, got "vllm-service"`,
		`proxy::migrate::max_moves: want 1 to 8, got 0`,
		`proxy::migrate::max_request_bytes: must be positive, got 0`,
		`proxy::migrate::triggers[1]: "stall" given twice`,
		`proxy::migrate::triggers[2]: want stall, idle_timeout, broken or engine_error, got "freeze"`,
		`proxy::attributes_from_headers: header "Authorization": a credential header's value never enters telemetry`,
		`proxy::attributes_from_headers: header "X-Tenant-ID": empty attribute key`,
		`proxy::attributes_from_headers: header "X-Team": attribute key of 257 bytes, at most 256 (as a hook's)`,
		`proxy::upstream::endpoint: want an http(s) URL, got "vllm:8000"`,
		`proxy::upstream::response_header_timeout: must be positive, got 0s`,
		`proxy::upstream::stream_idle_timeout: must not be negative, got -1s`,
		`vllm::interval: must be positive, got 0s`,
	}, strings.Split(err.Error(), "\n"))
}

// The errors of Validate name YAML keys, never the Go fields they are
// decoded into.
func TestConfigErrorsNameYAMLKeys(t *testing.T) {
	for _, name := range []string{"invalid", "vllm_invalid", "vllm_no_targets", "proxy_invalid"} {
		_, err := loadConfig(t, component.NewIDWithName(metadata.Type, name))
		require.Error(t, err)
		for _, line := range strings.Split(err.Error(), "\n") {
			key, _, ok := strings.Cut(line, ": ")
			require.True(t, ok, line)
			assert.Regexp(t, `^[a-z_]+(\[\d+\])?(::[a-z_]+(\[\d+\])?)*$`, key, line)
		}
	}
}

// Every YAML example of README.md configures the receiver validly, and the
// complete ones use only the components they define.
func TestREADMEExamples(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(raw, -1)
	require.Len(t, blocks, 6)
	for i, b := range blocks {
		path := filepath.Join(t.TempDir(), "config.yaml")
		require.NoError(t, os.WriteFile(path, b[1], 0o600)) //nolint:gosec // G703: a path under t.TempDir()
		cm, err := confmaptest.LoadConf(path)
		require.NoError(t, err, "example %d", i)
		sub, err := cm.Sub("receivers::token_stream")
		require.NoError(t, err)
		cfg := createDefaultConfig().(*Config)
		require.NoError(t, sub.Unmarshal(cfg), "example %d", i)
		require.NoError(t, confmap.Validate(cfg), "example %d", i)
		pipelines, _ := cm.Get("service::pipelines").(map[string]any)
		for name, p := range pipelines {
			for _, kind := range []string{"receivers", "exporters"} {
				for _, id := range p.(map[string]any)[kind].([]any) {
					assert.True(t, cm.IsSet(kind+"::"+id.(string)), "example %d: pipeline %s uses %s %s, which it does not define", i, name, kind, id)
				}
			}
		}
	}
}

// TestConfigHookPath: hooks::http::path is a plain path; ServeMux pattern
// syntax and anything that is not the path served exactly as written is
// refused at Validate, naming the key.
func TestConfigHookPath(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/token_events": "",
		"/hooks/":          "",
		"/a-b_c.d~e":       "",
		"/v1/{x":           `hooks::http::path: a plain path without pattern wildcards ('{', '}'), got "/v1/{x"`,
		"/v1/{id}":         `hooks::http::path: a plain path without pattern wildcards ('{', '}'), got "/v1/{id}"`,
		"/v1/{$}":          `hooks::http::path: a plain path without pattern wildcards ('{', '}'), got "/v1/{$}"`,
		"POST /v1/events":  `hooks::http::path: must start with '/', got "POST /v1/events"`,
		"/v1/my events":    `hooks::http::path: no spaces or control characters (a method prefix like "POST /x" is not a path), got "/v1/my events"`,
		"/v1/events?x=1":   `hooks::http::path: a path without query or fragment, got "/v1/events?x=1"`,
		"/v1/%7Bx":         `hooks::http::path: a path without percent-escapes, got "/v1/%7Bx"`,
		"example.com/v1":   `hooks::http::path: must start with '/', got "example.com/v1"`,
		"":                 `hooks::http::path: must start with '/', got ""`,
	} {
		cfg := createDefaultConfig().(*Config)
		cfg.Hooks.HTTP.GetOrInsertDefault().Path = path
		err := cfg.Validate()
		if want == "" {
			assert.NoError(t, err, path)
			continue
		}
		assert.EqualError(t, err, want, path)
	}
}

// TestConfigVLLMErrorsRedactTargets: Validate's errors about targets, which
// reach start-up logs, never quote a target's credentials.
func TestConfigVLLMErrorsRedactTargets(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	v := cfg.VLLM.GetOrInsertDefault()
	v.Targets = []string{
		"ftp://user:s3cret@host/metrics?token=tok123",
		"http://user:s3cret@host/metrics?token=tok123",
		"http://user:s3cret@host/metrics?token=tok123",
		"http://user:s3cret@host:bad/metrics?token=tok123",
		"http://user:s3cret@host/metrics?token=tok123\x7f",
	}
	err := cfg.Validate()
	require.Error(t, err)
	for _, secret := range []string{"user", "s3cret", "tok123"} {
		assert.NotContains(t, err.Error(), secret)
	}
	assert.Contains(t, err.Error(), `vllm::targets[0]: want an http(s) URL, got "ftp://xxxxx@host/metrics?token=xxxxx"`)
	assert.Contains(t, err.Error(), `vllm::targets[2]: duplicate of vllm::targets[1] ("http://xxxxx@host/metrics?token=xxxxx")`)
	t.Log(err)
}

// unmarshalAsCollector decodes yaml, the receiver's section, as the
// collector does for `validate` and at start-up: into the factory's default
// config, through the component.Config it is held as.
func unmarshalAsCollector(t *testing.T, yaml string) (component.Config, error) {
	t.Helper()
	retrieved, err := confmap.NewRetrievedFromYAML([]byte(yaml))
	require.NoError(t, err)
	conf, err := retrieved.AsConf()
	require.NoError(t, err)
	cfg := NewFactory().CreateDefaultConfig()
	return cfg, conf.Unmarshal(&cfg)
}

// A misspelled key fails in every section, named by its path: in the
// sections with confighttp's settings (hooks::http, proxy, proxy::upstream,
// vllm::client) and below them (proxy::stall) the collector dropped it.
func TestConfigUnknownKeyNamedByPath(t *testing.T) {
	for _, tc := range []struct{ key, yaml string }{
		{"bogus", "hooks: {udp: {}}\nbogus: 1"},
		{"hooks::bogus", "hooks: {udp: {}, bogus: 1}"},
		{"hooks::http::bogus_http", "hooks: {http: {bogus_http: 1}}"},
		{"hooks::http::tls::cert_fil", "hooks: {http: {tls: {cert_fil: cert.pem}}}"},
		{"hooks::http::cors::allowed_origin", "hooks: {http: {cors: {allowed_origin: [x]}}}"},
		{"hooks::udp::batch_windw", "hooks: {udp: {batch_windw: 1ms}}"},
		{"hooks::unix::bogus", "hooks: {unix: {endpoint: /tmp/s, bogus: 1}}"},
		{"hooks::limits::max_line_byte", "hooks: {udp: {}, limits: {max_line_byte: 1}}"},
		{"proxy::max_stream", "proxy: {upstream: {endpoint: 'http://e:8000'}, max_stream: 1}"},
		{"proxy::stall::max_gpa", "proxy: {upstream: {endpoint: 'http://e:8000'}, stall: {max_gpa: 2s}}"},
		{"proxy::migrate::max_move", "proxy: {upstream: {endpoint: 'http://e:8000'}, migrate: {endpoint: 'http://s:8000', max_move: 2}}"},
		{"proxy::upstream::stream_idle_timout", "proxy: {upstream: {endpoint: 'http://e:8000', stream_idle_timout: 1s}}"},
		{"proxy::upstream::tls::ca_fil", "proxy: {upstream: {endpoint: 'https://e:8000', tls: {ca_fil: ca.pem}}}"},
		{"proxy::tls::key_fil", "proxy: {upstream: {endpoint: 'http://e:8000'}, tls: {key_fil: k.pem}}"},
		{"vllm::intervl", "vllm: {intervl: 1s}"},
		{"vllm::client::timout", "vllm: {client: {timout: 1s}}"},
		{"vllm::client::tls::insecure_skip_verfy", "vllm: {client: {tls: {insecure_skip_verfy: true}}}"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			_, err := unmarshalAsCollector(t, tc.yaml)
			require.Error(t, err, "an unknown key is refused")
			assert.Regexp(t, `(^|\n)'' has invalid keys: `+regexp.QuoteMeta(tc.key)+`$`, err.Error())
		})
	}
}

// The keys that are the user's to choose are accepted: header names of
// attributes_from_headers, client headers, response headers; and enabled,
// which turns an optional section off.
func TestConfigFreeKeysAccepted(t *testing.T) {
	cfg, err := unmarshalAsCollector(t, `
hooks:
  http:
    response_headers: {X-Served-By: otelcol}
  udp:
    enabled: false
proxy:
  upstream:
    endpoint: http://engine:8000
    headers: {X-Any-Header: v}
  attributes_from_headers: {X-Tenant-ID: tenant.id}
vllm:
  client:
    headers: {X-Scrape: v}
`)
	require.NoError(t, err)
	c := cfg.(*Config)
	assert.False(t, c.Hooks.UDP.HasValue())
	assert.Equal(t, map[string]string{"X-Tenant-ID": "tenant.id"}, c.Proxy.Get().AttributesFromHeaders)
	require.NoError(t, c.Validate())
}
