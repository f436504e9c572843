// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"context"
	_ "embed"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/selfmetrics"
)

// make demo-breaker: the load-balancer story. HAProxy balances two vllmsim
// replicas, A and B, each behind a token_stream proxy of one collector, and
// asks engine_health's agent-check about each. llmload streams through
// HAProxy the whole time. Partway through, B starts to freeze mid-decode
// (vllmsim's /admin/degrade); engine_health ejects it and HAProxy stops
// sending it requests. Later B is healed, and comes back once its ejection
// time is over. Every 250 ms the demo reads HAProxy's statistics and
// engine_health's verdict on B; the report puts, per second, the requests
// each replica got, the stalls the client saw and B's state side by side.
// The story runs three times: as it is, with the proxies' stall breaker on,
// and with proxy::migrate on too ("heal"), where a stream the breaker cuts
// is continued through HAProxy instead of ending in an error.

//go:embed breaker.yaml
var breakerCollectorConfig []byte

// haproxyConfig is the HAProxy configuration of the story, with {{name}}
// fields for the addresses and engine names (see haproxyConfigFor).
//
//go:embed haproxy.cfg
var haproxyConfig string

// haproxyConfigFor fills in the {{name}} fields of haproxyConfig.
func haproxyConfigFor(vars map[string]string) string {
	cfg := haproxyConfig
	for k, v := range vars {
		cfg = strings.ReplaceAll(cfg, "{{"+k+"}}", v)
	}
	return cfg
}

// BreakerStory is the timeline of the story, from the start of the load.
type BreakerStory struct {
	Degrade     time.Duration `json:"degrade_ns"` // B starts freezing
	Heal        time.Duration `json:"heal_ns"`    // B is healed
	Total       time.Duration `json:"total_ns"`   // the load stops
	Concurrency int           `json:"concurrency"`
	// B's degradation: every Every-th decoding step lasts Freeze longer.
	Freeze time.Duration `json:"freeze_ns"`
	Every  int           `json:"every"`
	// BaseTime is engine_health's eject::base_time.
	BaseTime time.Duration `json:"base_time_ns"`
	// StallMaxGap is the proxies' proxy::stall::max_gap (0: the breaker is
	// off); llmload re-sends a request the breaker cut up to
	// stallRetries times, through HAProxy.
	StallMaxGap time.Duration `json:"stall_max_gap_ns"`
	// Migrate turns the proxies' proxy::migrate on: a stream the breaker
	// cuts, or whose upstream breaks, is continued through HAProxy's
	// frontend (the Service in front of the replicas, which engine_health
	// steers away from B once it ejected it), up to migrateMaxMoves times.
	Migrate bool `json:"migrate"`
}

// migrateMaxMoves is proxy::migrate::max_moves in the heal run. Until
// engine_health has B out, HAProxy sends every other continuation to B,
// where it stalls again (and is moved again: B's own proxy cannot move a
// continuation, and cuts it, which the first proxy takes as the engine's
// error); each such move costs max_gap and more, so eight (the most) outlast
// the seconds B takes to be ejected, where the default (1) would leave half
// the streams cut before it with their error.
const migrateMaxMoves = 8

// stallRetries is llmload's -retry-stalled in the story: enough that a
// request cut on B twice before B is out still completes on A.
const stallRetries = 5

// DefaultBreakerStory is make demo-breaker's: 15 s healthy, B degraded
// until 35 s, the load until 65 s, so that B's re-admission (30 s after
// its ejection, engine_health's default) and the traffic it gets after it
// are in the run.
func DefaultBreakerStory() BreakerStory {
	return BreakerStory{
		Degrade: 15 * time.Second, Heal: 35 * time.Second, Total: 65 * time.Second, Concurrency: 8,
		Freeze: 1500 * time.Millisecond, Every: 8, BaseTime: 30 * time.Second,
	}
}

// clientStallGap is a gap the client counts as a stall: token_session's
// freeze (3 × 150 ms without a token).
const clientStallGap = 450 * time.Millisecond

// BreakerSecond is one second of the story.
type BreakerSecond struct {
	T int `json:"t_s"`
	// RequestsA and RequestsB are the requests HAProxy sent each replica.
	RequestsA int `json:"requests_a"`
	RequestsB int `json:"requests_b"`
	// ClientStalls are the gaps of 450 ms or more the client saw end.
	ClientStalls int `json:"client_stalls"`
	// BState is engine_health's verdict on B at the end of the second,
	// BHAProxy HAProxy's status of server b.
	BState   string `json:"b_state"`
	BHAProxy string `json:"b_haproxy"`
}

