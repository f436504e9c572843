// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Who used the GPU: each point's collector figures of engine time by
// tenant (token_session's llm.engine.time, llm.session.engine_time) beside
// the simulator's truth (vllmsim -attribution-out). llmload labels the
// long-context share as the RAG tenant and the rest as the chat tenant.
const (
	tenantRAG          = "rag"
	tenantChat         = "chat"
	PlotAttribution    = "gpu_seconds_vs_tokens.png"
	metricEngineTime   = "llm.engine.time"
	metricEngineEnergy = "llm.engine.energy"
)

// TenantFigures are one tenant's totals at a point.
type TenantFigures struct {
	Tenant     string  `json:"tenant"`
	CollectorS float64 `json:"collector_s"` // llm.engine.time, prefill + decode
	TruthS     float64 `json:"simulator_s"`
	CollectorJ float64 `json:"collector_j"` // llm.engine.energy
	TruthJ     float64 `json:"simulator_j"`
	Tokens     int64   `json:"tokens"` // prompt + output, the simulator's count
}

// AttributionFigures compare a point's attribution with the truth.
type AttributionFigures struct {
	// Sessions is how many kept sessions (spans) matched a request of the
	// truth; their engine time's error (%, |collector − truth| / truth).
	Sessions int `json:"sessions"`
	// Halves are each tenant's error (%) over the kept sessions that ended
	// in each half of the point ("tenant/1", "tenant/2"): a bill is per
	// period.
	Halves         map[string]float64 `json:"tenant_error_by_half_pct,omitempty"`
	ErrP50         float64            `json:"session_error_p50_pct"`
	ErrP90         float64            `json:"session_error_p90_pct"`
	ErrMax         float64            `json:"session_error_max_pct"`
	Tenants        []TenantFigures    `json:"tenants"`
	CollectorBusyS float64            `json:"collector_busy_s"`
	CollectorIdleS float64            `json:"collector_idle_s"`
	TruthBusyS     float64            `json:"simulator_busy_s"`
	TruthIdleS     float64            `json:"simulator_idle_s"`
	TruthWallS     float64            `json:"simulator_wall_s"`
}

