package sessionmetrics

import (
	"errors"
	"fmt"
	"strings"
)

// Temporality is the aggregation temporality of the sums and histograms.
type Temporality int

const (
	// Cumulative reports totals since a series was created (the default).
	Cumulative Temporality = iota
	// Delta reports what happened since the previous AppendTo and then resets.
	Delta
)

// String returns the configuration spelling: "cumulative" or "delta".
func (t Temporality) String() string {
	switch t {
	case Cumulative:
		return "cumulative"
	case Delta:
		return "delta"
	}
	return fmt.Sprintf("Temporality(%d)", int(t))
}

// UnmarshalText accepts "cumulative" or "delta" (any case), so the type can sit in a component config.
func (t *Temporality) UnmarshalText(text []byte) error {
	switch strings.ToLower(string(text)) {
	case "cumulative":
		*t = Cumulative
	case "delta":
		*t = Delta
	default:
		return fmt.Errorf("temporality: want cumulative or delta, got %q", text)
	}
	return nil
}

// HistogramKind selects how histograms are aggregated.
type HistogramKind int

const (
	// Explicit uses the fixed bucket boundaries of each metric (the default).
	Explicit HistogramKind = iota
	// Exponential uses base-2 exponential histograms with at most Config.ExponentialMaxSize buckets.
	Exponential
)

// String returns the configuration spelling: "explicit" or "exponential".
func (k HistogramKind) String() string {
	switch k {
	case Explicit:
		return "explicit"
	case Exponential:
		return "exponential"
	}
	return fmt.Sprintf("HistogramKind(%d)", int(k))
}

// UnmarshalText accepts "explicit" or "exponential" (any case).
func (k *HistogramKind) UnmarshalText(text []byte) error {
	switch strings.ToLower(string(text)) {
	case "explicit":
		*k = Explicit
	case "exponential":
		*k = Exponential
	default:
		return fmt.Errorf("histogram: want explicit or exponential, got %q", text)
	}
	return nil
}

// Default limits.
const (
	DefaultCardinalityLimit   = 2000
	DefaultExponentialMaxSize = 160
)

// Config configures an Aggregator. Start from DefaultConfig; the zero Config is invalid.
type Config struct {
	// Dimensions are extra dimension keys (session attribute keys). Their values come in Dims.Extra, in
	// this order, and are emitted under these keys.
	Dimensions []string
	// CardinalityLimit is the maximum number of data points (distinct attribute sets) per metric,
	// the overflow point included, as in the OTel SDK: CardinalityLimit-1 regular sets, and every
	// further set is folded into one point with only otel.metric.overflow=true.
	CardinalityLimit int
	// Temporality of sums and histograms.
	Temporality Temporality
	// Histogram selects explicit or exponential histograms for all histogram metrics.
	Histogram HistogramKind
	// ExponentialMaxSize is the maximum number of buckets of an exponential histogram; only checked
	// when Histogram is Exponential.
	ExponentialMaxSize int
}

// DefaultConfig returns the defaults: no extra dimensions, 2000 series per metric, cumulative,
// explicit histograms, 160 exponential buckets.
func DefaultConfig() Config {
	return Config{
		CardinalityLimit:   DefaultCardinalityLimit,
		Temporality:        Cumulative,
		Histogram:          Explicit,
		ExponentialMaxSize: DefaultExponentialMaxSize,
	}
}

// builtinKeys are attribute keys the aggregator sets itself; a configured dimension must not reuse one.
var builtinKeys = []string{
	attrOperation, attrProvider, attrModel, attrErrorType, attrEngine,
	attrTokenType, attrOutcome, attrSampled, attrOverflow,
}

// Validate reports every problem of the configuration, each naming its field.
func (c Config) Validate() error {
	var errs []error
	if c.CardinalityLimit < 2 {
		errs = append(errs, fmt.Errorf("CardinalityLimit: want at least 2 (one regular series plus the overflow series), got %d", c.CardinalityLimit))
	}
	switch c.Temporality {
	case Cumulative, Delta:
	default:
		errs = append(errs, fmt.Errorf("Temporality: want Cumulative or Delta, got %d", int(c.Temporality)))
	}
	switch c.Histogram {
	case Explicit:
	case Exponential:
		if c.ExponentialMaxSize < 2 {
			errs = append(errs, fmt.Errorf("ExponentialMaxSize: want at least 2, got %d", c.ExponentialMaxSize))
		}
	default:
		errs = append(errs, fmt.Errorf("Histogram: want Explicit or Exponential, got %d", int(c.Histogram)))
	}
	seen := make(map[string]int, len(c.Dimensions))
	for i, key := range c.Dimensions {
		switch {
		case key == "":
			errs = append(errs, fmt.Errorf("Dimensions[%d]: empty key", i))
		case isBuiltinKey(key):
			errs = append(errs, fmt.Errorf("Dimensions[%d]: %q is set by the aggregator itself", i, key))
		default:
			if j, dup := seen[key]; dup {
				errs = append(errs, fmt.Errorf("Dimensions[%d]: %q repeats Dimensions[%d]", i, key, j))
			} else {
				seen[key] = i
			}
		}
	}
	return errors.Join(errs...)
}

func isBuiltinKey(key string) bool {
	for _, k := range builtinKeys {
		if k == key {
			return true
		}
	}
	return false
}
