// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// Params records the run's parameters in the JSON result.
type Params struct {
	URL              string  `json:"url"`
	Endpoint         string  `json:"endpoint"`
	Model            string  `json:"model"`
	Concurrency      int     `json:"concurrency"`
	RequestRate      float64 `json:"request_rate"`
	DurationS        float64 `json:"duration_s"`
	Requests         int     `json:"requests"`
	WarmupRequests   int     `json:"warmup_requests"`
	WarmupDurationS  float64 `json:"warmup_duration_s"`
	PromptTokens     string  `json:"prompt_tokens"`
	OutputTokens     string  `json:"output_tokens"`
	LongShare        float64 `json:"long_share"`
	LongPromptTokens int     `json:"long_prompt_tokens"`
	Seed             uint64  `json:"seed"`
	IgnoreEOS        bool    `json:"ignore_eos"`
	SLOTTFTms        float64 `json:"slo_ttft_ms"`
	SLOTPOTms        float64 `json:"slo_tpot_ms"`
	SLOE2Ems         float64 `json:"slo_e2e_ms"`
	RampUpS          float64 `json:"ramp_up_s"`
}

// Report is the result of a run; it is what -out writes.
type Report struct {
	Tool        string    `json:"tool"`
	Params      Params    `json:"params"`
	StartedAt   time.Time `json:"started_at"`
	Interrupted bool      `json:"interrupted"`
	WindowS     float64   `json:"window_s"` // measured window: first measured request issued -> last measured request finished
	Completed   int       `json:"completed"`
	Failed      int       `json:"failed"`
	// Retried: attempts cut by a stall breaker (engine_stalled) and sent
	// again (-retry-stalled); each request counts once, by its last attempt.
	Retried           int            `json:"retried"`
	Aborted           int            `json:"aborted"` // in flight at SIGINT: neither completed nor failed
	WarmupRequests    int            `json:"warmup_requests"`
	Errors            map[string]int `json:"errors"`
	InputTokens       int64          `json:"total_input_tokens"`
	OutputTokens      int64          `json:"total_output_tokens"`
	RequestThroughput float64        `json:"request_throughput"` // completed requests/s
	OutputThroughput  float64        `json:"output_throughput"`  // output tokens/s
	TotalThroughput   float64        `json:"total_token_throughput"`
	GoodRequests      *int           `json:"good_requests"` // null when no SLO was given
	Goodput           *float64       `json:"goodput"`       // requests/s meeting every SLO; null when no SLO was given
	MaxConcurrency    int64          `json:"max_concurrency"`
	TTFT              *Summary       `json:"ttft_ms"`
	TPOT              *Summary       `json:"tpot_ms"`
	ITL               *Summary       `json:"itl_ms"`
	E2E               *Summary       `json:"e2e_ms"`
}

func paramsOf(c Config) Params {
	return Params{
		URL: c.URL, Endpoint: c.Endpoint, Model: c.Model,
		Concurrency: c.Concurrency, RequestRate: c.Rate,
		DurationS: c.Duration.Seconds(), Requests: c.Requests,
		WarmupRequests: c.WarmupRequests, WarmupDurationS: c.WarmupDuration.Seconds(),
		PromptTokens: c.PromptTokens.String(), OutputTokens: c.OutputTokens.String(),
		LongShare: c.LongShare, LongPromptTokens: c.LongPromptTokens,
		Seed: c.Seed, IgnoreEOS: c.IgnoreEOS,
		SLOTTFTms: ms(c.SLOTTFT), SLOTPOTms: ms(c.SLOTPOT), SLOE2Ems: ms(c.SLOE2E),
		RampUpS: c.RampUp.Seconds(),
	}
}

