package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/collector/confmap"

	"github.com/otelcol-llm/otelcol-llm/internal/heldspans"
	"github.com/otelcol-llm/otelcol-llm/internal/session"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenevent"
)

// PassTokenEvents says which token event records travel on down the logs
// pipeline after being folded.
type PassTokenEvents string

const (
	// PassNone: token events stop here; only summaries and alerts go on.
	PassNone PassTokenEvents = "none"
	// PassSampled: the token event records of sampled sessions go on,
	// after the session's verdict, just before its summary. They are held
	// until then: memory grows with the tokens of the sessions in flight.
	PassSampled PassTokenEvents = "sampled"
	// PassAll: every token event record goes on as it came.
	PassAll PassTokenEvents = "all"
)

// Config is the configuration of the token_session processor.
type Config struct {
	// PassTokenEvents: none (default), sampled or all.
	PassTokenEvents PassTokenEvents `mapstructure:"pass_token_events"`
	// ProviderName is gen_ai.provider.name on every output.
	ProviderName string `mapstructure:"provider_name"`
	// Window is how many of the latest per-token gaps the window TPOT averages.
	Window   int            `mapstructure:"window"`
	Stall    StallConfig    `mapstructure:"stall"`
	Session  SessionConfig  `mapstructure:"session"`
	Sampling SamplingConfig `mapstructure:"sampling"`
	Metrics  MetricsConfig  `mapstructure:"metrics"`
	Traces   TracesConfig   `mapstructure:"traces"`
	Limits   LimitsConfig   `mapstructure:"limits"`
	// EngineTiming joins the engine's own timing (its span) to sessions.
	EngineTiming EngineTimingConfig `mapstructure:"engine_timing"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// StallConfig defines a stall: Consecutive per-token gaps above Gap, or no
// token for Consecutive×Gap.
type StallConfig struct {
	Gap         time.Duration `mapstructure:"gap"`
	Consecutive int           `mapstructure:"consecutive"`
	// MaxRecords bounds the stall episodes kept per session for span events.
	MaxRecords int `mapstructure:"max_records"`
	// CheckInterval is how often idle sessions are checked for freezes and
	// timeouts.
	CheckInterval time.Duration `mapstructure:"check_interval"`
	// DeliverySlack is how late a source's events may arrive before its
	// silence counts towards a freeze (freezes are judged on the engine's
	// clock).
	DeliverySlack time.Duration `mapstructure:"delivery_slack"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// SessionConfig bounds the session table.
type SessionConfig struct {
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`
	MaxActive   int           `mapstructure:"max_active"`
	// EndedMemory is how many ended session IDs are remembered to recognise
	// late events.
	EndedMemory int `mapstructure:"ended_memory"`
	// MaxFutureSkew rejects events stamped further ahead of the collector's
	// clock.
	MaxFutureSkew time.Duration `mapstructure:"max_future_skew"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// SamplingConfig is the tail sampling policy.
type SamplingConfig struct {
	TTFT          time.Duration `mapstructure:"ttft"`
	TPOT          time.Duration `mapstructure:"tpot"`
	Stalls        bool          `mapstructure:"stalls"`
	Errors        bool          `mapstructure:"errors"`
	NormalPercent float64       `mapstructure:"normal_percent"`
	// QueueTime keeps sessions that waited longer in the engine's queue
	// (as the timing on their end says); 0 disables.
	QueueTime time.Duration `mapstructure:"queue_time"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// MetricsConfig configures the session metrics added to the metrics pipeline.
type MetricsConfig struct {
	FlushInterval    time.Duration `mapstructure:"flush_interval"`
	Dimensions       []string      `mapstructure:"dimensions"`
	CardinalityLimit int           `mapstructure:"cardinality_limit"`
	// Temporality: cumulative (default) or delta. A plain string, checked
	// by Validate with the other settings.
	Temporality sessionmetrics.Temporality `mapstructure:"temporality"`
	// Histogram: explicit (default) or exponential; checked like Temporality.
	Histogram sessionmetrics.HistogramKind `mapstructure:"histogram"`
	// ExponentialMaxSize is the most buckets of an exponential histogram.
	ExponentialMaxSize int `mapstructure:"exponential_max_size"`
	// MaxModels bounds the distinct model names in the metrics (the model
	// comes from the client); further ones are recorded as _OTHER. 0: no
	// bound.
	MaxModels int `mapstructure:"max_models"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// LimitsConfig bounds what one token event record may carry, as the
// token_stream receiver's hooks::limits bound a wire line: records from any
// OTLP sender are held to the same rules.
type LimitsConfig struct {
	MaxSessionIDBytes int `mapstructure:"max_session_id_bytes"`
	MaxAttributes     int `mapstructure:"max_attributes"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func (l LimitsConfig) eventLimits() tokenevent.Limits {
	return tokenevent.Limits{MaxSessionIDBytes: l.MaxSessionIDBytes, MaxAttributes: l.MaxAttributes}
}

// EngineTimingConfig bounds the wait for the engine's span of a session,
// which brings the engine's own split of its time (queue, prefill, decode).
type EngineTimingConfig struct {
	// Wait is how long an ended session waits for its engine span (vLLM
	// batches its spans, 5 s by default); a kept session's span and summary
	// are held as long.
	Wait time.Duration `mapstructure:"wait"`
	// MaxSessions bounds the sessions, and early engine spans, waiting.
	MaxSessions int `mapstructure:"max_sessions"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// TracesConfig bounds the spans held until their session's verdict.
type TracesConfig struct {
	MaxHeldSpans     int           `mapstructure:"max_held_spans"`
	MaxHold          time.Duration `mapstructure:"max_hold"`
	VerdictCacheSize int           `mapstructure:"verdict_cache_size"`
	// VerdictSpans emits a small span the moment a session is kept before
	// its end (a TTFT breach at the first token, a stall), so that a tail
	// sampler elsewhere (a gateway tier) learns the verdict long before
	// the session span, which comes at the end.
	VerdictSpans bool `mapstructure:"verdict_spans"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func createDefaultConfig() *Config {
	d := session.DefaultConfig()
	h := heldspans.DefaultConfig()
	return &Config{
		PassTokenEvents: PassNone,
		ProviderName:    "vllm",
		Window:          d.Window,
		Stall: StallConfig{Gap: d.StallGap, Consecutive: d.StallConsecutive, MaxRecords: d.MaxStallRecords,
			CheckInterval: 50 * time.Millisecond, DeliverySlack: d.DeliverySlack},
		Session: SessionConfig{IdleTimeout: d.IdleTimeout, MaxActive: d.MaxActive, EndedMemory: d.EndedMemory,
			MaxFutureSkew: d.MaxFutureSkew},
		Sampling: SamplingConfig{TTFT: d.Sampling.TTFT, TPOT: d.Sampling.TPOT, Stalls: d.Sampling.Stalls,
			Errors: d.Sampling.Errors, NormalPercent: d.Sampling.NormalPercent},
		Metrics: MetricsConfig{FlushInterval: 15 * time.Second, CardinalityLimit: sessionmetrics.DefaultCardinalityLimit,
			Temporality: sessionmetrics.Cumulative, Histogram: sessionmetrics.Explicit, ExponentialMaxSize: sessionmetrics.DefaultExponentialMaxSize,
			MaxModels: sessionmetrics.DefaultMaxModels},
		Traces:       TracesConfig{MaxHeldSpans: h.MaxHeldSpans, MaxHold: h.MaxHold, VerdictCacheSize: h.VerdictCacheSize},
		Limits:       LimitsConfig{MaxSessionIDBytes: tokenevent.DefaultMaxSessionIDBytes, MaxAttributes: tokenevent.DefaultMaxAttributes},
		EngineTiming: EngineTimingConfig{Wait: 6 * time.Second, MaxSessions: 20_000},
	}
}

// sessionConfig is the state machine's view of the configuration.
func (cfg *Config) sessionConfig() session.Config {
	return session.Config{
		Window:           cfg.Window,
		StallGap:         cfg.Stall.Gap,
		StallConsecutive: cfg.Stall.Consecutive,
		MaxStallRecords:  cfg.Stall.MaxRecords,
		DeliverySlack:    cfg.Stall.DeliverySlack,
		IdleTimeout:      cfg.Session.IdleTimeout,
		MaxFutureSkew:    cfg.Session.MaxFutureSkew,
		MaxActive:        cfg.Session.MaxActive,
		EndedMemory:      cfg.Session.EndedMemory,
		Sampling: session.SamplingConfig{TTFT: cfg.Sampling.TTFT, TPOT: cfg.Sampling.TPOT, Stalls: cfg.Sampling.Stalls,
			Errors: cfg.Sampling.Errors, NormalPercent: cfg.Sampling.NormalPercent, QueueTime: cfg.Sampling.QueueTime},
	}
}

func (cfg *Config) metricsConfig() sessionmetrics.Config {
	return sessionmetrics.Config{
		Dimensions:         cfg.Metrics.Dimensions,
		CardinalityLimit:   cfg.Metrics.CardinalityLimit,
		Temporality:        cfg.Metrics.Temporality,
		Histogram:          cfg.Metrics.Histogram,
		ExponentialMaxSize: cfg.Metrics.ExponentialMaxSize,
		MaxModels:          cfg.Metrics.MaxModels,
	}
}

func (cfg *Config) heldSpansConfig() heldspans.Config {
	return heldspans.Config{MaxHeldSpans: cfg.Traces.MaxHeldSpans, MaxHold: cfg.Traces.MaxHold, VerdictCacheSize: cfg.Traces.VerdictCacheSize}
}

var _ confmap.Validator = (*Config)(nil)

// Validate reports every invalid setting at once, each named by its key
// path (stall::check_interval, traces::max_held_spans).
func (cfg *Config) Validate() error {
	errs := []error{cfg.sessionConfig().Validate()}
	switch cfg.PassTokenEvents {
	case PassNone, PassSampled, PassAll:
	default:
		errs = append(errs, fmt.Errorf("pass_token_events: want none, sampled or all, got %q", cfg.PassTokenEvents))
	}
	if cfg.ProviderName == "" {
		errs = append(errs, errors.New("provider_name: must not be empty"))
	}
	if cfg.Stall.CheckInterval <= 0 {
		errs = append(errs, fmt.Errorf("stall::check_interval: must be positive, got %s", cfg.Stall.CheckInterval))
	}
	if cfg.EngineTiming.Wait < 0 {
		errs = append(errs, fmt.Errorf("engine_timing::wait: must not be negative, got %s", cfg.EngineTiming.Wait))
	}
	if cfg.EngineTiming.MaxSessions < 0 {
		errs = append(errs, fmt.Errorf("engine_timing::max_sessions: must not be negative, got %d", cfg.EngineTiming.MaxSessions))
	}
	if cfg.Limits.MaxSessionIDBytes <= 0 {
		errs = append(errs, fmt.Errorf("limits::max_session_id_bytes: must be positive, got %d", cfg.Limits.MaxSessionIDBytes))
	}
	if cfg.Limits.MaxAttributes <= 0 {
		errs = append(errs, fmt.Errorf("limits::max_attributes: must be positive, got %d", cfg.Limits.MaxAttributes))
	}
	if cfg.Metrics.FlushInterval <= 0 {
		errs = append(errs, fmt.Errorf("metrics::flush_interval: must be positive, got %s", cfg.Metrics.FlushInterval))
	}
	errs = append(errs, under("metrics", cfg.metricsConfig().Validate()), under("traces", cfg.heldSpansConfig().Validate()))
	return errors.Join(errs...)
}

// under puts each error of err (one, or several joined) under key: the
// internal packages name their settings relative to their own section.
func under(key string, err error) error {
	if err == nil {
		return nil
	}
	errs := []error{err}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		errs = joined.Unwrap()
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = fmt.Errorf("%s::%w", key, e)
	}
	return errors.Join(out...)
}
