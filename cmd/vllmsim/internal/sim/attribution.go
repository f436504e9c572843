// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sim

import (
	"errors"
	"io"
	"time"
)

// Power is the simulated GPU's power model. While a step computing N
// tokens runs, the GPU draws
//
//	IdleWatts + (MaxWatts - IdleWatts) * min(1, N / SaturationTokens)
//
// and IdleWatts between steps: a GPU's draw rises with the work in flight
// until its units are saturated. It is the truth's model, not a claim about
// any GPU: the figures only need to differ between light and heavy steps.
type Power struct {
	IdleWatts        float64
	MaxWatts         float64
	SaturationTokens int
}

// DefaultPower is an H100-like envelope: 80 W idle, 700 W (its TDP) at 256
// or more tokens a step.
func DefaultPower() Power { return Power{IdleWatts: 80, MaxWatts: 700, SaturationTokens: 256} }

func (p Power) validate() error {
	if p.IdleWatts < 0 || p.MaxWatts < p.IdleWatts || p.SaturationTokens < 1 {
		return errors.New("power: want 0 <= idle watts <= max watts and saturation tokens >= 1")
	}
	return nil
}

// Watts is the draw during a step computing tokens tokens (0: idle).
func (p Power) Watts(tokens int) float64 {
	if tokens <= 0 {
		return p.IdleWatts
	}
	return p.IdleWatts + (p.MaxWatts-p.IdleWatts)*min(1, float64(tokens)/float64(p.SaturationTokens))
}

// Share is a request's true share of the engine: each step's wall time and
// energy split among the requests in it in proportion to the tokens each
// computed in the step (a prefill chunk's tokens, one per decode), the
// attribution model the collector estimates. Prefill counts the steps in
// which the request computed prompt (or, after a pre-emption, recomputed)
// tokens, Decode the others.
type Share struct {
	Prefill, Decode time.Duration
	EnergyJ         float64
}

// EngineTime is Prefill + Decode.
func (s Share) EngineTime() time.Duration { return s.Prefill + s.Decode }

// Totals are the engine's wall time split into busy (some step running)
// and idle, with the energy of each. Orphaned is the busy time of tokens
// whose request was aborted while their step ran: it belongs to no
// finished request's Share. Conservation: the Shares of all requests plus
// Orphaned equal Busy; Busy + Idle = Wall.
type Totals struct {
	Wall, Busy, Idle, Orphaned  time.Duration
	BusyEnergyJ, IdleEnergyJ    float64
	OrphanedEnergyJ, EnergyJ    float64
	Steps                       int64
	PrefillTokens, DecodeTokens int64
}

// ledger is the engine's account of steps and idle time; guarded by the
// engine lock.
type ledger struct {
	power Power
	// started: the first Plan has run; wallStart is its time.
	started   bool
	wallStart time.Time
	// lastEnd is when the previous step ended (or the idle time up to
	// which was accounted); running: a planned step has not been committed.
	lastEnd time.Time
	running bool
	// idled: the last Plan found nothing to run, so the engine waited.
	idled    bool
	totals   Totals
	energyMJ float64 // whole energy, for the DCGM counter
	// watts is the draw now: the running step's, or idle.
	watts float64
}

// planned notes a Plan at now that chose b (empty: the engine idles).
func (l *ledger) planned(b *Batch, now time.Time) {
	if !l.started {
		l.started, l.wallStart, l.lastEnd = true, now, now
	}
	if len(b.Entries) == 0 {
		l.idled = true
		return
	}
	// A step planned straight after the previous one ended starts at that
	// end: the scheduler's own time between them is the engine's, not idle.
	b.acctStart = now
	if !l.idled && now.After(l.lastEnd) {
		b.acctStart = l.lastEnd
	}
	l.running, l.idled = true, false
	n := b.PrefillTokens + b.DecodeSeqs
	l.watts = l.power.Watts(n)
}

