// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/otelcol-llm/otelcol-llm/cmd/vllmsim/internal/sim"
)

// attributionLog keeps every finished request's true share of engine time
// and energy and writes it as NDJSON when the simulator stops
// (-attribution-out): the truth the collector's attribution is checked
// against. One line a request, then one line with the engine's totals
// ("kind":"engine").
type attributionLog struct {
	path string
	eng  *sim.Engine
	mu   sync.Mutex
	recs []attributionRecord
}

type attributionRecord struct {
	Kind         string  `json:"kind"` // "request"
	ID           string  `json:"id"`
	TraceID      string  `json:"trace_id,omitempty"`
	Tenant       string  `json:"tenant,omitempty"`
	Finish       string  `json:"finish"`
	PromptTokens int     `json:"prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
	EngineTimeS  float64 `json:"engine_time_s"`
	PrefillS     float64 `json:"prefill_s"`
	DecodeS      float64 `json:"decode_s"`
	EnergyJ      float64 `json:"energy_j"`
}

// engineRecord is the last line: conservation is shares + orphaned_s =
// busy_s and busy_s + idle_s = wall_s.
type engineRecord struct {
	Kind            string  `json:"kind"` // "engine"
	Model           string  `json:"model"`
	WallS           float64 `json:"wall_s"`
	BusyS           float64 `json:"busy_s"`
	IdleS           float64 `json:"idle_s"`
	OrphanedS       float64 `json:"orphaned_s"`
	EnergyJ         float64 `json:"energy_j"`
	BusyEnergyJ     float64 `json:"busy_energy_j"`
	IdleEnergyJ     float64 `json:"idle_energy_j"`
	OrphanedEnergyJ float64 `json:"orphaned_energy_j"`
	Steps           int64   `json:"steps"`
	PrefillTokens   int64   `json:"prefill_tokens"`
	DecodeTokens    int64   `json:"decode_tokens"`
}

func (l *attributionLog) Started(*sim.Request)          {}
func (l *attributionLog) Token(*sim.Request, sim.Event) {}

func (l *attributionLog) Finished(r *sim.Request, reason string, _ time.Time) {
	s := r.Share()
	rec := attributionRecord{
		Kind: "request", ID: r.ID, TraceID: traceIDOf(r.Params.TraceParent), Tenant: r.Params.Tenant, Finish: reason,
		PromptTokens: r.Params.PromptTokens, OutputTokens: r.Generated(),
		EngineTimeS: s.EngineTime().Seconds(), PrefillS: s.Prefill.Seconds(), DecodeS: s.Decode.Seconds(), EnergyJ: s.EnergyJ,
	}
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
}

// traceIDOf is the trace ID of a W3C traceparent ("" if it is not one).
func traceIDOf(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}

// close writes the file; now closes the engine's idle time.
func (l *attributionLog) close(now time.Time) error {
	t := l.eng.Totals(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, r := range l.recs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	err := enc.Encode(engineRecord{
		Kind: "engine", Model: l.eng.Config().Model,
		WallS: t.Wall.Seconds(), BusyS: t.Busy.Seconds(), IdleS: t.Idle.Seconds(), OrphanedS: t.Orphaned.Seconds(),
		EnergyJ: t.EnergyJ, BusyEnergyJ: t.BusyEnergyJ, IdleEnergyJ: t.IdleEnergyJ, OrphanedEnergyJ: t.OrphanedEnergyJ,
		Steps: t.Steps, PrefillTokens: t.PrefillTokens, DecodeTokens: t.DecodeTokens,
	})
	if err != nil {
		return err
	}
	return os.WriteFile(l.path, b.Bytes(), 0o644)
}
