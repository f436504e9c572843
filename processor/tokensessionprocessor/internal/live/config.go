// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"
)

// Config is the live view (live.go, server.go): an HTTP endpoint that
// shows the sessions in flight. Off while Endpoint is empty.
type Config struct {
	// ServerConfig is where the view is served (endpoint, tls, auth, ...),
	// as every confighttp server is configured.
	ServerConfig confighttp.ServerConfig `mapstructure:",squash"`
	// Interval is how often GET /sessions/stream sends a snapshot.
	Interval time.Duration `mapstructure:"interval"`
	// MaxSessions bounds the sessions in one snapshot: the worst ones.
	MaxSessions int `mapstructure:"max_sessions"`
	// Recent is how many ended sessions a snapshot lists, latest first.
	Recent int `mapstructure:"recent"`
	// MaxViewers bounds the GET /sessions/stream viewers connected at once.
	MaxViewers int `mapstructure:"max_viewers"`
	// MaxFilters bounds the distinct filters (?engine=, ?model=) the
	// viewers watch at once, the unfiltered view aside: each adds its rows
	// to the one pass over the table per interval, and an encoding.
	MaxFilters int `mapstructure:"max_filters"`
	// MaxEngines bounds the engines in one snapshot: the worst ones.
	MaxEngines int `mapstructure:"max_engines"`
	// TraceURL is a link to the user's tracing UI, with {trace_id} where
	// the trace ID goes; empty: trace IDs are not links.
	TraceURL string `mapstructure:"trace_url"`
	// Attributes are the start attributes a snapshot shows; no other is.
	Attributes []string `mapstructure:"attributes"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// Limits of the live view's settings: a snapshot is built under the
// sessions' lock, so its size is bounded whatever the configuration says.
const (
	maxLiveSessions = 10_000
	maxLiveRecent   = 10_000
	maxLiveViewers  = 1_000
	maxLiveFilters  = 64
	maxLiveEngines  = 1_000
	minLiveInterval = 50 * time.Millisecond
	traceIDToken    = "{trace_id}"
)

// DefaultConfig is the view off, and its bounds when it is on.
func DefaultConfig() Config {
	server := confighttp.NewDefaultServerConfig()
	server.NetAddr.Endpoint = "" // off
	return Config{
		ServerConfig: server, Interval: time.Second, MaxSessions: 500, Recent: 100, MaxViewers: 16,
		MaxFilters: 16, MaxEngines: 64,
	}
}

// Enabled reports whether the live view is served.
func (l *Config) Enabled() bool { return l.ServerConfig.NetAddr.Endpoint != "" }

// Validate names each invalid setting within the section; the processor's
// Validate puts live:: before it. The server settings are confighttp's to
// check.
func (l *Config) Validate() []error {
	var errs []error
	if l.Interval < minLiveInterval {
		errs = append(errs, fmt.Errorf("interval: must be at least %s, got %s", minLiveInterval, l.Interval))
	}
	if l.MaxSessions <= 0 || l.MaxSessions > maxLiveSessions {
		errs = append(errs, fmt.Errorf("max_sessions: want 1 to %d, got %d", maxLiveSessions, l.MaxSessions))
	}
	if l.Recent < 0 || l.Recent > maxLiveRecent {
		errs = append(errs, fmt.Errorf("recent: want 0 to %d, got %d", maxLiveRecent, l.Recent))
	}
	if l.MaxViewers <= 0 || l.MaxViewers > maxLiveViewers {
		errs = append(errs, fmt.Errorf("max_viewers: want 1 to %d, got %d", maxLiveViewers, l.MaxViewers))
	}
	if l.MaxFilters <= 0 || l.MaxFilters > maxLiveFilters {
		errs = append(errs, fmt.Errorf("max_filters: want 1 to %d, got %d", maxLiveFilters, l.MaxFilters))
	}
	if l.MaxEngines <= 0 || l.MaxEngines > maxLiveEngines {
		errs = append(errs, fmt.Errorf("max_engines: want 1 to %d, got %d", maxLiveEngines, l.MaxEngines))
	}
	if l.TraceURL != "" {
		if err := validateTraceURL(l.TraceURL); err != nil {
			errs = append(errs, fmt.Errorf("trace_url: %w", err))
		}
	}
	for i, k := range l.Attributes {
		if k == "" {
			errs = append(errs, fmt.Errorf("attributes[%d]: must not be empty", i))
		}
	}
	return errs
}

// validateTraceURL accepts an http or https URL with {trace_id} in it: the
// page puts it in a link's href, where another scheme (javascript:) would
// run in the viewer's browser.
func validateTraceURL(raw string) error {
	if !strings.Contains(raw, traceIDToken) {
		return fmt.Errorf("want %s in %q, where the trace ID goes", traceIDToken, raw)
	}
	u, err := url.Parse(strings.ReplaceAll(raw, traceIDToken, "0"))
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("want an http or https URL, got %q", raw)
	}
	if u.Host == "" {
		return errors.New("want a host in the URL")
	}
	return nil
}
