// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package testbin finds the binaries that end-to-end tests run: the built
// distribution, and the project's own commands built for the test.
//
// The distribution's path comes from OTELCOL_LLM_BIN (make test sets it).
// Without it the tests skip, except under CI, where a missing binary is a
// failure: a CI run that skipped them would pass without testing anything.
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Collector returns the path of the built distribution, from
// OTELCOL_LLM_BIN; it skips the test when the variable is unset, or fails it
// under CI.
func Collector(tb testing.TB) string {
	tb.Helper()
	bin := os.Getenv("OTELCOL_LLM_BIN")
	if bin == "" {
		if os.Getenv("CI") != "" {
			tb.Fatal("OTELCOL_LLM_BIN is not set: run the end-to-end tests through `make test`")
		}
		tb.Skip("OTELCOL_LLM_BIN is not set; `make test` builds the collector and sets it")
	}
	if _, err := os.Stat(bin); err != nil { //nolint:gosec // the binary the test runner names
		tb.Fatalf("OTELCOL_LLM_BIN: %v", err)
	}
	return bin
}

// Build builds the module's package pkg (a path from the module root, such
// as ./cmd/vllmsim) into the test's temporary folder and returns the binary.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	root := ModuleRoot(tb)
	out := filepath.Join(tb.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// Module is the distribution's module path.
const Module = "github.com/otelcol-llm/otelcol-llm"

// ModuleRoot returns the folder of the distribution module's go.mod,
// wherever in the repository the test runs: in that module, or in a test
// module nested in it (the end-to-end tests' and the deploy kit's, which
// keep their dependencies out of the product's go.mod).
func ModuleRoot(tb testing.TB) string {
	tb.Helper()
	b, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		tb.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(b))
	if gomod == "" || gomod == os.DevNull {
		tb.Fatal("go env GOMOD: the test does not run inside the module")
	}
	for dir := filepath.Dir(gomod); ; dir = filepath.Dir(dir) {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePath(data) == Module {
			return dir
		}
		if parent := filepath.Dir(dir); parent == dir {
			tb.Fatalf("no go.mod of %s at or above %s", Module, filepath.Dir(gomod))
		}
	}
}

// modulePath is the path a go.mod's module directive names.
func modulePath(gomod []byte) string {
	for line := range strings.Lines(string(gomod)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}
