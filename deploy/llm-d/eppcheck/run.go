// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// run is one run of the scenarios: the pods, the EPP, the load through it
// and what was recorded.
type run struct {
	o         options
	sidecar   string // the sidecar config each pod runs
	t0        time.Time
	pods      map[string]*pod
	endpoints string // the file-discovery file
	epp       *exec.Cmd
	envoy     *envoy

	mu        sync.Mutex
	phase     string
	forward   bool // requests are sent to their endpoint; false: the EPP is only asked
	decisions []decisionPoint
	served    []servedRecord
	results   []scenarioResult

	requests, servedLog, events *jsonl
	seq                         atomic.Int64
	inflight                    sync.WaitGroup
	stopLoad                    func()
}

// decisionPoint is what the waits read of a decision: when, and which pods
// the filter kept (the profile scored them).
type decisionPoint struct {
	t      time.Duration
	scored map[string]float64
	pick   string
}

// requestRecord is one line of requests.jsonl.
type requestRecord struct {
	T       float64            `json:"t"`
	ID      string             `json:"id"`
	Phase   string             `json:"phase"`
	Probe   bool               `json:"probe,omitempty"`
	Direct  bool               `json:"direct,omitempty"` // sent to the pod, not through the EPP
	Pick    string             `json:"pick,omitempty"`
	Scores  map[string]float64 `json:"scores,omitempty"`
	Refused int                `json:"refused,omitempty"`
	Err     string             `json:"err,omitempty"`
	Outcome *outcome           `json:"outcome,omitempty"`
}

// servedRecord is one scrape of a sidecar's /metrics by the driver: what
// the EPP's engine-health-source reads there.
type servedRecord struct {
	T      float64            `json:"t"`
	Pod    string             `json:"pod"`
	Err    string             `json:"err,omitempty"`
	Gauges map[string]float64 `json:"gauges,omitempty"`
}

// scenarioResult is a scenario's figures, in the order measured.
type scenarioResult struct {
	Name    string      `json:"name"`
	From    float64     `json:"from"`
	To      float64     `json:"to"`
	Figures [][2]string `json:"figures"`
}

// jsonl writes one JSON value a line.
type jsonl struct {
	mu sync.Mutex
	f  *os.File
}

func newJSONL(path string) (*jsonl, error) {
	f, err := os.Create(path)
	return &jsonl{f: f}, err
}

func (j *jsonl) write(v any) {
	b, _ := json.Marshal(v)
	j.mu.Lock()
	defer j.mu.Unlock()
	_, _ = j.f.Write(append(b, '\n'))
}

func newRun(o options, sidecar string) (*run, error) {
	r := &run{o: o, sidecar: sidecar, pods: map[string]*pod{}, forward: true, stopLoad: func() {}}
	var err error
	for _, f := range []struct {
		dst  **jsonl
		name string
	}{{&r.requests, "requests.jsonl"}, {&r.servedLog, "served.jsonl"}, {&r.events, "events.jsonl"}} {
		if *f.dst, err = newJSONL(filepath.Join(o.out, f.name)); err != nil {
			return nil, err
		}
	}
	r.endpoints, err = filepath.Abs(filepath.Join(o.out, "endpoints.yaml"))
	return r, err
}

func (r *run) since() time.Duration { return time.Since(r.t0) }

func secs(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

// event records what the driver did, and starts a phase when phase is set.
func (r *run) event(phase, what string) time.Duration {
	t := r.since()
	r.mu.Lock()
	if phase != "" {
		r.phase = phase
	}
	phase = r.phase
	r.mu.Unlock()
	r.events.write(map[string]any{"t": secs(t), "phase": phase, "event": what})
	fmt.Printf("%7.2fs  %-8s %s\n", secs(t), phase, what)
	return t
}

// addPod makes a pod and starts its engine and sidecar.
func (r *run) addPod(ctx context.Context, name string) (*pod, error) {
	p, err := newPod(r.o.out, name, len(r.pods)+1)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.pods[name] = p
	r.mu.Unlock()
	if err := p.startSim(r.o.vllmsim); err != nil {
		return nil, err
	}
	if err := p.startSidecar(ctx, r.o.collector, r.sidecar); err != nil {
		return nil, err
	}
	return p, waitHTTP(ctx, "http://"+p.addr()+"/health", 30*time.Second)
}

// list writes the endpoints file: the EPP's discovery reads it again when it
// is replaced.
func (r *run) list(pods ...*pod) error {
	var b strings.Builder
	b.WriteString("endpoints:\n")
	now := r.since()
	r.mu.Lock()
	for _, p := range pods {
		if p.listed == 0 {
			p.listed = now
		}
	}
	r.mu.Unlock()
	for _, p := range pods {
		fmt.Fprintf(&b, "  - name: pod-%s\n    namespace: eppcheck\n    address: %q\n    port: \"8001\"\n", p.name, p.ip)
	}
	tmp := r.endpoints + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, r.endpoints)
}

