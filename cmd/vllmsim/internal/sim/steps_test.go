// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/otelcol-llm/otelcol-llm/internal/attribution"
)

// recorder keeps what a proxy in front of the engine sees of each request.
type recorder struct {
	reqs     map[string]*seen
	order    []*seen
	finished []*Request
}

type seen struct {
	r        *Request
	arrival  int64
	tokens   []int64
	end      int64
	prompt   int64
	output   int64
	queue    int64 // engine's queue time (ns), from its per-request metrics
	tenant   string
	truth    float64
	estimate map[string]float64
}

func (o *recorder) Started(r *Request) {
	s := &seen{r: r, arrival: r.Arrival.UnixNano(), prompt: int64(r.Params.PromptTokens), tenant: r.Params.Tenant, estimate: map[string]float64{}}
	o.reqs[r.ID] = s
	o.order = append(o.order, s)
}

func (o *recorder) Token(r *Request, ev Event) {
	s := o.reqs[r.ID]
	s.tokens = append(s.tokens, ev.Time.UnixNano())
}

func (o *recorder) Finished(r *Request, _ string, t time.Time) {
	s := o.reqs[r.ID]
	s.end = t.UnixNano()
	s.output = int64(r.Generated())
	q, _, _ := r.Timing()
	s.queue = int64(q)
	o.finished = append(o.finished, r)
}

type labPoint struct {
	name    string
	cfg     Config
	clients int
}

func demoPoints() []labPoint {
	var pts []labPoint
	for _, sc := range []string{"b", "c"} {
		for _, c := range []int{25, 50, 75, 100, 150, 200} {
			cfg := testConfig()
			cfg.KVBlocks = 4096
			if sc == "b" {
				cfg.ChunkedPrefill, cfg.PrefillPriority, cfg.MaxNumBatchedTokens = false, true, cfg.MaxModelLen
			} else {
				cfg.ChunkedPrefill, cfg.PrefillPriority, cfg.MaxNumBatchedTokens = true, false, 1024
			}
			pts = append(pts, labPoint{name: fmt.Sprintf("%s-c%d", sc, c), cfg: cfg, clients: c})
		}
	}
	return pts
}

// runPoint drives the engine in a closed loop of clients for dur of engine
// time, with the demo's load: prompts uniform 200-800, one in ten of 3000
// (the rag tenant), 128 tokens out.
func runPoint(t *testing.T, p labPoint, dur time.Duration) (*recorder, *Engine) {
	e := newEngine(t, p.cfg)
	o := &recorder{reqs: map[string]*seen{}}
	e.SetObserver(o)
	rng := rand.New(rand.NewPCG(uint64(p.clients), 7))
	now := t0
	n := 0
	submit := func(at time.Time) {
		pr := Params{PromptTokens: 200 + rng.IntN(601), MaxTokens: 128, Tenant: "chat"}
		if rng.Float64() < 0.1 {
			pr = Params{PromptTokens: 3000, MaxTokens: 128, Tenant: "rag"}
		}
		if _, err := e.Submit(fmt.Sprint(n), pr, at); err != nil {
			t.Fatal(err)
		}
		n++
	}
	// Clients start over the first 3 s, as llmload's ramp-up.
	var pending []time.Time
	for i := range p.clients {
		pending = append(pending, t0.Add(time.Duration(i)*3*time.Second/time.Duration(p.clients)))
	}
	end := t0.Add(dur)
	for now.Before(end) {
		sort.Slice(pending, func(i, j int) bool { return pending[i].Before(pending[j]) })
		k := 0
		for k < len(pending) && !pending[k].After(now) {
			submit(pending[k])
			k++
		}
		pending = pending[k:]
		b := e.Step(now)
		if b.Duration == 0 {
			if len(pending) == 0 {
				break
			}
			now = pending[0]
			continue
		}
		now = now.Add(b.Duration)
		for range o.finished {
			pending = append(pending, now.Add(time.Duration(rng.Float64()*float64(2*time.Millisecond))))
		}
		o.finished = o.finished[:0]
	}
	return o, e
}

// proxyEvent is one thing the proxy sees, in time order.
type proxyEvent struct {
	at   int64
	kind int // 0 arrive, 1 token, 2 end
	s    *seen
	i    int
}

func timeline(o *recorder, jitter time.Duration) []proxyEvent {
	var evs []proxyEvent
	rng := rand.New(rand.NewPCG(11, 13))
	for _, s := range o.order {
		evs = append(evs, proxyEvent{at: s.arrival, kind: 0, s: s})
		last := int64(0)
		for i, at := range s.tokens {
			// What the proxy reads lags the engine's step end by its
			// stream's share of the machine: up to jitter.
			if jitter > 0 {
				at = max(at+rng.Int64N(int64(jitter)), last+1)
			}
			last = at
			evs = append(evs, proxyEvent{at: at, kind: 1, s: s, i: i})
		}
		if s.end != 0 {
			evs = append(evs, proxyEvent{at: max(s.end, last), kind: 2, s: s})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].kind < evs[j].kind
	})
	return evs
}