// BreakerPhase gathers the requests that started in one phase of the story.
type BreakerPhase struct {
	Name     string  `json:"name"`
	FromS    float64 `json:"from_s"`
	ToS      float64 `json:"to_s"`
	Requests int     `json:"requests"`
	// Stalled requests saw a gap of 450 ms or more.
	Stalled int `json:"stalled"`
	// Cut are the attempts the stall breaker cut (each sent again by
	// llmload when Retried); they count in Requests, and their gaps, the
	// wait up to the error event included, in the quantiles.
	Cut      int     `json:"cut"`
	Retried  int     `json:"retried"`
	GapP50Ms float64 `json:"gap_p50_ms"`
	GapP99Ms float64 `json:"gap_p99_ms"`
}

// BreakerReport is the result of the story (breaker.json).
type BreakerReport struct {
	Story     BreakerStory `json:"story"`
	StartedAt time.Time    `json:"started_at"`
	// Moments of the story, in seconds from the start of the load; -1 when
	// it did not happen.
	DegradedS   float64 `json:"degraded_s"`
	EjectedS    float64 `json:"ejected_s"`    // engine_health ejects B
	DownS       float64 `json:"down_s"`       // HAProxy marks b down
	HealedS     float64 `json:"healed_s"`     // B is healed
	ReadmittedS float64 `json:"readmitted_s"` // engine_health re-admits B
	UpS         float64 `json:"up_s"`         // HAProxy marks b up again
	EjectReason string  `json:"eject_reason"`

	Seconds []BreakerSecond `json:"seconds"`
	Phases  []BreakerPhase  `json:"phases"`
	Failed  int             `json:"failed_requests"`
	// Moves are the heal run's migrations (nil in the others).
	Moves *BreakerMoves `json:"moves,omitempty"`
	Plot  string        `json:"plot"`
}

// BreakerMoves are the migrations of a heal run: the collector's count by
// outcome (otelcol_receiver_token_stream_proxy_migrations, both proxies)
// and what they cost the client. With the breaker on, a gap of max_gap or
// more in an answer that completed is one the proxy cut and moved: the gap
// is the breaker's wait plus the continuation's way to its first token
// (through HAProxy, a prefill of the prompt and the text carried).
type BreakerMoves struct {
	Moved   int `json:"moved"`
	Refused int `json:"refused"`
	Failed  int `json:"failed"`
	// RefusedBy counts the refusals by reason, "trigger/reason".
	RefusedBy map[string]int `json:"refused_by,omitempty"`
	// Gaps are the client's gaps of max_gap or more in answers that
	// completed, in Answers answers; their quantiles and longest, ms.
	Gaps     int     `json:"gaps"`
	Answers  int     `json:"answers"`
	GapP50Ms float64 `json:"gap_p50_ms"`
	GapP99Ms float64 `json:"gap_p99_ms"`
	GapMaxMs float64 `json:"gap_max_ms"`
}

// breakerSample is what the demo read at one moment.
type breakerSample struct {
	at             time.Duration
	stotA, stotB   int
	haproxyB       string
	bState, reason string
}

