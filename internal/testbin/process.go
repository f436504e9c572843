package testbin

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/benchproc"
)

// SyncBuffer collects a process's output while a test reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Process is the distribution run by a test.
type Process struct {
	Output *SyncBuffer
	cmd    *exec.Cmd
	exited chan error
	once   sync.Once
	t      testing.TB
}

// StartCollector runs the built distribution with args, env added to the
// test's environment, and returns once it is ready. It stops the process
// (SIGTERM) when the test ends, if Stop or Crash has not, and checks that it
// exits cleanly; the process dies with the test binary whatever happens.
func StartCollector(t testing.TB, args, env []string) *Process {
	t.Helper()
	p := &Process{Output: &SyncBuffer{}, cmd: exec.Command(Collector(t), args...), exited: make(chan error, 1), t: t}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.Output, p.Output
	p.cmd.SysProcAttr = benchproc.DieWithParent()
	require.NoError(t, p.cmd.Start())
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(p.Stop)
	require.Eventually(t, func() bool {
		select {
		case err := <-p.exited:
			p.exited <- err
			return true
		default:
		}
		return strings.Contains(p.Output.String(), "Everything is ready")
	}, 60*time.Second, 20*time.Millisecond)
	require.Contains(t, p.Output.String(), "Everything is ready", "the collector exited early")
	return p
}

// Stop sends SIGTERM and checks that the process exits cleanly within 30 s;
// it does nothing the second time.
func (p *Process) Stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.exited:
			assert.NoError(p.t, err, "collector exit\n%s", p.Output)
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			p.t.Errorf("the collector did not stop within 30 s of SIGTERM\n%s", p.Output)
		}
	})
}

// Crash kills the process (SIGKILL): no shutdown, as a node lost.
func (p *Process) Crash() {
	p.once.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
}

// Tool returns the path of a Debian-packaged tool, installing its package
// when it is missing and the test runs as root (as CI does); elsewhere the
// test is skipped without it, and under CI it fails.
func Tool(t testing.TB, name, pkg string) string {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	if _, err := exec.LookPath("apt-get"); err == nil && os.Geteuid() == 0 {
		install := exec.Command("sh", "-c", "apt-get install -y -qq "+pkg+" || (apt-get update -qq && apt-get install -y -qq "+pkg+")")
		install.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := install.CombinedOutput()
		t.Logf("apt-get install %s: %v\n%s", pkg, err, out)
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is missing and could not be installed (apt-get install %s)", name, pkg)
	}
	t.Skipf("%s is missing: apt-get install %s", name, pkg)
	return ""
}

// StartProcess runs bin with args until the test ends (SIGTERM then, and
// the process dies with the test binary whatever happens), and returns its
// output.
func StartProcess(t testing.TB, bin string, args ...string) *SyncBuffer {
	t.Helper()
	out := &SyncBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = benchproc.DieWithParent()
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	return out
}
