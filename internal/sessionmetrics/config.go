// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sessionmetrics

import (
	"fmt"
	"strings"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/keyset"
)

// Temporality is the aggregation temporality of the sums and histograms,
// spelt as in the configuration. It is a plain string, checked by
// Validate, so that a misspelling is reported with every other problem
// rather than stopping the decoding of the configuration.
type Temporality string

const (
	// Cumulative reports totals since a series was created (the default).
	Cumulative Temporality = "cumulative"
	// Delta reports what happened since the previous AppendTo and then resets.
	Delta Temporality = "delta"
)

// HistogramKind selects how histograms are aggregated, spelt as in the
// configuration; a plain string like Temporality.
type HistogramKind string

const (
	// Explicit uses the fixed bucket boundaries of each metric (the default).
	Explicit HistogramKind = "explicit"
	// Exponential uses base-2 exponential histograms with at most Config.ExponentialMaxSize buckets.
	Exponential HistogramKind = "exponential"
)

// Default limits.
const (
	DefaultCardinalityLimit   = 2000
	DefaultExponentialMaxSize = 160
	DefaultMaxModels          = 100
	DefaultMaxEngines         = 100
	DefaultForgetAfter        = time.Hour
)

// ModelOverflow is the gen_ai.request.model (and llm.engine) value the
// sessions of models beyond Config.MaxModels (engines beyond
// Config.MaxEngines) are recorded under.
const ModelOverflow = keyset.Overflow

