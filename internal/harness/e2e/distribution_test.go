// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// TestDistributionComponents holds the binary, builder-config.yaml and the
// README's component table to the same list, and checks that the components
// of the scale-out topology configure together.
func TestDistributionComponents(t *testing.T) {
	bin := testbin.Collector(t)

	out, err := exec.Command(bin, "components").CombinedOutput()
	require.NoError(t, err, "%s", out)
	built := componentsOf(string(out))

	fromReadme := readmeComponents(t)
	for kind, names := range built {
		assert.ElementsMatch(t, names, fromReadme[kind], "%s: `otelcol-llm components` against the README's table", kind)
	}

	// Every module in builder-config.yaml is on the release train, and every
	// one is in the binary (a component ocb dropped would show here).
	cfg, err := os.ReadFile(filepath.Join("..", "..", "..", "builder-config.yaml"))
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`(?m)^\s*- gomod: (\S+) (v\S+)`).FindAllStringSubmatch(string(cfg), -1) {
		if strings.HasPrefix(m[1], "github.com/otelcol-llm/") {
			continue
		}
		assert.Contains(t, []string{"v0.161.0", "v1.67.0"}, m[2], "%s is off the release train", m[1])
		assert.Contains(t, string(out), "module: "+m[1]+" "+m[2], "%s is not in the binary", m[1])
	}

	for _, want := range []struct{ kind, name string }{
		{"exporters", "load_balancing"},
		{"exporters", "file"},
		{"processors", "tail_sampling"},
		{"processors", "filter"},
		{"processors", "transform"},
	} {
		assert.Contains(t, built[want.kind], want.name)
	}

	validate := exec.Command(bin, "validate", "--config", filepath.Join("testdata", "release-train.yaml"))
	validate.Env = append(os.Environ(), "FILE_EXPORTER_PATH="+filepath.Join(t.TempDir(), "traces.jsonl"))
	out, err = validate.CombinedOutput()
	require.NoError(t, err, "validate release-train.yaml:\n%s", out)
}

// componentsOf reads `otelcol-llm components`: the name of each component,
// by kind.
func componentsOf(out string) map[string][]string {
	byKind := map[string][]string{}
	kind := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, " ") && strings.HasSuffix(line, ":") {
			kind = strings.TrimSuffix(line, ":")
			continue
		}
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "- name: "); ok && kind != "" {
			byKind[kind] = append(byKind[kind], name)
		}
	}
	return byKind
}

// readmeComponents reads the README's table under "What is in the
// distribution": the component names of each row, aliases left out.
func readmeComponents(t *testing.T) map[string][]string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "..", "README.md"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "## What is in the distribution")
	require.True(t, ok, "README has no 'What is in the distribution' section")
	byKind := map[string][]string{}
	name := regexp.MustCompile("`([a-z_]+)`")
	alias := regexp.MustCompile("\\(alias `[a-z_]+`\\)")
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 4 || !slices.Contains([]string{"receivers", "processors", "exporters", "connectors", "extensions"}, strings.TrimSpace(cells[1])) {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(alias.ReplaceAllString(cells[2], ""), -1) {
			byKind[strings.TrimSpace(cells[1])] = append(byKind[strings.TrimSpace(cells[1])], m[1])
		}
	}
	require.NotEmpty(t, byKind, "README's component table not found")
	return byKind
}
