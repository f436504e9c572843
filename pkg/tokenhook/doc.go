// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package tokenhook is the client an inference engine embeds to send token
// events (session start, streamed token chunks, session end) to the
// otelcol-llm token_stream receiver, over the receiver's Unix socket (one
// stream connection, acknowledged; the default where the node offers it),
// UDP or HTTP, in the receiver's NDJSON wire schema (v1). Its Event is the collector's own event model,
// and it checks events by the receiver's own rules; it needs nothing but
// the standard library.
//
// The calls an engine makes from its inference loop (Client.Start,
// Client.Token, Client.End, Client.Send) never block: they check the event,
// returning a *FieldError for an invalid one, then put it on a bounded
// queue, or drop and count it when the queue is full. One background
// goroutine per Client encodes the queue into NDJSON batches and sends
// them; what happened to every event shows in Client.Stats. That goroutine
// polls the queue (every FlushInterval, or when a caller finds it half
// full) rather than waiting on it, so a call never pays for waking it.
//
// Over a Unix socket (Config.Endpoint "unix:///path"), a line written is in
// flight until the receiver's acknowledgement says what became of it;
// Stats counts it then. When the connection ends (a collector restart), the
// lines in flight no acknowledgement covered count as failed, and the next
// batch connects again, backing off while it cannot.
//
// A batch holds whole lines, and ends at Config.MaxBatchBytes or at
// Config.MaxBatchLines lines, whichever comes first: the receiver reads at
// most hooks::limits::max_lines_per_batch lines of a batch (10 000 by
// default, DefaultMaxBatchLines) and rejects the rest, so a backlog after a
// pause must not make larger batches. Over HTTP, when the receiver's
// answer to a batch states lower limits (it does when the batch broke
// one), the client keeps its next batches within them.
//
// See Example for the calls, and hooks/README.md in the repository for
// the contract this client shares with the Python one: invalid arguments,
// over-long and rejected lines, proxies, timeouts and retries.
//
// Prompt and completion text has no field here on purpose: token events
// carry counts and times only.
package tokenhook // import "github.com/otelcol-llm/otelcol-llm/pkg/tokenhook"