// RunBreaker runs the story with its files in out and writes
// out/report.md, out/report.json and the plot.
func RunBreaker(ctx context.Context, bins Binaries, haproxy string, story BreakerStory, out string, progress Progress) (rep *BreakerReport, err error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	var started []*process.Process
	defer func() {
		for i := len(started) - 1; i >= 0; i-- {
			if stopErr := started[i].Stop(stopGrace); stopErr != nil && err == nil {
				err = stopErr
			}
		}
	}()
	addrs := map[string]string{}
	for _, name := range []string{"sim_a", "sim_b", "proxy_a", "proxy_b", "health", "agent", "frontend", "stats", "telemetry"} {
		if addrs[name], err = process.FreeAddr(); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"a", "b"} {
		sim, err := startProcess("vllmsim-"+r, filepath.Join(out, "vllmsim-"+r+".log"), bins.Sim,
			[]string{"-addr", addrs["sim_"+r], "-model", Model}, nil)
		if err != nil {
			return nil, err
		}
		started = append(started, sim)
		if err := sim.WaitHTTP(ctx, "http://"+addrs["sim_"+r]+"/health", 30*time.Second); err != nil {
			return nil, err
		}
	}

	cfgPath := filepath.Join(out, "collector.yaml")
	if err := os.WriteFile(cfgPath, breakerCollectorConfig, 0o644); err != nil {
		return nil, err
	}
	migrateEndpoint := ""
	if story.Migrate {
		migrateEndpoint = "http://" + addrs["frontend"]
	}
	telemetryHost, telemetryPort, _ := strings.Cut(addrs["telemetry"], ":")
	col, err := startProcess("otelcol-llm", filepath.Join(out, "otelcol.log"), bins.Collector, []string{"--config", cfgPath}, []string{
		"PROXY_A=" + addrs["proxy_a"], "PROXY_B=" + addrs["proxy_b"],
		"UPSTREAM_A=http://" + addrs["sim_a"], "UPSTREAM_B=http://" + addrs["sim_b"],
		"HEALTH_ENDPOINT=" + addrs["health"], "AGENT_ENDPOINT=" + addrs["agent"], "BASE_TIME=" + story.BaseTime.String(),
		"STALL_MAX_GAP=" + story.StallMaxGap.String(),
		"MIGRATE_ENDPOINT=" + migrateEndpoint, "MIGRATE_MAX_MOVES=" + strconv.Itoa(migrateMaxMoves),
		"TELEMETRY_HOST=" + telemetryHost, "TELEMETRY_PORT=" + telemetryPort,
	})
	if err != nil {
		return nil, err
	}
	started = append(started, col)
	if err := col.WaitHTTP(ctx, "http://"+addrs["health"]+"/engines", 60*time.Second); err != nil {
		return nil, err
	}

	// The engine of a proxy's sessions is its upstream's host:port.
	engineB := addrs["sim_b"]
	agentHost, agentPort, _ := strings.Cut(addrs["agent"], ":")
	haCfg := haproxyConfigFor(map[string]string{
		"frontend": addrs["frontend"], "stats": addrs["stats"], "proxy_a": addrs["proxy_a"], "proxy_b": addrs["proxy_b"],
		"agent_host": agentHost, "agent_port": agentPort, "engine_a": addrs["sim_a"], "engine_b": engineB,
	})
	haPath := filepath.Join(out, "haproxy.cfg")
	if err := os.WriteFile(haPath, []byte(haCfg), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, haproxy, "-c", "-f", haPath).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy -c: %w\n%s", err, out)
	}
	ha, err := startProcess("haproxy", filepath.Join(out, "haproxy.log"), haproxy, []string{"-db", "-f", haPath}, nil)
	if err != nil {
		return nil, err
	}
	started = append(started, ha)
	statsURL := "http://" + addrs["stats"] + "/stats"
	if err := ha.WaitHTTP(ctx, statsURL, 30*time.Second); err != nil {
		return nil, err
	}
	// Both servers up before the load starts.
	for deadline := time.Now().Add(30 * time.Second); ; {
		s, err := haproxyServers(statsURL, "engines")
		if err == nil && strings.HasPrefix(s["a"].Status, "UP") && strings.HasPrefix(s["b"].Status, "UP") {
			break
		}
		if time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("HAProxy did not see both servers up within 30s: %w", err)
			}
			return nil, fmt.Errorf("HAProxy did not see both servers up within 30s: %v", s)
		}
		time.Sleep(100 * time.Millisecond)
	}

	breakerNote := "the proxies' stall breaker off"
	if story.StallMaxGap > 0 {
		breakerNote = fmt.Sprintf("the proxies' stall breaker at %s, llmload retrying what it cuts up to %d times", story.StallMaxGap, stallRetries)
	}
	if story.Migrate {
		breakerNote += fmt.Sprintf(", proxy::migrate on through HAProxy (max_moves %d)", migrateMaxMoves)
	}
	progress("load: %d concurrent streams through HAProxy for %s; B freezes %s every %d steps from %s to %s; %s",
		story.Concurrency, story.Total, story.Freeze, story.Every, story.Degrade, story.Heal, breakerNote)
	requestsPath := filepath.Join(out, "requests.ndjson")
	load, err := startProcess("llmload", filepath.Join(out, "llmload.log"), bins.Load, []string{
		"-url", "http://" + addrs["frontend"], "-model", Model, "-quiet",
		"-concurrency", strconv.Itoa(story.Concurrency), "-duration", story.Total.String(),
		"-prompt-tokens", "uniform:50-200", "-output-tokens", "64", "-seed", "16",
		"-out", filepath.Join(out, "llmload.json"), "-requests-out", requestsPath, "-requests-itl",
		"-retry-stalled", strconv.Itoa(stallRetries),
	}, nil)
	if err != nil {
		return nil, err
	}
	started = append(started, load)
	start := time.Now()
	rep = &BreakerReport{
		Story: story, StartedAt: start.UTC(), DegradedS: -1, EjectedS: -1, DownS: -1, HealedS: -1,
		ReadmittedS: -1, UpS: -1,
	}

	samples, err := watchBreaker(ctx, load, start, story, func(at time.Duration, action string) error {
		simB := "http://" + addrs["sim_b"]
		switch action {
		case "degrade":
			progress("B degraded: it freezes %s every %d decoding steps", story.Freeze, story.Every)
			rep.DegradedS = at.Seconds()
			return postAdmin(simB + fmt.Sprintf("/admin/degrade?freeze=%s&every=%d", story.Freeze, story.Every))
		default:
			progress("B healed")
			rep.HealedS = at.Seconds()
			return postAdmin(simB + "/admin/heal")
		}
	}, statsURL, "http://"+addrs["health"]+"/engines/"+engineB+"/health")
	if err != nil {
		return nil, err
	}
	if err := load.Wait(ctx, stopGrace); err != nil {
		return nil, err
	}
	reqs, err := readRequests(requestsPath)
	if err != nil {
		return nil, err
	}
	rep.build(samples, reqs, start)
	if story.Migrate {
		rep.Moves = &BreakerMoves{}
		if err := rep.Moves.count(addrs["telemetry"]); err != nil {
			return nil, err
		}
		rep.Moves.gaps(reqs, story.StallMaxGap)
		progress("moves: %d moved, %d refused %v, %d failed; the client's gaps around them p50 %s ms, p99 %s ms",
			rep.Moves.Moved, rep.Moves.Refused, rep.Moves.RefusedBy, rep.Moves.Failed, f1(rep.Moves.GapP50Ms), f1(rep.Moves.GapP99Ms))
	}
	progress("B ejected at %s s (%s), HAProxy took it out at %s s, re-admitted at %s s, back at HAProxy at %s s",
		f1(rep.EjectedS), rep.EjectReason, f1(rep.DownS), f1(rep.ReadmittedS), f1(rep.UpS))
	rep.Plot = PlotBreaker
	if err := plotBreaker(filepath.Join(out, PlotBreaker), rep); err != nil {
		return rep, err
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return rep, err
	}
	if err := os.WriteFile(filepath.Join(out, "report.json"), append(data, '\n'), 0o644); err != nil {
		return rep, err
	}
	return rep, os.WriteFile(filepath.Join(out, "report.md"), []byte(rep.markdown()), 0o644)
}