// start starts pods a and b, the EPP over them, and the load.
func (r *run) start(ctx context.Context) error {
	r.t0 = time.Now()
	r.event("setup", "pods a and b: vllmsim and the sidecar")
	var listed []*pod
	for _, name := range []string{"a", "b"} {
		p, err := r.addPod(ctx, name)
		if err != nil {
			return fmt.Errorf("pod %s: %w", name, err)
		}
		listed = append(listed, p)
	}
	if err := r.list(listed...); err != nil {
		return err
	}
	if err := r.startEPP(ctx); err != nil {
		return err
	}
	loadCtx, cancel := context.WithCancel(ctx)
	r.stopLoad = sync.OnceFunc(func() {
		cancel()
		r.inflight.Wait()
	})
	go r.load(loadCtx)
	go r.monitor(loadCtx)
	return nil
}

// startEPP starts the EPP (again) and waits until it picks endpoints.
func (r *run) startEPP(ctx context.Context) error {
	cfg, err := writeEPPConfig(r.o, r.endpoints)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logFile, err := os.OpenFile(filepath.Join(r.o.out, "epp.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close() // the EPP has its own descriptor
	epp := exec.Command(exe, "epp",
		"--config-file", cfg, "--pool-name", "eppcheck", "--pool-namespace", "eppcheck",
		"--grpc-port", "9002", "--grpc-health-port", "9003", "--metrics-port", "9090",
		"--secure-serving=false", "--tracing=false",
		// The filter and the scorer are Alpha: the EPP refuses the config
		// without this.
		"--allow-experimental-plugins",
		"--emit-endpoint-scores", fmt.Sprintf("--v=%d", r.o.eppVerbosity))
	epp.Stdout, epp.Stderr = logFile, logFile
	epp.SysProcAttr = diesWithDriver()
	r.event("", "the EPP starts: "+strings.Join(epp.Args[1:], " "))
	if err := epp.Start(); err != nil {
		return err
	}
	r.mu.Lock()
	r.epp = epp
	r.mu.Unlock()
	if r.envoy == nil {
		if r.envoy, err = newEnvoy("127.0.0.1:9002"); err != nil {
			return err
		}
	}
	return r.waitEPP(ctx)
}

// waitEPP asks the EPP until it picks an endpoint.
func (r *run) waitEPP(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		d, err := r.envoy.decide(ctx, "ready", r.body())
		if err == nil && d.Dest != "" {
			r.event("", "the EPP picks endpoints")
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("the EPP picked no endpoint in 60 s: see %s", filepath.Join(r.o.out, "epp.log"))
}

func (r *run) body() []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      "meta-llama/Llama-3.1-8B-Instruct",
		"messages":   []map[string]string{{"role": "user", "content": "Tell me about the weather on the coast."}},
		"max_tokens": r.o.maxTokens,
		"stream":     true,
	})
	return b
}

// load asks the EPP rate times a second and sends each request where it
// says; while forwarding is off it asks every 5 s and sends nothing.
func (r *run) load(ctx context.Context) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / r.o.rate))
	defer tick.Stop()
	var lastProbe time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			r.mu.Lock()
			forward := r.forward
			r.mu.Unlock()
			if !forward && now.Sub(lastProbe) < 5*time.Second {
				continue
			}
			lastProbe = now
			r.inflight.Add(1)
			go func() {
				defer r.inflight.Done()
				r.request(ctx, forward)
			}()
		}
	}
}

// podOf is the pod an endpoint address belongs to.
func (r *run) podOf(addr string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, p := range r.pods {
		if p.addr() == addr {
			return name
		}
	}
	return addr
}

func (r *run) request(ctx context.Context, forward bool) {
	id := fmt.Sprintf("r%05d", r.seq.Add(1))
	body := r.body()
	d, err := r.envoy.decide(ctx, id, body)
	t := r.since()
	r.mu.Lock()
	phase := r.phase
	r.mu.Unlock()
	rec := requestRecord{T: secs(t), ID: id, Phase: phase, Probe: !forward, Refused: d.Refused}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		rec.Err = err.Error()
	}
	if d.Dest != "" {
		rec.Pick = r.podOf(d.Dest)
	}
	if d.Scores != nil {
		rec.Scores = make(map[string]float64, len(d.Scores))
		for addr, s := range d.Scores {
			rec.Scores[r.podOf(addr)] = s
		}
	}
	if err == nil {
		r.mu.Lock()
		r.decisions = append(r.decisions, decisionPoint{t: t, scored: rec.Scores, pick: rec.Pick})
		r.mu.Unlock()
	}
	if forward && d.Dest != "" {
		o := r.envoy.send(ctx, d.Dest, body)
		rec.Outcome = &o
	}
	r.requests.write(rec)
}

