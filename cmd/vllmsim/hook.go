// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"log"
	"time"

	"github.com/otelcol-llm/otelcol-llm/cmd/vllmsim/internal/sim"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenhook"
)

// hook sends the engine's token events with pkg/tokenhook (engine-hook
// mode). Its calls never block, so it may run under the engine lock.
type hook struct {
	c       *tokenhook.Client
	model   string
	profile string
	engine  string
	logger  *log.Logger
	// engineShare: the end events carry the request's exact share of the
	// engine's time and energy (-hook-engine-share).
	engineShare bool
}

func newHook(endpoint, engine string, cfg sim.Config, logger *log.Logger) (*hook, error) {
	c, err := tokenhook.New(tokenhook.Config{Endpoint: endpoint})
	if err != nil {
		return nil, err
	}
	return &hook{c: c, model: cfg.Model, profile: cfg.Profile, engine: engine, logger: logger}, nil
}

func (h *hook) Started(r *sim.Request) {
	attrs := map[string]string{"quantization": h.profile}
	if r.Params.Tenant != "" {
		attrs["tenant.id"] = r.Params.Tenant // as a gateway in front of the engine would label it
	}
	st := tokenhook.Start{
		SessionID: r.ID, Time: r.Arrival, Model: h.model, Operation: r.Params.Operation,
		PromptTokens: r.Params.PromptTokens, HasPromptTokens: true, Engine: h.engine, Attributes: attrs,
	}
	// In the request's trace, as an engine's hook joins its caller's.
	if trace, parent, ok := readTraceparent(r.Params.TraceParent); ok {
		st.TraceID, st.ParentSpanID = trace, parent
	}
	h.check(h.c.Start(st))
}

func (h *hook) Token(r *sim.Request, ev sim.Event) { h.check(h.c.Token(r.ID, ev.Time, 1)) }

func (h *hook) Finished(r *sim.Request, reason string, t time.Time) {
	e := tokenhook.End{SessionID: r.ID, Time: t, FinishReason: reason, CompletionTokens: r.Generated(), HasCompletionTokens: true}
	// The engine's own timing, as a hook in a real engine would send it.
	e.QueueTime, e.PrefillTime, e.DecodeTime = r.Timing()
	e.HasTiming = true
	if h.engineShare {
		// The exact share, as an engine that sees its steps computes it.
		sh := r.Share()
		e.EnginePrefill, e.EngineDecode, e.HasEngineTime = sh.Prefill, sh.Decode, true
		e.EnergyJ, e.HasEnergy = sh.EnergyJ, true
	}
	h.check(h.c.End(e))
}

// check logs an event the client refused as invalid: a simulator bug, since
// the client only refuses events that break the event rules.
func (h *hook) check(err error) {
	if err != nil {
		h.logger.Printf("token hook: %v", err)
	}
}

func (h *hook) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = h.c.Close(ctx)
}