// migrationsMetric is the proxies' migrations counter in the collector's
// own metrics.
const migrationsMetric = "otelcol_receiver_token_stream_proxy_migrations"

// count reads the collector's migrations counter, by outcome.
func (m *BreakerMoves) count(telemetry string) error {
	fams, err := selfmetrics.Families(telemetry)
	if err != nil {
		return fmt.Errorf("the collector's migrations counter: %w", err)
	}
	for _, series := range fams[migrationsMetric].GetMetric() {
		labels := map[string]string{}
		for _, l := range series.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		n := int(series.GetCounter().GetValue())
		switch labels["outcome"] {
		case "moved":
			m.Moved += n
		case "failed":
			m.Failed += n
		case "refused":
			m.Refused += n
			if m.RefusedBy == nil {
				m.RefusedBy = map[string]int{}
			}
			m.RefusedBy[labels["trigger"]+"/"+labels["reason"]] += n
		}
	}
	return nil
}

// gaps takes the client's gaps of maxGap or more in answers that
// completed.
func (m *BreakerMoves) gaps(reqs []requestRecord, maxGap time.Duration) {
	var all []float64
	for _, r := range reqs {
		if !r.OK {
			continue
		}
		n := len(all)
		for _, g := range r.ITLms {
			if g >= float64(maxGap)/float64(time.Millisecond) {
				all = append(all, g)
			}
		}
		if len(all) > n {
			m.Answers++
		}
	}
	m.Gaps = len(all)
	if len(all) > 0 {
		q := exactQuantiles(all)
		m.GapP50Ms, m.GapP99Ms, m.GapMaxMs = q.P50, q.P99, slices.Max(all)
	}
}

// watchBreaker samples HAProxy and engine_health every 250 ms until the load
// exits, and calls act at the story's degrade and heal moments.
func watchBreaker(ctx context.Context, load *process.Process, start time.Time, story BreakerStory,
	act func(at time.Duration, action string) error, statsURL, healthURL string,
) ([]breakerSample, error) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var samples []breakerSample
	degraded, healed := false, false
	for {
		at := time.Since(start)
		if !degraded && at >= story.Degrade {
			degraded = true
			if err := act(at, "degrade"); err != nil {
				return samples, err
			}
		}
		if !healed && at >= story.Heal {
			healed = true
			if err := act(at, "heal"); err != nil {
				return samples, err
			}
		}
		s := breakerSample{at: at}
		if servers, err := haproxyServers(statsURL, "engines"); err == nil {
			s.stotA, s.stotB, s.haproxyB = servers["a"].Sessions, servers["b"].Sessions, servers["b"].Status
		}
		s.bState, s.reason = engineState(healthURL)
		samples = append(samples, s)
		select {
		case <-ctx.Done():
			return samples, ctx.Err()
		case <-load.Exited():
			return samples, nil
		case <-tick.C:
		}
	}
}

