// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"
)

// The answer to a batch taken whole is written by hand on the hot path; it
// must be the answer writeResponse encodes, headers included.
func TestWriteAcceptedIsWriteResponse(t *testing.T) {
	for _, n := range []int{1, 42, 1000, 1 << 40} {
		fast, slow := httptest.NewRecorder(), httptest.NewRecorder()
		writeAccepted(fast, n)
		writeResponse(slow, http.StatusOK, &batchResponse{Accepted: n})
		assert.Equal(t, slow.Code, fast.Code)
		assert.Equal(t, slow.Body.String(), fast.Body.String())
		assert.Equal(t, slow.Header(), fast.Header())
	}
}

func TestNDJSONContentType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/x-ndjson":                true,
		"application/x-ndjson; charset=utf-8": true,
		"Application/JSON":                    true,
		"text/plain":                          false,
		"":                                    false,
		"application/x-ndjson; =":             false,
	} {
		assert.Equal(t, want, ndjsonContentType(ct), ct)
	}
}

// The answer to a batch that broke a limit (cut at max_lines_per_batch,
// over max_request_body_size) states the limits, named as their
// configuration keys, so that a client can keep within them; the other
// answers are as they were.
func TestHTTPAnswerStatesLimits(t *testing.T) {
	tr := startReceiver(t, new(consumertest.LogsSink), func(c *Config) {
		c.Hooks.HTTP.Get().ServerConfig.MaxRequestBodySize = 1024
		c.Hooks.Limits.MaxLinesPerBatch = 2
		c.Hooks.Limits.MaxLineBytes = 512
	})
	want := &hookLimits{MaxLinesPerBatch: 2, MaxLineBytes: 512, MaxRequestBodySize: 1024}
	raw := func(body string) (int, string) {
		resp, err := http.Post(tr.url, "application/x-ndjson", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	status, body := raw(tok1 + "\n" + tok1 + "\n" + tok1 + "\n")
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, `{"accepted":2,"rejected":1,"errors":[{"line":3,"message":"batch holds more than 2 lines: this line and the 0 after it not read"}],`+
		`"limits":{"max_lines_per_batch":2,"max_line_bytes":512,"max_request_body_size":1024}}`+"\n", body)

	status, _, resp := post(t, tr.url, "application/x-ndjson", strings.Repeat(tok1+"\n", 20))
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
	assert.Equal(t, "body larger than max_request_body_size (1024 bytes)", resp.Error)
	assert.Equal(t, want, resp.Limits)

	for _, b := range []string{"{}\n", tok1 + "\n{}\n", tok1 + "\n" + strings.Repeat("x", 600) + "\n"} {
		_, _, resp = post(t, tr.url, "application/x-ndjson", b)
		assert.Nil(t, resp.Limits, "no limit broken but a line's: %q", b)
	}
	status, body = raw(tok1 + "\n" + tok2 + "\n")
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, `{"accepted":2,"rejected":0,"errors":[]}`+"\n", body)

	// max_request_body_size 0 is confighttp's default, stated as the
	// number confighttp enforces (it writes it into the config it serves).
	tr = startReceiver(t, new(consumertest.LogsSink), func(c *Config) {
		c.Hooks.HTTP.Get().ServerConfig.MaxRequestBodySize = 0
		c.Hooks.Limits.MaxLinesPerBatch = 1
	})
	_, _, resp = post(t, tr.url, "application/x-ndjson", tok1+"\n"+tok1+"\n")
	require.NotNil(t, resp.Limits)
	assert.Equal(t, int64(confighttpDefaultBodyBytes), resp.Limits.MaxRequestBodySize)
	assert.Equal(t, tr.r.cfg.Hooks.HTTP.Get().ServerConfig.MaxRequestBodySize, resp.Limits.MaxRequestBodySize)
}
