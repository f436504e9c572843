// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package strictconfig

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"
)

// testConfig has the shapes the components' configurations have: confighttp
// server settings squashed at its top, a section beside them, a client's
// settings squashed into a section with keys of its own and another client
// as a plain section, an Optional section, maps with free keys and with
// checked values, and a list of sections.
type testConfig struct {
	Server   confighttp.ServerConfig                  `mapstructure:",squash"`
	Stall    stallConfig                              `mapstructure:"stall"`
	Upstream upstreamConfig                           `mapstructure:"upstream"`
	Client   confighttp.ClientConfig                  `mapstructure:"client"`
	Agent    configoptional.Optional[agentConfig]     `mapstructure:"agent"`
	Attrs    map[string]string                        `mapstructure:"attributes"`
	Routes   map[string]agentConfig                   `mapstructure:"routes"`
	Rules    []stallConfig                            `mapstructure:"rules"`
	Hooks    configoptional.Optional[hooksHTTPConfig] `mapstructure:"hooks"`

	_ struct{}
}

type stallConfig struct {
	MaxGap    time.Duration `mapstructure:"max_gap"`
	MinTokens int           `mapstructure:"min_tokens"`
}

type upstreamConfig struct {
	Client                confighttp.ClientConfig `mapstructure:",squash"`
	ResponseHeaderTimeout time.Duration           `mapstructure:"response_header_timeout"`
}

type agentConfig struct {
	Endpoint string `mapstructure:"endpoint"`
}

// hooksHTTPConfig is an Optional section squashing the server settings, as
// token_stream's hooks::http.
type hooksHTTPConfig struct {
	Server confighttp.ServerConfig `mapstructure:",squash"`
	Path   string                  `mapstructure:"path"`
}

func (c *testConfig) Unmarshal(conf *confmap.Conf) error { return Unmarshal(conf, c) }

// plainConfig is testConfig without the check: what the collector decodes.
type plainConfig testConfig

func defaultConfig() testConfig {
	return testConfig{
		Server:   confighttp.NewDefaultServerConfig(),
		Stall:    stallConfig{MaxGap: time.Second, MinTokens: 3},
		Upstream: upstreamConfig{Client: confighttp.NewDefaultClientConfig(), ResponseHeaderTimeout: time.Minute},
		Client:   confighttp.NewDefaultClientConfig(),
		Agent:    configoptional.Default(agentConfig{Endpoint: "localhost:1"}),
		Attrs:    map[string]string{"x-default": "d"},
	}
}

func load(t *testing.T, yaml string) (testConfig, error) {
	t.Helper()
	retrieved, err := confmap.NewRetrievedFromYAML([]byte(yaml))
	require.NoError(t, err)
	conf, err := retrieved.AsConf()
	require.NoError(t, err)
	cfg := defaultConfig()
	return cfg, conf.Unmarshal(&cfg)
}

// Every key the collector's confighttp README documents for a server is
// accepted where a section squashes the server settings, at the top and in
// an Optional section, and decodes.
func TestServerKeysAccepted(t *testing.T) {
	const server = `
endpoint: 0.0.0.0:4320
transport: tcp
tls:
  cert_file: cert.pem
  key_file: key.pem
  client_ca_file: ca.pem
  min_version: "1.3"
  reload_interval: 1h
cors:
  allowed_origins: [https://*.example.com]
  allowed_headers: [X-Custom]
  exposed_headers: [X-Exposed]
  max_age: 7200
auth:
  authenticator: basicauth
  request_params: [token]
max_request_body_size: 1048576
include_metadata: true
response_headers:
  X-Served-By: otelcol
compression_algorithms: ["", gzip]
read_timeout: 10s
read_header_timeout: 5s
write_timeout: 20s
middlewares:
  - id: mw
`
	for name, yaml := range map[string]string{
		"top":                       server + "keepalive:\n  enabled: true\n  idle_timeout: 2m\n",
		"top, deprecated keepalive": server + "idle_timeout: 3m\nkeep_alives_enabled: false\n",
		"optional section":          "hooks:\n  path: /h\n" + indent(server+"keepalive:\n  idle_timeout: 2m\n"),
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := load(t, yaml)
			require.NoError(t, err)
			s := &cfg.Server
			if h := cfg.Hooks.Get(); h != nil {
				s = &h.Server
				assert.Equal(t, "/h", h.Path)
			}
			assert.Equal(t, "0.0.0.0:4320", s.NetAddr.Endpoint)
			assert.Equal(t, "cert.pem", s.TLS.Get().CertFile)
			assert.Equal(t, []string{"https://*.example.com"}, s.CORS.Get().AllowedOrigins)
			assert.Equal(t, "basicauth", s.Auth.Get().Config.AuthenticatorID.String())
			assert.Equal(t, int64(1<<20), s.MaxRequestBodySize)
			assert.True(t, s.IncludeMetadata)
			assert.Len(t, s.ResponseHeaders, 1)
			assert.Equal(t, []string{"", "gzip"}, s.CompressionAlgorithms)
			assert.Equal(t, 10*time.Second, s.ReadTimeout)
			assert.Equal(t, 5*time.Second, s.ReadHeaderTimeout)
			assert.Equal(t, 20*time.Second, s.WriteTimeout)
			assert.Len(t, s.Middlewares, 1)
		})
	}
}

