// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package proxy is the token_stream receiver's reverse proxy in front of an
// OpenAI-compatible server: the relay of each completions stream and the
// session it makes of it, the proxy's limits and time bounds, the drain at
// shutdown, and the batching of the token events it observes.
//
// It knows the receiver only through the Sink it is given: the logs
// pipeline, the proxy's self-telemetry counters (named in the receiver's
// metadata.yaml) and a logger. The header policy, the W3C trace context
// and the error bodies it answers with are in headers.go; its bounds on
// the client and the upstream in limits.go; the stall breaker, which cuts a
// stream whose next token is too late, in breaker.go; how a stream not
// relayed whole ends for its client, in cut.go.
package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"
)

// Sink is what the proxy is given by the receiver that runs it.
type Sink interface {
	// ConsumeEvents hands records holding events token events to the logs
	// pipeline; the sink counts them as accepted or refused. The proxy
	// calls it from one goroutine at a time.
	ConsumeEvents(ctx context.Context, logs plog.Logs, events int) error
	// Counters are the proxy's own counters; the proxy reads them once.
	Counters() Counters
	// Logger is the logger of the proxy's logs.
	Logger() *zap.Logger
}

// Counters are the proxy's self-telemetry; the reason attribute sets are
// the proxy's (the enums of the receiver's metadata.yaml).
type Counters struct {
	// RefusedRequests: completions requests answered without a session
	// (request_refusal).
	RefusedRequests metric.Int64Counter
	// PassthroughFailures: pass-through requests the proxy answered itself
	// (passthrough_failure).
	PassthroughFailures metric.Int64Counter
	// OversizedEvents: SSE events forwarded without being read.
	OversizedEvents metric.Int64Counter
	// DroppedEvents: token events dropped before the pipeline (event_drop).
	DroppedEvents metric.Int64Counter
	// StalledStreams: streams the stall breaker cut.
	StalledStreams metric.Int64Counter
	// CutStreams: streams not relayed whole, ended for the client with an
	// error event, by reason (cut_reason); the breaker's are StalledStreams.
	CutStreams metric.Int64Counter
	// UpstreamRetries: upstream requests whose kept-alive connection failed
	// before any byte of the answer, by outcome (retry_outcome).
	UpstreamRetries metric.Int64Counter
	// Migrations: streams that met a proxy::migrate trigger, by outcome,
	// trigger and (refused) reason.
	Migrations metric.Int64Counter
	// TruncatedValues: values of the events cut to their bound
	// (tokenevent.CutValues), counted with transport proxy.
	TruncatedValues metric.Int64Counter
}
