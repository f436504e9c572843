// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Endpoint names accepted by -endpoint.
const (
	EndpointChat        = "chat"
	EndpointCompletions = "completions"
)

// Config is everything a run needs; it is also written (as Params) into the
// JSON result so a result file documents how it was produced.
type Config struct {
	URL              string
	Endpoint         string
	Model            string
	APIKey           string
	Concurrency      int     // 0 = unbounded (only valid with Rate)
	Rate             float64 // requests/s, 0 = closed loop (concurrency mode)
	Duration         time.Duration
	Requests         int
	WarmupRequests   int
	WarmupDuration   time.Duration
	PromptTokens     Dist
	OutputTokens     Dist
	LongShare        float64
	LongPromptTokens int
	Seed             uint64
	IgnoreEOS        bool
	SLOTTFT          time.Duration
	SLOTPOT          time.Duration
	SLOE2E           time.Duration
	Timeout          time.Duration
	Out              string
	Quiet            bool
	// RequestsOut names an NDJSON file with one line per request (see
	// RequestRecord); empty: not written.
	RequestsOut string
	// RequestsITL adds every request's inter-token gaps to its RequestsOut
	// line, so that when each gap happened can be worked out.
	RequestsITL bool
	// TenantHeader, LongTenant and ShortTenant label each request's tenant
	// in the header TenantHeader: LongTenant for the long-context share,
	// ShortTenant for the others (a RAG tenant and a chat tenant).
	TenantHeader, LongTenant, ShortTenant string
	// Traceparent sends a fresh W3C traceparent (random trace ID, sampled)
	// with every request, so spans made from it can be matched to requests.
	Traceparent bool
	// RampUp spreads the start of the closed loop's workers evenly over
	// this long, so a run does not begin with Concurrency requests at once.
	RampUp time.Duration
	// RetryStalled re-sends a request whose stream a stall breaker cut (an
	// error event of type engine_stalled), up to this many times, as an
	// application or gateway retrying on another replica would.
	RetryStalled int
}

// Dist is a distribution of token counts: fixed N, uniform:A-B or normal:MEAN,SD.
type Dist struct {
	Kind string  `json:"kind"` // "fixed", "uniform", "normal"
	N    int     `json:"n,omitempty"`
	Min  int     `json:"min,omitempty"`
	Max  int     `json:"max,omitempty"`
	Mean float64 `json:"mean,omitempty"`
	SD   float64 `json:"sd,omitempty"`
}

// ParseDist parses "N", "uniform:A-B" or "normal:MEAN,SD".
func ParseDist(s string) (Dist, error) {
	s = strings.TrimSpace(s)
	switch {
	case strings.HasPrefix(s, "uniform:"):
		a, b, ok := strings.Cut(strings.TrimPrefix(s, "uniform:"), "-")
		if !ok {
			return Dist{}, fmt.Errorf("bad distribution %q: want uniform:A-B", s)
		}
		lo, err1 := strconv.Atoi(strings.TrimSpace(a))
		hi, err2 := strconv.Atoi(strings.TrimSpace(b))
		if err1 != nil || err2 != nil || lo < 1 || hi < lo {
			return Dist{}, fmt.Errorf("bad distribution %q: want uniform:A-B with 1 <= A <= B", s)
		}
		return Dist{Kind: "uniform", Min: lo, Max: hi}, nil
	case strings.HasPrefix(s, "normal:"):
		a, b, ok := strings.Cut(strings.TrimPrefix(s, "normal:"), ",")
		if !ok {
			return Dist{}, fmt.Errorf("bad distribution %q: want normal:MEAN,SD", s)
		}
		m, err1 := strconv.ParseFloat(strings.TrimSpace(a), 64)
		sd, err2 := strconv.ParseFloat(strings.TrimSpace(b), 64)
		if err1 != nil || err2 != nil || m < 1 || sd < 0 || math.IsNaN(m) || math.IsInf(m, 0) || math.IsNaN(sd) || math.IsInf(sd, 0) {
			return Dist{}, fmt.Errorf("bad distribution %q: want normal:MEAN,SD with MEAN >= 1, SD >= 0", s)
		}
		return Dist{Kind: "normal", Mean: m, SD: sd}, nil
	default:
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return Dist{}, fmt.Errorf("bad distribution %q: want N >= 1, uniform:A-B or normal:MEAN,SD", s)
		}
		return Dist{Kind: "fixed", N: n}, nil
	}
}