// monitor scrapes each sidecar's /metrics every 250 ms, as the EPP's
// engine-health-source does every second.
func (r *run) monitor(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r.mu.Lock()
		pods := make([]*pod, 0, len(r.pods))
		for _, p := range r.pods {
			pods = append(pods, p)
		}
		r.mu.Unlock()
		for _, p := range pods {
			rec := servedRecord{Pod: p.name}
			rec.Gauges, rec.Err = scrapeGauges(ctx, client, "http://"+p.ip+":13140/metrics")
			rec.T = secs(r.since())
			r.mu.Lock()
			r.served = append(r.served, rec)
			r.mu.Unlock()
			r.servedLog.write(rec)
		}
	}
}

// scrapeGauges reads engine_health's gauges of engine localhost:8000, by
// short name (ejected, stall_ratio, ...); a series absent is a key absent.
func scrapeGauges(ctx context.Context, client *http.Client, url string) (map[string]float64, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, resp.Status
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err.Error()
	}
	gauges := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "engine" && l.GetValue() == "localhost:8000" {
					gauges[strings.TrimPrefix(name, "llm_engine_health_")] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return gauges, ""
}

// waitDecision waits up to limit for a decision after since that pred
// holds for.
func (r *run) waitDecision(ctx context.Context, since, limit time.Duration, pred func(decisionPoint) bool) (time.Duration, bool) {
	return waitFor(ctx, limit, func() (time.Duration, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, d := range r.decisions {
			if d.t >= since && pred(d) {
				return d.t, true
			}
		}
		return 0, false
	})
}

// waitServed waits up to limit for a scrape of pod's sidecar after since
// that pred holds for.
func (r *run) waitServed(ctx context.Context, pod string, since, limit time.Duration, pred func(servedRecord) bool) (servedRecord, bool) {
	var found servedRecord
	_, ok := waitFor(ctx, limit, func() (time.Duration, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, s := range r.served {
			if s.Pod == pod && s.T >= secs(since) && pred(s) {
				found = s
				return 0, true
			}
		}
		return 0, false
	})
	return found, ok
}

// at is a record's time.
func at(t float64) time.Duration { return time.Duration(t * float64(time.Second)) }

func waitFor(ctx context.Context, limit time.Duration, check func() (time.Duration, bool)) (time.Duration, bool) {
	deadline := time.Now().Add(limit)
	for {
		if t, ok := check(); ok {
			return t, true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func scored(pod string) func(decisionPoint) bool {
	return func(d decisionPoint) bool { _, ok := d.scored[pod]; return ok }
}

func filteredOut(pod string) func(decisionPoint) bool {
	return func(d decisionPoint) bool { _, ok := d.scored[pod]; return !ok && len(d.scored) > 0 }
}

func ejected(v float64) func(servedRecord) bool {
	return func(s servedRecord) bool { e, ok := s.Gauges["ejected"]; return ok && e == v }
}

func (r *run) setForward(on bool) {
	r.mu.Lock()
	r.forward = on
	r.mu.Unlock()
}

func (r *run) close() {
	r.stopLoad()
	r.mu.Lock()
	pods := r.pods
	r.mu.Unlock()
	for _, p := range pods {
		stop(p.collector)
		stop(p.sim)
		kill(p.holder)
	}
	if r.epp != nil {
		stop(r.epp)
	}
}

// lastServed is the last scrape of pod's sidecar.
func (r *run) lastServed(pod string) servedRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.served) - 1; i >= 0; i-- {
		if r.served[i].Pod == pod {
			return r.served[i]
		}
	}
	return servedRecord{}
}

func describeServed(s servedRecord) string {
	if s.Err != "" {
		return "no answer (" + s.Err + ")"
	}
	if len(s.Gauges) == 0 {
		return "200, no series of the engine"
	}
	var b bytes.Buffer
	for _, k := range []string{"ejected", "stall_ratio", "window_sessions"} {
		if v, ok := s.Gauges[k]; ok {
			fmt.Fprintf(&b, "%s %g, ", k, v)
		}
	}
	return strings.TrimSuffix(b.String(), ", ")
}
