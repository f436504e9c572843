// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// eppLine is what the report reads of one line of the EPP's log.
type eppLine struct {
	t   time.Duration // since the run's start
	msg string
	raw map[string]any
}

// podInLine finds the pod an EPP log field names (an endpoint's
// namespaced name, however it is encoded).
var podInLine = regexp.MustCompile(`pod-([a-z])\b`)

func podOfField(v any) string {
	b, _ := json.Marshal(v)
	if m := podInLine.FindSubmatch(b); m != nil {
		return string(m[1])
	}
	return ""
}

// readEPPLog reads the lines of the EPP's log the report uses.
func (r *run) readEPPLog(keep func(msg string) bool, each func(eppLine)) error {
	f, err := os.Open(filepath.Join(r.o.out, "epp.log"))
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var m map[string]any
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		msg, _ := m["msg"].(string)
		if !keep(msg) {
			continue
		}
		ts, _ := m["ts"].(float64)
		sec, frac := int64(ts), ts-float64(int64(ts))
		wall := time.Unix(sec, int64(frac*1e9))
		each(eppLine{t: wall.Sub(r.t0), msg: msg, raw: m})
	}
	return sc.Err()
}

// pluginScores are each request's scores by scorer and pod, from the EPP's
// log at --v=4 ("Calculated score").
func (r *run) pluginScores() map[string]map[string]map[string]float64 {
	out := map[string]map[string]map[string]float64{}
	_ = r.readEPPLog(func(msg string) bool { return msg == "Calculated score" }, func(l eppLine) {
		id, _ := l.raw["x-request-id"].(string)
		plugin := podlessName(l.raw["plugin"])
		pod := podOfField(l.raw["endpoint"])
		score, ok := l.raw["score"].(float64)
		if id == "" || pod == "" || !ok {
			return
		}
		if out[id] == nil {
			out[id] = map[string]map[string]float64{}
		}
		if out[id][plugin] == nil {
			out[id][plugin] = map[string]float64{}
		}
		out[id][plugin][pod] = score
	})
	return out
}

// podlessName is a plugin's name as the EPP logs its typed name.
func podlessName(v any) string {
	switch p := v.(type) {
	case string:
		name, _, _ := strings.Cut(p, "/")
		return name
	case map[string]any:
		for _, k := range []string{"Name", "name"} {
			if s, ok := p[k].(string); ok {
				return s
			}
		}
	}
	return fmt.Sprint(v)
}

// refresh is one "Refreshed metrics" line of the EPP's log at --v=5: an
// extractor updated an endpoint's metrics, and stamped their update time.
type refresh struct {
	t          time.Duration
	pod        string
	engineOnly bool // the engine-health extractor (custom metrics only)
	queue      int
	kv         float64
	updateTime time.Duration // since the run's start
}

var (
	queueRE  = regexp.MustCompile(`WaitingQueueSize:(-?\d+)`)
	kvRE     = regexp.MustCompile(`KVCacheUsagePercent:([-+.\deE]+)`)
	updateRE = regexp.MustCompile(`UpdateTime:(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [-+]\d{4})`)
)

func (r *run) refreshes() []refresh {
	var out []refresh
	_ = r.readEPPLog(func(msg string) bool { return msg == "Refreshed metrics" }, func(l eppLine) {
		updated := fmt.Sprint(l.raw["updated"])
		names, _ := json.Marshal(l.raw["metrics"])
		rf := refresh{t: l.t, pod: podOfField(l.raw["endpoint"]), engineOnly: !strings.Contains(string(names), "vllm:")}
		if m := queueRE.FindStringSubmatch(updated); m != nil {
			rf.queue, _ = strconv.Atoi(m[1])
		}
		if m := kvRE.FindStringSubmatch(updated); m != nil {
			rf.kv, _ = strconv.ParseFloat(m[1], 64)
		}
		if m := updateRE.FindStringSubmatch(updated); m != nil {
			if ut, err := time.Parse("2006-01-02 15:04:05.999999999 -0700", m[1]); err == nil {
				rf.updateTime = ut.Sub(r.t0)
			}
		}
		if rf.pod != "" {
			out = append(out, rf)
		}
	})
	return out
}

