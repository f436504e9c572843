// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package llamacpp runs llama.cpp's llama-server for the tests: the build of
// tools/llama-server.sh (make llama-server), a tiny random-weight model made
// once per test process with make_model.py, and one server per Start on a
// free loopback port.
//
// The build's folder comes from LLAMA_CPP_DIR (make test sets it), else from
// the script's cache. Without a build, or without a python3 that has numpy
// and PyYAML, the tests skip saying what is missing, except under CI, where
// that is a failure: a CI run that skipped them would pass without testing
// anything. Find, MakeModel and Run are the same without a test, for make
// demo-real.
package llamacpp // import "github.com/otelcol-llm/otelcol-llm/internal/harness/llamacpp"

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// Vocab is the vocab-only GGUF of the llama.cpp tree whose tokenizer the
// model reuses (LLaMA's SentencePiece, 32 000 tokens).
const Vocab = "ggml-vocab-llama-spm.gguf"

//go:embed make_model.py
var makeModelPy []byte

// MissingError says that something the servers need is not installed or
// built, and how to get it.
type MissingError struct{ What string }

func (e *MissingError) Error() string { return e.What }

// need skips the test, or fails it under CI, when err says something is
// missing; it fails the test on any other error.
func need(tb testing.TB, err error) {
	tb.Helper()
	var m *MissingError
	switch {
	case err == nil:
	case errors.As(err, &m) && os.Getenv("CI") == "":
		tb.Skip(m.What)
	default:
		tb.Fatal(err)
	}
}

// Find returns the folder of the llama-server build (bin/llama-server,
// gguf-py/, models/, release): LLAMA_CPP_DIR, else the cached build of
// tools/llama-server.sh under root, the module's root.
func Find(root string) (string, error) {
	dir := os.Getenv("LLAMA_CPP_DIR")
	if dir == "" {
		out, err := exec.Command(filepath.Join(root, "tools", "llama-server.sh"), "--cached").Output() //nolint:gosec // the module's own script
		if err != nil {
			return "", &MissingError{"llama-server is not built: run `make llama-server` (needs npm, git, cmake and g++), or set LLAMA_CPP_DIR"}
		}
		dir = strings.TrimSpace(string(out))
	}
	if _, err := os.Stat(filepath.Join(dir, "bin", "llama-server")); err != nil { //nolint:gosec // the user's own build folder
		return "", fmt.Errorf("LLAMA_CPP_DIR: %w", err)
	}
	return dir, nil
}

var build struct {
	once sync.Once
	dir  string
	err  error
}

// Dir is Find for a test, once per test process.
func Dir(tb testing.TB) string {
	tb.Helper()
	build.once.Do(func() { build.dir, build.err = Find(testbin.ModuleRoot(tb)) })
	need(tb, build.err)
	return build.dir
}

// ReleaseOf is the llama.cpp tag and commit the build in dir is of.
func ReleaseOf(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "release"))
	return strings.TrimSpace(string(b)), err
}