// storyClient reads HAProxy and engine_health and drives vllmsim; without
// keep-alive, no idle connection outlives the story.
var storyClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func postAdmin(url string) error {
	resp, err := storyClient.Post(url, "text/plain", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s", url, resp.Status)
	}
	return nil
}

// engineState reads engine_health's verdict on one engine: its state and
// reason, "unknown" before it has seen the engine, "" when it did not
// answer.
func engineState(url string) (state, reason string) {
	resp, err := storyClient.Get(url)
	if err != nil {
		return "", ""
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return "unknown", ""
	}
	var st struct {
		State  string `json:"state"`
		Reason string `json:"reason"`
	}
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return "", ""
	}
	return st.State, st.Reason
}

// haproxyServer is a server's line of HAProxy's CSV statistics.
type haproxyServer struct {
	Status   string // UP, DOWN, …
	Sessions int    // stot: the requests sent to it so far
}

// haproxyServers reads the servers of backend from HAProxy's statistics page
// (its CSV form).
func haproxyServers(statsURL, backend string) (map[string]haproxyServer, error) {
	resp, err := storyClient.Get(statsURL + ";csv")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := csv.NewReader(resp.Body)
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("HAProxy statistics: %w", err)
	}
	if len(rows) == 0 {
		return nil, errors.New("HAProxy statistics: empty")
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[strings.TrimPrefix(name, "# ")] = i
	}
	out := map[string]haproxyServer{}
	for _, row := range rows[1:] {
		if len(row) <= max(col["stot"], col["status"]) || row[col["pxname"]] != backend || row[col["svname"]] == "BACKEND" {
			continue
		}
		n, _ := strconv.Atoi(row[col["stot"]])
		out[row[col["svname"]]] = haproxyServer{Status: row[col["status"]], Sessions: n}
	}
	return out, nil
}

// build fills the report from the samples and the client's requests.
func (rep *BreakerReport) build(samples []breakerSample, reqs []requestRecord, start time.Time) {
	var prev *breakerSample
	for i := range samples {
		s := &samples[i]
		t := s.at.Seconds()
		if s.bState == stateEjected && rep.EjectedS < 0 {
			rep.EjectedS, rep.EjectReason = t, s.reason
		}
		if strings.HasPrefix(s.haproxyB, "DOWN") && rep.DownS < 0 {
			rep.DownS = t
		}
		if prev != nil && prev.bState == stateEjected && s.bState == "healthy" && rep.ReadmittedS < 0 {
			rep.ReadmittedS = t
		}
		if rep.DownS >= 0 && strings.HasPrefix(s.haproxyB, "UP") && rep.UpS < 0 {
			rep.UpS = t
		}
		prev = s
	}

	// The client's gaps, each at the moment it ended.
	type gap struct{ endS, ms float64 }
	var gaps []gap
	for _, r := range reqs {
		if !r.OK && !r.Retried {
			rep.Failed++
		}
		if !r.OK && r.Error != errEngineStalled {
			continue
		}
		at := float64(r.StartUnixNano-start.UnixNano())/1e9 + r.TTFTms/1000
		for _, g := range r.ITLms {
			at += g / 1000
			gaps = append(gaps, gap{at, g})
		}
	}

	seconds := int(rep.Story.Total.Seconds())
	last := func(t float64) *breakerSample {
		var found *breakerSample
		for i := range samples {
			if samples[i].at.Seconds() <= t {
				found = &samples[i]
			}
		}
		return found
	}
	for sec := range seconds {
		row := BreakerSecond{T: sec}
		from, to := last(float64(sec)), last(float64(sec+1))
		if from != nil && to != nil {
			row.RequestsA, row.RequestsB = to.stotA-from.stotA, to.stotB-from.stotB
		}
		if to != nil {
			row.BState, row.BHAProxy = to.bState, to.haproxyB
		}
		for _, g := range gaps {
			if g.endS >= float64(sec) && g.endS < float64(sec+1) && g.ms >= float64(clientStallGap.Milliseconds()) {
				row.ClientStalls++
			}
		}
		rep.Seconds = append(rep.Seconds, row)
	}

	// Phases by when each request started.
	end := rep.Story.Total.Seconds()
	bound := func(v float64) float64 {
		if v < 0 {
			return end
		}
		return v
	}
	phases := []BreakerPhase{
		{Name: "before: both replicas healthy", FromS: 0, ToS: rep.DegradedS},
		{Name: "B freezing, still in rotation", FromS: rep.DegradedS, ToS: bound(rep.DownS)},
		{Name: "B ejected (healed at " + f1(rep.HealedS) + " s)", FromS: bound(rep.DownS), ToS: bound(rep.UpS)},
		{Name: "B re-admitted", FromS: bound(rep.UpS), ToS: end},
	}
	for i := range phases {
		ph := &phases[i]
		var all []float64
		for _, r := range reqs {
			t := float64(r.StartUnixNano-start.UnixNano()) / 1e9
			cut := !r.OK && r.Error == errEngineStalled
			if (!r.OK && !cut) || t < ph.FromS || t >= ph.ToS {
				continue
			}
			ph.Requests++
			if cut {
				ph.Cut++
				if r.Retried {
					ph.Retried++
				}
			}
			if len(r.ITLms) > 0 && slices.Max(r.ITLms) >= float64(clientStallGap.Milliseconds()) {
				ph.Stalled++
			}
			all = append(all, r.ITLms...)
		}
		if len(all) > 0 {
			q := exactQuantiles(all)
			ph.GapP50Ms, ph.GapP99Ms = q.P50, q.P99
		}
	}
	rep.Phases = phases
}

