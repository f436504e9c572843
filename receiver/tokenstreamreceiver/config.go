// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os/user"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelcol-llm/otelcol-llm/internal/strictconfig"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"
)

// Config is the configuration of the token_stream receiver.
type Config struct {
	// Hooks are the endpoints engine hooks push token events to.
	Hooks HooksConfig `mapstructure:"hooks"`
	// Proxy is a reverse proxy in front of an OpenAI-compatible server whose
	// completions requests it observes.
	Proxy configoptional.Optional[ProxyConfig] `mapstructure:"proxy"`
	// VLLM scrapes the engines' Prometheus /metrics endpoints (the metrics
	// signal).
	VLLM configoptional.Optional[VLLMConfig] `mapstructure:"vllm"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// HooksConfig configures the hook endpoints. Each transport is off unless
// its key is present, as with the otlp receiver's protocols.
type HooksConfig struct {
	// HTTP accepts NDJSON batches posted to Path.
	HTTP configoptional.Optional[HTTPConfig] `mapstructure:"http"`
	// UDP accepts datagrams of one or more NDJSON lines.
	UDP configoptional.Optional[UDPConfig] `mapstructure:"udp"`
	// Unix accepts stream connections on a Unix domain socket, each a
	// stream of NDJSON lines.
	Unix configoptional.Optional[UnixConfig] `mapstructure:"unix"`
	// Limits apply to every transport.
	Limits LimitsConfig `mapstructure:"limits"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// HTTPConfig is the HTTP hook endpoint: a standard confighttp server.
type HTTPConfig struct {
	ServerConfig confighttp.ServerConfig `mapstructure:",squash"`
	// Path is the URL path token event batches are posted to.
	Path string `mapstructure:"path"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// maxDatagramBytes is the largest UDP payload; a datagram is read whole.
const maxDatagramBytes = 65507

// UDPConfig is the UDP hook endpoint.
type UDPConfig struct {
	// Endpoint is the host:port to listen on.
	Endpoint string `mapstructure:"endpoint"`
	// SocketBufferSize sets the socket's receive buffer (SO_RCVBUF) in bytes;
	// 0 keeps the OS default. A larger buffer absorbs bursts.
	SocketBufferSize int `mapstructure:"socket_buffer_size"`
	// BatchWindow is how long the listener goes on reading datagrams after
	// the first of a batch before handing them to the pipeline together:
	// one pipeline call and one record per session for all of them, instead
	// of per datagram. 0 waits for none: only the datagrams one read takes
	// (those already queued) go together.
	BatchWindow time.Duration `mapstructure:"batch_window"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// UnixConfig is the Unix domain socket hook endpoint: an engine on the
// node keeps a connection open and writes lines as they come, and the
// listener hands them to the pipeline in batches by time, acknowledging
// each batch on the connection.
type UnixConfig struct {
	// Endpoint is the socket's path. A socket file left by a collector
	// that did not shut down is replaced.
	Endpoint string `mapstructure:"endpoint"`
	// BatchWindow is how long a connection goes on reading after the
	// first bytes of a batch before handing the batch to the pipeline, as
	// hooks::udp::batch_window. 0 hands over what each read took.
	BatchWindow time.Duration `mapstructure:"batch_window"`
	// SocketMode is the socket file's permission, in octal ("0660"): on
	// Linux connecting needs write permission, so it says who may send.
	SocketMode string `mapstructure:"socket_mode"`
	// SocketGroup is the group of the socket file, and of the directories
	// the receiver makes for it: a name or a numeric ID. Empty: the
	// collector's own group.
	SocketGroup string `mapstructure:"socket_group"`
	// DirectoryMode is the permission, in octal, of the socket's directory
	// when the receiver makes it; one that exists is left as it is.
	DirectoryMode string `mapstructure:"directory_mode"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// unixPermissions is what the receiver sets on the socket and on the
// directories it makes for it; gid is -1 to leave the group as created.
type unixPermissions struct {
	socketMode, directoryMode fs.FileMode
	gid                       int
}

// permissions reads socket_mode, socket_group and directory_mode, with an
// error for each that is not valid.
func (u *UnixConfig) permissions() (unixPermissions, []error) {
	var errs []error
	mode := func(key, s string) fs.FileMode {
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil || m > 0o777 {
			errs = append(errs, fmt.Errorf("hooks::unix::%s: want a permission in octal, at most \"0777\" (quoted, as YAML would read 0660 as a number), got %q", key, s))
		}
		return fs.FileMode(m) & fs.ModePerm
	}
	p := unixPermissions{socketMode: mode("socket_mode", u.SocketMode), directoryMode: mode("directory_mode", u.DirectoryMode), gid: -1}
	if u.SocketGroup != "" {
		gid, err := lookupGroup(u.SocketGroup)
		if err != nil {
			errs = append(errs, fmt.Errorf("hooks::unix::socket_group: %w", err))
		}
		p.gid = gid
	}
	return p, errs
}

// lookupGroup is the ID of a group given by name or number.
func lookupGroup(group string) (int, error) {
	if gid, err := strconv.ParseUint(group, 10, 31); err == nil {
		return int(gid), nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return -1, fmt.Errorf("want a group name or numeric ID: %w", err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return -1, fmt.Errorf("group %q has the ID %q, not a number", group, g.Gid)
	}
	return gid, nil
}

// ProxyConfig is the proxy: a confighttp server for the clients and a
// confighttp client for the upstream (its endpoint is the upstream's URL).
type ProxyConfig struct {
	ServerConfig confighttp.ServerConfig `mapstructure:",squash"`
	Upstream     UpstreamConfig          `mapstructure:"upstream"`
	// ClientBodyTimeout bounds each wait for the client's next request
	// body bytes (nginx's client_body_timeout): a slow-drip upload gets 408.
	ClientBodyTimeout time.Duration `mapstructure:"client_body_timeout"`
	// ClientSendTimeout bounds each write to the client (nginx's
	// send_timeout): a client that stops reading is let go, and the
	// upstream request with it.
	ClientSendTimeout time.Duration `mapstructure:"client_send_timeout"`
	// DrainTimeout bounds how long Shutdown lets running streams finish
	// after the listener closed; the streams still running then are cut and
	// their sessions end as shutdown.
	DrainTimeout time.Duration `mapstructure:"drain_timeout"`
	// MaxStreams bounds the observed requests open at once (503 beyond it);
	// 0 means no bound.
	MaxStreams int `mapstructure:"max_streams"`
	// EventQueueSize bounds the token events waiting for the pipeline; when
	// it is full, further token events are dropped (counted) and the
	// streams go on.
	EventQueueSize int `mapstructure:"event_queue_size"`
	// Stall is the stall breaker: a stream whose next token is too late is
	// cut, so that the client can retry on another replica. Off by default.
	Stall StallConfig `mapstructure:"stall"`
	// Migrate continues a stream that fails mid-answer (a stall, a broken
	// stream, the engine's error event) on a healthy replica, so that the
	// client gets one whole answer. Off unless its endpoint is set.
	Migrate MigrateConfig `mapstructure:"migrate"`
	// AttributesFromHeaders copies request headers into the session's start
	// attributes: header name -> attribute key (a tenant header for
	// token_session's attribution::tenant_attribute). Empty by default:
	// no header value enters telemetry unless named here.
	AttributesFromHeaders map[string]string `mapstructure:"attributes_from_headers"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// credentialHeaders may never be copied into attributes: their values are
// secrets.
var credentialHeaders = map[string]bool{
	"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "Set-Cookie": true,
	"X-Api-Key": true, "Api-Key": true,
}

// headerAttributes is attributes_from_headers checked and in a fixed order
// (by header), with canonical header names.
func (p *ProxyConfig) headerAttributes(maxAttributes int) ([]proxy.HeaderAttribute, []error) {
	var out []proxy.HeaderAttribute
	var errs []error
	keys := map[string]string{}
	for h, key := range p.AttributesFromHeaders {
		name := http.CanonicalHeaderKey(strings.TrimSpace(h))
		switch {
		case name == "":
			errs = append(errs, errors.New("proxy::attributes_from_headers: empty header name"))
		case credentialHeaders[name]:
			errs = append(errs, fmt.Errorf("proxy::attributes_from_headers: header %q: a credential header's value never enters telemetry", h))
		case key == "":
			errs = append(errs, fmt.Errorf("proxy::attributes_from_headers: header %q: empty attribute key", h))
		case len(key) > tokenevent.MaxAttributeKeyBytes:
			errs = append(errs, fmt.Errorf("proxy::attributes_from_headers: header %q: attribute key of %d bytes, at most %d (as a hook's)", h, len(key), tokenevent.MaxAttributeKeyBytes))
		case keys[key] != "":
			errs = append(errs, fmt.Errorf("proxy::attributes_from_headers: header %q: attribute key %q also from header %q", h, key, keys[key]))
		default:
			keys[key] = h
			out = append(out, proxy.HeaderAttribute{Header: name, Attribute: key})
		}
	}
	if maxAttributes > 0 && len(out) > maxAttributes {
		errs = append(errs, fmt.Errorf("proxy::attributes_from_headers: %d entries, more than limits::max_attributes (%d)", len(out), maxAttributes))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Header < out[j].Header })
	return out, errs
}

// StallConfig is the proxy's stall breaker.
type StallConfig struct {
	// MaxGap is the longest a stream may go without a token once it has
	// MinTokens; a later token is not waited for: the upstream request is
	// cancelled and the client gets an engine_stalled error event. 0 turns
	// the breaker off. The wait for the first token (queue and prefill) is
	// never cut.
	MaxGap time.Duration `mapstructure:"max_gap"`
	// MinTokens is the token events (content chunks) a stream relays before
	// the breaker watches it, for models that pause long early on (a
	// reasoning phase); 0 and 1 both watch from the first token.
	MinTokens int `mapstructure:"min_tokens"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// MigrateConfig is the proxy's migration of failing streams: a confighttp
// client for the endpoint that reaches the healthy replicas (the cluster's
// Service or router), and when and how often to move a stream.
type MigrateConfig struct {
	ClientConfig confighttp.ClientConfig `mapstructure:",squash"`
	// MaxMoves bounds the moves of one request.
	MaxMoves int `mapstructure:"max_moves"`
	// Triggers are the failures a stream moves on: stall, idle_timeout,
	// broken, engine_error.
	Triggers []string `mapstructure:"triggers"`
	// MaxRequestBytes bounds the copy of each request kept to send it
	// again; a larger request is not moved.
	MaxRequestBytes int `mapstructure:"max_request_bytes"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// maxMoves bounds max_moves: a request that fails on that many replicas
// is not the replicas' problem.
const maxMoves = 8

// resolve is what the proxy takes, nil when off, with an error for each
// key that is not valid.
func (m *MigrateConfig) resolve(upstream string) (*proxy.MigrateConfig, []error) {
	if m.ClientConfig.Endpoint == "" {
		return nil, nil
	}
	var errs []error
	u, err := url.Parse(m.ClientConfig.Endpoint)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("proxy::migrate::endpoint: %w", err))
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		errs = append(errs, fmt.Errorf("proxy::migrate::endpoint: want an http(s) URL, got %q", m.ClientConfig.Endpoint))
	case strings.TrimSuffix(m.ClientConfig.Endpoint, "/") == strings.TrimSuffix(upstream, "/"):
		errs = append(errs, errors.New("proxy::migrate::endpoint: the upstream itself; want the endpoint of the other replicas (the Service or router in front of them)"))
	}
	if m.MaxMoves < 1 || m.MaxMoves > maxMoves {
		errs = append(errs, fmt.Errorf("proxy::migrate::max_moves: want 1 to %d, got %d", maxMoves, m.MaxMoves))
	}
	if m.MaxRequestBytes <= 0 {
		errs = append(errs, fmt.Errorf("proxy::migrate::max_request_bytes: must be positive, got %d", m.MaxRequestBytes))
	}
	var on proxy.Triggers
	if len(m.Triggers) == 0 {
		errs = append(errs, errors.New("proxy::migrate::triggers: want at least one of stall, idle_timeout, broken, engine_error"))
	}
	for i, name := range m.Triggers {
		t, ok := proxy.TriggerNames[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("proxy::migrate::triggers[%d]: want stall, idle_timeout, broken or engine_error, got %q", i, name))
		case on&t != 0:
			errs = append(errs, fmt.Errorf("proxy::migrate::triggers[%d]: %q given twice", i, name))
		}
		on |= t
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return &proxy.MigrateConfig{
		Client: m.ClientConfig, Endpoint: u, Engine: engineName(u),
		MaxMoves: m.MaxMoves, On: on, MaxRequestBytes: m.MaxRequestBytes,
	}, nil
}

// UpstreamConfig is the proxy's client of the engine: confighttp's settings
// and the proxy's own time bounds. A stream has no overall bound: it lasts
// as long as its completion, as long as the engine keeps sending.
type UpstreamConfig struct {
	ClientConfig confighttp.ClientConfig `mapstructure:",squash"`
	// ResponseHeaderTimeout bounds the wait for the upstream's response
	// headers once the request is written (504 on expiry). A non-streaming
	// response's headers come with the whole completion.
	ResponseHeaderTimeout time.Duration `mapstructure:"response_header_timeout"`
	// StreamIdleTimeout bounds each wait for the upstream's next bytes once
	// its headers arrived; 0 disables it.
	StreamIdleTimeout time.Duration `mapstructure:"stream_idle_timeout"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// headerTimeout is response_header_timeout, or the deprecated
// confighttp timeout when that is set (it used to bound the whole exchange).
func (u *UpstreamConfig) headerTimeout() time.Duration {
	if u.ClientConfig.Timeout > 0 {
		return u.ClientConfig.Timeout
	}
	return u.ResponseHeaderTimeout
}

// LimitsConfig bounds what one request or datagram may carry.
type LimitsConfig struct {
	// MaxLineBytes is the longest NDJSON line accepted.
	MaxLineBytes int `mapstructure:"max_line_bytes"`
	// MaxLinesPerBatch is the most lines taken from one request or datagram;
	// the lines after it are rejected.
	MaxLinesPerBatch int `mapstructure:"max_lines_per_batch"`
	// MaxSessionIDBytes is the longest session_id accepted.
	MaxSessionIDBytes int `mapstructure:"max_session_id_bytes"`
	// MaxAttributes is the most attributes a start event may carry.
	MaxAttributes int `mapstructure:"max_attributes"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func (l LimitsConfig) parserLimits() tokenevent.Limits {
	return tokenevent.Limits{MaxLineBytes: l.MaxLineBytes, MaxSessionIDBytes: l.MaxSessionIDBytes, MaxAttributes: l.MaxAttributes}
}

var _ confmap.Unmarshaler = (*Config)(nil)

// Unmarshal decodes the configuration as the collector does and refuses
// every key no section knows, naming its section (internal/strictconfig:
// the collector drops them in sections with confighttp's settings).
func (cfg *Config) Unmarshal(conf *confmap.Conf) error {
	return strictconfig.Unmarshal(conf, cfg)
}

var _ confmap.Validator = (*Config)(nil)

// Validate checks the configuration, reporting every problem at once.
func (cfg *Config) Validate() error {
	var errs []error
	if !cfg.Hooks.HTTP.HasValue() && !cfg.Hooks.UDP.HasValue() && !cfg.Hooks.Unix.HasValue() && !cfg.Proxy.HasValue() && !cfg.VLLM.HasValue() {
		errs = append(errs, errors.New("no source configured: set at least one of hooks::http, hooks::udp, hooks::unix, proxy and vllm"))
	}
	if v := cfg.VLLM.Get(); v != nil {
		errs = append(errs, v.validate()...)
	}
	if p := cfg.Proxy.Get(); p != nil {
		errs = append(errs, checkListenAddr("proxy::endpoint", &p.ServerConfig), checkBodyLimit("proxy", &p.ServerConfig))
		for _, d := range []struct {
			key string
			v   time.Duration
		}{
			{"client_body_timeout", p.ClientBodyTimeout},
			{"client_send_timeout", p.ClientSendTimeout},
			{"drain_timeout", p.DrainTimeout},
			{"upstream::timeout", p.Upstream.ClientConfig.Timeout},
			{"upstream::response_header_timeout", p.Upstream.ResponseHeaderTimeout},
			{"upstream::stream_idle_timeout", p.Upstream.StreamIdleTimeout},
			{"stall::max_gap", p.Stall.MaxGap},
		} {
			if d.v < 0 {
				errs = append(errs, fmt.Errorf("proxy::%s: must not be negative, got %s", d.key, d.v))
			}
		}
		if p.MaxStreams < 0 {
			errs = append(errs, fmt.Errorf("proxy::max_streams: must not be negative (0: no bound), got %d", p.MaxStreams))
		}
		if p.Stall.MinTokens < 0 {
			errs = append(errs, fmt.Errorf("proxy::stall::min_tokens: must not be negative, got %d", p.Stall.MinTokens))
		}
		if p.EventQueueSize <= 0 {
			errs = append(errs, fmt.Errorf("proxy::event_queue_size: must be positive, got %d", p.EventQueueSize))
		}
		if p.Upstream.headerTimeout() == 0 {
			errs = append(errs, errors.New("proxy::upstream::response_header_timeout: must be positive, got 0s"))
		}
	}
	if h := cfg.Hooks.HTTP.Get(); h != nil {
		errs = append(errs, checkListenAddr("hooks::http::endpoint", &h.ServerConfig), checkBodyLimit("hooks::http", &h.ServerConfig))
		if err := checkHookPath(h.Path); err != nil {
			errs = append(errs, fmt.Errorf("hooks::http::path: %w", err))
		}
	}
	if u := cfg.Hooks.UDP.Get(); u != nil {
		if _, _, err := net.SplitHostPort(u.Endpoint); err != nil {
			errs = append(errs, fmt.Errorf("hooks::udp::endpoint: %w", err))
		}
		if u.SocketBufferSize < 0 {
			errs = append(errs, fmt.Errorf("hooks::udp::socket_buffer_size: must not be negative, got %d", u.SocketBufferSize))
		}
		if u.BatchWindow < 0 || u.BatchWindow > maxBatchWindow {
			errs = append(errs, fmt.Errorf("hooks::udp::batch_window: want 0 to %s, got %s", maxBatchWindow, u.BatchWindow))
		}
	}
	if u := cfg.Hooks.Unix.Get(); u != nil {
		switch {
		case u.Endpoint == "":
			errs = append(errs, errors.New("hooks::unix::endpoint: want the socket's path, got none"))
		case len(u.Endpoint) > maxUnixPathBytes:
			errs = append(errs, fmt.Errorf("hooks::unix::endpoint: %d bytes, a socket path holds at most %d", len(u.Endpoint), maxUnixPathBytes))
		}
		if u.BatchWindow < 0 || u.BatchWindow > maxBatchWindow {
			errs = append(errs, fmt.Errorf("hooks::unix::batch_window: want 0 to %s, got %s", maxBatchWindow, u.BatchWindow))
		}
	}
	l := cfg.Hooks.Limits
	for _, f := range []struct {
		name string
		v    int
	}{
		{"max_line_bytes", l.MaxLineBytes},
		{"max_lines_per_batch", l.MaxLinesPerBatch},
		{"max_session_id_bytes", l.MaxSessionIDBytes},
		{"max_attributes", l.MaxAttributes},
	} {
		if f.v <= 0 {
			errs = append(errs, fmt.Errorf("hooks::limits::%s: must be positive, got %d", f.name, f.v))
		}
	}
	if l.MaxLineBytes > maxDatagramBytes && cfg.Hooks.UDP.HasValue() {
		errs = append(errs, fmt.Errorf("hooks::limits::max_line_bytes: %d exceeds the largest UDP datagram (%d)", l.MaxLineBytes, maxDatagramBytes))
	}
	_, rerrs := cfg.resolve()
	errs = append(errs, rerrs...)
	return errors.Join(errs...)
}

// resolvedSources is the configuration as the sources take it, read from
// Config in one place: Validate reports the errors of this reading, and the
// receiver keeps its result from when it is made.
type resolvedSources struct {
	// proxy is what proxy.Start takes; nil without a proxy.
	proxy *proxy.Config
	// unix is the Unix hook's permissions, when it is on.
	unix unixPermissions
}

// resolve reads the settings the proxy and the hooks take that are derived
// from more than one key, or looked up: the upstream's URL and engine name,
// the header attributes, the Unix socket's permissions and group.
func (cfg *Config) resolve() (resolvedSources, []error) {
	var s resolvedSources
	var errs []error
	if p := cfg.Proxy.Get(); p != nil {
		pc, perrs := p.proxyConfig(cfg.Hooks.Limits.MaxAttributes)
		s.proxy, errs = pc, append(errs, perrs...)
	}
	if u := cfg.Hooks.Unix.Get(); u != nil {
		perm, perrs := u.permissions()
		s.unix, errs = perm, append(errs, perrs...)
	}
	return s, errs
}

// proxyConfig is what proxy.Start takes, with an error for each key that
// is not valid: the upstream's endpoint and attributes_from_headers.
func (p *ProxyConfig) proxyConfig(maxAttributes int) (*proxy.Config, []error) {
	var errs []error
	upstream, err := url.Parse(p.Upstream.ClientConfig.Endpoint)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("proxy::upstream::endpoint: %w", err))
	case upstream.Scheme != "http" && upstream.Scheme != "https", upstream.Host == "":
		errs = append(errs, fmt.Errorf("proxy::upstream::endpoint: want an http(s) URL, got %q", p.Upstream.ClientConfig.Endpoint))
	}
	headers, herrs := p.headerAttributes(maxAttributes)
	errs = append(errs, herrs...)
	migrate, merrs := p.Migrate.resolve(p.Upstream.ClientConfig.Endpoint)
	errs = append(errs, merrs...)
	if len(errs) > 0 {
		return nil, errs
	}
	return &proxy.Config{
		Server: p.ServerConfig, Client: p.Upstream.ClientConfig, Upstream: upstream, Engine: engineName(upstream),
		ResponseHeaderTimeout: p.Upstream.headerTimeout(), StreamIdleTimeout: p.Upstream.StreamIdleTimeout,
		ClientBodyTimeout: p.ClientBodyTimeout, ClientSendTimeout: p.ClientSendTimeout,
		DrainTimeout: p.DrainTimeout, MaxStreams: p.MaxStreams, EventQueueSize: p.EventQueueSize,
		StallMaxGap: p.Stall.MaxGap, StallMinTokens: int64(p.Stall.MinTokens), HeaderAttributes: headers,
		Migrate: migrate,
	}, nil
}