// Every key the collector's confighttp README documents for a client is
// accepted where a section squashes the client settings and where they are
// a section of their own, and decodes.
func TestClientKeysAccepted(t *testing.T) {
	const client = `
endpoint: http://engine:8000
proxy_url: http://proxy:3128
tls:
  insecure: false
  ca_file: ca.pem
  cert_file: cert.pem
  key_file: key.pem
  server_name_override: engine
headers:
  X-Api-Version: "2"
read_buffer_size: 4096
write_buffer_size: 4096
timeout: 30s
compression: gzip
compression_params:
  level: 1
max_conns_per_host: 10
auth:
  authenticator: oauth2client
force_attempt_http2: true
http2_read_idle_timeout: 10s
http2_ping_timeout: 5s
cookies:
  enabled: true
middlewares:
  - id: mw
`
	for name, yaml := range map[string]string{
		"squashed": "upstream:\n  response_header_timeout: 1m\n" + indent(client+"keepalive:\n  enabled: true\n  idle_conn_timeout: 1m\n  max_idle_conns: 10\n  max_idle_conns_per_host: 2\n"),
		"section":  "client:\n" + indent(client+"idle_conn_timeout: 1m\nmax_idle_conns: 10\nmax_idle_conns_per_host: 2\ndisable_keep_alives: true\n"),
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := load(t, yaml)
			require.NoError(t, err)
			c := &cfg.Client
			if name == "squashed" {
				c = &cfg.Upstream.Client
			}
			assert.Equal(t, "http://engine:8000", c.Endpoint)
			assert.Equal(t, "ca.pem", c.TLS.CAFile)
			assert.Len(t, c.Headers, 1)
			assert.Equal(t, 30*time.Second, c.Timeout)
			assert.Equal(t, "oauth2client", c.Auth.Get().AuthenticatorID.String())
			assert.Equal(t, 10, c.MaxIdleConns) //nolint:staticcheck // SA1019: the deprecated key must still decode
			assert.True(t, c.Cookies.HasValue())
		})
	}
}

// indent puts yaml under a section's key.
func indent(yaml string) string {
	var b strings.Builder
	for line := range strings.Lines(yaml) {
		if line != "\n" {
			b.WriteString("  " + line)
		}
	}
	return b.String()
}

// Each unknown key is refused, by its path, in the collector's wording,
// wherever it is: the sections beside, above and below the confighttp
// settings the collector leaves unchecked included.
func TestUnknownKeysNamedByPath(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"bogus: 1", "bogus"},
		{"stall: {max_gpa: 2s}", "stall::max_gpa"},
		{"upstream: {endpont: http://x}", "upstream::endpont"},
		{"upstream: {tls: {ca_fil: x}}", "upstream::tls::ca_fil"},
		{"client: {bogus: 1}", "client::bogus"},
		{"client: {keepalive: {bogus: 1}}", "client::keepalive::bogus"},
		{"tls: {cert_fil: x}", "tls::cert_fil"},
		{"cors: {allowed_origin: [x]}", "cors::allowed_origin"},
		{"auth: {authenticatr: x}", "auth::authenticatr"},
		{"dialer: {timeot: 1s}", "dialer::timeot"},
		{"keepalive: {idle_timout: 1s}", "keepalive::idle_timout"},
		{"middlewares: [{id: a}, {id: b, bogus: 1}]", "middlewares[1]::bogus"},
		{"response_headers: [{name: a, value: b, bogus: 1}]", "response_headers[0]::bogus"},
		{"agent: {endpoint: x, bogus: 1}", "agent::bogus"},
		{"routes: {a: {endpoint: x, bogus: 1}}", "routes::a::bogus"},
		{"rules: [{max_gap: 1s, bogus: 1}]", "rules[0]::bogus"},
		{"hooks: {path: /h, bogus_http: 1}", "hooks::bogus_http"},
		{"hooks: {tls: {bogus: 1}}", "hooks::tls::bogus"},
		// Every one at once, in the order of their paths.
		{"zz: 1\naa: 1\nstall: {b: 1, a: 1}\nupstream: {c: 1}", "aa, stall::a, stall::b, upstream::c, zz"},
	} {
		t.Run(tc.yaml, func(t *testing.T) {
			_, err := load(t, tc.yaml)
			require.Error(t, err)
			// confmap puts the section it decodes, the top level, before the
			// error of an Unmarshal method.
			assert.Regexp(t, `(^|\n)'' has invalid keys: `+regexp.QuoteMeta(tc.want)+`$`, err.Error())
		})
	}
}

