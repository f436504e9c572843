// Package session is the token_session processor's state machine: it folds
// token events into sessions and measures them (TTFT, TPOT, per-token gaps,
// window TPOT, stalls), ends them (completed, error, aborted, timeout,
// evicted, shutdown) and gives each a sampling verdict. It is plain Go: time
// comes in as arguments (the injectable clock), results go out as Reports
// appended to the caller's slice and handled after the call (an Observer
// only keeps the caller's per-session state), and no goroutine runs here.
package session // import "github.com/otelcol-llm/otelcol-llm/internal/session"

import (
	"errors"
	"fmt"
	"time"
)

// Config holds the session semantics. DefaultConfig gives the defaults the
// token_session processor documents in its README. Validate names each
// setting by its key in the processor's configuration (window,
// stall::gap, session::idle_timeout, sampling::ttft, ...).
type Config struct {
	// Window is how many of the latest per-token gaps the window TPOT averages.
	Window int
	// StallGap is the per-token gap above which a gap is slow.
	StallGap time.Duration
	// StallConsecutive slow gaps in a row make a stall. A session whose last
	// token arrived more than StallConsecutive×StallGap ago is stalled too:
	// the freeze is reported while it lasts, not when decoding resumes.
	StallConsecutive int
	// MaxStallRecords bounds the stall episodes a session keeps in detail
	// (for span events); all are counted.
	MaxStallRecords int
	// DeliverySlack is how late a source's events may arrive before its
	// silence counts against its sessions. Freezes are judged on the
	// engine's clock: a session is frozen when its source's latest engine
	// time is StallConsecutive×StallGap past the session's last token. When
	// the source itself goes quiet, its engine time is taken to advance
	// with the collector's clock after DeliverySlack.
	DeliverySlack time.Duration
	// IdleTimeout ends a session that has received no event for this long.
	IdleTimeout time.Duration
	// MaxFutureSkew rejects an event stamped further ahead of the
	// collector's clock than this (a hook with a bad clock).
	MaxFutureSkew time.Duration
	// MaxActive bounds the session table; a new session beyond it evicts the
	// least recently active one.
	MaxActive int
	// EndedMemory is how many recently ended session IDs are remembered, so
	// that events arriving after the end are recognised as late.
	EndedMemory int
	Sampling    SamplingConfig
}

// SamplingConfig is the tail sampling policy: a session is kept if any
// enabled rule matches, else with probability NormalPercent/100, decided
// consistently from its trace ID.
type SamplingConfig struct {
	// TTFT keeps sessions whose time to first token exceeds it; 0 disables.
	TTFT time.Duration
	// TPOT keeps sessions whose time per output token exceeds it; 0 disables.
	TPOT time.Duration
	// Stalls keeps sessions that stalled.
	Stalls bool
	// Errors keeps sessions that ended in error or timed out.
	Errors bool
	// NormalPercent is the share of the other sessions kept, 0 to 100.
	NormalPercent float64
	// QueueTime keeps sessions that waited longer in the engine's queue, as
	// the engine's timing known at the end says; 0 disables.
	QueueTime time.Duration
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
		Window:           10,
		StallGap:         150 * time.Millisecond,
		StallConsecutive: 3,
		MaxStallRecords:  8,
		DeliverySlack:    500 * time.Millisecond,
		IdleTimeout:      5 * time.Minute,
		MaxFutureSkew:    time.Minute,
		MaxActive:        100_000,
		EndedMemory:      16_384,
		Sampling: SamplingConfig{
			TTFT:          500 * time.Millisecond,
			TPOT:          80 * time.Millisecond,
			Stalls:        true,
			Errors:        true,
			NormalPercent: 1,
		},
	}
}

// Validate reports every invalid setting at once, each named by its key
// path in the token_session configuration.
func (c Config) Validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %d", name, v))
		}
	}
	positiveDuration := func(name string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %s", name, d))
		}
	}
	nonNegativeDuration := func(name string, d time.Duration) {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %s", name, d))
		}
	}
	positive("window", c.Window)
	if c.Window > maxWindow {
		errs = append(errs, fmt.Errorf("window: at most %d, got %d", maxWindow, c.Window))
	}
	positiveDuration("stall::gap", c.StallGap)
	positive("stall::consecutive", c.StallConsecutive)
	if c.MaxStallRecords < 0 {
		errs = append(errs, fmt.Errorf("stall::max_records: must not be negative, got %d", c.MaxStallRecords))
	}
	nonNegativeDuration("stall::delivery_slack", c.DeliverySlack)
	positiveDuration("session::idle_timeout", c.IdleTimeout)
	positiveDuration("session::max_future_skew", c.MaxFutureSkew)
	positive("session::max_active", c.MaxActive)
	positive("session::ended_memory", c.EndedMemory)
	nonNegativeDuration("sampling::ttft", c.Sampling.TTFT)
	nonNegativeDuration("sampling::tpot", c.Sampling.TPOT)
	nonNegativeDuration("sampling::queue_time", c.Sampling.QueueTime)
	if p := c.Sampling.NormalPercent; !(p >= 0 && p <= 100) {
		errs = append(errs, fmt.Errorf("sampling::normal_percent: must be within [0, 100], got %v", p))
	}
	return errors.Join(errs...)
}
