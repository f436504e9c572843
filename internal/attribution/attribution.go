// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package attribution divides an engine's busy time and energy among the
// sessions it computes, with conservation by construction: the sessions'
// shares plus the engine's idle time are its wall time.
//
// The model (the processor README states it for users) is vLLM's
// scheduler's: an engine step's time is shared among the sessions in the
// step in proportion to the tokens each computes in it — a prefill chunk's
// tokens, one token per decoding sequence. The collector does not see the
// steps, but it sees every token, and every step ends with a token of each
// sequence it decoded or whose prompt it finished: Steps reads the steps
// from the tokens' times and settles each one a short while after it
// ended, once the tokens of every session in it have come (steps.go).
package attribution // import "github.com/otelcol-llm/otelcol-llm/internal/attribution"

// Totals are an engine's account: Wall = Busy + Idle by construction, and
// Busy is the sum of every share charged (Charged, the ended sessions'
// shares) and those still accruing.
type Totals struct {
	Wall, Busy, Idle                       float64 // seconds
	BusyEnergy, IdleEnergy                 float64 // joules, while a power reading was known
	Charged, ChargedPrefill, ChargedDecode float64 // seconds, ended sessions
	ChargedEnergy                          float64
}

// DefaultBudget is vLLM's default max_num_batched_tokens with chunked
// prefill (2048).
const DefaultBudget = 2048
