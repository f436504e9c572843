// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
)

// otherEngine is a second engine every correctness collector also scrapes,
// with values of its own: a session named for the first engine must get the
// first engine's state, not this one's.
var otherEngine = newExposition("other engine", []byte(`# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="other"} 0.99
# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="other"} 99.0
# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="other"} 77.0
# HELP vllm:num_preemptions_total Pre-emptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="other"} 55.0
`))

// readout is what one collector made of one exposition.
type readout struct {
	src      source
	accept   string         // the Accept header it sent
	served   map[string]int // what the engine answered
	resource map[string]any
	first    pmetric.ResourceMetrics // the first scrape of the engine
	last     pmetric.ResourceMetrics // the last one
	summary  map[string]any          // vllm.* attributes of the session summary
	stall    map[string]any          // vllm.* attributes of the stall alert
	err      error
}

// readEngine runs src against exp (answered as negotiated, or text only)
// and reads back what it emitted.
func readEngine(bin, dir string, src source, exp exposition, negotiate bool) readout {
	ro := readout{src: src}
	a, err := startEngine(exp, negotiate, "")
	if err != nil {
		ro.err = err
		return ro
	}
	defer a.close()
	b, err := startEngine(otherEngine, negotiate, "")
	if err != nil {
		ro.err = err
		return ro
	}
	defer b.close()
	name := fmt.Sprintf("correct-%s-%s-%t", slug(string(src)), slug(exp.name), negotiate)
	s := setup{
		src: src, targets: []string{a.addr(), b.addr()}, interval: time.Second, telemetry: process.MustFreeAddr(),
		hooks: process.MustFreeAddr(), metricsFile: filepath.Join(dir, name+".metrics.json"), logsFile: filepath.Join(dir, name+".logs.json"),
	}
	// The file exporter appends: start from empty files.
	_ = os.Remove(s.metricsFile)
	_ = os.Remove(s.logsFile)
	c, err := startCollector(bin, dir, name, config(s), s.telemetry)
	if err != nil {
		ro.err = err
		return ro
	}
	defer c.stop()
	if _, err := c.waitReady(30 * time.Second); err != nil {
		ro.err = err
		return ro
	}
	// Two scrapes of the engine before the session, one during or after.
	if err := waitScrapes(a, 3, 30*time.Second); err != nil {
		ro.err = err
		return ro
	}
	if err := postSession(s.hooks, "session-"+name, a.addr()); err != nil {
		ro.err = err
		return ro
	}
	if err := waitScrapes(a, a.scrapes.Load()+1, 10*time.Second); err != nil {
		ro.err = err
		return ro
	}
	time.Sleep(500 * time.Millisecond)
	c.stop()
	ro.accept, ro.served = a.answers()
	ro.first, ro.last, ro.err = engineScrapes(s.metricsFile, a.addr())
	if ro.err == nil {
		ro.resource = ro.last.Resource().Attributes().AsRaw()
		ro.summary, ro.stall, ro.err = sessionContext(s.logsFile)
	}
	return ro
}

