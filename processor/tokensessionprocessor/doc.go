// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package tokensessionprocessor is the token_session processor: it folds the
// token event records of the logs pipeline into LLM sessions, measures each
// (TTFT, TPOT, inter-token gaps, stalls), samples them on their end (tail
// sampling with rules and a consistent probabilistic draw), and emits a
// summary record and a session span for each kept session, stall alerts the
// moment a stall is detected, and session metrics on the metrics pipeline.
// On the traces pipeline it holds the spans of a trace with an active session
// until the session's verdict.
//
// One core, with one session table, serves the logs, metrics and traces
// instances that share a component ID. It is four parts with a lock each
// (see core): the fold of sessions and their outputs, the engine context,
// the held spans with the verdict cache, and the attribution of GPU time.
// The state machine lives in internal/session, the metrics in
// internal/sessionmetrics and the held spans in internal/heldspans; this
// package wires them to the collector.
//
//go:generate mdatagen metadata.yaml
package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"
