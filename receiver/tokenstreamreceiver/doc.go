// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package tokenstreamreceiver is the token_stream receiver. On the logs
// signal it takes in the token events of LLM requests (start, token, end)
// from engine hooks, as NDJSON posted over HTTP or sent in UDP datagrams,
// and from a reverse proxy in front of an OpenAI-compatible server that
// observes the completions streams it relays; it emits them as log records
// in the record form of internal/tokenrecord. On the metrics signal it
// scrapes engines' Prometheus /metrics endpoints (the vllm source).
//
// This package is the wiring: configuration, factory, lifecycle, the hook
// endpoints, the scraper and the hand-over to the pipeline. The proxy lives
// in internal/proxy, given a Sink by the receiver, with its codecs beside it:
// internal/sse (SSE framing) and internal/openaistream (what the proxy reads
// in OpenAI traffic). The codecs other parts use too live at the
// repository's root: pkg/tokenevent, internal/tokenparse and
// internal/tokenrecord (the event model, its parser and its records), and
// internal/promconv (exposition to pmetric).
//
//go:generate mdatagen metadata.yaml
package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"
