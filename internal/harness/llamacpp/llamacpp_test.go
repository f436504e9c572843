// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		Cleanup()
		os.Exit(code)
	}))
}

// TestServerAnswers: the built llama-server serves the tiny model: a chat
// answer of exactly max_tokens tokens with usage and llama.cpp's timings,
// and its /metrics page.
func TestServerAnswers(t *testing.T) {
	s := Start(t, Options{})
	assert.Regexp(t, `^v\d+\.\d+\.\d+ [0-9a-f]{40}$`, Release(t))
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	resp, err := client.Post(s.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"hello"}],"max_tokens":7,"ignore_eos":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var answer struct {
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Timings struct {
			PredictedN int `json:"predicted_n"`
		} `json:"timings"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	assert.Equal(t, 7, answer.Usage.CompletionTokens)
	assert.Equal(t, 7, answer.Timings.PredictedN)
	assert.Positive(t, answer.Usage.PromptTokens)

	resp, err = client.Get(s.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^llamacpp:tokens_predicted_total 7$`, string(page))
}