// stateEjected is engine_health's word for an ejected engine.
const stateEjected = "ejected"

// errEngineStalled is the error class llmload gives a stream the proxy's
// stall breaker cut.
const errEngineStalled = "engine_stalled"

// markdown is report.md.
func (rep *BreakerReport) markdown() string {
	var b strings.Builder
	s := rep.Story
	fmt.Fprintf(&b, "# make demo-breaker\n\nStarted %s. HAProxy balances two vllmsim replicas, A and B, each behind a "+
		"token_stream proxy; HAProxy asks engine_health's agent-check about each. llmload keeps %d streams going "+
		"through HAProxy for %s. At %s B starts to freeze for %s every %d decoding steps; at %s it is healed.\n\n",
		rep.StartedAt.Format(time.RFC3339), s.Concurrency, s.Total, s.Degrade, s.Freeze, s.Every, s.Heal)
	if s.StallMaxGap > 0 {
		fmt.Fprintf(&b, "The proxies' stall breaker is on (`proxy::stall::max_gap: %s`): a stream without a token for that "+
			"long is cut with an `engine_stalled` error event, and llmload sends the request again (up to %d times), "+
			"through HAProxy.\n\n", s.StallMaxGap, stallRetries)
	} else {
		b.WriteString("The proxies' stall breaker is off.\n\n")
	}
	if s.Migrate {
		fmt.Fprintf(&b, "`proxy::migrate` is on (`endpoint`: HAProxy's frontend, `max_moves: %d`): a stream the breaker "+
			"cuts is continued through HAProxy with what the client already received, and the client gets one answer "+
			"instead of the error event.\n\n", migrateMaxMoves)
	}
	fmt.Fprintf(&b, "| moment | s |\n|---|---|\n")
	for _, m := range []struct {
		name string
		v    float64
	}{
		{"B degraded", rep.DegradedS},
		{"engine_health ejects B (" + rep.EjectReason + ")", rep.EjectedS},
		{"HAProxy marks b DOWN", rep.DownS},
		{"B healed", rep.HealedS},
		{"engine_health re-admits B", rep.ReadmittedS},
		{"HAProxy marks b UP", rep.UpS},
	} {
		fmt.Fprintf(&b, "| %s | %s |\n", m.name, moment(m.v))
	}
	if rep.EjectedS >= 0 && rep.DegradedS >= 0 {
		fmt.Fprintf(&b, "\nTime to eject: **%.2f s** from B's degradation to engine_health's verdict", rep.EjectedS-rep.DegradedS)
		if rep.DownS >= 0 {
			fmt.Fprintf(&b, ", %.2f s to HAProxy taking B out", rep.DownS-rep.DegradedS)
		}
		b.WriteString(" (moments are read every 250 ms).\n")
	}
	fmt.Fprintf(&b, "\n## The client, by when each request started\n\nA request counts in the phase it started in: one "+
		"already on B when B began to freeze stalls whatever happens next, since ejection only steers new requests, "+
		"unless the stall breaker cuts it. A request the breaker cut and llmload sent again counts once per attempt; "+
		"the gaps of a cut attempt end with the wait for its error event.\n\n"+
		"| phase | from s | to s | requests | with a gap ≥ 450 ms | cut by the breaker (retried) | gap p50 ms | gap p99 ms |\n|---|---|---|---|---|---|---|---|\n")
	for _, ph := range rep.Phases {
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d (%d) | %s | %s |\n", ph.Name, moment(ph.FromS), moment(ph.ToS), ph.Requests, ph.Stalled,
			ph.Cut, ph.Retried, f1(ph.GapP50Ms), f1(ph.GapP99Ms))
	}
	fmt.Fprintf(&b, "\n%d requests failed.\n", rep.Failed)
	if m := rep.Moves; m != nil {
		fmt.Fprintf(&b, "\n## Moves\n\nThe collector moved %d streams (%d refused, %d failed: "+
			"`otelcol_receiver_token_stream_proxy_migrations`). The client saw %d gaps of %s or more in %d answers that "+
			"completed: each a move, the breaker's wait plus the continuation's way to its first token. Their p50 "+
			"**%s ms**, p99 **%s ms**, longest %s ms.\n", m.Moved, m.Refused, m.Failed, m.Gaps, s.StallMaxGap, m.Answers,
			f1(m.GapP50Ms), f1(m.GapP99Ms), f1(m.GapMaxMs))
	}
	fmt.Fprintf(&b, "\n![requests, stalls and B's state](%s)\n\n", rep.Plot)
	fmt.Fprintf(&b, "## Per second\n\n| t s | requests to A | requests to B | client stalls | B (engine_health) | b (HAProxy) |\n|---|---|---|---|---|---|\n")
	for _, r := range rep.Seconds {
		fmt.Fprintf(&b, "| %d | %d | %d | %d | %s | %s |\n", r.T, r.RequestsA, r.RequestsB, r.ClientStalls, r.BState, r.BHAProxy)
	}
	b.WriteString("\nFiles: `collector.yaml`, `haproxy.cfg`, the logs of every process, `requests.ndjson` (llmload's " +
		"line per request, with its gaps), `report.json` (every figure above).\n")
	return b.String()
}