// Release is ReleaseOf the build a test uses.
func Release(tb testing.TB) string {
	tb.Helper()
	r, err := ReleaseOf(Dir(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// python returns a python3 that imports numpy and yaml: Debian's
// python3-numpy and python3-yaml install for /usr/bin/python3, which may not
// be the python3 first on PATH (a pyenv one).
func python() (string, error) {
	candidates := []string{"/usr/bin/python3"}
	if p, err := exec.LookPath("python3"); err == nil {
		candidates = append(candidates, p)
	}
	for _, p := range candidates {
		if exec.Command(p, "-c", "import numpy, yaml").Run() == nil {
			return p, nil
		}
	}
	return "", &MissingError{fmt.Sprintf("no python3 with numpy and PyYAML (tried %s): apt-get install python3-numpy python3-yaml", strings.Join(candidates, ", "))}
}

// MakeModel writes the tiny random-weight model into the folder into,
// with the build in dir (a few seconds), and returns its path.
func MakeModel(dir, into string) (string, error) {
	py, err := python()
	if err != nil {
		return "", err
	}
	script := filepath.Join(into, "make_model.py")
	if err := os.WriteFile(script, makeModelPy, 0o600); err != nil {
		return "", err
	}
	path := filepath.Join(into, "tiny-random.gguf")
	cmd := exec.Command(py, script, filepath.Join(dir, "models", Vocab), path)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(dir, "gguf-py"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make_model.py: %w\n%s", err, out)
	}
	return path, nil
}

var model struct {
	once sync.Once
	tmp  string
	path string
	err  error
}

// Model returns the path of the tiny model, made on the first call of the
// test process and removed by Cleanup.
func Model(tb testing.TB) string {
	tb.Helper()
	dir := Dir(tb)
	model.once.Do(func() {
		// Not tb.TempDir: the model outlives the test that makes it.
		if model.tmp, model.err = os.MkdirTemp("", "otelcol-llm-llamacpp-"); model.err != nil { //nolint:usetesting // removed by Cleanup
			return
		}
		model.path, model.err = MakeModel(dir, model.tmp)
	})
	need(tb, model.err)
	return model.path
}

// Cleanup removes the model; a TestMain calls it once the tests are done.
func Cleanup() {
	if model.tmp != "" {
		_ = os.RemoveAll(model.tmp)
	}
}

// Options say how a server runs.
type Options struct {
	// Parallel is the number of slots (--parallel; 0: 2): requests beyond
	// it wait for a slot.
	Parallel int
	// Context is the context size in tokens, all slots together (--ctx-size;
	// 0: 4096).
	Context int
	// Threads for generation and batches (0: 1, so that two servers share
	// two cores without fighting).
	Threads int
	// Log, when set, is a file the server's output goes to, else a buffer
	// (Output).
	Log string
}

// Server is a running llama-server.
type Server struct {
	// URL is http://127.0.0.1:port, without a trailing slash.
	URL    string
	Addr   string
	Output *testbin.SyncBuffer
	proc   *process.Process
}

// Run runs the build in dir's llama-server with model on a free loopback
// port, with continuous batching and /metrics, and returns once /health
// answers 200 (within a minute, or ctx's end).
func Run(ctx context.Context, dir, model string, o Options) (*Server, error) {
	bin := filepath.Join(dir, "bin", "llama-server")
	o.Parallel, o.Context, o.Threads = orDefault(o.Parallel, 2), orDefault(o.Context, 4096), orDefault(o.Threads, 1)
	addr, err := process.FreeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := strings.Cut(addr, ":")
	args := []string{
		"--model", model, "--host", "127.0.0.1", "--port", port,
		"--parallel", strconv.Itoa(o.Parallel), "--cont-batching", "--metrics",
		"--ctx-size", strconv.Itoa(o.Context), "--threads", strconv.Itoa(o.Threads),
		"--threads-batch", strconv.Itoa(o.Threads), "--no-warmup",
	}
	// Niced: the engine's slowness lengthens a request for its client and
	// the collector alike, while a client or collector waiting for a CPU
	// the engine holds would skew the clocks the tests compare. nice
	// execs the server, so the process is the server's.
	args = append([]string{"-n", "10", bin}, args...)
	s := &Server{URL: "http://" + addr, Addr: addr}
	opts := process.Options{SIGTERMIsClean: true, Log: o.Log}
	if o.Log == "" {
		s.Output = &testbin.SyncBuffer{}
		opts.Output = s.Output
	}
	if s.proc, err = process.Start("llama-server", "nice", args, opts); err != nil {
		return nil, err
	}
	if err := s.proc.WaitHTTP(ctx, s.URL+"/health", time.Minute); err != nil {
		_ = s.proc.Stop(10 * time.Second)
		if s.Output != nil {
			err = fmt.Errorf("%w\n%s", err, s.Output)
		}
		return nil, err
	}
	return s, nil
}

// Start is Run for a test: the server is stopped when the test ends, if
// Kill has not.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	s, err := Run(context.Background(), Dir(tb), Model(tb), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		// A frozen server ignores SIGTERM until it runs again.
		_ = s.Thaw()
		_ = s.Stop()
	})
	return s
}

// Stop stops the server (SIGTERM, SIGKILL after 10 s).
func (s *Server) Stop() error { return s.proc.Stop(10 * time.Second) }

// Kill kills the server (SIGKILL), as an engine that crashes.
func (s *Server) Kill() { s.proc.Kill() }

// Freeze stops the server (SIGSTOP) mid-answer, as an engine that hangs:
// its connections stay open and nothing more comes; Thaw resumes it. Start
// thaws it when the test ends.
func (s *Server) Freeze() error { return s.proc.Freeze() }

// Thaw resumes a server Freeze stopped.
func (s *Server) Thaw() error { return s.proc.Thaw() }

// UsedCPU is the CPU time the server has used (user and system), once it
// has stopped.
func (s *Server) UsedCPU() time.Duration { return s.proc.UsedCPU() }

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}
