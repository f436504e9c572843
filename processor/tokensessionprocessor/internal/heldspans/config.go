// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package heldspans // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"

import (
	"fmt"
	"math"
	"time"
)

// Config bounds a Buffer; it is the traces section of the token_session
// processor's configuration, with its keys. Every bound must be positive;
// see DefaultConfig.
type Config struct {
	// MaxHeldSpans bounds the spans held across all traces. Hold refuses a span
	// beyond it, and the caller passes that span on unsampled (fail open).
	MaxHeldSpans int `mapstructure:"max_held_spans"`
	// MaxHold is how long the oldest held span of a trace may wait for a verdict
	// before Expire sends the whole trace on as kept.
	MaxHold time.Duration `mapstructure:"max_hold"`
	// VerdictCacheSize is how many trace IDs the verdict cache remembers. Its
	// entries are allocated up front; with the index they take about 100 bytes
	// each once evictions have started (about 10 MB at the default).
	VerdictCacheSize int `mapstructure:"verdict_cache_size"`
	// VerdictSpans: the caller emits a small span the moment a session is
	// kept before its end (a TTFT breach at the first token, a stall), so
	// that a tail sampler elsewhere (a gateway tier) learns the verdict long
	// before the session span, which comes at the end. The Buffer does not
	// read it; it is here because it is a setting of the same section.
	VerdictSpans bool `mapstructure:"verdict_spans"`
	// PhaseSpans: the caller writes a kept session's phases (queue, prefill,
	// decode) as child spans of its session span, so that a trace UI draws
	// where the time went. Like VerdictSpans, a setting of the section the
	// Buffer does not read.
	PhaseSpans bool `mapstructure:"phase_spans"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// DefaultConfig returns the defaults of the token_session processor.
func DefaultConfig() Config {
	return Config{
		MaxHeldSpans:     100_000,
		MaxHold:          5 * time.Minute,
		VerdictCacheSize: 100_000,
		PhaseSpans:       true,
	}
}

// Validate returns every invalid field, each named by its key. A slice,
// not an error: the token_session processor puts each under its traces
// key, and the collector, which calls every Validate() error in a
// configuration, would report them a second time without it.
func (c Config) Validate() []error {
	var errs []error
	if c.MaxHeldSpans <= 0 {
		errs = append(errs, fmt.Errorf("max_held_spans: must be positive, got %d", c.MaxHeldSpans))
	}
	if c.MaxHold <= 0 {
		errs = append(errs, fmt.Errorf("max_hold: must be positive, got %s", c.MaxHold))
	}
	switch {
	case c.VerdictCacheSize <= 0:
		errs = append(errs, fmt.Errorf("verdict_cache_size: must be positive, got %d", c.VerdictCacheSize))
	case c.VerdictCacheSize > math.MaxInt32:
		// Entries link to each other by int32 index to keep them small.
		errs = append(errs, fmt.Errorf("verdict_cache_size: at most %d, got %d", math.MaxInt32, c.VerdictCacheSize))
	}
	return errs
}
