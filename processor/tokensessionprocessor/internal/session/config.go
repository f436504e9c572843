// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package session is the token_session processor's state machine: it folds
// token events into sessions and measures them (TTFT, TPOT, per-token gaps,
// window TPOT, stalls), ends them (completed, error, aborted, timeout,
// evicted, shutdown) and gives each a sampling verdict. It is plain Go: time
// comes in as arguments (the injectable clock), results go out as Reports
// appended to the caller's slice and handled after the call (an Observer
// only keeps the caller's per-session state), and no goroutine runs here.
package session // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"

import (
	"errors"
	"fmt"
	"time"
)

// Config holds the session semantics. Its parts are sections of the
// token_session processor's configuration: each section type carries its
// keys (mapstructure tags), DefaultConfig their defaults, and each
// section's Validate names its settings by their keys within the section,
// which the processor puts under the section's key.
type Config struct {
	// Window is how many of the latest per-token gaps the window TPOT
	// averages (the processor's window key).
	Window   int
	Stall    StallConfig
	Table    TableConfig
	Sampling SamplingConfig
}

// StallConfig defines a stall: Consecutive per-token gaps above Gap, or no
// token for Consecutive×Gap (a freeze).
type StallConfig struct {
	// Gap is the per-token gap above which a gap is slow.
	Gap time.Duration `mapstructure:"gap"`
	// Consecutive slow gaps in a row make a stall. A session whose last
	// token arrived more than Consecutive×Gap ago is stalled too: the
	// freeze is reported while it lasts, not when decoding resumes.
	Consecutive int `mapstructure:"consecutive"`
	// MaxRecords bounds the stall episodes a session keeps in detail (for
	// span events); all are counted.
	MaxRecords int `mapstructure:"max_records"`
	// CheckInterval is how often the caller calls Table.Tick: freezes and
	// timeouts are found no later than that.
	CheckInterval time.Duration `mapstructure:"check_interval"`
	// DeliverySlack is how late a source's events may arrive before its
	// silence counts against its sessions. Freezes are judged on the
	// engine's clock: a session is frozen when its source's latest engine
	// time is Consecutive×Gap past the session's last token. When the
	// source itself goes quiet, its engine time is taken to advance with
	// the collector's clock after DeliverySlack.
	DeliverySlack time.Duration `mapstructure:"delivery_slack"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// TableConfig bounds the session table.
type TableConfig struct {
	// IdleTimeout ends a session that has received no event for this long.
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`
	// MaxActive bounds the table; a new session beyond it evicts the least
	// recently active one.
	MaxActive int `mapstructure:"max_active"`
	// EndedMemory is how many recently ended session IDs are remembered, so
	// that events arriving after the end are recognized as late.
	EndedMemory int `mapstructure:"ended_memory"`
	// MaxFutureSkew rejects an event stamped further ahead of the
	// collector's clock than this (a hook with a bad clock).
	MaxFutureSkew time.Duration `mapstructure:"max_future_skew"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// SamplingConfig is the tail sampling policy: a session is kept if any
// enabled rule matches, else with probability NormalPercent/100, decided
// consistently from its trace ID.
type SamplingConfig struct {
	// TTFT keeps sessions whose time to first token exceeds it; 0 disables.
	TTFT time.Duration `mapstructure:"ttft"`
	// TPOT keeps sessions whose time per output token exceeds it; 0 disables.
	TPOT time.Duration `mapstructure:"tpot"`
	// Stalls keeps sessions that stalled.
	Stalls bool `mapstructure:"stalls"`
	// Errors keeps sessions that ended in error or timed out.
	Errors bool `mapstructure:"errors"`
	// NormalPercent is the share of the other sessions kept, 0 to 100.
	NormalPercent float64 `mapstructure:"normal_percent"`
	// QueueTime keeps sessions that waited longer in the engine's queue, as
	// the engine's timing known at the end says; 0 disables.
	QueueTime time.Duration `mapstructure:"queue_time"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// maxWindow bounds Window; a session's window is indexed with 16 bits.
const maxWindow = 4096

// maxBeforeStart is how far before its session's start an event may be
// stamped (clocks of one host, read at different points of the request)
// before it is rejected as impossible.
const maxBeforeStart = time.Second

// DefaultConfig returns the defaults, which the token_session processor's
// README lists with each key.
func DefaultConfig() Config {
	return Config{
		Window: 10,
		Stall: StallConfig{
			Gap:           150 * time.Millisecond,
			Consecutive:   3,
			MaxRecords:    8,
			CheckInterval: 50 * time.Millisecond,
			DeliverySlack: 500 * time.Millisecond,
		},
		Table: TableConfig{
			IdleTimeout:   5 * time.Minute,
			MaxActive:     100_000,
			EndedMemory:   16_384,
			MaxFutureSkew: time.Minute,
		},
		Sampling: SamplingConfig{
			TTFT:          500 * time.Millisecond,
			TPOT:          80 * time.Millisecond,
			Stalls:        true,
			Errors:        true,
			NormalPercent: 1,
		},
	}
}

// Validate reports every invalid setting at once, each under the name of
// its part here (window, stall::gap, table::max_active, ...). The
// token_session processor checks the sections itself, under its own keys,
// before it makes a Table.
func (c Config) Validate() error {
	var errs []error
	if err := ValidateWindow(c.Window); err != nil {
		errs = append(errs, fmt.Errorf("window: %w", err))
	}
	for _, part := range []struct {
		name string
		errs []error
	}{{"stall", c.Stall.Validate()}, {"table", c.Table.Validate()}, {"sampling", c.Sampling.Validate()}} {
		for _, err := range part.errs {
			errs = append(errs, fmt.Errorf("%s::%w", part.name, err))
		}
	}
	return errors.Join(errs...)
}

// ValidateWindow checks the number of gaps the window TPOT averages.
func ValidateWindow(n int) error {
	switch {
	case n <= 0:
		return fmt.Errorf("must be positive, got %d", n)
	case n > maxWindow:
		return fmt.Errorf("at most %d, got %d", maxWindow, n)
	}
	return nil
}

// The sections' Validate return a slice, not an error: the collector calls
// every Validate() error it finds in a configuration, and would report
// these a second time, without their section's key.

// Validate returns every problem of the section, each named by its key.
func (c StallConfig) Validate() []error {
	var errs []error
	errs = positiveDuration(errs, "gap", c.Gap)
	errs = positive(errs, "consecutive", c.Consecutive)
	if c.MaxRecords < 0 {
		errs = append(errs, fmt.Errorf("max_records: must not be negative, got %d", c.MaxRecords))
	}
	errs = positiveDuration(errs, "check_interval", c.CheckInterval)
	return nonNegativeDuration(errs, "delivery_slack", c.DeliverySlack)
}

// Validate returns every problem of the section, each named by its key.
func (c TableConfig) Validate() []error {
	var errs []error
	errs = positiveDuration(errs, "idle_timeout", c.IdleTimeout)
	errs = positiveDuration(errs, "max_future_skew", c.MaxFutureSkew)
	errs = positive(errs, "max_active", c.MaxActive)
	return positive(errs, "ended_memory", c.EndedMemory)
}

// Validate returns every problem of the section, each named by its key.
func (c SamplingConfig) Validate() []error {
	var errs []error
	errs = nonNegativeDuration(errs, "ttft", c.TTFT)
	errs = nonNegativeDuration(errs, "tpot", c.TPOT)
	errs = nonNegativeDuration(errs, "queue_time", c.QueueTime)
	if p := c.NormalPercent; !(p >= 0 && p <= 100) {
		errs = append(errs, fmt.Errorf("normal_percent: must be within [0, 100], got %v", p))
	}
	return errs
}

func positive(errs []error, name string, v int) []error {
	if v <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive, got %d", name, v))
	}
	return errs
}

func positiveDuration(errs []error, name string, d time.Duration) []error {
	if d <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive, got %s", name, d))
	}
	return errs
}

func nonNegativeDuration(errs []error, name string, d time.Duration) []error {
	if d < 0 {
		errs = append(errs, fmt.Errorf("%s: must not be negative, got %s", name, d))
	}
	return errs
}
