// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// churner stands for months of pod churn, compressed: beside the load it
// ends, through the HTTP hook, sessions whose engine, model and tenant are
// each a name never seen before, rate names a second. With -churn the
// collector also runs engine_health on token_session's metrics with its
// times compressed (collectorConfig), so that what a collector forgets over
// hours is forgotten within the run; at the end, probeEjection checks that
// a failing engine is still ejected.
type churner struct {
	url  string
	rate int
	// posted are the sessions the hook took (answered 200); failed the
	// batches it did not.
	posted, failed int
}

// churnBatchEvery is how often the churner posts a batch of new names.
const churnBatchEvery = 100 * time.Millisecond

func (c *churner) run(ctx context.Context) {
	perBatch := max(c.rate*int(churnBatchEvery)/int(time.Second), 1)
	tick := time.NewTicker(churnBatchEvery)
	defer tick.Stop()
	client := &http.Client{Timeout: 10 * time.Second}
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		lines := make([]string, 0, 3*perBatch)
		base := time.Now().UnixNano()
		for range perBatch {
			n++
			lines = append(lines, hookSession(fmt.Sprintf("churn-%d", n), base, fmt.Sprintf("churn-engine-%d", n),
				fmt.Sprintf("churn-model-%d", n), fmt.Sprintf("churn-tenant-%d", n), "")...)
		}
		if postHook(ctx, client, c.url, lines) == nil {
			c.posted += perBatch
		} else {
			c.failed++
		}
	}
}

// hookSession is the hook lines of one session: a start, a token 20 ms
// later and an end (with errorType, when not empty, as its error).
func hookSession(id string, base int64, engine, model, tenant, errorType string) []string {
	end := ""
	if errorType != "" {
		end = fmt.Sprintf(`,"error":%q`, errorType)
	}
	ms := int64(time.Millisecond)
	return []string{
		fmt.Sprintf(`{"event":"start","session_id":%q,"time_unix_nano":%d,"model":%q,"operation":"chat","engine":%q,"attributes":{"tenant.id":%q}}`,
			id, base, model, engine, tenant),
		fmt.Sprintf(`{"event":"token","session_id":%q,"time_unix_nano":%d}`, id, base+20*ms),
		fmt.Sprintf(`{"event":"end","session_id":%q,"time_unix_nano":%d,"completion_tokens":1%s}`, id, base+30*ms, end),
	}
}

func postHook(ctx context.Context, client *http.Client, url string, lines []string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("hook answered %s", resp.Status)
	}
	return nil
}

// ejectionProbe is what probeEjection saw.
type ejectionProbe struct {
	Ejected bool    `json:"ejected"`
	AfterS  float64 `json:"after_s"`
	State   string  `json:"last_state"`
	// Sessions are the probe's sessions the hook took.
	Sessions int `json:"sessions"`
}

// probeEjection ends, every second, five sessions of an engine that fails
// every request and five of a healthy one, until engine_health ejects the
// failing one or timeout passes.
func probeEjection(ctx context.Context, hookURL, healthAddr string, timeout time.Duration) ejectionProbe {
	client := &http.Client{Timeout: 5 * time.Second}
	var p ejectionProbe
	start := time.Now()
	for i := 0; time.Since(start) < timeout && ctx.Err() == nil; i++ {
		base := time.Now().UnixNano()
		var lines []string
		for j := range 5 {
			lines = append(lines, hookSession(fmt.Sprintf("probe-bad-%d-%d", i, j), base, "probe-failing", "probe-model", "probe", "500")...)
			lines = append(lines, hookSession(fmt.Sprintf("probe-ok-%d-%d", i, j), base, "probe-healthy", "probe-model", "probe", "")...)
		}
		if postHook(ctx, client, hookURL, lines) == nil {
			p.Sessions += 10
		}
		p.State = engineState(client, healthAddr, "probe-failing")
		if p.State == "ejected" {
			p.Ejected, p.AfterS = true, time.Since(start).Seconds()
			return p
		}
		time.Sleep(time.Second)
	}
	p.AfterS = time.Since(start).Seconds()
	return p
}

// engineState is engine_health's state of engine: healthy, ejected,
// unknown (404) or what went wrong.
func engineState(client *http.Client, healthAddr, engine string) string {
	resp, err := client.Get("http://" + healthAddr + "/engines/" + engine + "/health")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return "unknown"
	}
	var st struct {
		State string `json:"state"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return err.Error()
	}
	return st.State
}
