package heldspans // import "github.com/otelcol-llm/otelcol-llm/internal/heldspans"

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config bounds a Buffer. Every field must be positive; see DefaultConfig.
type Config struct {
	// MaxHeldSpans bounds the spans held across all traces. Hold refuses a span
	// beyond it, and the caller passes that span on unsampled (fail open).
	MaxHeldSpans int
	// MaxHold is how long the oldest held span of a trace may wait for a verdict
	// before Expire sends the whole trace on as kept.
	MaxHold time.Duration
	// VerdictCacheSize is how many trace IDs the verdict cache remembers. Its
	// entries are allocated up front; with the index they take about 100 bytes
	// each once evictions have started (about 10 MB at the default).
	VerdictCacheSize int
}

// DefaultConfig returns the defaults of the token_session processor.
func DefaultConfig() Config {
	return Config{
		MaxHeldSpans:     100_000,
		MaxHold:          5 * time.Minute,
		VerdictCacheSize: 100_000,
	}
}

// Validate reports every invalid field at once, each named by its key
// under the token_session processor's traces key.
func (c Config) Validate() error {
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
	return errors.Join(errs...)
}