// buildReport summarizes; called with r.mu held.
func (r *runner) buildReport(startWall, end time.Time, interrupted bool) *Report {
	a := &r.agg
	rep := &Report{
		Tool:           "llmload",
		Params:         paramsOf(r.cfg),
		StartedAt:      startWall,
		Interrupted:    interrupted,
		Completed:      a.completed,
		Failed:         a.failed,
		Retried:        a.retried,
		Aborted:        a.interrupted,
		WarmupRequests: a.warmupDone,
		Errors:         a.errors,
		InputTokens:    a.inputTokens,
		OutputTokens:   a.outputTokens,
		MaxConcurrency: r.maxInflight.Load(),
		TTFT:           Summarize(a.ttft),
		TPOT:           Summarize(a.tpot),
		ITL:            Summarize(a.itl),
		E2E:            Summarize(a.e2e),
	}
	if !r.windowStart.IsZero() && end.After(r.windowStart) {
		rep.WindowS = end.Sub(r.windowStart).Seconds()
	}
	if rep.WindowS > 0 {
		rep.RequestThroughput = float64(a.completed) / rep.WindowS
		rep.OutputThroughput = float64(a.outputTokens) / rep.WindowS
		rep.TotalThroughput = float64(a.inputTokens+a.outputTokens) / rep.WindowS
	}
	if r.cfg.SLOTTFT > 0 || r.cfg.SLOTPOT > 0 || r.cfg.SLOE2E > 0 {
		good := a.good
		gp := 0.0
		if rep.WindowS > 0 {
			gp = float64(good) / rep.WindowS
		}
		rep.GoodRequests, rep.Goodput = &good, &gp
	}
	return rep
}

// WriteTable prints a human-readable summary in the style of vllm bench serve.
func (rep *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	line := func(label string, format string, args ...any) {
		fmt.Fprintf(&b, "%-40s"+format+"\n", append([]any{label}, args...)...)
	}
	b.WriteString(center(" Serving Benchmark Result (llmload) ", 62, '=') + "\n")
	line("Target:", "%s (%s)", rep.Params.URL, rep.Params.Endpoint)
	line("Model:", "%s", rep.Params.Model)
	if rep.Params.RequestRate > 0 {
		capS := "none"
		if rep.Params.Concurrency > 0 {
			capS = fmt.Sprint(rep.Params.Concurrency)
		}
		line("Request rate (Poisson):", "%g req/s (max concurrency %s)", rep.Params.RequestRate, capS)
	} else {
		line("Concurrency:", "%d", rep.Params.Concurrency)
	}
	if rep.Interrupted {
		line("Interrupted:", "yes (SIGINT; %d in-flight requests aborted)", rep.Aborted)
	}
	line("Successful requests:", "%d", rep.Completed)
	line("Failed requests:", "%d", rep.Failed)
	if rep.Retried > 0 {
		line("Retried (engine_stalled):", "%d", rep.Retried)
	}
	if len(rep.Errors) > 0 {
		keys := make([]string, 0, len(rep.Errors))
		for k := range rep.Errors {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			line("  "+k+":", "%d", rep.Errors[k])
		}
	}
	line("Warm-up requests (excluded):", "%d", rep.WarmupRequests)
	line("Measured window (s):", "%.2f", rep.WindowS)
	line("Max concurrency observed:", "%d", rep.MaxConcurrency)
	line("Total input tokens:", "%d", rep.InputTokens)
	line("Total generated tokens:", "%d", rep.OutputTokens)
	line("Request throughput (req/s):", "%.2f", rep.RequestThroughput)
	line("Output token throughput (tok/s):", "%.2f", rep.OutputThroughput)
	line("Total token throughput (tok/s):", "%.2f", rep.TotalThroughput)
	if rep.Goodput != nil {
		line("Good requests (all SLOs met):", "%d", *rep.GoodRequests)
		line("Request goodput (req/s):", "%.2f", *rep.Goodput)
	}
	b.WriteString(strings.Repeat("-", 62) + "\n")
	fmt.Fprintf(&b, "%-12s %9s %9s %9s %9s %9s\n", "Metric (ms)", "Mean", "P50", "P95", "P99", "Count")
	row := func(name string, s *Summary) {
		if s == nil {
			fmt.Fprintf(&b, "%-12s %9s %9s %9s %9s %9d\n", name, "-", "-", "-", "-", 0)
			return
		}
		fmt.Fprintf(&b, "%-12s %9.2f %9.2f %9.2f %9.2f %9d\n", name, s.Mean, s.P50, s.P95, s.P99, s.Count)
	}
	row("TTFT", rep.TTFT)
	row("TPOT", rep.TPOT)
	row("ITL", rep.ITL)
	row("E2E", rep.E2E)
	b.WriteString(strings.Repeat("=", 62) + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func center(s string, width int, fill byte) string {
	if len(s) >= width {
		return s
	}
	left := (width - len(s)) / 2
	return strings.Repeat(string(fill), left) + s + strings.Repeat(string(fill), width-len(s)-left)
}

// WriteJSONFile writes the report as indented JSON.
func (rep *Report) WriteJSONFile(path string) error {
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644) //nolint:gosec // G703: the path is the -out flag of the person running it
}
