// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEjectionAfterEngineChurn: issue 38's finding, through the binary with
// the default token_session and engine_health settings. 1 500 engine names
// (pod churn over a collector's life, or one hook client on purpose) each
// end a session: more than token_session's metrics::max_engines (100) and
// engine_health's 1024. Then a real engine fails every request beside a
// healthy one, and must be judged and ejected. Before, with cumulative
// session metrics re-sent at every flush, no engine was ever forgotten: the
// judge stayed full of made-up names and answered the real engine 404, and
// token_session kept the new engine's sessions under _OTHER (or the
// overflow series) until the names before it were forgotten.
func TestEjectionAfterEngineChurn(t *testing.T) {
	healthAddr := freePort(t, "tcp")
	col := startCollector(t, "ejection.yaml", "", "HEALTH_ENDPOINT="+healthAddr)
	url := "http://" + col.httpAddr + "/v1/token-events"
	ms := uint64(time.Millisecond)
	sessions := func(prefix, engine, end string, n int) []string {
		base := uint64(time.Now().UnixNano())
		lines := make([]string, 0, 3*n)
		for i := range n {
			id := fmt.Sprintf("%s-%d", prefix, i)
			e := engine
			if e == "" {
				e = id
			}
			lines = append(lines,
				fmt.Sprintf(`{"event":"start","session_id":%q,"time_unix_nano":%d,"model":"m","operation":"chat","engine":%q}`, id, base, e),
				fmt.Sprintf(`{"event":"token","session_id":%q,"time_unix_nano":%d}`, id, base+20*ms),
				fmt.Sprintf(`{"event":"end","session_id":%q,"time_unix_nano":%d,"completion_tokens":1%s}`, id, base+30*ms, end))
		}
		return lines
	}
	for batch := range 3 {
		postLines(t, url, sessions(fmt.Sprint("junk", batch), "", "", 500)...)
	}
	state := func(engine string) string {
		r, err := http.Get("http://" + healthAddr + "/engines/" + engine + "/health")
		if err != nil {
			return err.Error()
		}
		defer r.Body.Close()
		var st struct {
			State string `json:"state"`
		}
		if r.StatusCode == http.StatusNotFound {
			return "unknown"
		}
		if err := json.NewDecoder(r.Body).Decode(&st); err != nil {
			return err.Error()
		}
		return st.State
	}
	// The made-up names reach the judge (one flush, 15 s at most): the
	// first 100, the rest under _OTHER.
	require.Eventually(t, func() bool {
		r, err := http.Get("http://" + healthAddr + "/engines")
		if err != nil {
			return false
		}
		defer r.Body.Close()
		var engines []json.RawMessage
		return json.NewDecoder(r.Body).Decode(&engines) == nil && len(engines) == 100
	}, 40*time.Second, 100*time.Millisecond, "100 engines known")

	// The real engine fails every request, the other serves them, a batch
	// a second, until the real one is out: at most three flushes. Each
	// takes the place of a made-up name idle since the last flush; the
	// first point of a cumulative series that started before the window
	// (at the flush before, 15 s earlier) only sets its base.
	deadline := time.Now().Add(60 * time.Second)
	last := ""
	for i := 0; time.Now().Before(deadline); i++ {
		lines := sessions(fmt.Sprint("real", i), "real-engine", `,"error":"500"`, 5)
		lines = append(lines, sessions(fmt.Sprint("ok", i), "healthy-engine", "", 5)...)
		postLines(t, url, lines...)
		if last = state("real-engine"); last == "ejected" {
			break
		}
		time.Sleep(time.Second)
	}
	require.Equal(t, "ejected", last, "a real engine failing every request after 1 500 engine names")
	require.Equal(t, "healthy", state("healthy-engine"))
}
