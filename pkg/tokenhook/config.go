// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// Defaults applied to zero Config fields, and the ports the token_stream
// receiver listens on by default.
const (
	DefaultUDPPort           = 4321
	DefaultHTTPPort          = 4320
	DefaultHTTPPath          = "/v1/token-events"
	DefaultQueueSize         = 65536
	DefaultFlushInterval     = 100 * time.Millisecond
	DefaultHTTPMaxBatchBytes = 1 << 20
	DefaultUDPMaxBatchBytes  = 8 << 10
	// DefaultUnixMaxBatchBytes bounds one write on a Unix socket: a
	// FlushInterval's events at a busy engine's rate, written at once.
	DefaultUnixMaxBatchBytes = 256 << 10
	// DefaultMaxBatchLines is the receiver's default
	// hooks::limits::max_lines_per_batch: it reads no more lines of a
	// request body or datagram and rejects the rest.
	DefaultMaxBatchLines = tokenevent.DefaultMaxLinesPerBatch
	// DefaultHTTPTimeout bounds one POST when Config.HTTPClient is nil and
	// Config.Timeout is zero.
	DefaultHTTPTimeout = 5 * time.Second
	// MaxUDPBatchBytes is the largest UDP payload an IPv4 datagram can carry.
	MaxUDPBatchBytes = 65507
	// DefaultUnixSocket is the token_stream receiver's default
	// hooks::unix::endpoint, the socket the node agent offers (a hostPath
	// its DaemonSet shares with the engines' pods).
	DefaultUnixSocket = "/run/otelcol-llm/hooks.sock"
)

// Config configures a Client. Only Endpoint is required.
type Config struct {
	// Endpoint is where the token_stream receiver listens:
	// "unix:///path/to/hooks.sock" (hooks::unix: one stream connection,
	// the cheapest for the collector), "udp://host:port" (port defaults to
	// 4321) or "http://host:port/v1/token-events" (https too; port
	// defaults to 4320 for both, and an empty path to /v1/token-events).
	// Empty means the node's collector: the Unix socket
	// DefaultUnixSocket when its directory exists (the node agent's
	// mount), udp://127.0.0.1:4321 otherwise (see NodeEndpoint).
	Endpoint string
	// QueueSize is how many events may wait for the background goroutine;
	// while it is full, new events are dropped. The goroutine takes the
	// queue every FlushInterval, or as soon as it is half full, so it
	// should hold a few FlushIntervals' worth of events. Default 65536.
	QueueSize int
	// MaxBatchBytes bounds one HTTP body or one UDP datagram. Batches hold
	// whole lines only; a single line longer than this is not sent and
	// counts as rejected. Default 1 MiB for HTTP, 8 KiB for UDP (at most
	// MaxUDPBatchBytes).
	MaxBatchBytes int
	// MaxBatchLines bounds the lines (events) of one HTTP body or UDP
	// datagram: the receiver reads at most its
	// hooks::limits::max_lines_per_batch lines of a batch and rejects the
	// rest. A batch ends at whichever of MaxBatchBytes and MaxBatchLines
	// it reaches first. Default DefaultMaxBatchLines, the receiver's
	// default; set the receiver's value when it is configured lower.
	// (Over HTTP the client also learns a lower limit from the receiver's
	// answer to a batch that broke it; UDP has no answer.)
	MaxBatchLines int
	// FlushInterval is how often the background goroutine sends what is
	// queued, full batch or not: the longest an event waits, sends aside.
	// It wakes this often even when idle. Default 100ms.
	FlushInterval time.Duration
	// Headers are added to every HTTP request, e.g. Authorization. HTTP only.
	Headers map[string]string
	// Timeout bounds one HTTP request, from connecting to reading the
	// answer; a request that takes longer fails its batch. Over a Unix
	// socket it bounds connecting, each write, and Close's wait for the
	// acknowledgement of the lines in flight. Default DefaultHTTPTimeout.
	// Not with HTTPClient, which brings its own.
	Timeout time.Duration
	// HTTPClient sends the HTTP requests. Default: a private client with
	// its own connection pool and the Timeout, which neither uses a proxy
	// (HTTP_PROXY and the like are ignored) nor follows redirects (a 3xx
	// answer fails the batch). HTTP only.
	HTTPClient *http.Client
}

