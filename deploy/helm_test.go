// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// helmChart is the chart version deploy/helm/values.yaml targets; its
// values.yaml and values.schema.json are vendored in deploy/helm/testdata.
const helmChart = "opentelemetry-collector 0.170.0"

func readYAML(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, yaml.Unmarshal(data, &v), path)
	return v
}

// coalesce merges values over defaults as Helm does: maps merge key by key,
// anything else is replaced, and a null removes the default.
func coalesce(defaults, values map[string]any) map[string]any {
	out := make(map[string]any, len(defaults))
	for k, v := range defaults {
		out[k] = v
	}
	for k, v := range values {
		if v == nil {
			delete(out, k)
			continue
		}
		dm, dok := out[k].(map[string]any)
		vm, vok := v.(map[string]any)
		if dok && vok {
			out[k] = coalesce(dm, vm)
			continue
		}
		out[k] = v
	}
	return out
}

// TestHelmValues validates deploy/helm/values.yaml, merged over the chart's
// own values as Helm merges them, against the chart's values.schema.json,
// and checks what the chart does with it: a DaemonSet of the otelcol-llm
// binary running deploy/agent-config.yaml, with the ports and variables it
// needs.
// chartValues merges values files over the chart's own values, as Helm
// does with -f, and validates the result with the chart's schema.
func chartValues(t *testing.T, files ...string) map[string]any {
	t.Helper()
	merged := readYAML(t, filepath.Join("helm", "testdata", "values.yaml"))
	for _, f := range files {
		merged = coalesce(merged, readYAML(t, filepath.Join("helm", f)))
	}
	schema := chartSchema(t)
	raw, err := json.Marshal(merged)
	require.NoError(t, err)
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
	require.NoError(t, err)
	require.NoError(t, schema.Validate(doc), "%v are valid for %s", files, helmChart)
	return merged
}

func chartSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	schemaData, err := os.ReadFile(filepath.Join("helm", "testdata", "values.schema.json"))
	require.NoError(t, err)
	schemaDoc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(schemaData)))
	require.NoError(t, err)
	// The chart's schema names the generic meta-schema URL; the chart's own
	// tests validate it as draft 7.
	schemaDoc.(map[string]any)["$schema"] = "http://json-schema.org/draft-07/schema#"
	c := jsonschema.NewCompiler()
	require.NoError(t, c.AddResource("values.schema.json", schemaDoc))
	schema, err := c.Compile("values.schema.json")
	require.NoError(t, err)
	return schema
}

func TestHelmValues(t *testing.T) {
	values := readYAML(t, filepath.Join("helm", "values.yaml"))
	merged := chartValues(t, "values.yaml")
	schema := chartSchema(t)

	// And the schema refuses what the chart refuses: a typo'd key.
	bad := coalesce(merged, map[string]any{"modes": "daemonset"})
	raw, err := json.Marshal(bad)
	require.NoError(t, err)
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
	require.NoError(t, err)
	require.Error(t, schema.Validate(doc), "the schema refuses unknown keys")

	assert.Equal(t, "daemonset", values["mode"])
	assert.Equal(t, "otelcol-llm", values["command"].(map[string]any)["name"], "the chart runs /otelcol-llm, the image's binary")
	// alternateConfig is deploy/agent-config.yaml.
	assert.Equal(t, readYAML(t, "agent-config.yaml"), values["alternateConfig"])

	cfg := readCollectorConfig(t, "agent-config.yaml")
	ports := map[float64]map[string]any{}
	for name, p := range merged["ports"].(map[string]any) {
		pm := p.(map[string]any)
		if pm["enabled"] == true {
			ports[pm["containerPort"].(float64)] = pm
		} else {
			assert.NotContains(t, []string{"otlp", "otlp-http", "hooks-http", "hooks-udp", "sessions", "metrics"}, name)
		}
	}
	for what, p := range cfg.ports {
		if what == "health_check" {
			continue // the chart adds its probes' port itself
		}
		require.Contains(t, ports, float64(p), "%s (%d) is an enabled port", what, p)
		assert.Equal(t, "TCP", ports[float64(p)]["protocol"], what)
	}
	for what, p := range cfg.udpPorts {
		require.Contains(t, ports, float64(p), "%s (%d/udp) is an enabled port", what, p)
		assert.Equal(t, "UDP", ports[float64(p)]["protocol"], what)
	}
	for _, what := range []string{"hooks http", "otlp grpc", "otlp http"} {
		assert.Equal(t, float64(cfg.ports[what]), ports[float64(cfg.ports[what])]["hostPort"], "%s on the node", what)
	}
	assert.Equal(t, float64(cfg.udpPorts["hooks udp"]), ports[float64(cfg.udpPorts["hooks udp"])]["hostPort"])

	// Every variable the config reads: MY_POD_IP from the chart, the rest
	// from extraEnvs.
	env := []string{"MY_POD_IP"}
	for _, e := range values["extraEnvs"].([]any) {
		env = append(env, e.(map[string]any)["name"].(string))
	}
	for _, name := range cfg.env {
		assert.Contains(t, env, name, "the config reads ${env:%s}", name)
	}
	// The chart probes health_check on 13133.
	assert.Equal(t, int32(13133), cfg.health)
	// The agent is a member of the hooks' socket_group, so it may give the
	// socket to it (checkSocketAccess).
	gid, err := strconv.ParseFloat(cfg.unixSocketGroup, 64)
	require.NoError(t, err, "socket_group %q is numeric", cfg.unixSocketGroup)
	assert.Contains(t, merged["podSecurityContext"].(map[string]any)["supplementalGroups"], gid)
}

// The gateway tier's values, and the agents' overlay that joins them to it.
func TestHelmGatewayValues(t *testing.T) {
	gw := chartValues(t, "gateway-values.yaml")
	assert.Equal(t, "deployment", gw["mode"])
	assert.Equal(t, "None", gw["service"].(map[string]any)["clusterIP"], "headless")
	assert.Equal(t, readYAML(t, "gateway.yaml"), readYAML(t, filepath.Join("helm", "gateway-values.yaml"))["alternateConfig"])
	// The agents' resolver names the chart's Service: fullnameOverride in
	// the namespace of the README's helm install.
	lb := readYAML(t, "agent-lb.yaml")
	resolver := lb["exporters"].(map[string]any)["load_balancing"].(map[string]any)["resolver"].(map[string]any)["k8s"].(map[string]any)
	assert.Equal(t, gw["fullnameOverride"].(string)+".observability", resolver["service"])

	agent := chartValues(t, "values.yaml", "agent-lb-values.yaml")
	args := agent["command"].(map[string]any)["extraArgs"].([]any)
	require.Equal(t, []any{"--config=/etc/otelcol-llm-lb/agent-lb.yaml"}, args)
	mounts := map[string]string{}
	for _, vm := range agent["extraVolumeMounts"].([]any) {
		mounts[vm.(map[string]any)["name"].(string)] = vm.(map[string]any)["mountPath"].(string)
	}
	assert.Equal(t, "/etc/otelcol-llm-lb", mounts["agent-lb"])
	assert.Equal(t, "/var/lib/otelcol-llm/queue", mounts["queue"], "the overlay keeps the queue's volume")
	m := loadManifests(t, "gateway")
	var key bool
	for _, cm := range m.configMaps {
		if cm.Name == "otelcol-llm-agent-lb" {
			_, key = cm.Data["agent-lb.yaml"]
		}
	}
	assert.True(t, key, "the ConfigMap the overlay mounts has agent-lb.yaml")
}
