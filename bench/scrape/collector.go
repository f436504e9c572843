package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// readyLine is what the collector logs once every component has started.
const readyLine = "Everything is ready"

// collector is one otelcol-llm process of a measurement.
type collector struct {
	cmd       *exec.Cmd
	started   time.Time
	logPath   string
	telemetry string // host:port of its own metrics (Prometheus format)
	exited    chan struct{}
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
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Never outlive the harness, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &collector{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	c.started = time.Now()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	go func() { _ = cmd.Wait(); logFile.Close(); close(c.exited) }()
	return c, nil
}

// waitListening waits until addr accepts connections.
func waitListening(addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			conn.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not listening after %s", addr, limit)
}

// waitReady waits for the ready line in the log and returns the time it
// carries (the log's own timestamp, millisecond precision).
func (c *collector) waitReady(limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if t, ok := logTime(c.logPath, readyLine); ok {
			return t, nil
		}
		select {
		case <-c.exited:
			return time.Time{}, fmt.Errorf("exited at start-up (log: %s)", c.logPath)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return time.Time{}, fmt.Errorf("not ready after %s (log: %s)", limit, c.logPath)
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

// stop sends SIGTERM and waits for the collector to exit, killing it after
// 15 s.
func (c *collector) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// cpu is the CPU time (user + system) the collector has used so far.
func (c *collector) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which may hold spaces: state is [0],
	// utime [11], stime [12], in clock ticks of 1/100 s (USER_HZ).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond, errors.Join(err1, err2)
}

// rss is the collector's resident set (VmRSS) in bytes.
func (c *collector) rss() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// selfMetrics reads the collector's own metrics: the value of each family
// (summed over its series), by name.
func (c *collector) selfMetrics() (map[string]float64, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + c.telemetry + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			switch {
			case m.Gauge != nil:
				out[name] += m.Gauge.GetValue()
			case m.Counter != nil:
				out[name] += m.Counter.GetValue()
			}
		}
	}
	return out, nil
}

// freeAddr returns a loopback address nothing listens on now.
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
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
