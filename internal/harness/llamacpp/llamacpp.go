// Package llamacpp runs llama.cpp's llama-server for the tests: the build of
// tools/llama-server.sh (make llama-server), a tiny random-weight model made
// once per test process with make_model.py, and one server per Start on a
// free loopback port.
//
// The build's folder comes from LLAMA_CPP_DIR (make test sets it), else from
// the script's cache. Without a build, or without a python3 that has numpy
// and PyYAML, the tests skip saying what is missing, except under CI, where
// that is a failure: a CI run that skipped them would pass without testing
// anything.
package llamacpp // import "github.com/otelcol-llm/otelcol-llm/internal/harness/llamacpp"

import (
	"context"
	_ "embed"
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

// missing skips the test, or fails it under CI, saying what is missing.
func missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatalf(format, args...)
	}
	tb.Skipf(format, args...)
}

var build struct {
	once sync.Once
	dir  string
}

// Dir returns the folder of the llama-server build (bin/llama-server,
// gguf-py/, models/, release): LLAMA_CPP_DIR, else the cached build of
// tools/llama-server.sh.
func Dir(tb testing.TB) string {
	tb.Helper()
	build.once.Do(func() {
		if build.dir = os.Getenv("LLAMA_CPP_DIR"); build.dir != "" {
			return
		}
		script := filepath.Join(testbin.ModuleRoot(tb), "tools", "llama-server.sh")
		if out, err := exec.Command(script, "--cached").Output(); err == nil {
			build.dir = strings.TrimSpace(string(out))
		}
	})
	if build.dir == "" {
		missing(tb, "llama-server is not built: run `make llama-server` (needs npm, git, cmake and g++), or set LLAMA_CPP_DIR")
	}
	if _, err := os.Stat(filepath.Join(build.dir, "bin", "llama-server")); err != nil {
		tb.Fatalf("LLAMA_CPP_DIR: %v", err)
	}
	return build.dir
}

// Release is the llama.cpp tag and commit the build is of.
func Release(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(tb), "release"))
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimSpace(string(b))
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
	return "", fmt.Errorf("no python3 with numpy and PyYAML (tried %s): apt-get install python3-numpy python3-yaml", strings.Join(candidates, ", "))
}

var model struct {
	once    sync.Once
	tmp     string
	path    string
	err     error
	missing bool // err says what to install, not what broke
}

// Model returns the path of the tiny model, made on the first call of the
// test process (a few seconds) and removed by Cleanup.
func Model(tb testing.TB) string {
	tb.Helper()
	dir := Dir(tb)
	model.once.Do(func() {
		py, err := python()
		if err != nil {
			model.err, model.missing = err, true
			return
		}
		// Not tb.TempDir: the model outlives the test that makes it.
		if model.tmp, model.err = os.MkdirTemp("", "otelcol-llm-llamacpp-"); model.err != nil { //nolint:usetesting // removed by Cleanup
			return
		}
		script := filepath.Join(model.tmp, "make_model.py")
		if model.err = os.WriteFile(script, makeModelPy, 0o600); model.err != nil {
			return
		}
		path := filepath.Join(model.tmp, "tiny-random.gguf")
		cmd := exec.Command(py, script, filepath.Join(dir, "models", Vocab), path)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(dir, "gguf-py"))
		if out, err := cmd.CombinedOutput(); err != nil {
			model.err = fmt.Errorf("make_model.py: %w\n%s", err, out)
			return
		}
		model.path = path
	})
	if model.missing {
		missing(tb, "%v", model.err)
	}
	if model.err != nil {
		tb.Fatal(model.err)
	}
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
}

// Server is a running llama-server.
type Server struct {
	// URL is http://127.0.0.1:port, without a trailing slash.
	URL    string
	Addr   string
	Output *testbin.SyncBuffer
	proc   *process.Process
}

// Start runs llama-server with the tiny model on a free loopback port, with
// continuous batching and /metrics, and returns once /health answers 200.
// The server is stopped when the test ends, if Kill has not.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	bin := filepath.Join(Dir(tb), "bin", "llama-server")
	m := Model(tb)
	o.Parallel, o.Context, o.Threads = orDefault(o.Parallel, 2), orDefault(o.Context, 4096), orDefault(o.Threads, 1)
	addr, err := process.FreeAddr()
	if err != nil {
		tb.Fatal(err)
	}
	_, port, _ := strings.Cut(addr, ":")
	args := []string{
		"--model", m, "--host", "127.0.0.1", "--port", port,
		"--parallel", strconv.Itoa(o.Parallel), "--cont-batching", "--metrics",
		"--ctx-size", strconv.Itoa(o.Context), "--threads", strconv.Itoa(o.Threads),
		"--threads-batch", strconv.Itoa(o.Threads), "--no-warmup",
	}
	// Niced: the engine's slowness lengthens a request for its client and
	// the collector alike, while a client or collector waiting for a CPU
	// the engine holds would skew the clocks the tests compare. nice
	// execs the server, so the process is the server's.
	args = append([]string{"-n", "10", bin}, args...)
	s := &Server{URL: "http://" + addr, Addr: addr, Output: &testbin.SyncBuffer{}}
	s.proc, err = process.Start("llama-server", "nice", args, process.Options{Output: s.Output, SIGTERMIsClean: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.proc.Stop(10 * time.Second) })
	if err := s.proc.WaitHTTP(context.Background(), s.URL+"/health", time.Minute); err != nil {
		tb.Fatalf("%v\n%s", err, s.Output)
	}
	return s
}

// Kill kills the server (SIGKILL), as an engine that crashes.
func (s *Server) Kill() { s.proc.Kill() }

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}
