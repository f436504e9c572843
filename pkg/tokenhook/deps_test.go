// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An engine that imports this package must not get pdata, gonum, gRPC or
// the collector into its build: only the standard library and the event
// model.
func TestDependencies(t *testing.T) {
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "go list needs the go command")
	const module = "github.com/otelcol-llm/otelcol-llm/"
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", module+"pkg/tokenhook").Output()
	var ee *exec.ExitError
	errors.As(err, &ee)
	require.NoError(t, err, "go list: %s", stderrOf(ee))
	deps := strings.Fields(string(out))
	assert.ElementsMatch(t, []string{module + "pkg/tokenevent", module + "pkg/tokenhook"}, deps)
	for _, d := range deps {
		for _, banned := range []string{"go.opentelemetry.io/collector", "/pdata", "gonum.org", "google.golang.org/grpc"} {
			assert.NotContains(t, d, banned)
		}
	}
}

func stderrOf(ee *exec.ExitError) string {
	if ee == nil {
		return ""
	}
	return string(bytes.TrimSpace(ee.Stderr))
}

// The README's "Hook clients" section shows Example's code, indented one
// tab less.
func TestReadmeShowsExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	example, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Hook clients\n")
	require.True(t, ok, "README has no Hook clients section")
	_, block, ok := strings.Cut(section, "\n```go\n")
	require.True(t, ok, "Hook clients section has no Go block")
	block, _, ok = strings.Cut(block, "\n```\n")
	require.True(t, ok)
	lines := strings.Split(block, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = "\t" + l
		}
	}
	want := strings.Join(lines, "\n") + "\n"
	assert.Contains(t, string(example), want, "README's Go block\n%s\nis not Example's code", block)
}
