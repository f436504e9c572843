// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// yamlBlock is a ```yaml block of a Markdown file, and the line its first
// YAML line is on.
type yamlBlock struct {
	line int
	text string
}

// yamlBlocks returns the ```yaml blocks of the Markdown file at path.
func yamlBlocks(t *testing.T, path string) []yamlBlock {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var (
		blocks []yamlBlock
		cur    *yamlBlock
		n      int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```yaml":
			cur = &yamlBlock{line: n + 1}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a ```yaml block is not closed", path)
	return blocks
}

// serviceLine finds a complete config: one with a top-level service key.
// The other blocks are fragments (one receiver's keys, say) and are not
// meant to run on their own.
var serviceLine = regexp.MustCompile(`(?m)^service:`)

// TestReadmeConfigsValidate: every complete config in the READMEs (the
// top-level one, the pages of docs/ and each component's) is one the
// distribution accepts, as a reader would paste it, and so are the configs
// at the top of the repository.
func TestReadmeConfigsValidate(t *testing.T) {
	bin := testbin.Collector(t)
	root := filepath.Join("..", "..", "..")
	readmes := []string{filepath.Join(root, "README.md")}
	// The pages the README links to, under docs/, are held to the same.
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	readmes = append(readmes, docs...)
	for _, dir := range []string{"receiver", "processor", "exporter"} {
		require.NoError(t, filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && d.Name() == "README.md" {
				readmes = append(readmes, path)
			}
			return err
		}))
	}
	// What the snippets and configs read from the environment, as a user
	// would set it.
	env := append(os.Environ(), "OTLP_BACKEND=backend.example:4317")

	validate := func(t *testing.T, config string) {
		t.Helper()
		cmd := exec.Command(bin, "validate", "--config", config)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "a complete config (one with service:) must validate as a reader pastes it: "+
			"define every component it names, set what it reads from the environment in this test\n%s", out)
	}

	var complete int
	for _, readme := range readmes {
		rel, err := filepath.Rel(root, readme)
		require.NoError(t, err)
		for _, b := range yamlBlocks(t, readme) {
			if !serviceLine.MatchString(b.text) {
				continue
			}
			complete++
			t.Run(fmt.Sprintf("%s:%d", rel, b.line), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "config.yaml")
				require.NoError(t, os.WriteFile(path, []byte(b.text), 0o600))
				validate(t, path)
			})
		}
	}
	require.Positive(t, complete, "no complete config found in %v", readmes)

	for _, config := range []string{"otelcol-dev.yaml", "otelcol-config.yaml"} {
		t.Run(config, func(t *testing.T) { validate(t, filepath.Join(root, config)) })
	}
}
