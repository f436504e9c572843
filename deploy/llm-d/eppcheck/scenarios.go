// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// degrade is how pod a goes bad: every 8th decoding step freezes for 1.5 s,
// as in make demo-breaker.
const degrade = "/admin/degrade?freeze=1500ms&every=8"

// scenarios runs the scenarios -scenarios names, after a baseline.
func (r *run) scenarios(ctx context.Context) {
	r.event("baseline", "load through the EPP, pods a and b")
	sleep(ctx, 15*time.Second)
	for _, name := range strings.Split(r.o.scenarios, ",") {
		if ctx.Err() != nil {
			return
		}
		from := r.since()
		var figures [][2]string
		switch strings.TrimSpace(name) {
		case "new-pod":
			figures = r.newPod(ctx)
		case "stall":
			figures = r.stall(ctx)
		case "restart":
			figures = r.restart(ctx)
		case "killed":
			figures = r.killed(ctx)
		case "idle":
			figures = r.idle(ctx)
		default:
			figures = [][2]string{{"error", "no such scenario"}}
		}
		r.mu.Lock()
		r.results = append(r.results, scenarioResult{Name: name, From: secs(from), To: secs(r.since()), Figures: figures})
		r.mu.Unlock()
	}
}

func (r *run) pod(name string) *pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pods[name]
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.2f s", secs(d)) }

// newPod: pod c joins the pool; with its sidecar serving the gauges from
// its start it scores as a pod that never stalls, and takes its share.
func (r *run) newPod(ctx context.Context) [][2]string {
	r.event("new-pod", "pod c starts")
	c, err := r.addPod(ctx, "c")
	if err != nil {
		return [][2]string{{"error", err.Error()}}
	}
	if err := r.list(r.pod("a"), r.pod("b"), c); err != nil {
		return [][2]string{{"error", err.Error()}}
	}
	added := r.event("", "pod c listed in the endpoints file")
	var out [][2]string
	out = append(out, [2]string{"c's sidecar serves at its first scrape", describeServed(r.firstServed("c", 0))})
	seen, ok := r.waitDecision(ctx, added, 30*time.Second, scored("c"))
	if !ok {
		return append(out, [2]string{"c scored by the EPP", "not within 30 s"})
	}
	out = append(out, [2]string{"c first scored (kept by the filter)", seconds(seen-added) + " after it was listed"})
	sleep(ctx, 20*time.Second)
	return out
}

// stall: pod a freezes mid-stream; engine_health ejects it, the EPP's filter
// drops it; healed, it comes back when its ejection ends.
func (r *run) stall(ctx context.Context) [][2]string {
	a := r.pod("a")
	t0 := r.event("stall", "pod a degraded: "+degrade)
	if err := a.admin(ctx, degrade); err != nil {
		return [][2]string{{"error", err.Error()}}
	}
	var out [][2]string
	if s, ok := r.waitServed(ctx, "a", t0, 30*time.Second, ejected(1)); ok {
		out = append(out, [2]string{"a's sidecar serves ejected 1", seconds(at(s.T)-t0) + " after the degradation"})
	}
	filtered, ok := r.waitDecision(ctx, t0, 30*time.Second, filteredOut("a"))
	if !ok {
		return append(out, [2]string{"a filtered out", "not within 30 s"})
	}
	out = append(out, [2]string{"a filtered out by drop-ejected", seconds(filtered-t0) + " after the degradation"})
	healed := r.event("", "pod a healed")
	if err := a.admin(ctx, "/admin/heal"); err != nil {
		return append(out, [2]string{"error", err.Error()})
	}
	if s, ok := r.waitServed(ctx, "a", healed, 90*time.Second, ejected(0)); ok {
		out = append(out, [2]string{"a's sidecar serves ejected 0 (its ejection over)", seconds(at(s.T)-healed) + " after the heal"})
	}
	back, ok := r.waitDecision(ctx, healed, 90*time.Second, scored("a"))
	if !ok {
		return append(out, [2]string{"a re-admitted", "not within 90 s of the heal"})
	}
	out = append(out, [2]string{"a re-admitted (kept by the filter again)", seconds(back-healed) + " after the heal, " +
		seconds(back-filtered) + " after it was filtered"})
	sleep(ctx, 10*time.Second)
	return out
}

