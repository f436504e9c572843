// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/selfmetrics"
)

// readyLine is what the collector logs once every component has started.
const readyLine = "Everything is ready"

// collector is one otelcol-llm (or vllmsim) process of a measurement.
type collector struct {
	*process.Process
	telemetry string // host:port of its own metrics (Prometheus format)
}

// startCollector writes the config to dir/name.yaml and starts bin on it;
// its log goes to dir/name.log.
func startCollector(bin, dir, name, config, telemetry string) (*collector, error) {
	cfg := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		return nil, err
	}
	c, err := startProcess(bin, dir, name, "--config", cfg)
	if c != nil {
		c.telemetry = telemetry
	}
	return c, err
}

// startProcess starts bin with args, its output going to dir/name.log.
func startProcess(bin, dir, name string, args ...string) (*collector, error) {
	p, err := process.Start(name, bin, args, process.Options{Log: filepath.Join(dir, name+".log")})
	if err != nil {
		return nil, err
	}
	return &collector{Process: p}, nil
}

// waitReady waits for the ready line in the log and returns the time it
// carries (the log's own timestamp, millisecond precision).
func (c *collector) waitReady(limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if t, ok := logTime(c.LogPath, readyLine); ok {
			return t, nil
		}
		select {
		case <-c.Exited():
			return time.Time{}, fmt.Errorf("exited at start-up (log: %s)", c.LogPath)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return time.Time{}, fmt.Errorf("not ready after %s (log: %s)", limit, c.LogPath)
}

// logTime returns the timestamp of the first log line containing text.
func logTime(path, text string) (time.Time, bool) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, text) {
			continue
		}
		ts, _, _ := strings.Cut(line, "\t")
		t, err := time.Parse("2006-01-02T15:04:05.000Z0700", ts)
		return t, err == nil
	}
	return time.Time{}, false
}

// stop sends SIGTERM and waits for the process to exit, killing it after
// 15 s.
func (c *collector) stop() { _ = c.Stop(15 * time.Second) }

// cpu is the CPU time (user + system) the process has used so far.
func (c *collector) cpu() (time.Duration, error) { return c.CPU() }

// rss is the process's resident set (VmRSS) in bytes.
func (c *collector) rss() (int64, error) { return c.RSS() }

// selfMetrics reads the collector's own metrics: the value of each family
// (summed over its series), by name.
func (c *collector) selfMetrics() (map[string]float64, error) {
	return selfmetrics.Values(c.telemetry)
}

// loadAvg is the 1-minute load average.
func loadAvg() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
