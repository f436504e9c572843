// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/collector/confmap"

	"github.com/otelcol-llm/otelcol-llm/internal/attribution"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/internal/strictconfig"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
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

// Config is the configuration of the token_session processor. The sections
// that configure a part of the processor are that part's own types, with
// their keys, defaults and checks: stall, session and sampling are the
// state machine's (internal/session), metrics the aggregator's
// (internal/sessionmetrics), traces the held spans' (internal/heldspans).
type Config struct {
	// PassTokenEvents: none (default), sampled or all.
	PassTokenEvents PassTokenEvents `mapstructure:"pass_token_events"`
	// ProviderName is gen_ai.provider.name on every output.
	ProviderName string `mapstructure:"provider_name"`
	// Window is how many of the latest per-token gaps the window TPOT averages.
	Window   int                    `mapstructure:"window"`
	Stall    session.StallConfig    `mapstructure:"stall"`
	Session  session.TableConfig    `mapstructure:"session"`
	Sampling session.SamplingConfig `mapstructure:"sampling"`
	Metrics  sessionmetrics.Config  `mapstructure:"metrics"`
	Traces   heldspans.Config       `mapstructure:"traces"`
	Limits   LimitsConfig           `mapstructure:"limits"`
	// EngineTiming joins the engine's own timing (its span) to sessions.
	EngineTiming EngineTimingConfig `mapstructure:"engine_timing"`
	// Live serves the sessions in flight over HTTP (internal/live).
	Live live.Config `mapstructure:"live"`
	// Attribution divides each engine's time and energy among its sessions
	// (attribution.go, its section below).
	Attribution AttributionConfig `mapstructure:"attribution"`

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
	// ExpectSpans: the engine sends its spans here, so sessions wait for
	// them from the first one. Without it a session waits only once an
	// engine span has been seen, and the first sessions after a start go
	// out without the engine's split; with it, a deployment whose engine
	// sends none would hold every kept session's outputs for Wait.
	ExpectSpans bool `mapstructure:"expect_spans"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// AttributionConfig configures who used the GPU: each engine's busy time
// and energy divided among its sessions (internal/attribution states the
// model), on the session outputs and as the llm.engine.time and
// llm.engine.energy counters.
type AttributionConfig struct {
	// Enabled: on by default; it costs a few O(1) steps per session and
	// one per token (the step it ends).
	Enabled bool `mapstructure:"enabled"`
	// TenantAttribute is the start attribute whose value is the session's
	// tenant on the counters (llm.tenant).
	TenantAttribute string `mapstructure:"tenant_attribute"`
	// MaxTenants bounds the distinct tenants on the counters held at once
	// (forgotten after metrics::forget_after without a session); the
	// sessions of the others count as _OTHER.
	MaxTenants int `mapstructure:"max_tenants"`
	// StepTokens is the engine's step token budget (vLLM's
	// max_num_batched_tokens): what a step's decodes leave of it is how
	// much of a prompt the step computes.
	StepTokens int `mapstructure:"step_tokens"`
	// KVCacheTokens and MaxNumSeqs were the limits the admission model
	// before the steps admitted by; no longer used, still accepted so
	// that configurations that set them load.
	KVCacheTokens int `mapstructure:"kv_cache_tokens"`
	MaxNumSeqs    int `mapstructure:"max_num_seqs"`
	// PrefillFirst: the engine runs no decodes in a step that computes
	// prompts, and computes each prompt whole (vLLM V0 without chunked
	// prefill).
	PrefillFirst bool `mapstructure:"prefill_first"`
	// SettleAfter is how long after an engine step ended it is settled
	// (charged to the sessions in it): the tokens of every session in it,
	// and the first tokens whose prompt it computed, must have come by
	// then. A session's share, its counting and a kept session's span and
	// summary wait as long after its end. 0: each batch's steps settle at
	// its end (only where a batch holds every token up to its time).
	SettleAfter time.Duration `mapstructure:"settle_after"`
	// StepJoin is how close in time two tokens of one engine are to be of
	// one step (the engine sends a step's tokens together; the network
	// and the receiver's batching spread them a little).
	StepJoin time.Duration `mapstructure:"step_join"`
	// DefaultPromptTokens is the prompt length assumed for a session whose
	// start did not give one (the proxy learns it at the end) before any
	// session of its tenant, or of its engine, ended with one.
	DefaultPromptTokens int `mapstructure:"default_prompt_tokens"`
	// PowerMetric is the GPU power gauge (W) read from the metrics
	// pipeline; PodAttribute its attribute naming the engine's pod.
	PowerMetric  string `mapstructure:"power_metric"`
	PodAttribute string `mapstructure:"pod_attribute"`
	// EnergyMetric is the GPU energy counter (mJ): where a pod has it, the
	// mean power between its last two readings is used instead of the
	// gauge, which samples one instant.
	EnergyMetric string `mapstructure:"energy_metric"`
	// ShareWait is how long a session whose start names its engine request
	// id (llm.engine.request_id) waits, after its end, for the engine's
	// share event, and a share for its session's end (shares.go); the
	// session's counting, and a kept one's span and summary, wait with it.
	ShareWait time.Duration `mapstructure:"share_wait"`
	// MaxPendingShares bounds the sessions and shares waiting so.
	MaxPendingShares int `mapstructure:"max_pending_shares"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func defaultAttributionConfig() AttributionConfig {
	return AttributionConfig{
		Enabled: true, TenantAttribute: "tenant.id", MaxTenants: 100,
		StepTokens: attribution.DefaultBudget, MaxNumSeqs: 256, DefaultPromptTokens: 512,
		SettleAfter: 2 * time.Second, StepJoin: 5 * time.Millisecond,
		PowerMetric: "DCGM_FI_DEV_POWER_USAGE", PodAttribute: "pod",
		EnergyMetric: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
		ShareWait:    5 * time.Second, MaxPendingShares: 20_000,
	}
}

// Validate names each bad setting within the section.
func (c AttributionConfig) Validate() []error {
	var errs []error
	if c.MaxTenants < 1 {
		errs = append(errs, fmt.Errorf("max_tenants: must be at least 1, got %d", c.MaxTenants))
	}
	if c.StepTokens < 1 {
		errs = append(errs, fmt.Errorf("step_tokens: must be at least 1, got %d", c.StepTokens))
	}
	if c.KVCacheTokens < 0 {
		errs = append(errs, fmt.Errorf("kv_cache_tokens: must not be negative, got %d", c.KVCacheTokens))
	}
	if c.DefaultPromptTokens < 1 {
		errs = append(errs, fmt.Errorf("default_prompt_tokens: must be at least 1, got %d", c.DefaultPromptTokens))
	}
	if c.MaxNumSeqs < 0 {
		errs = append(errs, fmt.Errorf("max_num_seqs: must not be negative, got %d", c.MaxNumSeqs))
	}
	if c.SettleAfter < 0 {
		errs = append(errs, fmt.Errorf("settle_after: must not be negative, got %s", c.SettleAfter))
	}
	if c.StepJoin < 0 || (c.SettleAfter > 0 && c.StepJoin >= c.SettleAfter) {
		errs = append(errs, fmt.Errorf("step_join: must be at least 0 and less than settle_after, got %s", c.StepJoin))
	}
	if c.ShareWait < 0 {
		errs = append(errs, fmt.Errorf("share_wait: must not be negative, got %s", c.ShareWait))
	}
	if c.MaxPendingShares < 0 {
		errs = append(errs, fmt.Errorf("max_pending_shares: must not be negative, got %d", c.MaxPendingShares))
	}
	return errs
}

// createDefaultConfig takes each part's defaults; only the processor's own
// settings have theirs here.
func createDefaultConfig() *Config {
	s := session.DefaultConfig()
	return &Config{
		PassTokenEvents: PassNone,
		ProviderName:    "vllm",
		Window:          s.Window,
		Stall:           s.Stall,
		Session:         s.Table,
		Sampling:        s.Sampling,
		Metrics:         sessionmetrics.DefaultConfig(),
		Traces:          heldspans.DefaultConfig(),
		Limits:          LimitsConfig{MaxSessionIDBytes: tokenevent.DefaultMaxSessionIDBytes, MaxAttributes: tokenevent.DefaultMaxAttributes},
		EngineTiming:    EngineTimingConfig{Wait: 6 * time.Second, MaxSessions: 20_000},
		Live:            live.DefaultConfig(),
		Attribution:     defaultAttributionConfig(),
	}
}

// sessionConfig is the state machine's configuration: its sections as
// given.
func (cfg *Config) sessionConfig() session.Config {
	return session.Config{Window: cfg.Window, Stall: cfg.Stall, Table: cfg.Session, Sampling: cfg.Sampling}
}

var _ confmap.Unmarshaler = (*Config)(nil)

// Unmarshal decodes the configuration as the collector does and refuses
// every key no section knows, naming its section (internal/strictconfig:
// the collector drops them in sections with confighttp's settings).
func (cfg *Config) Unmarshal(conf *confmap.Conf) error {
	return strictconfig.Unmarshal(conf, cfg)
}

var _ confmap.Validator = (*Config)(nil)

// Validate reports every invalid setting at once, in the order of the keys,
// each named by its key path (stall::check_interval, traces::max_held_spans):
// the parts name their settings within their section, and the section's key
// is put before them here, where the sections are named.
func (cfg *Config) Validate() error {
	var errs []error
	switch cfg.PassTokenEvents {
	case PassNone, PassSampled, PassAll:
	default:
		errs = append(errs, fmt.Errorf("pass_token_events: want none, sampled or all, got %q", cfg.PassTokenEvents))
	}
	if cfg.ProviderName == "" {
		errs = append(errs, errors.New("provider_name: must not be empty"))
	}
	if err := session.ValidateWindow(cfg.Window); err != nil {
		errs = append(errs, fmt.Errorf("window: %w", err))
	}
	errs = append(errs, under("stall", cfg.Stall.Validate())...)
	errs = append(errs, under("session", cfg.Session.Validate())...)
	errs = append(errs, under("sampling", cfg.Sampling.Validate())...)
	errs = append(errs, under("metrics", cfg.Metrics.Validate())...)
	errs = append(errs, under("traces", cfg.Traces.Validate())...)
	if cfg.Limits.MaxSessionIDBytes <= 0 {
		errs = append(errs, fmt.Errorf("limits::max_session_id_bytes: must be positive, got %d", cfg.Limits.MaxSessionIDBytes))
	}
	if cfg.Limits.MaxAttributes <= 0 {
		errs = append(errs, fmt.Errorf("limits::max_attributes: must be positive, got %d", cfg.Limits.MaxAttributes))
	}
	if cfg.EngineTiming.Wait < 0 {
		errs = append(errs, fmt.Errorf("engine_timing::wait: must not be negative, got %s", cfg.EngineTiming.Wait))
	}
	if cfg.EngineTiming.MaxSessions < 0 {
		errs = append(errs, fmt.Errorf("engine_timing::max_sessions: must not be negative, got %d", cfg.EngineTiming.MaxSessions))
	}
	errs = append(errs, under("live", cfg.Live.Validate())...)
	errs = append(errs, under("attribution", cfg.Attribution.Validate())...)
	return errors.Join(errs...)
}

// under puts each error of a section under the section's key.
func under(key string, errs []error) []error {
	for i, err := range errs {
		errs[i] = fmt.Errorf("%s::%w", key, err)
	}
	return errs
}