// pointFigures are an estimate's errors at a point against the truth.
type pointFigures struct {
	sessions int
	// tenant is each tenant's error (estimate − truth) / truth over the
	// point, half over each half of it (by session end).
	tenant, half map[string]float64
	p50, p90     float64
}

func figures(o *recorder, got map[*seen]float64, mid, cutoff int64) pointFigures {
	var errs []float64
	tr, md := map[string]float64{}, map[string]float64{}
	for _, s := range o.order {
		v, ok := got[s]
		if !ok || s.truth <= 0 || s.end == 0 || s.end > cutoff {
			continue
		}
		errs = append(errs, math.Abs(v-s.truth)/s.truth)
		h := "/1"
		if s.end >= mid {
			h = "/2"
		}
		for _, k := range []string{s.tenant, s.tenant + h} {
			tr[k] += s.truth
			md[k] += v
		}
	}
	slices.Sort(errs)
	f := pointFigures{sessions: len(errs), tenant: map[string]float64{}, half: map[string]float64{}}
	for k, t := range tr {
		e := (md[k] - t) / t
		if len(k) > 2 && k[len(k)-2] == '/' {
			f.half[k] = e
		} else {
			f.tenant[k] = e
		}
	}
	if len(errs) > 0 {
		f.p50, f.p90 = errs[len(errs)/2], errs[len(errs)*9/10]
	}
	return f
}

// The proxy's estimate (attribution.Steps: the engine's steps read from
// the token stream, settled after the fact) against the simulator's exact
// shares, at each point of make demo's two sweeps, on the simulator's own
// clock (no wall clock, no goroutine: the result does not depend on the
// machine). The collector gets the events as the receiver hands them over,
// in 100 ms batches grouped by session, with the prompt known at the start
// (the request body's estimate), joins tokens 5 ms apart into a step
// (step_join) and settles 2 s behind; then the same with each token read
// up to 5 ms after its step ended (a busy proxy), and logged at 2 and 8 ms. Targets (issue 42):
// each tenant within 5% over the point and 10% over each half, the
// per-session error's p90 within 25%, and the shares plus idle time equal
// to the engine's wall time. Prefill first (sweep b) the steps show
// everything and the estimate is exact; with chunked prefill (sweep c) a
// prompt pre-empted in the middle of its prefill computes chunks that are
// thrown away, which no token shows: from 75 clients on, where the KV
// cache runs out, the figures are logged, not asserted. With the prompt
// known only at the end (the tenant's mean until then) the figures are
// logged beside.
func TestStepsAgainstTruth(t *testing.T) {
	window, lag := 100*time.Millisecond, 2*time.Second
	for _, p := range demoPoints() {
		t.Run(p.name, func(t *testing.T) {
			o, e := runPoint(t, p, 40*time.Second)
			evs := timeline(o, 0)
			for _, s := range o.order {
				s.truth = s.r.Share().EngineTime().Seconds()
			}
			mid, cutoff := t0.Add(17*time.Second).UnixNano(), t0.Add(32*time.Second).UnixNano()
			var totals attribution.Totals
			est := onlineSteps(true, window, lag, &totals)(p, evs)
			f := figures(o, est, mid, cutoff)
			log := func(name string, f pointFigures) {
				t.Logf("%-7s %-26s %3d sessions, %3d pre-emptions: chat %+6.1f%% rag %+6.1f%%, halves chat %+6.1f%% %+6.1f%% rag %+6.1f%% %+6.1f%%, per session p50 %5.1f%% p90 %5.1f%%",
					p.name, name, f.sessions, e.Snapshot().Preemptions, 100*f.tenant["chat"], 100*f.tenant["rag"],
					100*f.half["chat/1"], 100*f.half["chat/2"], 100*f.half["rag/1"], 100*f.half["rag/2"], 100*f.p50, 100*f.p90)
			}
			log("steps, prompt at start", f)
			log("steps, prompt at end", figures(o, onlineSteps(false, window, lag, nil)(p, evs), mid, cutoff))
			for _, j := range []time.Duration{2 * time.Millisecond, 5 * time.Millisecond, 8 * time.Millisecond} {
				log(fmt.Sprintf("steps, %s of jitter", j), figures(o, onlineSteps(true, window, lag, nil)(p, timeline(o, j)), mid, cutoff))
			}

			// Conservation: every settled step's time is charged or idle,
			// and the settled busy time is the engine's.
			truth := e.Totals(t0.Add(time.Hour))
			assert.InDelta(t, totals.Busy+totals.Idle, totals.Wall, 1e-6)
			assert.InEpsilon(t, truth.Busy.Seconds(), totals.Busy, 0.01, "busy time")
			assert.InEpsilon(t, totals.Busy, totals.Charged, 1e-9, "every step's time is charged")
			if p.cfg.ChunkedPrefill && p.clients >= 75 {
				return
			}
			jittered := figures(o, onlineSteps(true, window, lag, nil)(p, timeline(o, 5*time.Millisecond)), mid, cutoff)
			for name, f := range map[string]pointFigures{"": f, ", 5 ms of jitter": jittered} {
				for k, v := range f.tenant {
					assert.Less(t, math.Abs(v), 0.05, "tenant %s%s", k, name)
				}
				for k, v := range f.half {
					assert.Less(t, math.Abs(v), 0.10, "tenant %s%s", k, name)
				}
				assert.Less(t, f.p90, 0.25, "per-session p90%s", name)
			}
		})
	}
}

