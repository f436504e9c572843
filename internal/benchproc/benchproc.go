// Package benchproc runs the processes of the benchmark and soak harnesses
// (the collector, vllmsim, llmload) and reads what they cost from /proc and
// from the collector's own telemetry. What it reads from /proc (CPU, RSS,
// open files) is Linux only and an error elsewhere; on Linux every process
// it starts dies with the harness (DieWithParent).
package benchproc // import "github.com/otelcol-llm/otelcol-llm/internal/benchproc"

import (
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

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Process is a started command whose output goes to a log file.
type Process struct {
	Cmd     *exec.Cmd
	LogPath string
	Started time.Time
	exited  chan struct{}
}

// Start starts bin with args, its stdout and stderr going to dir/name.log.
func Start(bin, dir, name string, args ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Never outlive the harness, however it ends.
	cmd.SysProcAttr = DieWithParent()
	p := &Process{Cmd: cmd, LogPath: logPath, exited: make(chan struct{})}
	p.Started = time.Now()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	go func() { _ = cmd.Wait(); logFile.Close(); close(p.exited) }()
	return p, nil
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Exited is closed when the process has ended.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Stop sends SIGTERM and waits up to limit for the process to end, then
// kills it. It reports whether the process ended on SIGTERM.
func (p *Process) Stop(limit time.Duration) bool {
	select {
	case <-p.exited:
		return true
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return true
	case <-time.After(limit):
		_ = p.Cmd.Process.Kill()
		<-p.exited
		return false
	}
}

// userHZ is USER_HZ, the unit of the CPU times in /proc: 100 on every Linux
// architecture Go supports.
const userHZ = 100

// ticks is a count of USER_HZ ticks as a duration.
func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// CPU is the process's user and system CPU time so far.
func (p *Process) CPU() (time.Duration, error) { return CPUOf(p.Pid()) }

// CPUOf is the user and system CPU time process pid has used so far (the
// harness's own: os.Getpid()).
func CPUOf(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return ticks(utime + stime), nil
}

// MachineBusy is the CPU time every process on the machine has used since
// boot: the first line of /proc/stat, all but idle and iowait.
func MachineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, errors.New("no cpu line in /proc/stat")
	}
	var total int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		total += n
	}
	return ticks(total), nil
}

// RSS is the process's resident set size in bytes.
func (p *Process) RSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// OpenFiles is the number of the process's open file descriptors.
func (p *Process) OpenFiles() (int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.Pid()))
	return len(entries), err
}

// SelfMetrics reads a Prometheus text endpoint (the collector's own
// telemetry at addr, /metrics): each family's value summed over its series,
// by name, for counters and gauges.
func SelfMetrics(addr string) (map[string]float64, error) {
	return selfMetrics(addr, nil)
}

// SelfMetric is one family of SelfMetrics, summed over the series whose
// labels include every one of labels.
func SelfMetric(addr, name string, labels map[string]string) (float64, error) {
	m, err := selfMetrics(addr, func(family string, series *dto.Metric) bool {
		if family != name {
			return false
		}
		have := map[string]string{}
		for _, l := range series.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				return false
			}
		}
		return true
	})
	return m[name], err
}

func selfMetrics(addr string, keep func(family string, series *dto.Metric) bool) (map[string]float64, error) {
	fams, err := SelfMetricFamilies(addr)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			if keep != nil && !keep(name, m) {
				continue
			}
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

// SelfMetricFamilies reads a Prometheus text endpoint (the collector's own
// telemetry at addr, /metrics) whole: its families by name, every series.
func SelfMetricFamilies(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// FreeAddr returns a loopback address nothing listens on now.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// MustFreeAddr is FreeAddr for a harness that cannot go on without one: it
// panics when no port can be had.
func MustFreeAddr() string {
	addr, err := FreeAddr()
	if err != nil {
		panic(err)
	}
	return addr
}

// WaitListening waits until addr accepts connections, at most limit, and
// fails at once if the process ends first (a bad config, a port taken).
func (p *Process) WaitListening(addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening after %s: %w (log: %s)", addr, limit, err, p.LogPath)
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited before %s was listening (log: %s)", addr, p.LogPath)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
