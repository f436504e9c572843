// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// unknownKeyConfig is a complete config whose one component section is
// given; the pipeline uses all three components.
const unknownKeyConfig = `
receivers:
  token_stream:
%s
processors:
  token_session:
%s
exporters:
  engine_health:
%s
service:
  pipelines:
    logs:
      receivers: [token_stream]
      processors: [token_session]
      exporters: [engine_health]
`

// TestValidateRefusesUnknownKeys: a misspelled key, in a section the
// collector itself leaves unchecked (one with confighttp's settings, or
// below one), fails `validate` and start-up alike, naming the component and
// the key's path.
func TestValidateRefusesUnknownKeys(t *testing.T) {
	bin := testbin.Collector(t)
	const (
		receiver  = "    hooks:\n      http:\n        endpoint: localhost:0\n"
		processor = "    window: 10\n"
		exporter  = "    endpoint: localhost:0\n"
	)
	for _, tc := range []struct {
		name, receiver, processor, exporter, want string
	}{
		{
			"hooks::http::bogus_http",
			"    hooks:\n      http:\n        endpoint: localhost:0\n        bogus_http: 1\n", processor, exporter,
			`'' has invalid keys: hooks::http::bogus_http`,
		},
		{
			"proxy::stall::max_gpa",
			"    proxy:\n      endpoint: localhost:0\n      upstream:\n        endpoint: http://localhost:1\n      stall:\n        max_gpa: 2s\n",
			processor, exporter,
			`'' has invalid keys: proxy::stall::max_gpa`,
		},
		{
			"live::max_viewer",
			receiver, "    live:\n      endpoint: localhost:0\n      max_viewer: 2\n", exporter,
			`'' has invalid keys: live::max_viewer`,
		},
		{
			"eject::stall_ratoi",
			receiver, processor, "    endpoint: localhost:0\n    eject:\n      stall_ratoi: 0.5\n",
			`'' has invalid keys: eject::stall_ratoi`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			config := fmt.Appendf(nil, unknownKeyConfig, tc.receiver, tc.processor, tc.exporter)
			require.NoError(t, os.WriteFile(path, config, 0o600))

			out, err := exec.Command(bin, "validate", "--config", path).CombinedOutput()
			require.Error(t, err, "validate accepted a misspelled key:\n%s", config)
			assert.Contains(t, string(out), tc.want)

			// Start-up decodes the config the same way, and stops before
			// anything listens. The deadline only bounds a collector that
			// wrongly started.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err = exec.CommandContext(ctx, bin, "--config", path).CombinedOutput()
			require.Error(t, err)
			require.NoError(t, ctx.Err(), "the collector started with a misspelled key:\n%s", out)
			assert.Contains(t, string(out), tc.want)
		})
	}
}
