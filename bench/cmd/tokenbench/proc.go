// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/selfmetrics"
)

// collector is one collector process started for a measurement: its CPU time
// and memory are read from /proc, its heap through the pprof extension and its
// self-telemetry from its Prometheus endpoint.
type collector struct {
	*process.Process
	name      string
	pprofAddr string
	telemetry string // host:port of the Prometheus self-telemetry endpoint
}

// startCollector writes config into dir and starts bin with it, waiting until
// every address in ready accepts connections.
func startCollector(name, bin, dir, config, pprofAddr, telemetry string, ready ...string) (*collector, error) {
	cfgPath := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	p, err := process.Start(name, bin, []string{"--config", cfgPath}, process.Options{Log: filepath.Join(dir, name+".log")})
	if err != nil {
		return nil, err
	}
	c := &collector{Process: p, name: name, pprofAddr: pprofAddr, telemetry: telemetry}
	for _, addr := range append(ready, pprofAddr, telemetry) {
		if err := c.WaitListening(addr, 30*time.Second); err != nil {
			c.stop()
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return c, nil
}

// stop sends SIGTERM and waits for a clean shutdown, killing it after 15 s.
func (c *collector) stop() { _ = c.Stop(15 * time.Second) }

// cpuSeconds is the CPU time the collector has used so far (0 once it is
// gone).
func (c *collector) cpuSeconds() float64 {
	d, _ := c.CPU()
	return d.Seconds()
}

// rssBytes is the collector's resident set (0 once it is gone).
func (c *collector) rssBytes() int64 {
	n, _ := c.RSS()
	return n
}

// driverCPUSeconds is the CPU time this driver has used so far.
func driverCPUSeconds() float64 {
	d, _ := process.CPUOf(os.Getpid())
	return d.Seconds()
}

// machineBusySeconds is the CPU time every process on the machine has used.
func machineBusySeconds() float64 {
	d, _ := process.MachineBusy()
	return d.Seconds()
}

// waitIdle waits until the collector has used at most one tick in each of two
// successive 250 ms windows (its timers cost less than that), or limit passes.
func (c *collector) waitIdle(limit time.Duration) {
	deadline := time.Now().Add(limit)
	quiet := 0
	prev, _ := c.CPU()
	for time.Now().Before(deadline) && quiet < 2 {
		time.Sleep(250 * time.Millisecond)
		now, _ := c.CPU()
		if now-prev <= 10*time.Millisecond { // one tick
			quiet++
		} else {
			quiet = 0
		}
		prev = now
	}
}

// heapAfterGC forces garbage collections in the collector (pprof's gc=1) and
// returns the live heap they leave (runtime.MemStats.HeapAlloc), so that
// memory held for sessions can be told apart from garbage not yet collected.
// Two collections: the first only moves sync.Pool contents to the victim
// cache, the second frees them.
func (c *collector) heapAfterGC() (int64, error) {
	if _, err := c.heapProfileAlloc(); err != nil {
		return 0, err
	}
	return c.heapProfileAlloc()
}

func (c *collector) heapProfileAlloc() (int64, error) {
	resp, err := http.Get("http://" + c.pprofAddr + "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapAlloc = "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no HeapAlloc in the heap profile", c.name)
}

// cpuProfile takes a CPU profile of the collector for d and writes it to path.
func (c *collector) cpuProfile(ctx context.Context, d time.Duration, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", c.pprofAddr, int(d.Seconds())), http.NoBody)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof profile: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// heapProfile writes the collector's heap profile (after a GC) to path.
func (c *collector) heapProfile(path string) error {
	resp, err := http.Get("http://" + c.pprofAddr + "/debug/pprof/heap?gc=1")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// metrics reads the collector's self-telemetry.
func (c *collector) metrics() (selfMetrics, error) {
	fams, err := selfmetrics.Families(c.telemetry)
	return selfMetrics(fams), err
}

type selfMetrics map[string]*dto.MetricFamily

// sum adds up the series of the counter or gauge name (with or without the
// _total suffix the Prometheus exporter adds) whose labels include match.
func (m selfMetrics) sum(name string, match map[string]string) float64 {
	total := 0.0
	for _, n := range []string{name, name + "_total"} {
		f, ok := m[n]
		if !ok {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			for k, v := range match {
				found := false
				for _, l := range s.GetLabel() {
					if l.GetName() == k && l.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case s.Counter != nil:
				total += s.GetCounter().GetValue()
			case s.Gauge != nil:
				total += s.GetGauge().GetValue()
			case s.Untyped != nil:
				total += s.GetUntyped().GetValue()
			}
		}
	}
	return total
}

// has tells whether the collector exports the metric at all (a counter
// that was never incremented may be absent, which also means zero).
func (m selfMetrics) has(name string) bool {
	_, a := m[name]
	_, b := m[name+"_total"]
	return a || b
}

// sumPrefix adds up every counter whose name starts with prefix.
func (m selfMetrics) sumPrefix(prefix string) float64 {
	total := 0.0
	for n := range m {
		if strings.HasPrefix(n, prefix) {
			total += m.sum(n, nil)
		}
	}
	return total
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