// settings is a validated Config with defaults applied.
type settings struct {
	udp           bool
	unix          string // the socket's path, for a unix:// endpoint
	addr          string // UDP: host:port
	url           string // HTTP: the full request URL
	queueSize     int
	maxBatchBytes int
	maxBatchLines int
	flushInterval time.Duration
	timeout       time.Duration // HTTP without httpClient only
	headers       http.Header
	httpClient    *http.Client
}

// resolve validates cfg, reporting every problem at once, and applies the
// defaults.
func (cfg Config) resolve() (settings, error) {
	var errs []error
	s := settings{
		queueSize:     cfg.QueueSize,
		maxBatchBytes: cfg.MaxBatchBytes,
		maxBatchLines: cfg.MaxBatchLines,
		flushInterval: cfg.FlushInterval,
		timeout:       cfg.Timeout,
		httpClient:    cfg.HTTPClient,
	}
	raw := cfg.Endpoint
	if raw == "" {
		raw = NodeEndpoint()
	}
	ep, err := parseEndpoint(raw)
	if err != nil {
		errs = append(errs, err)
	}
	s.udp, s.unix, s.addr, s.url = ep.udp, ep.unix, ep.addr, ep.url

	s.queueSize = orDefault("QueueSize", s.queueSize, DefaultQueueSize, &errs)
	s.maxBatchLines = orDefault("MaxBatchLines", s.maxBatchLines, DefaultMaxBatchLines, &errs)
	s.flushInterval = orDefault("FlushInterval", s.flushInterval, DefaultFlushInterval, &errs)
	timeout := DefaultHTTPTimeout
	if cfg.HTTPClient != nil {
		timeout = 0
		if cfg.Timeout > 0 {
			errs = append(errs, errors.New("Timeout: set, but HTTPClient brings its own (set its Timeout)"))
		}
	}
	s.timeout = orDefault("Timeout", s.timeout, timeout, &errs)
	switch {
	case s.maxBatchBytes < 0:
		errs = append(errs, fmt.Errorf("MaxBatchBytes: must not be negative, got %d", s.maxBatchBytes))
	case s.maxBatchBytes == 0 && s.unix != "":
		s.maxBatchBytes = DefaultUnixMaxBatchBytes
	case s.maxBatchBytes == 0 && s.udp:
		s.maxBatchBytes = DefaultUDPMaxBatchBytes
	case s.maxBatchBytes == 0:
		s.maxBatchBytes = DefaultHTTPMaxBatchBytes
	case s.udp && s.maxBatchBytes > MaxUDPBatchBytes:
		errs = append(errs, fmt.Errorf("MaxBatchBytes: %d does not fit a UDP datagram, limit is %d", s.maxBatchBytes, MaxUDPBatchBytes))
	}

	if err == nil && s.unix != "" {
		if len(cfg.Headers) > 0 {
			errs = append(errs, errors.New("Headers: set, but a unix:// endpoint sends no headers"))
		}
		if cfg.HTTPClient != nil {
			errs = append(errs, errors.New("HTTPClient: set, but the endpoint is unix://"))
		}
	}
	if err == nil && s.udp {
		// Settings a UDP endpoint would silently ignore are mistakes: an
		// Authorization header that is never sent, for one.
		if len(cfg.Headers) > 0 {
			errs = append(errs, errors.New("Headers: set, but a udp:// endpoint sends no headers"))
		}
		if cfg.HTTPClient != nil {
			errs = append(errs, errors.New("HTTPClient: set, but the endpoint is udp://"))
		}
		if cfg.Timeout != 0 {
			errs = append(errs, errors.New("Timeout: set, but a udp:// endpoint has no requests to time"))
		}
		s.timeout = 0
	}
	if len(cfg.Headers) > 0 {
		s.headers = make(http.Header, len(cfg.Headers))
		for k, v := range cfg.Headers {
			if !validHeaderName(k) {
				errs = append(errs, fmt.Errorf("Headers: invalid header name %q", k))
				continue
			}
			if strings.ContainsAny(v, "\r\n\x00") {
				errs = append(errs, fmt.Errorf("Headers: %s: value holds a line break or NUL", k))
				continue
			}
			s.headers.Set(k, v)
		}
	}
	if len(errs) > 0 {
		return settings{}, fmt.Errorf("tokenhook: invalid Config: %w", errors.Join(errs...))
	}
	return s, nil
}

