// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package process runs the child processes of the harness (the collector,
// vllmsim, llmload, haproxy) for the benchmarks, the demo and the tests: a
// command whose output goes to a log file or a writer, that dies with the
// harness however the harness ends (on Linux), and that is stopped with
// SIGTERM, then SIGKILL after a grace period. It also reads what a process
// costs from /proc (Linux only, an error elsewhere).
package process // import "github.com/otelcol-llm/otelcol-llm/internal/harness/process"

import (
	"context"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Options say where a process's output goes and how it is stopped.
type Options struct {
	// Env is added to the harness's own environment.
	Env []string
	// Log is the file (created) that stdout and stderr go to; when empty,
	// they go to Output (nowhere when Output is nil too).
	Log    string
	Output io.Writer
	// OwnGroup puts the process in a process group of its own, so that a
	// Ctrl-C in the terminal reaches the harness only, which then stops its
	// children in order; the kernel sends it SIGTERM (not SIGKILL) if the
	// harness dies without stopping it.
	OwnGroup bool
	// SIGTERMIsClean counts dying of the SIGTERM that Stop sends as a clean
	// stop (haproxy -db ends so); otherwise only exit status 0 is.
	SIGTERMIsClean bool
}

// ErrKilled is the error of a Stop that had to kill the process.
var ErrKilled = errors.New("killed")

// Process is a started command.
type Process struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string // "" when the output goes to Options.Output
	Started time.Time
	opts    Options
	exited  chan struct{}
	err     error // Wait's result, valid once exited is closed
	// terminated: Stop sent SIGTERM.
	terminated bool
}

// Start starts bin with args; name names it in errors.
func Start(name, bin string, args []string, o Options) (*Process, error) {
	cmd := exec.Command(bin, args...)
	if o.Env != nil {
		cmd.Env = append(os.Environ(), o.Env...)
	}
	var logFile *os.File
	if o.Log != "" {
		var err error
		if logFile, err = os.Create(o.Log); err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = logFile, logFile
	} else if o.Output != nil {
		cmd.Stdout, cmd.Stderr = o.Output, o.Output
	}
	// Never outlive the harness, however it ends.
	cmd.SysProcAttr = sysProcAttr(o.OwnGroup)
	p := &Process{Name: name, Cmd: cmd, LogPath: o.Log, opts: o, exited: make(chan struct{})}
	p.Started = time.Now()
	if err := cmd.Start(); err != nil {
		if logFile != nil {
			logFile.Close()
		}
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		if logFile != nil {
			logFile.Close()
		}
		close(p.exited)
	}()
	return p, nil
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Exited is closed when the process has ended.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Stop sends SIGTERM and waits up to grace for the process to end, then
// kills it (the error wraps ErrKilled then). Otherwise it returns Err. It
// is safe to call more than once, and on a process that already ended.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return p.Err()
	default:
	}
	p.terminated = true
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.Err()
	case <-time.After(grace):
		_ = p.Cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %s of SIGTERM: %w", p.Name, grace, ErrKilled)
	}
}

// Kill kills the process (SIGKILL: no shutdown, as a node lost) and waits
// for it to end.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Kill()
	<-p.exited
}

// Freeze stops the process (SIGSTOP), as a process that hangs: its
// sockets stay open and nothing comes from them until Thaw.
func (p *Process) Freeze() error { return p.Cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw resumes a process Freeze stopped (SIGCONT).
func (p *Process) Thaw() error { return p.Cmd.Process.Signal(syscall.SIGCONT) }

// Err is how the process ended, once it has: nil for a clean exit (see
// Options.SIGTERMIsClean), else Wait's error with the log's path.
func (p *Process) Err() error {
	var exit *exec.ExitError
	if p.opts.SIGTERMIsClean && p.terminated && errors.As(p.err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	if p.err != nil {
		return fmt.Errorf("%s: %w%s", p.Name, p.err, p.seeLog())
	}
	return nil
}

// seeLog points an error at the log file, when there is one.
func (p *Process) seeLog() string {
	if p.LogPath == "" {
		return ""
	}
	return " (log: " + p.LogPath + ")"
}

// Wait waits for the process to end by itself and returns Err, or stops it
// (Stop with grace) when ctx ends and returns ctx's error.
func (p *Process) Wait(ctx context.Context, grace time.Duration) error {
	select {
	case <-p.exited:
		return p.Err()
	case <-ctx.Done():
		_ = p.Stop(grace)
		return ctx.Err()
	}
}

// UsedCPU is the user and system CPU time of a process that has ended (0
// before).
func (p *Process) UsedCPU() time.Duration {
	st := p.Cmd.ProcessState
	if st == nil {
		return 0
	}
	return st.UserTime() + st.SystemTime()
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
			return fmt.Errorf("%s not listening after %s: %w%s", addr, limit, err, p.seeLog())
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited before %s was listening%s", addr, p.seeLog())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitHTTP polls url until it answers 200, the process ends, or timeout
// passes.
func (p *Process) WaitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// No keep-alive: no idle connection (and its goroutines) outlives the
	// check.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before it was ready: %w%s", p.Name, p.err, p.seeLog())
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s not ready at %s within %s%s", p.Name, url, timeout, p.seeLog())
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// FreeAddr returns a loopback TCP address free at the time of the call,
// for a process the harness is about to start. The port is drawn below the
// kernel's ephemeral range: a port the kernel hands out itself (a listener
// on :0, the local end of any outgoing connection) can be taken by another
// process between this call and the listener's start, and on a busy
// machine running tests in parallel it was (a collector failing with
// "address already in use"); one drawn at random below that range can only
// be taken by another draw of the same port.
func FreeAddr() (string, error) { return freeAddr("tcp") }

// FreeUDPAddr is FreeAddr for a UDP listener.
func FreeUDPAddr() (string, error) { return freeAddr("udp") }

func freeAddr(network string) (string, error) {
	low := ephemeralLow()
	for range 100 {
		if low <= minDrawnPort+1 {
			break
		}
		port := minDrawnPort + mathrand.IntN(low-minDrawnPort)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if tryListen(network, addr) {
			return addr, nil
		}
	}
	// No free port below the range: one of the kernel's.
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		defer c.Close()
		return c.LocalAddr().String(), nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// minDrawnPort is the lowest port FreeAddr draws: above the well-known and
// most registered services' ports.
const minDrawnPort = 20000

// tryListen reports whether addr could be listened on, and closes what it
// opened.
func tryListen(network, addr string) bool {
	var c io.Closer
	var err error
	if network == "udp" {
		c, err = net.ListenPacket("udp", addr)
	} else {
		c, err = net.Listen("tcp", addr)
	}
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default where it cannot be read).
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				return v
			}
		}
	}
	return 32768
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