// Config configures an Aggregator; it is the metrics section of the
// token_session processor's configuration, with its keys. Start from
// DefaultConfig; the zero Config is invalid.
type Config struct {
	// FlushInterval is how often the caller renders the metrics (AppendTo)
	// and sends them on.
	FlushInterval time.Duration `mapstructure:"flush_interval"`
	// Dimensions are extra dimension keys (session attribute keys). Their values come in Dims.Extra, in
	// this order, and are emitted under these keys.
	Dimensions []string `mapstructure:"dimensions"`
	// CardinalityLimit is the maximum number of data points (distinct attribute sets) per metric,
	// the overflow point included, as in the OTel SDK: CardinalityLimit-1 regular sets, and every
	// further set is folded into one point with only otel.metric.overflow=true.
	CardinalityLimit int `mapstructure:"cardinality_limit"`
	// Temporality of sums and histograms: cumulative (default) or delta, any case.
	Temporality Temporality `mapstructure:"temporality"`
	// Histogram selects explicit (default) or exponential histograms for all histogram metrics; any case.
	Histogram HistogramKind `mapstructure:"histogram"`
	// ExponentialMaxSize is the maximum number of buckets of an exponential histogram; only checked
	// when Histogram is Exponential.
	ExponentialMaxSize int `mapstructure:"exponential_max_size"`
	// MaxModels bounds the distinct gen_ai.request.model values held at once: the model comes
	// from the client's request, and without a bound invented names would take the whole
	// CardinalityLimit from real series. Sessions of further models are recorded with the model
	// ModelOverflow. 0 means no bound.
	MaxModels int `mapstructure:"max_models"`
	// MaxEngines bounds the distinct llm.engine values held at once, as MaxModels the models:
	// engines come and go with their pods, each restart a new address. 0 means no bound.
	MaxEngines int `mapstructure:"max_engines"`
	// ForgetAfter is how long a series, a model or an engine is kept without a recording (and,
	// for a model or an engine, without an open session): then it is forgotten, its series are
	// no longer sent (under cumulative temporality they end, as a gone pod's do in Prometheus)
	// and its place under the bounds is free. It is checked at each AppendTo, from the first
	// AppendTo after the last recording. 0 means never.
	ForgetAfter time.Duration `mapstructure:"forget_after"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// DefaultConfig returns the defaults: flushed every 15 s, no extra dimensions, 2000 series per
// metric, 100 models, 100 engines, forgotten after an hour, cumulative, explicit histograms, 160
// exponential buckets.
func DefaultConfig() Config {
	return Config{
		FlushInterval:      15 * time.Second,
		CardinalityLimit:   DefaultCardinalityLimit,
		Temporality:        Cumulative,
		Histogram:          Explicit,
		ExponentialMaxSize: DefaultExponentialMaxSize,
		MaxModels:          DefaultMaxModels,
		MaxEngines:         DefaultMaxEngines,
		ForgetAfter:        DefaultForgetAfter,
	}
}

// AttrOutcome is the outcome of a session on llm.sessions: completed,
// error, aborted, timeout, evicted, shutdown (session.Outcome).
const AttrOutcome = "llm.session.outcome"

// Attribute keys set by the aggregator.
const (
	attrOperation = "gen_ai.operation.name"
	attrProvider  = "gen_ai.provider.name"
	attrModel     = "gen_ai.request.model"
	attrErrorType = "error.type"
	attrEngine    = "llm.engine"
	attrTokenType = "gen_ai.token.type"
	attrSampled   = "llm.session.sampled"
	attrOverflow  = "otel.metric.overflow"
)

// builtinKeys are attribute keys the aggregator sets itself; a configured dimension must not reuse one.
var builtinKeys = []string{
	attrOperation, attrProvider, attrModel, attrErrorType, attrEngine,
	attrTokenType, AttrOutcome, attrSampled, attrOverflow,
}

// normalized returns c with Temporality and Histogram in lower case, as
// the constants spell them.
func (c Config) normalized() Config {
	c.Temporality = Temporality(strings.ToLower(string(c.Temporality)))
	c.Histogram = HistogramKind(strings.ToLower(string(c.Histogram)))
	return c
}

// Validate returns every problem of the configuration, each named by its
// key. A slice, not an error: the token_session processor puts each under
// its metrics key, and the collector, which calls every Validate() error
// in a configuration, would report them a second time without it.
func (c Config) Validate() []error {
	var errs []error
	if c.FlushInterval <= 0 {
		errs = append(errs, fmt.Errorf("flush_interval: must be positive, got %s", c.FlushInterval))
	}
	if c.CardinalityLimit < 2 {
		errs = append(errs, fmt.Errorf("cardinality_limit: want at least 2 (one regular series plus the overflow series), got %d", c.CardinalityLimit))
	}
	if c.MaxModels < 0 {
		errs = append(errs, fmt.Errorf("max_models: must not be negative (0: no bound), got %d", c.MaxModels))
	}
	if c.MaxEngines < 0 {
		errs = append(errs, fmt.Errorf("max_engines: must not be negative (0: no bound), got %d", c.MaxEngines))
	}
	if c.ForgetAfter < 0 {
		errs = append(errs, fmt.Errorf("forget_after: must not be negative (0: never), got %s", c.ForgetAfter))
	}
	n := c.normalized()
	switch n.Temporality {
	case Cumulative, Delta:
	default:
		errs = append(errs, fmt.Errorf("temporality: want cumulative or delta, got %q", c.Temporality))
	}
	switch n.Histogram {
	case Explicit:
	case Exponential:
		if c.ExponentialMaxSize < 2 {
			errs = append(errs, fmt.Errorf("exponential_max_size: want at least 2, got %d", c.ExponentialMaxSize))
		}
	default:
		errs = append(errs, fmt.Errorf("histogram: want explicit or exponential, got %q", c.Histogram))
	}
	seen := make(map[string]int, len(c.Dimensions))
	for i, key := range c.Dimensions {
		switch {
		case key == "":
			errs = append(errs, fmt.Errorf("dimensions::%d: empty key", i))
		case isBuiltinKey(key):
			errs = append(errs, fmt.Errorf("dimensions::%d: %q is set by the aggregator itself", i, key))
		default:
			if j, dup := seen[key]; dup {
				errs = append(errs, fmt.Errorf("dimensions::%d: %q repeats dimensions::%d", i, key, j))
			} else {
				seen[key] = i
			}
		}
	}
	return errs
}

func isBuiltinKey(key string) bool {
	for _, k := range builtinKeys {
		if k == key {
			return true
		}
	}
	return false
}