func moment(v float64) string {
	if v < 0 {
		return "—"
	}
	return f1(v)
}

// PlotBreaker is the story's plot in the report folder.
const PlotBreaker = "breaker.png"

// plotBreaker draws the story on one time axis: the requests each replica
// got per second, the stalls the client saw per second, and B's state as
// engine_health and HAProxy saw it; dashed lines mark the degradation and
// the healing.
func plotBreaker(path string, rep *BreakerReport) error {
	var reqA, reqB, stalls, ejected, down plotter.XYs
	for _, r := range rep.Seconds {
		x := float64(r.T) + 0.5
		reqA = append(reqA, plotter.XY{X: x, Y: float64(r.RequestsA)})
		reqB = append(reqB, plotter.XY{X: x, Y: float64(r.RequestsB)})
		stalls = append(stalls, plotter.XY{X: x, Y: float64(r.ClientStalls)})
		e, d := 0.0, 0.0
		if r.BState == stateEjected {
			e = 1
		}
		if strings.HasPrefix(r.BHAProxy, "DOWN") {
			d = 1
		}
		// Steps: the state holds for the whole second.
		ejected = append(ejected, plotter.XY{X: float64(r.T), Y: e}, plotter.XY{X: float64(r.T + 1), Y: e})
		down = append(down, plotter.XY{X: float64(r.T), Y: d}, plotter.XY{X: float64(r.T + 1), Y: d})
	}
	end := rep.Story.Total.Seconds()
	panel := func(title, ylabel string) *plot.Plot {
		p := newPlot()
		p.Title.Text = title
		p.Y.Label.Text = ylabel
		p.X.Min, p.X.Max = 0, end
		p.Legend.Top = true
		return p
	}
	marks := func(p *plot.Plot, ymax float64) error {
		for _, at := range []float64{rep.DegradedS, rep.HealedS} {
			if at < 0 {
				continue
			}
			l, err := newLine(plotter.XYs{{X: at, Y: 0}, {X: at, Y: ymax}}, color.Gray{Y: 0x80}, true)
			if err != nil {
				return err
			}
			p.Add(l)
		}
		return nil
	}
	maxOf := func(xys ...plotter.XYs) float64 {
		m := 1.0
		for _, s := range xys {
			for _, xy := range s {
				m = max(m, xy.Y)
			}
		}
		return m * 1.15
	}

	routed := panel("Requests HAProxy sent each replica (per second); dashed: B degraded, B healed", "requests/s")
	routed.Y.Min, routed.Y.Max = 0, maxOf(reqA, reqB)
	if err := addLines(routed, namedLine{"A", reqA, colorA, false}, namedLine{"B", reqB, colorB, true}); err != nil {
		return err
	}
	if err := marks(routed, routed.Y.Max); err != nil {
		return err
	}

	stalled := panel("Stalls the client saw (gaps of 450 ms or more, per second)", "stalls/s")
	stalled.Y.Min, stalled.Y.Max = 0, maxOf(stalls)
	l, err := newLine(stalls, colorExtra, false)
	if err != nil {
		return err
	}
	stalled.Add(l)
	if err := marks(stalled, stalled.Y.Max); err != nil {
		return err
	}

	state := panel("B's state: 1 = ejected (engine_health), down (HAProxy)", "out")
	state.X.Label.Text = "seconds since the load started"
	state.Y.Min, state.Y.Max = -0.1, 1.3
	if err := addLines(state, namedLine{"engine_health: ejected", ejected, colorB, false},
		namedLine{"HAProxy: b DOWN", down, colorC, true}); err != nil {
		return err
	}
	if err := marks(state, 1.3); err != nil {
		return err
	}
	return saveTiles(path, [][]*plot.Plot{{routed}, {stalled}, {state}}, 10*vg.Inch, 9*vg.Inch)
}