// orDefault returns v, or def when v is zero; a negative v is an error
// about field.
func orDefault[T int | time.Duration](field string, v, def T, errs *[]error) T {
	if v < 0 {
		*errs = append(*errs, fmt.Errorf("%s: must not be negative, got %v", field, v))
	}
	if v == 0 {
		return def
	}
	return v
}

type endpoint struct {
	udp  bool
	unix string
	addr string
	url  string
}

// NodeEndpoint is the endpoint an empty Config.Endpoint stands for, the
// node's collector: its Unix socket (DefaultUnixSocket) when the socket's
// directory exists, which is how the node agent offers it (the directory
// is its hostPath, mounted into the engine's pod; the socket itself may
// come and go with collector restarts), otherwise its UDP port on
// loopback.
func NodeEndpoint() string {
	if fi, err := os.Stat(filepath.Dir(DefaultUnixSocket)); err == nil && fi.IsDir() {
		return "unix://" + DefaultUnixSocket
	}
	return "udp://127.0.0.1:" + strconv.Itoa(DefaultUDPPort)
}

// maxUnixPathBytes is the longest socket path (sockaddr_un's sun_path, its
// NUL excluded, on Linux).
const maxUnixPathBytes = 107

func parseEndpoint(raw string) (endpoint, error) {
	const want = "want unix:///path, udp://host:port or http://host:port" + DefaultHTTPPath
	u, err := url.Parse(raw)
	if err != nil {
		return endpoint{}, fmt.Errorf("Endpoint: %w", err)
	}
	var ep endpoint
	port := DefaultHTTPPort
	switch u.Scheme {
	case "unix":
		switch {
		case u.Host != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
			return endpoint{}, fmt.Errorf("Endpoint %q: a unix:// endpoint is an absolute path only, as unix:///run/otelcol-llm/hooks.sock", raw)
		case !strings.HasPrefix(u.Path, "/"):
			return endpoint{}, fmt.Errorf("Endpoint %q: missing the socket's path", raw)
		case len(u.Path) > maxUnixPathBytes:
			return endpoint{}, fmt.Errorf("Endpoint %q: the path is %d bytes, a socket path holds at most %d", raw, len(u.Path), maxUnixPathBytes)
		}
		ep.unix = u.Path
		return ep, nil
	case "udp":
		ep.udp, port = true, DefaultUDPPort
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return endpoint{}, fmt.Errorf("Endpoint %q: a udp:// endpoint is host and port only", raw)
		}
	case "http", "https":
	default:
		return endpoint{}, fmt.Errorf("Endpoint %q: scheme %q not supported, %s", raw, u.Scheme, want)
	}
	host := u.Hostname()
	if host == "" {
		return endpoint{}, fmt.Errorf("Endpoint %q: missing host, %s", raw, want)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return endpoint{}, fmt.Errorf("Endpoint %q: port %q out of range 1-65535", raw, p)
		}
		port = n
	}
	hostPort := net.JoinHostPort(host, strconv.Itoa(port))
	if ep.udp {
		ep.addr = hostPort
		return ep, nil
	}
	u.Host = hostPort
	if u.Path == "" || u.Path == "/" {
		u.Path, u.RawPath = DefaultHTTPPath, ""
	}
	ep.url = u.String()
	return ep, nil
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