// routerVersion is the router module this binary was built with.
func routerVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, m := range bi.Deps {
		if m.Path == "github.com/llm-d/llm-d-router" {
			v := m.Version
			if m.Replace != nil {
				v += " (replaced by " + m.Replace.Path + ")"
			}
			return v
		}
	}
	return "unknown"
}

// report writes report.md and results.json.
func (r *run) report() error {
	var b strings.Builder
	mode := "the shipped sidecar config (engine_health names its engine: engines: [localhost:8000])"
	if r.o.withoutEngines {
		mode = "the shipped sidecar config without engines: (the behavior before issue 40)"
	}
	fmt.Fprintf(&b, "# eppcheck: the llm-d router's EPP on deploy/llm-d\n\n")
	fmt.Fprintf(&b, "- router: github.com/llm-d/llm-d-router %s, cmd/epp's runner, file discovery\n", routerVersion())
	fmt.Fprintf(&b, "- sidecar: %s\n", mode)
	fmt.Fprintf(&b, "- load: %g requests/s through the EPP, max_tokens %d; run of %s\n\n", r.o.rate, r.o.maxTokens, seconds(r.since()))

	r.mu.Lock()
	results := slices.Clone(r.results)
	r.mu.Unlock()
	for _, res := range results {
		fmt.Fprintf(&b, "## %s (%.1f–%.1f s)\n\n| | |\n|---|---|\n", res.Name, res.From, res.To)
		for _, f := range res.Figures {
			fmt.Fprintf(&b, "| %s | %s |\n", f[0], f[1])
		}
		b.WriteString("\n")
	}
	r.phaseTable(&b)
	r.staleness(&b)
	if err := os.WriteFile(filepath.Join(r.o.out, "report.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	raw, _ := json.MarshalIndent(results, "", "  ")
	fmt.Println(b.String())
	return os.WriteFile(filepath.Join(r.o.out, "results.json"), raw, 0o644)
}

// phaseTable is, per phase and pod: how often the filter kept it, its picks,
// its weighted score and its stall-ratio score, and what its sidecar served.
func (r *run) phaseTable(b *strings.Builder) {
	f, err := os.Open(filepath.Join(r.o.out, "requests.jsonl"))
	if err != nil {
		return
	}
	defer f.Close()
	perPlugin := r.pluginScores()
	type cell struct {
		decisions, kept, picks, ok, failed int
		score, stall                       []float64
	}
	cells := map[string]map[string]*cell{}
	var phases []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec requestRecord
		if json.Unmarshal(sc.Bytes(), &rec) != nil || rec.Err != "" || rec.Direct {
			continue
		}
		if cells[rec.Phase] == nil {
			cells[rec.Phase] = map[string]*cell{}
			phases = append(phases, rec.Phase)
		}
		for name, p := range r.pods {
			if at(rec.T) < p.listed {
				continue
			}
			c := cells[rec.Phase][name]
			if c == nil {
				c = &cell{}
				cells[rec.Phase][name] = c
			}
			c.decisions++
			if s, ok := rec.Scores[name]; ok {
				c.kept++
				c.score = append(c.score, s)
			}
			if s, ok := perPlugin[rec.ID]["stall-ratio"][name]; ok {
				c.stall = append(c.stall, s)
			}
			if rec.Pick == name {
				c.picks++
				if rec.Outcome != nil && rec.Outcome.Status == 200 && rec.Outcome.Err == "" {
					c.ok++
				} else if rec.Outcome != nil {
					c.failed++
				}
			}
		}
	}
	b.WriteString("## Per phase and pod\n\n")
	b.WriteString("Kept: the share of the EPP's decisions whose scores include the pod (drop-ejected kept it). " +
		"Score: the weighted sum of the profile's scorers (stall-ratio ×2, queue, KV cache). " +
		"Stall-ratio: that scorer's own score, from the EPP's log.\n\n")
	b.WriteString("| phase | pod | decisions | kept | picks (sent: ok/failed) | score mean [min, max] | stall-ratio mean [min, max] |\n|---|---|---|---|---|---|---|\n")
	names := make([]string, 0, len(r.pods))
	for name := range r.pods {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, phase := range phases {
		for _, name := range names {
			c := cells[phase][name]
			if c == nil || c.decisions == 0 {
				continue
			}
			fmt.Fprintf(b, "| %s | %s | %d | %.0f%% | %d (%d/%d) | %s | %s |\n", phase, name, c.decisions,
				100*float64(c.kept)/float64(c.decisions), c.picks, c.ok, c.failed, spread(c.score), spread(c.stall))
		}
	}
	b.WriteString("\n")
}

func spread(v []float64) string {
	if len(v) == 0 {
		return "–"
	}
	lo, hi, sum := v[0], v[0], 0.0
	for _, x := range v {
		lo, hi, sum = min(lo, x), max(hi, x), sum+x
	}
	return fmt.Sprintf("%.2f [%.2f, %.2f]", sum/float64(len(v)), lo, hi)
}

// staleness: while pod b's engine is dead, how fresh the EPP holds b's
// queue and KV figures to be (now − their update time), against how old
// they are (now − the last scrape of vLLM's metrics that updated them); the
// saturation detector counts an endpoint whose figures are older than 200 ms
// as saturated (its utilization detector's metricsStalenessThreshold).
func (r *run) staleness(b *strings.Builder) {
	kill, restart, ok := r.killWindow()
	if !ok {
		return
	}
	refreshes := r.refreshes()
	if len(refreshes) == 0 {
		b.WriteString("## Staleness\n\nNo \"Refreshed metrics\" lines in the EPP's log (run with -epp-v 5).\n\n")
		return
	}
	const fresh = 200 * time.Millisecond
	var lastEngine time.Duration
	var stamps []time.Duration
	vllmAfter := 0
	for _, rf := range refreshes {
		switch {
		case rf.pod != "b" || rf.t > restart:
		case rf.t < kill:
			if !rf.engineOnly {
				lastEngine = rf.t
			}
		case rf.engineOnly:
			stamps = append(stamps, rf.t)
		default:
			vllmAfter++
		}
	}
	var freshTime, maxGap time.Duration
	prev := kill
	for i, s := range stamps {
		maxGap = max(maxGap, s-prev)
		next := restart
		if i+1 < len(stamps) {
			next = stamps[i+1]
		}
		freshTime += min(fresh, next-s)
		prev = s
	}
	fmt.Fprintf(b, "## b's engine metrics while its engine was dead (%.1f–%.1f s)\n\n", secs(kill), secs(restart))
	fmt.Fprintf(b, "- the last refresh from vLLM's metrics (through the proxy): %.2f s; none after the kill: %d\n", secs(lastEngine), vllmAfter)
	fmt.Fprintf(b, "- refreshes from engine_health's gauges, each stamping all of b's metrics as updated now: %d, at most %d ms apart\n",
		len(stamps), maxGap.Milliseconds())
	fmt.Fprintf(b, "- the queue and KV figures were %s old when the engine came back, yet looked fresher than %d ms for %s of the %s (%.0f%%)\n\n",
		seconds(restart-lastEngine), fresh.Milliseconds(), seconds(freshTime), seconds(restart-kill), 100*secs(freshTime)/secs(restart-kill))
}

// killWindow is when pod b's engine was killed and started again.
func (r *run) killWindow() (kill, restart time.Duration, ok bool) {
	raw, err := os.ReadFile(filepath.Join(r.o.out, "events.jsonl"))
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(raw), "\n") {
		var ev struct {
			T     float64 `json:"t"`
			Event string  `json:"event"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		switch {
		case strings.HasPrefix(ev.Event, "pod b's vllmsim killed"):
			kill = at(ev.T)
		case strings.HasPrefix(ev.Event, "pod b's vllmsim started again"):
			restart = at(ev.T)
		}
	}
	return kill, restart, kill > 0 && restart > kill
}