// restart: pod a is ejected again, healed, and its sidecar restarts while
// the EPP holds ejected=1 for it.
func (r *run) restart(ctx context.Context) [][2]string {
	a := r.pod("a")
	t0 := r.event("restart", "pod a degraded: "+degrade)
	if err := a.admin(ctx, degrade); err != nil {
		return [][2]string{{"error", err.Error()}}
	}
	var out [][2]string
	filtered, ok := r.waitDecision(ctx, t0, 30*time.Second, filteredOut("a"))
	if !ok {
		return append(out, [2]string{"a filtered out", "not within 30 s"})
	}
	out = append(out, [2]string{"a filtered out", seconds(filtered-t0) + " after the degradation"})
	r.event("", "pod a healed")
	if err := a.admin(ctx, "/admin/heal"); err != nil {
		return append(out, [2]string{"error", err.Error()})
	}
	r.event("", "pod a's sidecar stops")
	stop(a.collector)
	if err := a.startSidecar(ctx, r.o.collector, r.sidecar); err != nil {
		return append(out, [2]string{"error", err.Error()})
	}
	ready := r.event("", "pod a's sidecar started again (engine_health answers)")
	out = append(out, [2]string{"a's restarted sidecar serves", describeServed(r.firstServed("a", ready))})
	back, ok := r.waitDecision(ctx, ready, r.o.observeRestart, scored("a"))
	if !ok {
		return append(out, [2]string{"a re-admitted", fmt.Sprintf("no: still filtered out %s after the restart (%s after it was filtered); its sidecar serves %s",
			seconds(r.o.observeRestart), seconds(r.since()-filtered), describeServed(r.lastServed("a")))})
	}
	out = append(out, [2]string{"a re-admitted", seconds(back-ready) + " after its sidecar answered again"})
	sleep(ctx, 10*time.Second)
	return out
}

// killed: pod b's engine dies behind its proxy.
func (r *run) killed(ctx context.Context) [][2]string {
	b := r.pod("b")
	t0 := r.event("killed", "pod b's vllmsim killed (SIGKILL)")
	kill(b.sim)
	var out [][2]string
	if s, ok := r.waitServed(ctx, "b", t0, 30*time.Second, ejected(1)); ok {
		out = append(out, [2]string{"b's sidecar serves ejected 1", seconds(at(s.T)-t0) + " after the kill"})
	}
	if filtered, ok := r.waitDecision(ctx, t0, 30*time.Second, filteredOut("b")); ok {
		out = append(out, [2]string{"b filtered out", seconds(filtered-t0) + " after the kill"})
	} else {
		out = append(out, [2]string{"b filtered out", "not within 30 s"})
	}
	sleep(ctx, t0+25*time.Second-r.since())
	r.event("", "pod b's vllmsim started again")
	if err := b.startSim(r.o.vllmsim); err != nil {
		return append(out, [2]string{"error", err.Error()})
	}
	sleep(ctx, 5*time.Second)
	return out
}

// idle: the EPP sends no request for longer than engine_health keeps an
// engine it has no news of, while pod b takes requests sent to it directly
// (another route); then the EPP restarts (a rollout, a second replica) and
// the requests go through it again.
func (r *run) idle(ctx context.Context) [][2]string {
	r.setForward(false)
	t0 := r.event("idle", fmt.Sprintf("no request through the EPP for %s (it is asked every 5 s); pod b gets 2 requests/s directly", r.o.idle))
	directCtx, stopDirect := context.WithCancel(ctx)
	defer stopDirect()
	go r.direct(directCtx, r.pod("b"), 500*time.Millisecond)
	sleep(ctx, r.o.idle)
	var out [][2]string
	for _, name := range []string{"a", "b", "c"} {
		if r.pod(name) != nil {
			out = append(out, [2]string{name + "'s sidecar serves after " + seconds(r.since()-t0), describeServed(r.lastServed(name))})
		}
	}
	r.event("", "the EPP stops")
	r.mu.Lock()
	epp := r.epp
	r.mu.Unlock()
	stop(epp)
	if err := r.startEPP(ctx); err != nil {
		return append(out, [2]string{"error", err.Error()})
	}
	stopDirect()
	r.setForward(true)
	back := r.event("after-idle", "requests through the new EPP again")
	sleep(ctx, 20*time.Second)
	r.mu.Lock()
	picks := map[string]int{}
	for _, d := range r.decisions {
		if d.t >= back {
			picks[d.pick]++
		}
	}
	r.mu.Unlock()
	return append(out, [2]string{"picks of the new EPP in the 20 s after", fmt.Sprint(picks)})
}

// direct sends a request to p every interval, not through the EPP.
func (r *run) direct(ctx context.Context, p *pod, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r.inflight.Add(1)
			go func() {
				defer r.inflight.Done()
				o := r.envoy.send(ctx, p.addr(), r.body())
				r.mu.Lock()
				phase := r.phase
				r.mu.Unlock()
				r.requests.write(requestRecord{T: secs(r.since()), ID: fmt.Sprintf("d%05d", r.seq.Add(1)), Phase: phase,
					Direct: true, Pick: p.name, Outcome: &o})
			}()
		}
	}
}

// firstServed is the first scrape of pod's sidecar after since that
// answered, waiting up to 5 s for it.
func (r *run) firstServed(pod string, since time.Duration) servedRecord {
	s, ok := r.waitServed(context.Background(), pod, since, 5*time.Second, func(s servedRecord) bool { return s.Err == "" })
	if !ok {
		return servedRecord{Err: "none within 5 s"}
	}
	return s
}