type attributionTruth struct {
	Kind         string  `json:"kind"`
	TraceID      string  `json:"trace_id"`
	Tenant       string  `json:"tenant"`
	PromptTokens int64   `json:"prompt_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	EngineTimeS  float64 `json:"engine_time_s"`
	EnergyJ      float64 `json:"energy_j"`
	BusyS        float64 `json:"busy_s"`
	IdleS        float64 `json:"idle_s"`
	WallS        float64 `json:"wall_s"`
}

// attributionFigures reads the simulator's truth and sets the collector's
// figures beside it.
func attributionFigures(truthPath string, spans []Span, engineTime, engineEnergy map[string]float64) (*AttributionFigures, error) {
	f, err := os.Open(truthPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a := &AttributionFigures{}
	byTenant := map[string]*TenantFigures{}
	tenant := func(name string) *TenantFigures {
		if t, ok := byTenant[name]; ok {
			return t
		}
		t := &TenantFigures{Tenant: name}
		byTenant[name] = t
		return t
	}
	byTrace := map[string]attributionTruth{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		var r attributionTruth
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", truthPath, err)
		}
		if r.Kind == "engine" {
			a.TruthBusyS, a.TruthIdleS, a.TruthWallS = r.BusyS, r.IdleS, r.WallS
			continue
		}
		t := tenant(r.Tenant)
		t.TruthS += r.EngineTimeS
		t.TruthJ += r.EnergyJ
		t.Tokens += r.PromptTokens + r.OutputTokens
		if r.TraceID != "" {
			byTrace[r.TraceID] = r
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for key, v := range engineTime {
		name, state, _ := strings.Cut(key, "/")
		if state == "idle" {
			a.CollectorIdleS += v
			continue
		}
		a.CollectorBusyS += v
		tenant(name).CollectorS += v
	}
	for key, v := range engineEnergy {
		if name, state, _ := strings.Cut(key, "/"); state != "idle" {
			tenant(name).CollectorJ += v
		}
	}
	var errs []float64
	first, last := int64(math.MaxInt64), int64(0)
	for _, s := range spans {
		if r, ok := byTrace[s.TraceID]; ok && s.EngineTimeS > 0 && r.EngineTimeS > 0 {
			first, last = min(first, s.EndUnixNano), max(last, s.EndUnixNano)
		}
	}
	mid := first/2 + last/2
	got, want := map[string]float64{}, map[string]float64{}
	for _, s := range spans {
		r, ok := byTrace[s.TraceID]
		if !ok || s.EngineTimeS == 0 || r.EngineTimeS <= 0 {
			continue
		}
		errs = append(errs, 100*math.Abs(s.EngineTimeS-r.EngineTimeS)/r.EngineTimeS)
		half := r.Tenant + "/1"
		if s.EndUnixNano >= mid {
			half = r.Tenant + "/2"
		}
		got[half] += s.EngineTimeS
		want[half] += r.EngineTimeS
	}
	a.Halves = map[string]float64{}
	for k, w := range want {
		a.Halves[k] = 100 * (got[k] - w) / w
	}
	a.Sessions = len(errs)
	if len(errs) > 0 {
		slices.Sort(errs)
		a.ErrP50, a.ErrP90, a.ErrMax = errs[len(errs)/2], errs[len(errs)*9/10], errs[len(errs)-1]
	}
	for _, t := range byTenant {
		a.Tenants = append(a.Tenants, *t)
	}
	sort.Slice(a.Tenants, func(i, j int) bool { return a.Tenants[i].Tenant < a.Tenants[j].Tenant })
	return a, nil
}

func pctErr(got, want float64) string {
	if want == 0 {
		return "–"
	}
	return fmt.Sprintf("%+.1f%%", 100*(got-want)/want)
}

// attributionMarkdown is the report's "Who used the GPU" section: each
// point's figures by both paths, the proxy's estimate and the engine's own
// share, against the simulator's truth.
func attributionMarkdown(rep *Report) string {
	var b strings.Builder
	b.WriteString("## Who used the GPU: the proxy's estimate and the engine's share vs the simulator\n\n")
	b.WriteString("Two tenants: `rag` (the long-context share, 3000-word prompts) and `chat` (the rest), labeled by `llmload` in " +
		"`X-Tenant-ID`, which the proxy copies into the sessions' `tenant.id` (`proxy::attributes_from_headers`). Two paths, " +
		"side by side: **estimate**, the point's collector in front of the engine (the proxy: the engine's steps read from " +
		"the tokens, each prompt's size from the request body until its usage); **exact**, a second collector to which " +
		"vllmsim's hook sends each request with the engine's own share of each step (what the vLLM plugin's engine core " +
		"sends), every session kept. Each against the simulator's truth (`vllmsim -attribution-out`: each step's time split " +
		"among its requests by tokens): `llm.engine.time` by tenant (prefill + decode) and its idle state; the error of " +
		"each tenant over the kept sessions that ended in each half of the point (a bill is per period); each kept " +
		"session's `llm.session.engine_time` error (the estimate's kept sessions are the slow ones and 1%). Token share: " +
		"the tenant's prompt + output tokens over all.\n\n")
	b.WriteString("| point | path | sessions | error p50 | p90 | max | tenant | GPU-s collector | simulator | Δ | Δ halves | J collector | simulator | token share | GPU-s share | busy + idle collector | simulator wall |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rep.Points {
		for _, path := range []struct {
			name string
			a    *AttributionFigures
		}{{"estimate", r.Attribution}, {"exact", r.ExactAttribution}} {
			a := path.a
			if a == nil {
				continue
			}
			var tokens, gpu float64
			for _, t := range a.Tenants {
				tokens += float64(t.Tokens)
				gpu += t.TruthS
			}
			for i, t := range a.Tenants {
				head := fmt.Sprintf("| %s | %s | %d | %.1f%% | %.1f%% | %.1f%% ", r.Point.Name(), path.name, a.Sessions, a.ErrP50, a.ErrP90, a.ErrMax)
				wall := fmt.Sprintf("%.2f + %.2f | %.2f", a.CollectorBusyS, a.CollectorIdleS, a.TruthWallS)
				if i > 0 {
					head, wall = "| | | | | | ", " | "
				}
				halves := "–"
				if h1, ok := a.Halves[t.Tenant+"/1"]; ok {
					halves = fmt.Sprintf("%+.1f%% / %+.1f%%", h1, a.Halves[t.Tenant+"/2"])
				}
				fmt.Fprintf(&b, "%s| %s | %.2f | %.2f | %s | %s | %.0f | %.0f | %.1f%% | %.1f%% | %s |\n", head, t.Tenant,
					t.CollectorS, t.TruthS, pctErr(t.CollectorS, t.TruthS), halves, t.CollectorJ, t.TruthJ,
					100*float64(t.Tokens)/max(tokens, 1), 100*t.TruthS/max(gpu, 1e-9), wall)
			}
		}
	}
	b.WriteString("\nThe plot `" + PlotAttribution + "` sets the RAG tenant's share of the GPU-seconds, by each path and the simulator's, beside its share of the tokens.\n\n")
	return b.String()
}

// plotAttribution draws, per point, each tenant's share of the GPU-seconds
// (collector and simulator) against its share of the tokens: tokens are not
// GPU time.
func plotAttribution(path string, pts []*PointResult) error {
	p := newPlot()
	p.Title.Text = "RAG tenant: share of GPU time vs share of tokens"
	p.Y.Label.Text = "% of the total"
	// Bottom right: the lines run above 15% there.
	p.Legend.Top, p.Legend.Left = false, false
	var ticks []plot.Tick
	var tok, col, exact, sim plotter.XYs
	for i, r := range pts {
		a := r.Attribution
		if a == nil {
			continue
		}
		if e := r.ExactAttribution; e != nil {
			if share, ok := ragShare(e.Tenants, func(t TenantFigures) float64 { return t.CollectorS }); ok {
				exact = append(exact, plotter.XY{X: float64(i), Y: share})
			}
		}
		var tokens, gpuC, gpuS float64
		var rag TenantFigures
		for _, t := range a.Tenants {
			tokens += float64(t.Tokens)
			gpuC += t.CollectorS
			gpuS += t.TruthS
			if t.Tenant == tenantRAG {
				rag = t
			}
		}
		if tokens == 0 || gpuS == 0 {
			continue
		}
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: r.Point.Name()})
		tok = append(tok, plotter.XY{X: float64(i), Y: 100 * float64(rag.Tokens) / tokens})
		sim = append(sim, plotter.XY{X: float64(i), Y: 100 * rag.TruthS / gpuS})
		if gpuC > 0 {
			col = append(col, plotter.XY{X: float64(i), Y: 100 * rag.CollectorS / gpuC})
		}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Tick.Label.Rotation = math.Pi / 4
	p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = draw.XRight, draw.YCenter
	for _, l := range []struct {
		name string
		xys  plotter.XYs
		c    int
		dash bool
	}{{"GPU-seconds, simulator", sim, 0, false}, {"GPU-seconds, estimate (proxy)", col, 0, true}, {"GPU-seconds, exact (engine's share)", exact, 2, true}, {"tokens", tok, 1, false}} {
		if len(l.xys) == 0 {
			continue
		}
		c := colorA
		switch l.c {
		case 1:
			c = colorB
		case 2:
			c = colorC
		}
		if err := addSweepLine(p, l.name, l.xys, c, l.dash, draw.CircleGlyph{}); err != nil {
			return err
		}
	}
	p.Y.Min = 0
	return p.Save(9*vg.Inch, 4.5*vg.Inch, path)
}

// ragShare is the RAG tenant's share of value over tenants, in percent;
// false when the total is 0.
func ragShare(tenants []TenantFigures, value func(TenantFigures) float64) (float64, bool) {
	var all, rag float64
	for _, t := range tenants {
		all += value(t)
		if t.Tenant == tenantRAG {
			rag += value(t)
		}
	}
	if all == 0 {
		return 0, false
	}
	return 100 * rag / all, true
}