// Where a type leaves the keys to the user (a map's keys, a MapList's map
// form) any key is accepted, and enabled is an Optional section's.
func TestFreeKeysAccepted(t *testing.T) {
	cfg, err := load(t, `
attributes: {X-Tenant-ID: tenant.id, any key: v}
response_headers: {X-Anything: v}
client: {headers: {X-Whatever: v}}
agent: {enabled: false}
hooks: {enabled: true, path: /h}
routes: {free-name: {endpoint: x}}
`)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"x-default": "d", "X-Tenant-ID": "tenant.id", "any key": "v"}, cfg.Attrs)
	assert.False(t, cfg.Agent.HasValue(), "agent::enabled: false")
	assert.True(t, cfg.Hooks.HasValue())
}

// Unmarshal decodes as the collector does: the defaults stay where the
// configuration says nothing, an absent or null Optional section keeps its
// variant, everything else is confmap's decoding unchanged.
func TestDecodesAsTheCollector(t *testing.T) {
	for _, yaml := range []string{
		"{}",
		"agent:",
		"agent: {}",
		"agent: {enabled: false}",
		"hooks:",
		"hooks: {path: /h}",
		"stall: {min_tokens: 5}\nattributes: {a: b}\nrules: [{max_gap: 2s}]",
		"endpoint: localhost:1\nidle_timeout: 2m\nupstream: {timeout: 5s, headers: [{name: a, value: b}]}",
		"keepalive: {enabled: false}\nclient: {keepalive: {max_idle_conns: 3}}",
	} {
		t.Run(yaml, func(t *testing.T) {
			strict, err := load(t, yaml)
			require.NoError(t, err)
			retrieved, err := confmap.NewRetrievedFromYAML([]byte(yaml))
			require.NoError(t, err)
			conf, err := retrieved.AsConf()
			require.NoError(t, err)
			plain := plainConfig(defaultConfig())
			require.NoError(t, conf.Unmarshal(&plain))
			assert.Equal(t, testConfig(plain), strict)
		})
	}
	// A component with no keys at all (token_stream: with nothing after it).
	cfg := defaultConfig()
	require.NoError(t, confmap.NewFromStringMap(nil).Unmarshal(&cfg))
	assert.Equal(t, defaultConfig(), cfg)
}

// Any configuration is checked without a panic: what is no map or list
// where a section is expected is left to the decode, which reports it.
func FuzzUnmarshal(f *testing.F) {
	for _, seed := range []string{
		"bogus: 1", "stall: 5", "stall: [1, 2]", "agent: x", "agent: [a]", "rules: {a: 1}", "rules: [1, [2], {x: 1}]",
		"routes: [a]", "routes: {a: 5}", "response_headers: 7", "middlewares: {id: a}", "hooks: {tls: 3, bogus: 1}",
		"upstream: {headers: [{name: a}], tls: []}", "client: {keepalive: 1}", "attributes: {a: {b: c}}",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(_ *testing.T, yaml string) {
		retrieved, err := confmap.NewRetrievedFromYAML([]byte(yaml))
		if err != nil {
			return
		}
		conf, err := retrieved.AsConf()
		if err != nil {
			return
		}
		cfg := defaultConfig()
		_ = conf.Unmarshal(&cfg)
	})
}