// onlineSteps feeds attribution.Steps what the proxy sees, as the
// collector gets it: in batches every window, a batch's events grouped
// by session; the prompt at the start when knowPrompt (the request
// body's estimate), else the tenant's mean so far.
func onlineSteps(knowPrompt bool, window, lag time.Duration, totals *attribution.Totals) func(p labPoint, evs []proxyEvent) map[*seen]float64 {
	return func(p labPoint, evs []proxyEvent) map[*seen]float64 {
		m := attribution.NewSteps(attribution.StepsConfig{StepTokens: p.cfg.MaxNumBatchedTokens, PrefillFirst: p.cfg.PrefillPriority, Join: int64(5 * time.Millisecond), Lag: int64(lag)})
		accts := map[*seen]*attribution.Account{}
		byAcct := map[*attribution.Account]*seen{}
		means := map[string][2]float64{}
		out := map[*seen]float64{}
		collect := func(fin []*attribution.Account) {
			for _, a := range fin {
				out[byAcct[a]] = a.EngineTime()
			}
		}
		w := int64(window)
		for i := 0; i < len(evs); {
			batch := (evs[i].at/w + 1) * w
			k := i
			for k < len(evs) && evs[k].at < batch {
				k++
			}
			b := slices.Clone(evs[i:k])
			sort.SliceStable(b, func(x, y int) bool { return b[x].s.r.Seq < b[y].s.r.Seq })
			for _, ev := range b {
				switch ev.kind {
				case 0:
					a := &attribution.Account{}
					accts[ev.s], byAcct[a] = a, ev.s
					pr := ev.s.prompt
					if !knowPrompt {
						pr = -1
						if mn := means[ev.s.tenant]; mn[1] > 0 {
							pr = int64(mn[0] / mn[1])
						}
					}
					m.Arrive(a, ev.at, pr)
				case 1:
					m.Token(accts[ev.s], ev.at, 1)
				case 2:
					m.End(accts[ev.s], ev.at, ev.s.prompt, ev.s.output)
					mn := means[ev.s.tenant]
					means[ev.s.tenant] = [2]float64{mn[0] + float64(ev.s.prompt), mn[1] + 1}
				}
			}
			collect(m.Settle(batch))
			i = k
		}
		collect(m.Settle(evs[len(evs)-1].at + int64(time.Hour)))
		if totals != nil {
			// Charged: every session's share, open ones' included.
			*totals = m.Totals()
			totals.Charged = 0
			for _, a := range accts {
				totals.Charged += a.EngineTime()
			}
		}
		return out
	}
}

// An engine of short steps (a small model on a fast GPU: 2 ms decode
// steps, shorter than step_join's 5 ms) is not read as one of longer
// steps: the join shrinks to a third of the time between a session's two
// tokens. Exact on the engine's times; with 1 ms of jitter, within the
// targets.
func TestStepsShortSteps(t *testing.T) {
	cfg := testConfig()
	cfg.Cost.DecodeBase, cfg.Cost.DecodePerSeq, cfg.Cost.PrefillPerToken, cfg.Cost.StepOverhead = 2*time.Millisecond, 40*time.Microsecond, 10*time.Microsecond, 100*time.Microsecond
	p := labPoint{name: "short-steps", cfg: cfg, clients: 25}
	o, _ := runPoint(t, p, 20*time.Second)
	for _, s := range o.order {
		s.truth = s.r.Share().EngineTime().Seconds()
	}
	mid, cutoff := t0.Add(8*time.Second).UnixNano(), t0.Add(15*time.Second).UnixNano()
	for _, jitter := range []time.Duration{0, time.Millisecond} {
		f := figures(o, onlineSteps(true, 100*time.Millisecond, 2*time.Second, nil)(p, timeline(o, jitter)), mid, cutoff)
		t.Logf("jitter %s: %d sessions, chat %+.1f%% rag %+.1f%%, per session p50 %.1f%% p90 %.1f%%", jitter, f.sessions, 100*f.tenant["chat"], 100*f.tenant["rag"], 100*f.p50, 100*f.p90)
		for k, v := range f.tenant {
			assert.Less(t, math.Abs(v), 0.05, "tenant %s, jitter %s", k, jitter)
		}
		assert.Less(t, f.p90, 0.25, "per-session p90, jitter %s", jitter)
	}
}
