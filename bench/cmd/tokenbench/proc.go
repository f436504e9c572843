package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat. It
// is 100 on every Linux architecture Go supports.
const clockTicks = 100

// collector is one collector process started for a measurement: its CPU time
// and memory are read from /proc, its heap through the pprof extension and its
// self-telemetry from its Prometheus endpoint.
type collector struct {
	name      string
	cmd       *exec.Cmd
	pprofAddr string
	telemetry string // host:port of the Prometheus self-telemetry endpoint
	logPath   string
	exited    chan struct{}
}

// startCollector writes config into dir and starts bin with it, waiting until
// every address in ready accepts connections.
func startCollector(name, bin, dir, config, pprofAddr, telemetry string, ready ...string) (*collector, error) {
	cfgPath := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The collector must not outlive the driver, whatever stops the driver.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	c := &collector{name: name, cmd: cmd, pprofAddr: pprofAddr, telemetry: telemetry, logPath: logPath, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); logFile.Close(); close(c.exited) }()
	for _, addr := range append(ready, pprofAddr, telemetry) {
		if err := c.waitPort(addr, 30*time.Second); err != nil {
			c.stop()
			return nil, fmt.Errorf("%s: %w (log: %s)", name, err, logPath)
		}
	}
	return c, nil
}

func (c *collector) waitPort(addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-c.exited:
			return errors.New("exited at start-up")
		default:
		}
		if conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			conn.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not listening after %s", addr, limit)
}

// stop sends SIGTERM and waits for a clean shutdown, killing it after 15 s.
func (c *collector) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

func (c *collector) pid() int { return c.cmd.Process.Pid }

// cpuTicks is utime+stime of pid, in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name in field 2 may hold spaces; the fields after it don't.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	return utime + stime, errors.Join(err1, err2)
}

// cpuSeconds is the CPU time pid has used so far.
func cpuSeconds(pid int) float64 {
	t, err := cpuTicks(pid)
	if err != nil {
		return 0
	}
	return float64(t) / clockTicks
}

// machineBusySeconds is the CPU time all processes on the machine have used
// (the first line of /proc/stat: everything but idle and iowait).
func machineBusySeconds() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	total := int64(0)
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
	}
	return float64(total) / clockTicks
}

// rssBytes is the resident set size of pid.
func rssBytes(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// waitIdle waits until the collector has used at most one tick in each of two
// successive 250 ms windows (its timers cost less than that), or limit passes.
func (c *collector) waitIdle(limit time.Duration) {
	deadline := time.Now().Add(limit)
	quiet := 0
	prev, _ := cpuTicks(c.pid())
	for time.Now().Before(deadline) && quiet < 2 {
		time.Sleep(250 * time.Millisecond)
		now, _ := cpuTicks(c.pid())
		if now-prev <= 1 {
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

// telemetry reads the collector's self-telemetry.
func (c *collector) metrics() (selfMetrics, error) {
	resp, err := http.Get("http://" + c.telemetry + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
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

// freeAddr returns a 127.0.0.1 address with a port nothing listens on now.
func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