// committed charges the step b, which ended at end, to its requests.
func (l *ledger) committed(b *Batch, end time.Time) {
	start := b.acctStart
	if start.IsZero() || end.Before(start) {
		start = end
	}
	if idle := start.Sub(l.lastEnd); idle > 0 {
		l.idle(idle)
	}
	d := end.Sub(start)
	l.lastEnd, l.running = end, false
	l.watts = l.power.IdleWatts
	n := 0
	for _, en := range b.Entries {
		n += en.Tokens
	}
	if n == 0 {
		return
	}
	watts := l.power.Watts(n)
	energy := watts * d.Seconds()
	t := &l.totals
	t.Steps++
	t.Busy += d
	t.BusyEnergyJ += energy
	l.energyMJ += energy * 1000
	for _, en := range b.Entries {
		share := time.Duration(float64(d) * float64(en.Tokens) / float64(n))
		e := energy * float64(en.Tokens) / float64(n)
		if en.Prefill {
			t.PrefillTokens += int64(en.Tokens)
		} else {
			t.DecodeTokens += int64(en.Tokens)
		}
		r := en.Req
		if r.state != stateRunning {
			t.Orphaned += share
			t.OrphanedEnergyJ += e
			continue
		}
		if en.Prefill {
			r.share.Prefill += share
		} else {
			r.share.Decode += share
		}
		r.share.EnergyJ += e
	}
}

func (l *ledger) idle(d time.Duration) {
	l.totals.Idle += d
	e := l.power.IdleWatts * d.Seconds()
	l.totals.IdleEnergyJ += e
	l.energyMJ += e * 1000
}

// closeAt accounts the idle time up to now (the engine stops or a reader
// asks for the totals).
func (l *ledger) closeAt(now time.Time) {
	if !l.started {
		return
	}
	if !l.running && now.After(l.lastEnd) {
		l.idle(now.Sub(l.lastEnd))
		l.lastEnd = now
	}
}

// Share returns r's true share so far; final once its last event has been
// received (or from the Observer's Finished).
func (r *Request) Share() Share { return r.share }

// Totals returns the engine's wall, busy and idle time up to now (idle
// time up to now is accounted first; a step still running is not
// counted).
func (e *Engine) Totals(now time.Time) Totals {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.acct.closeAt(now)
	t := e.acct.totals
	if e.acct.started {
		t.Wall = e.acct.lastEnd.Sub(e.acct.wallStart)
	}
	t.EnergyJ = t.BusyEnergyJ + t.IdleEnergyJ
	return t
}

// PowerNow returns the GPU's draw now (W) and the energy it used since the
// engine started (mJ), as DCGM's power gauge and energy counter read them.
func (e *Engine) PowerNow() (watts, energyMJ float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := e.acct.watts
	if !e.acct.started {
		w = e.acct.power.IdleWatts
	}
	return w, e.acct.energyMJ
}

// GPU names the simulated GPU on the DCGM-shaped series: dcgm-exporter's
// labels, with the pod, namespace and container of the engine it serves
// (what dcgm-exporter adds with its Kubernetes pod mapping).
type GPU struct {
	UUID, ModelName, Hostname, Pod, Namespace, Container string
}

// WriteDCGM writes the GPU's power draw and energy counter in the form
// NVIDIA's dcgm-exporter serves them: DCGM_FI_DEV_POWER_USAGE (gauge, W)
// and DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (counter, mJ), one GPU, "0".
func (e *Engine) WriteDCGM(w io.Writer, g GPU) error {
	watts, mj := e.PowerNow()
	lbl := `gpu="0",UUID="` + escape(g.UUID) + `",pci_bus_id="00000000:00:1E.0",device="nvidia0",modelName="` + escape(g.ModelName) +
		`",Hostname="` + escape(g.Hostname) + `",container="` + escape(g.Container) + `",namespace="` + escape(g.Namespace) +
		`",pod="` + escape(g.Pod) + `"`
	_, err := io.WriteString(w, "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"+
		"DCGM_FI_DEV_POWER_USAGE{"+lbl+"} "+FormatFloat(watts)+"\n"+
		"# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"+
		"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{"+lbl+"} "+FormatFloat(mj)+"\n")
	return err
}
