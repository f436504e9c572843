// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pod is a model server pod as the EPP sees one: its own network namespace
// with one address, vllmsim on localhost:8000 and the otelcol-llm sidecar
// beside it (proxy on :8001, engine_health on :13140), so that the sidecar
// config runs as shipped: every pod's proxy names its engine localhost:8000,
// as in Kubernetes.
type pod struct {
	name   string // a, b, c: the endpoint is pod-<name>
	netns  string // /proc/<pid>/ns/net of the process that holds it
	ip     string // its address, which the EPP scrapes and routes to
	dir    string // its logs and the sidecar's queue
	holder *exec.Cmd

	sim, collector *exec.Cmd
	sims, sidecars int           // starts so far, for the log files' names
	listed         time.Duration // when it was first in the endpoints file
}

// addr is the endpoint's address as the EPP names it: the pod's IP and the
// proxy's port (the InferencePool's target port).
func (p *pod) addr() string { return p.ip + ":8001" }

// runCmd runs a command to its end; the driver runs as root in a network
// namespace of its own (run.sh), so nothing it makes is seen outside it.
func runCmd(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// newPod makes pod name's network namespace, held by a sleeping process,
// with a veth pair to the driver's: 10.213.<index>.1 on the driver's side,
// 10.213.<index>.2 in the pod.
func newPod(out, name string, index int) (*pod, error) {
	p := &pod{name: name, ip: fmt.Sprintf("10.213.%d.2", index), dir: filepath.Join(out, "pod-"+name)}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, err
	}
	p.holder = exec.Command("unshare", "--net", "sleep", "infinity")
	p.holder.SysProcAttr = diesWithDriver()
	if err := p.holder.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.holder.Wait() }()
	p.netns = fmt.Sprintf("/proc/%d/ns/net", p.holder.Process.Pid)
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		if ns, err := os.Readlink(p.netns); err == nil && ns != own {
			break
		}
		if i == 100 {
			return nil, fmt.Errorf("pod %s: no network namespace of its own after 1 s", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
	host, peer := "veth-"+name, "eth-"+name
	for _, args := range [][]string{
		{"ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", strconv.Itoa(p.holder.Process.Pid)},
		{"ip", "addr", "add", fmt.Sprintf("10.213.%d.1/24", index), "dev", host},
		{"ip", "link", "set", host, "up"},
		{"nsenter", "--net=" + p.netns, "ip", "addr", "add", p.ip + "/24", "dev", peer},
		{"nsenter", "--net=" + p.netns, "ip", "link", "set", peer, "up"},
		{"nsenter", "--net=" + p.netns, "ip", "link", "set", "lo", "up"},
	} {
		if err := runCmd(args[0], args[1:]...); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// inPod starts a command in the pod's namespace, its output to a file.
func (p *pod) inPod(logName string, env []string, name string, args ...string) (*exec.Cmd, error) {
	f, err := os.Create(filepath.Join(p.dir, logName))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("nsenter", append([]string{"--net=" + p.netns, name}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = diesWithDriver()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	go func() {
		_ = cmd.Wait()
		f.Close()
	}()
	return cmd, nil
}

// startSim starts vllmsim on localhost:8000, the proxy's upstream.
func (p *pod) startSim(bin string) error {
	p.sims++
	cmd, err := p.inPod(fmt.Sprintf("vllmsim-%d.log", p.sims), nil, bin, "-addr", "127.0.0.1:8000")
	if err != nil {
		return err
	}
	p.sim = cmd
	return nil
}

// startSidecar starts the collector with the sidecar config; it is ready
// when engine_health answers.
func (p *pod) startSidecar(ctx context.Context, bin, config string) error {
	p.sidecars++
	queue := filepath.Join(p.dir, "queue")
	cmd, err := p.inPod(fmt.Sprintf("sidecar-%d.log", p.sidecars), []string{
		// Nothing listens there: the OTLP export fails and is retried from
		// the queue, beside what this run watches.
		"OTLP_BACKEND=127.0.0.1:4317", "OTLP_BACKEND_INSECURE=true",
		"K8S_NODE_NAME=node", "K8S_POD_NAME=pod-" + p.name, "K8S_NAMESPACE=eppcheck",
		"OTELCOL_LLM_STORAGE_DIR=" + queue,
	}, bin, "--config", config)
	if err != nil {
		return err
	}
	p.collector = cmd
	return waitHTTP(ctx, "http://"+p.ip+":13140/engines", 30*time.Second)
}

// waitHTTP polls url until it answers 200.
func waitHTTP(ctx context.Context, url string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not answering after %s", url, limit)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop ends a process: SIGTERM, then SIGKILL after 10 s.
func stop(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	for range 100 {
		if err := cmd.Process.Signal(syscall.Signal(0)); errors.Is(err, os.ErrProcessDone) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
}

// diesWithDriver: a process the driver starts is killed when the driver
// ends, however it ends, so that no pod outlives a run.
func diesWithDriver() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// kill ends a process at once, as a crash does.
func kill(cmd *exec.Cmd) {
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}

// admin posts to vllmsim's admin API through the pod's proxy (a POST the
// proxy does not observe passes through).
func (p *pod) admin(ctx context.Context, pathAndQuery string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.addr()+pathAndQuery, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", pathAndQuery, resp.Status)
	}
	return nil
}
