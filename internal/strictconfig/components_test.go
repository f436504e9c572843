// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package strictconfig_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"
)

// The check knows a section's keys from its fields, which holds for a type
// that decodes itself only where its Unmarshal decodes into its own fields
// (confighttp's settings) or is one the check knows (an Optional takes
// enabled too, a MapList a map of free keys). A type of the components'
// configurations that newly decodes itself, after an upgrade of the
// collector, fails this test until someone has read its Unmarshal and the
// check agrees with it.
func TestCustomUnmarshalersAreKnown(t *testing.T) {
	known := []string{
		"confighttp.ClientConfig", // conf.Unmarshal(cc) and the keepalive keys, all fields
		"confighttp.ServerConfig", // likewise
		"configopaque.MapList",    // a list of name/value, or a map with free keys
		"configoptional.Optional", // the held type's keys, and enabled
		"enginehealthexporter.Config",
		"tokensessionprocessor.Config",
		"tokenstreamreceiver.Config",
	}
	unmarshaler := reflect.TypeFor[confmap.Unmarshaler]()
	seen := map[reflect.Type]bool{}
	var found []string
	var visit func(reflect.Type)
	visit = func(t reflect.Type) {
		if seen[t] {
			return
		}
		seen[t] = true
		if reflect.PointerTo(t).Implements(unmarshaler) {
			name, _, _ := strings.Cut(t.String(), "[")
			if !slices.Contains(found, name) {
				found = append(found, name)
			}
		}
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
			visit(t.Elem())
		case reflect.Struct:
			for f := range t.Fields() {
				if f.IsExported() {
					visit(f.Type)
				}
			}
			if get, ok := reflect.PointerTo(t).MethodByName("Get"); ok && strings.HasPrefix(t.Name(), "Optional[") {
				visit(get.Type.Out(0).Elem())
			}
		}
	}
	visit(reflect.TypeFor[tokenstreamreceiver.Config]())
	visit(reflect.TypeFor[tokensessionprocessor.Config]())
	visit(reflect.TypeFor[enginehealthexporter.Config]())
	slices.Sort(found)
	assert.Equal(t, known, found)
}

// Every configuration the project ships or documents still decodes: the
// READMEs' and docs' YAML examples, the configs at the top of the
// repository, under deploy/, the end-to-end tests' and the demo's. None of
// their keys is refused.
func TestShippedConfigsDecode(t *testing.T) {
	root := filepath.Join("..", "..")
	var docs, configs []string
	for _, pattern := range []string{"*.md", "docs/*.md", "deploy/*.md", "*/*/README.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		require.NoError(t, err)
		docs = append(docs, m...)
	}
	for _, pattern := range []string{"*.yaml", "deploy/*.yaml", "deploy/llm-d/*.yaml", "internal/harness/e2e/testdata/*.yaml", "cmd/llmdemo/internal/demo/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		require.NoError(t, err)
		configs = append(configs, m...)
	}
	type source struct{ name, yaml string }
	var sources []source
	for _, path := range docs {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		for i, block := range yamlBlock.FindAllSubmatch(b, -1) {
			sources = append(sources, source{fmt.Sprintf("%s block %d", path, i), string(block[1])})
		}
	}
	for _, path := range configs {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		sources = append(sources, source{path, string(b)})
	}

	factories := map[string]func() component.Config{
		"receivers::token_stream":   tokenstreamreceiver.NewFactory().CreateDefaultConfig,
		"processors::token_session": tokensessionprocessor.NewFactory().CreateDefaultConfig,
		"exporters::engine_health":  enginehealthexporter.NewFactory().CreateDefaultConfig,
	}
	decoded := map[string]int{}
	for _, src := range sources {
		retrieved, err := confmap.NewRetrievedFromYAML([]byte(src.yaml))
		if err != nil {
			continue // not YAML: a fragment with placeholders
		}
		conf, err := retrieved.AsConf()
		require.NoError(t, err)
		for prefix, createDefault := range factories {
			kind, typ, _ := strings.Cut(prefix, "::")
			ids, _ := conf.Get(kind).(map[string]any)
			for id := range ids {
				if id != typ && !strings.HasPrefix(id, typ+"/") {
					continue
				}
				sub, err := conf.Sub(kind + "::" + id)
				require.NoError(t, err)
				cfg := createDefault()
				// A value read from the environment (${env:BASE_TIME}) is
				// left as it is written, and fails to decode where it is no
				// string; its key is still checked.
				if err := sub.Unmarshal(&cfg); err != nil {
					assert.NotContains(t, err.Error(), "invalid keys", "%s: %s::%s", src.name, kind, id)
				}
				decoded[typ]++
			}
		}
	}
	t.Log(decoded)
	for _, typ := range []string{"token_stream", "token_session", "engine_health"} {
		assert.Positive(t, decoded[typ], typ)
	}
}

var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")
