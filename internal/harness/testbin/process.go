// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package testbin

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
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
	proc   *process.Process
	once   sync.Once
	t      testing.TB
}

// StartCollector runs the built distribution with args, env added to the
// test's environment, and returns once it is ready. It stops the process
// (SIGTERM) when the test ends, if Stop or Crash has not, and checks that it
// exits cleanly; the process dies with the test binary whatever happens.
func StartCollector(tb testing.TB, args, env []string) *Process {
	tb.Helper()
	p := &Process{Output: &SyncBuffer{}, t: tb}
	var err error
	p.proc, err = process.Start("the collector", Collector(tb), args, process.Options{Env: env, Output: p.Output})
	require.NoError(tb, err)
	tb.Cleanup(p.Stop)
	require.Eventually(tb, func() bool {
		select {
		case <-p.proc.Exited():
			return true
		default:
		}
		return strings.Contains(p.Output.String(), "Everything is ready")
	}, 60*time.Second, 20*time.Millisecond)
	require.Contains(tb, p.Output.String(), "Everything is ready", "the collector exited early")
	// otelcol's Run installs its SIGTERM handler only after the service has
	// started and logged "Everything is ready"; a SIGTERM in between kills
	// the process instead of stopping it gracefully (a drain test stopping
	// the collector early saw "signal: terminated" on a loaded machine).
	// Nothing observable marks the handler's arrival, so give Run a moment.
	time.Sleep(250 * time.Millisecond)
	return p
}

// Stop sends SIGTERM and checks that the process exits cleanly within 30 s;
// it does nothing the second time.
func (p *Process) Stop() {
	p.once.Do(func() {
		if err := p.proc.Stop(30 * time.Second); err != nil {
			assert.NoError(p.t, err, "collector exit\n%s", p.Output)
		}
	})
}

// Crash kills the process (SIGKILL): no shutdown, as a node lost.
func (p *Process) Crash() {
	p.once.Do(p.proc.Kill)
}

// Tool returns the path of a tool a test runs, which .ci/run installs with
// its Debian package pkg. Without it the test fails under CI and is skipped
// elsewhere, naming the command that installs it.
func Tool(tb testing.TB, name, pkg string) string {
	tb.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("%s is missing: apt-get install %s", name, pkg)
	}
	tb.Skipf("%s is missing: apt-get install %s", name, pkg)
	return ""
}

// StartProcess runs bin with args until the test ends (SIGTERM then, and
// the process dies with the test binary whatever happens), and returns its
// output.
func StartProcess(tb testing.TB, bin string, args ...string) *SyncBuffer {
	tb.Helper()
	out := &SyncBuffer{}
	p, err := process.Start(bin, bin, args, process.Options{Output: out})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = p.Stop(time.Hour) })
	return out
}