// namedLine is a line of a panel with its legend entry.
type namedLine struct {
	name string
	xys  plotter.XYs
	c    color.Color
	dash bool
}

// addLines draws lines on p, each with its legend entry.
func addLines(p *plot.Plot, lines ...namedLine) error {
	for _, nl := range lines {
		l, err := newLine(nl.xys, nl.c, nl.dash)
		if err != nil {
			return err
		}
		p.Add(l)
		p.Legend.Add(nl.name, l)
	}
	return nil
}

// BreakerRun is one run of the story for the comparison: its name, its
// report and its report.md relative to comparison.md.
type BreakerRun struct {
	Name   string
	Report *BreakerReport
	Path   string
}

// BreakerComparison is comparison.md: the client's phases of the story's
// runs (the stall breaker off, on, and with proxy::migrate), side by side.
func BreakerComparison(runs ...BreakerRun) string {
	var b strings.Builder
	b.WriteString("# make demo-breaker: the stall breaker off, on, and healing\n\nThe same story ")
	for i, r := range runs {
		sep := ", "
		switch {
		case i == 0:
			sep = ""
		case i == len(runs)-1:
			sep = " and "
		}
		fmt.Fprintf(&b, "%s[%s](%s) (%s; started %s)", sep, r.Name, r.Path, r.Report.setting(), r.Report.StartedAt.Format(time.RFC3339))
	}
	b.WriteString(". Requests by the phase they started in; a cut attempt counts as a request, and its gaps end with the " +
		"wait for its error event.\n\n")
	b.WriteString("| phase | run | from s | to s | requests | with a gap ≥ 450 ms | cut (retried) | gap p50 ms | gap p99 ms |\n" +
		"|---|---|---|---|---|---|---|---|---|\n")
	phases := len(runs[0].Report.Phases)
	for _, r := range runs {
		phases = min(phases, len(r.Report.Phases))
	}
	for i := range phases {
		for _, r := range runs {
			ph := r.Report.Phases[i]
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %d | %d (%d) | %s | %s |\n", ph.Name, r.Name, moment(ph.FromS),
				moment(ph.ToS), ph.Requests, ph.Stalled, ph.Cut, ph.Retried, f1(ph.GapP50Ms), f1(ph.GapP99Ms))
		}
	}
	b.WriteString("\n| run | time to eject B s | requests cut (error event) | requests failed | streams moved | client's gap at a move p50 / p99 / max ms |\n" +
		"|---|---|---|---|---|---|\n")
	for _, r := range runs {
		cut := 0
		for _, ph := range r.Report.Phases {
			cut += ph.Cut
		}
		moved, gaps := "—", "—"
		if m := r.Report.Moves; m != nil {
			moved = strconv.Itoa(m.Moved)
			gaps = f1(m.GapP50Ms) + " / " + f1(m.GapP99Ms) + " / " + f1(m.GapMaxMs)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %s | %s |\n", r.Name, since(r.Report.EjectedS, r.Report.DegradedS), cut,
			r.Report.Failed, moved, gaps)
	}
	return b.String()
}

// setting says how the proxies ran in the story.
func (rep *BreakerReport) setting() string {
	switch {
	case rep.Story.Migrate:
		return fmt.Sprintf("`proxy::stall::max_gap: %s`, `proxy::migrate` through HAProxy, `max_moves: %d`", rep.Story.StallMaxGap, migrateMaxMoves)
	case rep.Story.StallMaxGap > 0:
		return fmt.Sprintf("`proxy::stall::max_gap: %s`, llmload retrying a cut request up to %d times", rep.Story.StallMaxGap, stallRetries)
	}
	return "the stall breaker off"
}

// since is to − from in seconds, or a dash when either did not happen.
func since(to, from float64) string {
	if to < 0 || from < 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", to-from)
}
