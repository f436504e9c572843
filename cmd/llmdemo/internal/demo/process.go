package demo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is a child process whose output goes to a log file in the
// report folder. It is stopped with SIGTERM (then SIGKILL after a grace
// period) by stop, which is safe to call more than once.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
	err    error // Wait's result, valid once exited is closed
	// terminated: stop sent SIGTERM. A process that dies of it (haproxy
	// -db does) was stopped cleanly.
	terminated bool
}

// stopGrace is how long a process gets between SIGTERM and SIGKILL.
const stopGrace = 15 * time.Second

func startProcess(name, logPath, bin string, args []string, env []string) (*process, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: lf, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.exited)
	}()
	return p, nil
}

// stop ends the process (SIGTERM, SIGKILL after stopGrace) and waits for
// it. It returns the exit error when the process did not exit cleanly.
func (p *process) stop() error {
	select {
	case <-p.exited:
		return p.exitErr()
	default:
	}
	p.terminated = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopGrace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %s of SIGTERM (killed)", p.name, stopGrace)
	}
	return p.exitErr()
}

func (p *process) exitErr() error {
	var exit *exec.ExitError
	if p.terminated && errors.As(p.err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	if p.err != nil {
		return fmt.Errorf("%s: %w (see %s)", p.name, p.err, p.log.Name())
	}
	return nil
}

// wait waits for the process to exit by itself, or stops it when ctx ends.
func (p *process) wait(ctx context.Context) error {
	select {
	case <-p.exited:
		return p.exitErr()
	case <-ctx.Done():
		_ = p.stop()
		return ctx.Err()
	}
}

// cpuSeconds is the user+system CPU time the process used; valid after it
// exited.
func (p *process) cpuSeconds() float64 {
	st := p.cmd.ProcessState
	if st == nil {
		return 0
	}
	return (st.UserTime() + st.SystemTime()).Seconds()
}

// waitHTTP polls url until it answers 200, the process exits, or the
// timeout passes.
func (p *process) waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
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
			return fmt.Errorf("%s exited before it was ready: %v (see %s)", p.name, p.err, p.log.Name())
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s not ready at %s within %s (see %s)", p.name, url, timeout, p.log.Name())
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}