// Sample draws one value (always >= 1).
func (d Dist) Sample(r *rand.Rand) int {
	var v int
	switch d.Kind {
	case "uniform":
		v = d.Min + r.IntN(d.Max-d.Min+1)
	case "normal":
		v = int(math.Round(d.Mean + d.SD*r.NormFloat64()))
	default:
		v = d.N
	}
	return max(v, 1)
}

func (d Dist) String() string {
	switch d.Kind {
	case "uniform":
		return fmt.Sprintf("uniform:%d-%d", d.Min, d.Max)
	case "normal":
		return fmt.Sprintf("normal:%g,%g", d.Mean, d.SD)
	default:
		return strconv.Itoa(d.N)
	}
}

// ParseFlags parses the command line into a validated Config.
func ParseFlags(args []string, output io.Writer) (Config, error) {
	fs := flag.NewFlagSet("llmload", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprintf(output, "Usage: llmload -url http://host:port -model NAME [flags]\n\n"+
			"Load generator for OpenAI-compatible streaming endpoints, timed like `vllm bench serve`.\n\n")
		fs.PrintDefaults()
	}
	var c Config
	var prompt, outputDist, warmup string
	var sloTTFT, sloTPOT, sloE2E float64
	fs.StringVar(&c.URL, "url", "http://localhost:8000", "base URL of the OpenAI-compatible server (with or without /v1)")
	fs.StringVar(&c.Endpoint, "endpoint", EndpointChat, "API to call: chat (/v1/chat/completions) or completions (/v1/completions)")
	fs.StringVar(&c.Model, "model", "", "model name sent in each request (required)")
	fs.StringVar(&c.APIKey, "api-key", "", "optional bearer token sent as Authorization header")
	fs.IntVar(&c.Concurrency, "concurrency", 0, "closed loop: N requests in flight at all times; with -rate: cap on in-flight requests (0 = no cap). Default 1 when -rate is not given")
	fs.Float64Var(&c.Rate, "rate", 0, "open loop: Poisson arrivals at R requests/s (0 = closed loop)")
	fs.DurationVar(&c.Duration, "duration", 0, "measure for this long after warm-up (stop issuing requests, then drain in-flight ones)")
	fs.IntVar(&c.Requests, "requests", 0, "measure this many requests after warm-up (default 100 when -duration is not given)")
	fs.StringVar(&warmup, "warmup", "0", "requests excluded from results: a count (e.g. 10) or a duration (e.g. 5s) from the start of the run")
	fs.StringVar(&prompt, "prompt-tokens", "256", "prompt length distribution in tokens (~words): N, uniform:A-B or normal:MEAN,SD")
	fs.StringVar(&outputDist, "output-tokens", "128", "output length distribution (max_tokens): N, uniform:A-B or normal:MEAN,SD")
	fs.Float64Var(&c.LongShare, "long-share", 0, "share (0..1) of requests that use -long-prompt-tokens instead of -prompt-tokens")
	fs.IntVar(&c.LongPromptTokens, "long-prompt-tokens", 8192, "prompt length of the long-context share")
	fs.Uint64Var(&c.Seed, "seed", 0, "random seed (prompts, lengths, arrivals)")
	fs.BoolVar(&c.IgnoreEOS, "ignore-eos", true, "send ignore_eos=true so servers that support it (vLLM, SGLang) generate exactly max_tokens")
	fs.Float64Var(&sloTTFT, "slo-ttft", 0, "goodput SLO: TTFT <= this many ms (0 = not used)")
	fs.Float64Var(&sloTPOT, "slo-tpot", 0, "goodput SLO: TPOT <= this many ms (0 = not used)")
	fs.Float64Var(&sloE2E, "slo-e2e", 0, "goodput SLO: E2E latency <= this many ms (0 = not used)")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "per-request timeout")
	fs.StringVar(&c.Out, "out", "", "write the full result as JSON to this file")
	fs.BoolVar(&c.Quiet, "quiet", false, "no progress line on stderr")
	fs.StringVar(&c.RequestsOut, "requests-out", "", "write one NDJSON line per request (warm-up included and flagged) to this file: timings, tokens, error, trace_id")
	fs.BoolVar(&c.RequestsITL, "requests-itl", false, "add each request's inter-token gaps (itl_ms, in order) to its -requests-out line")
	fs.DurationVar(&c.RampUp, "ramp-up", 0, "closed loop: start the -concurrency workers evenly over this long instead of all at once (the requests of the ramp count like any other; see -warmup)")
	fs.IntVar(&c.RetryStalled, "retry-stalled", 0, "re-send a request whose stream was cut with an engine_stalled error event (the collector proxy's stall breaker) up to N times; each attempt is its own -requests-out line, and the report counts the retries")
	fs.StringVar(&c.TenantHeader, "tenant-header", "X-Tenant-ID", "request header that carries -long-tenant and -short-tenant")
	fs.StringVar(&c.LongTenant, "long-tenant", "", "tenant of the long-context requests (-long-share), sent in -tenant-header (empty: none)")
	fs.StringVar(&c.ShortTenant, "short-tenant", "", "tenant of the other requests, sent in -tenant-header (empty: none)")
	fs.BoolVar(&c.Traceparent, "traceparent", false, "send a fresh W3C traceparent (random trace ID, sampled flag) with each request; its trace ID goes into -requests-out")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	var err error
	if c.PromptTokens, err = ParseDist(prompt); err != nil {
		return Config{}, fmt.Errorf("-prompt-tokens: %w", err)
	}
	if c.OutputTokens, err = ParseDist(outputDist); err != nil {
		return Config{}, fmt.Errorf("-output-tokens: %w", err)
	}
	if c.WarmupRequests, c.WarmupDuration, err = parseWarmup(warmup); err != nil {
		return Config{}, err
	}
	c.SLOTTFT = msToDuration(sloTTFT)
	c.SLOTPOT = msToDuration(sloTPOT)
	c.SLOE2E = msToDuration(sloE2E)
	if c.Rate == 0 && c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.Requests == 0 && c.Duration == 0 {
		c.Requests = 100
	}
	return c, c.Validate()
}

func msToDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

func parseWarmup(s string) (int, time.Duration, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 {
			return 0, 0, fmt.Errorf("-warmup: must be >= 0")
		}
		return n, 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, 0, fmt.Errorf("-warmup: %q is neither a request count nor a duration", s)
	}
	return 0, d, nil
}

// Validate checks a Config built by hand (tests) or by ParseFlags.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("-url is required"))
	}
	if c.Model == "" {
		errs = append(errs, errors.New("-model is required"))
	}
	if c.Endpoint != EndpointChat && c.Endpoint != EndpointCompletions {
		errs = append(errs, fmt.Errorf("-endpoint must be %q or %q", EndpointChat, EndpointCompletions))
	}
	if c.Concurrency < 0 || c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		errs = append(errs, errors.New("-concurrency and -rate must be >= 0 and finite"))
	}
	if c.Rate == 0 && c.Concurrency == 0 {
		errs = append(errs, errors.New("give -concurrency N or -rate R"))
	}
	if c.RampUp < 0 || (c.RampUp > 0 && c.Rate > 0) {
		errs = append(errs, errors.New("-ramp-up must be >= 0, and is for the closed loop only (not with -rate)"))
	}
	if c.Requests < 0 || c.Duration < 0 {
		errs = append(errs, errors.New("-requests and -duration must be >= 0"))
	}
	if c.Requests == 0 && c.Duration == 0 {
		errs = append(errs, errors.New("give -requests N or -duration D"))
	}
	if c.LongShare < 0 || c.LongShare > 1 || math.IsNaN(c.LongShare) {
		errs = append(errs, errors.New("-long-share must be within [0,1]"))
	}
	if c.LongShare > 0 && c.LongPromptTokens < 1 {
		errs = append(errs, errors.New("-long-prompt-tokens must be >= 1"))
	}
	if c.PromptTokens.Kind == "" || c.OutputTokens.Kind == "" {
		errs = append(errs, errors.New("prompt and output token distributions are required"))
	}
	return errors.Join(errs...)
}
