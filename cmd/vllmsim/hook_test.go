// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHookSendsTokenEvents(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer pc.Close()
	base := startSim(t, "-hook", "udp://"+pc.LocalAddr().String(), "-profile", "fp8")

	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"a b c","max_tokens":3}`))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	type event struct {
		Event            string            `json:"event"`
		SessionID        string            `json:"session_id"`
		TimeUnixNano     int64             `json:"time_unix_nano"`
		PromptTokens     int               `json:"prompt_tokens"`
		CompletionTokens int               `json:"completion_tokens"`
		FinishReason     string            `json:"finish_reason"`
		Operation        string            `json:"operation"`
		Attributes       map[string]string `json:"attributes"`
	}
	var got []event
	buf := make([]byte, 65536)
	deadline := time.Now().Add(5 * time.Second)
	for len(got) == 0 || got[len(got)-1].Event != "end" {
		require.NoError(t, pc.SetReadDeadline(deadline))
		n, _, err := pc.ReadFrom(buf)
		require.NoError(t, err, "events so far: %+v", got)
		for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
			var ev event
			require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
			got = append(got, ev)
		}
	}
	require.Len(t, got, 5, "start, 3 tokens, end: %+v", got)
	assert.Equal(t, "start", got[0].Event)
	assert.Equal(t, 3, got[0].PromptTokens)
	assert.Equal(t, "text_completion", got[0].Operation)
	assert.Equal(t, "fp8", got[0].Attributes["quantization"])
	assert.True(t, strings.HasPrefix(got[0].SessionID, "cmpl-"))
	for i, ev := range got[1:4] {
		assert.Equal(t, "token", ev.Event)
		assert.Equal(t, got[0].SessionID, ev.SessionID)
		assert.Greater(t, ev.TimeUnixNano, got[i].TimeUnixNano, "times increase")
	}
	assert.Equal(t, "end", got[4].Event)
	assert.Equal(t, 3, got[4].CompletionTokens)
	assert.Equal(t, "stop", got[4].FinishReason)
}
