// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package live is token_session's live view: the sessions in flight, the
// engines' totals and the latest ended sessions, served over HTTP as JSON,
// Server-Sent Events and one page. The fold feeds it the sessions that end
// (State.Ended) and lends it the table, under its lock, for each snapshot.
package live // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"