func waitScrapes(e *fakeEngine, n int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for e.scrapes.Load() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("engine scraped %d times, want %d within %s", e.scrapes.Load(), n, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// postSession posts the README's first session to the HTTP hook: a start,
// six chunks and an end, with three gaps of 200 ms in a row (a stall), on
// the given engine, timed now.
func postSession(hooks, id, engine string) error {
	now := time.Now().UnixNano()
	const ms = int64(time.Millisecond)
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"event":"start","session_id":%q,"time_unix_nano":%d,"model":"m","operation":"chat","prompt_tokens":812,"engine":%q}`+"\n", id, now, engine)
	for i, off := range []int64{180, 205, 405, 605, 805, 830} {
		count := 1
		if i == 1 {
			count = 2
		}
		fmt.Fprintf(&b, `{"event":"token","session_id":%q,"time_unix_nano":%d,"count":%d}`+"\n", id, now+off*ms, count)
	}
	fmt.Fprintf(&b, `{"event":"end","session_id":%q,"time_unix_nano":%d,"completion_tokens":7,"finish_reason":"stop"}`+"\n", id, now+831*ms)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Post("http://"+hooks+"/v1/token-events", "application/x-ndjson", &b)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("hook answered %s", resp.Status)
	}
	return nil
}

// jsonLines calls fn with each line of a file exporter's output.
func jsonLines(path string, fn func([]byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		if err := fn(sc.Bytes()); err != nil {
			return err
		}
	}
	return sc.Err()
}

// engineScrapes returns the first and last resource metrics of the engine
// at addr (its service.instance.id) in a file exporter's output.
func engineScrapes(path, addr string) (first, last pmetric.ResourceMetrics, err error) {
	var all []pmetric.ResourceMetrics
	err = jsonLines(path, func(line []byte) error {
		md, err := (&pmetric.JSONUnmarshaler{}).UnmarshalMetrics(line)
		if err != nil {
			return err
		}
		for _, rm := range md.ResourceMetrics().All() {
			if v, ok := rm.Resource().Attributes().Get("service.instance.id"); ok && v.Str() == addr {
				all = append(all, rm)
			}
		}
		return nil
	})
	if err == nil && len(all) < 2 {
		err = fmt.Errorf("%s: %d scrapes of %s, want 2 or more", path, len(all), addr)
	}
	if err != nil {
		return first, last, err
	}
	return all[0], all[len(all)-1], nil
}

// sessionContext returns the engine attributes (vllm.*) of the session
// summary and of the stall alert in a file exporter's logs output.
func sessionContext(path string) (summary, stall map[string]any, err error) {
	err = jsonLines(path, func(line []byte) error {
		ld, err := (&plog.JSONUnmarshaler{}).UnmarshalLogs(line)
		if err != nil {
			return err
		}
		for _, rl := range ld.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					attrs := map[string]any{}
					for k, v := range lr.Attributes().All() {
						if strings.HasPrefix(k, "vllm.") {
							attrs[k] = v.AsRaw()
						}
					}
					switch lr.EventName() {
					case tokenrecord.EventNameSummary:
						summary = attrs
					case tokenrecord.EventNameStall:
						stall = attrs
					}
				}
			}
		}
		return nil
	})
	if err == nil && (summary == nil || stall == nil) {
		err = fmt.Errorf("%s: no session summary or stall alert", path)
	}
	return summary, stall, err
}

// metricView is a metric as compared between the sources: its shape, and
// each point's attributes and values.
type metricView struct {
	shape  string            // type, temporality, monotonicity
	points map[string]string // attributes → value(s)
	starts map[string]bool   // how the start times were set
}

// viewOf describes the metrics of the last scrape of ro; first-scrape
// times and the exposition's _created values name the start times.
func viewOf(ro readout, exp exposition) map[string]metricView {
	firstTS := map[pcommon.Timestamp]bool{}
	forEachPoint(ro.first, func(_ pmetric.Metric, _ pcommon.Map, ts, _ pcommon.Timestamp, _ string) {
		firstTS[ts] = true
	})
	out := map[string]metricView{}
	forEachPoint(ro.last, func(m pmetric.Metric, attrs pcommon.Map, ts, start pcommon.Timestamp, value string) {
		v, ok := out[m.Name()]
		if !ok {
			v = metricView{shape: shape(m), points: map[string]string{}, starts: map[string]bool{}}
			out[m.Name()] = v
		}
		v.points[attrString(attrs)] = value
		if m.Type() == pmetric.MetricTypeSum || m.Type() == pmetric.MetricTypeHistogram {
			v.starts[startKind(start, ts, firstTS, exp)] = true
		}
	})
	return out
}

func forEachPoint(rm pmetric.ResourceMetrics, fn func(m pmetric.Metric, attrs pcommon.Map, ts, start pcommon.Timestamp, value string)) {
	if rm == (pmetric.ResourceMetrics{}) {
		return
	}
	for _, sm := range rm.ScopeMetrics().All() {
		for _, m := range sm.Metrics().All() {
			switch m.Type() {
			case pmetric.MetricTypeGauge, pmetric.MetricTypeSum:
				var dps pmetric.NumberDataPointSlice
				if m.Type() == pmetric.MetricTypeSum {
					dps = m.Sum().DataPoints()
				} else {
					dps = m.Gauge().DataPoints()
				}
				for _, dp := range dps.All() {
					v := dp.DoubleValue()
					if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
						v = float64(dp.IntValue())
					}
					fn(m, dp.Attributes(), dp.Timestamp(), dp.StartTimestamp(), strconv.FormatFloat(v, 'g', -1, 64))
				}
			case pmetric.MetricTypeHistogram:
				for _, dp := range m.Histogram().DataPoints().All() {
					fn(m, dp.Attributes(), dp.Timestamp(), dp.StartTimestamp(), fmt.Sprintf("count %d sum %g bounds %v counts %v",
						dp.Count(), dp.Sum(), dp.ExplicitBounds().AsRaw(), dp.BucketCounts().AsRaw()))
				}
			default:
				fn(m, pcommon.NewMap(), 0, 0, m.Type().String())
			}
		}
	}
}

func shape(m pmetric.Metric) string {
	switch m.Type() {
	case pmetric.MetricTypeSum:
		mono := "non-monotonic"
		if m.Sum().IsMonotonic() {
			mono = "monotonic"
		}
		return fmt.Sprintf("sum (%s, %s)", strings.ToLower(m.Sum().AggregationTemporality().String()), mono)
	case pmetric.MetricTypeHistogram:
		return fmt.Sprintf("histogram (%s)", strings.ToLower(m.Histogram().AggregationTemporality().String()))
	}
	return strings.ToLower(m.Type().String())
}

func attrString(m pcommon.Map) string {
	raw := m.AsRaw()
	keys := slices.Sorted(maps.Keys(raw))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, raw[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// startKind names how a start time was set.
func startKind(start, ts pcommon.Timestamp, firstTS map[pcommon.Timestamp]bool, exp exposition) string {
	switch start {
	case 0:
		return "unset"
	case ts:
		return "= point time"
	}
	for c := range exp.created {
		if sec, err := strconv.ParseFloat(c, 64); err == nil && math.Abs(float64(start)/1e9-sec) < 1e-3 {
			return "from _created"
		}
	}
	if firstTS[start] {
		return "first scrape"
	}
	return fmt.Sprintf("other (%s before the point)", time.Duration(ts-start).Round(time.Millisecond))
}

func slug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}
