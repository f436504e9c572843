// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package enginehealthexporter is the engine_health exporter: outlier
// ejection from live sessions. It reads the session metrics token_session
// emits over every session (llm.sessions by outcome and error.type,
// llm.sessions.active, llm.session.stalls and the TTFT histogram, by
// llm.engine), and optionally its stall alerts, keeps
// a sliding window per engine, and judges each engine healthy or ejected with
// Envoy's outlier-detection semantics. Load balancers read the verdicts: an
// HTTP health endpoint per engine (Kubernetes probes, Envoy's and HAProxy's
// HTTP checks), a JSON list, and HAProxy's agent-check protocol.
//
//go:generate mdatagen metadata.yaml
package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"