// maxUnixPathBytes is the longest socket path: sockaddr_un's sun_path holds
// 108 bytes on Linux, its terminating NUL included (104 on the BSDs).
const maxUnixPathBytes = 107

// checkBodyLimit reports a negative max_request_body_size, which confighttp
// would silently replace by its own default (0 keeps that default).
func checkBodyLimit(prefix string, s *confighttp.ServerConfig) error {
	if s.MaxRequestBodySize < 0 {
		return fmt.Errorf("%s::max_request_body_size: must not be negative, got %d", prefix, s.MaxRequestBodySize)
	}
	return nil
}

// checkListenAddr reports a TCP listen endpoint that is no host:port, which
// would otherwise only fail at start; a unix socket's is left to confighttp.
func checkListenAddr(key string, s *confighttp.ServerConfig) error {
	if !strings.HasPrefix(string(s.NetAddr.Transport), "tcp") && s.NetAddr.Transport != "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(s.NetAddr.Endpoint); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

// checkHookPath accepts a plain URL path: it starts with '/' and holds no
// ServeMux pattern syntax (wildcards in braces, a method or host before
// it), no whitespace, query, fragment or percent-escape, so that the path
// the hook is served at is exactly the one written.
func checkHookPath(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("must start with '/', got %q", p)
	case strings.ContainsAny(p, "{}"):
		return fmt.Errorf("a plain path without pattern wildcards ('{', '}'), got %q", p)
	case strings.ContainsFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return fmt.Errorf("no spaces or control characters (a method prefix like \"POST /x\" is not a path), got %q", p)
	case strings.ContainsAny(p, "?#"):
		return fmt.Errorf("a path without query or fragment, got %q", p)
	}
	// Requests are matched on their decoded path: a percent-escape here
	// would never match.
	if u, err := url.Parse(p); err != nil || u.Path != p {
		return fmt.Errorf("a path without percent-escapes, got %q", p)
	}
	return nil
}
