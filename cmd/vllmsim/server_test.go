// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const model = "meta-llama/Llama-3.1-8B-Instruct"

// startSim runs the simulator on a loopback port with fast costs and stops
// it when the test ends.
func startSim(t *testing.T, extra ...string) string {
	t.Helper()
	args := append([]string{
		"-addr", "127.0.0.1:0", "-model", model,
		"-decode-base", "1ms", "-decode-per-seq", "10us", "-prefill-per-token", "5us", "-step-overhead", "100us",
	}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, io.Discard, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		http.DefaultClient.CloseIdleConnections()
	})
	return "http://" + addr
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body)) //nolint:gosec // G107: the test server on loopback
	require.NoError(t, err)
	return resp
}

// sseData returns the data payloads of an SSE body, skipping comments.
func sseData(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, d)
		} else {
			require.True(t, line == "" || strings.HasPrefix(line, ":"), "unexpected SSE line %q", line)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// shape renders a JSON document's keys in order with value kinds, so two
// documents with the same fields, order and types have the same shape.
func shape(t *testing.T, doc string) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.UseNumber()
	var sb strings.Builder
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				sb.WriteString("{")
				for dec.More() {
					k, err := dec.Token()
					if err != nil {
						return err
					}
					sb.WriteString(k.(string) + ":")
					if err := walk(); err != nil {
						return err
					}
					sb.WriteString(",")
				}
				_, err = dec.Token()
				sb.WriteString("}")
				return err
			case '[':
				sb.WriteString("[")
				for dec.More() {
					if err := walk(); err != nil {
						return err
					}
					sb.WriteString(",")
				}
				_, err = dec.Token()
				sb.WriteString("]")
				return err
			}
		case string:
			sb.WriteString("s")
		case json.Number:
			sb.WriteString("n")
		case bool:
			sb.WriteString("b")
		case nil:
			sb.WriteString("null")
		}
		return nil
	}
	require.NoError(t, walk(), doc)
	return sb.String()
}

// fixtureStreams returns the chat and completions streams of the fixture.
func fixtureStreams(t *testing.T) (chat, text []string) {
	f, err := os.Open("../../testdata/fixtures/vllm/sse-streams.txt")
	require.NoError(t, err)
	defer f.Close()
	all := sseData(t, f)
	i := slices.Index(all, "[DONE]")
	require.GreaterOrEqual(t, i, 0, "no [DONE] in the fixture")
	return all[:i+1], all[i+1:]
}

func TestChatStreamMatchesFixture(t *testing.T) {
	base := startSim(t)
	fx, _ := fixtureStreams(t)
	require.Len(t, fx, 11) // role, 7 content, finish, usage, [DONE]

	resp := post(t, base+"/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is the capital of France?"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":8}`)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	got := sseData(t, resp.Body)
	require.Len(t, got, 11, "role + 7 words + EOS finish + usage + [DONE]: %v", got)
	assert.Equal(t, shape(t, fx[0]), shape(t, got[0]), "role chunk")
	assert.Contains(t, got[0], `"delta":{"role":"assistant","content":""}`)
	for i := 1; i <= 7; i++ {
		assert.Equal(t, shape(t, fx[i]), shape(t, got[i]), "content chunk %d", i)
	}
	assert.Equal(t, shape(t, fx[8]), shape(t, got[8]), "finish chunk")
	assert.Contains(t, got[8], `"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}`)
	assert.Equal(t, shape(t, fx[9]), shape(t, got[9]), "usage chunk")
	assert.Contains(t, got[9], `"choices":[],"usage":{"prompt_tokens":8,"total_tokens":16,"completion_tokens":8}`)
	assert.Equal(t, "[DONE]", got[10])

	var ids []string
	for _, d := range got[:10] {
		var c struct {
			ID, Object, Model string
		}
		require.NoError(t, json.Unmarshal([]byte(d), &c))
		ids = append(ids, c.ID)
		assert.Equal(t, "chat.completion.chunk", c.Object)
		assert.Equal(t, model, c.Model)
	}
	assert.Regexp(t, `^chatcmpl-[0-9a-f]{32}$`, ids[0])
	for _, id := range ids {
		assert.Equal(t, ids[0], id)
	}

	t.Run("ignore_eos finishes on a text chunk with length", func(t *testing.T) {
		resp := post(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":3,"ignore_eos":true}`)
		defer resp.Body.Close()
		got := sseData(t, resp.Body)
		require.Len(t, got, 5, "role + 3 tokens + [DONE], no usage chunk: %v", got)
		assert.Equal(t, shape(t, fx[8]), shape(t, got[3]))
		assert.Contains(t, got[3], `"finish_reason":"length","stop_reason":null`)
		assert.NotContains(t, got[3], `"content":""`)
		for _, d := range got {
			assert.NotContains(t, d, "usage")
		}
	})
}

func TestCompletionStreamMatchesFixture(t *testing.T) {
	base := startSim(t)
	_, fx := fixtureStreams(t)
	require.Len(t, fx, 5) // 3 tokens, usage, [DONE]

	resp := post(t, base+"/v1/completions", `{"model":"`+model+`","prompt":"The capital of France is","stream":true,"stream_options":{"include_usage":true},"max_tokens":3,"ignore_eos":true}`)
	defer resp.Body.Close()
	got := sseData(t, resp.Body)
	require.Len(t, got, 5, "%v", got)
	for i := range 3 {
		assert.Equal(t, shape(t, fx[i]), shape(t, got[i]), "chunk %d", i)
		assert.Regexp(t, `^\{"id":"cmpl-[0-9a-f]{32}","object":"text_completion"`, got[i])
		assert.Contains(t, got[i], `"usage":null}`)
	}
	assert.Contains(t, got[2], `"finish_reason":"length","stop_reason":null`)
	assert.Equal(t, shape(t, fx[3]), shape(t, got[3]))
	assert.Contains(t, got[3], `"choices":[],"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}`)
	assert.Equal(t, "[DONE]", got[4])

	t.Run("without include_usage", func(t *testing.T) {
		resp := post(t, base+"/v1/completions", `{"prompt":"a b","stream":true,"max_tokens":2}`)
		defer resp.Body.Close()
		got := sseData(t, resp.Body)
		require.Len(t, got, 3, "%v", got)
		assert.Contains(t, got[1], `"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":null}`)
		assert.Equal(t, "[DONE]", got[2])
	})
}

func TestNonStreaming(t *testing.T) {
	base := startSim(t)
	resp := post(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"one two three"}]}],"max_tokens":4}`)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, `{id:s,object:s,created:n,model:s,choices:[{index:n,message:{role:s,content:s,tool_calls:[],},logprobs:null,finish_reason:s,stop_reason:null,},],usage:{prompt_tokens:n,total_tokens:n,completion_tokens:n,prompt_tokens_details:null,},}`, shape(t, string(body)))
	var c struct {
		Object  string
		Choices []struct {
			Message      struct{ Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		}
	}
	require.NoError(t, json.Unmarshal(body, &c))
	assert.Equal(t, "chat.completion", c.Object)
	assert.Equal(t, "stop", c.Choices[0].FinishReason)
	assert.NotEmpty(t, c.Choices[0].Message.Content)
	assert.Equal(t, 3, c.Usage.PromptTokens)
	assert.Equal(t, 4, c.Usage.CompletionTokens)
	assert.Equal(t, 7, c.Usage.TotalTokens)

	resp2 := post(t, base+"/v1/completions", `{"prompt":["x y"],"max_tokens":2,"ignore_eos":true}`)
	defer resp2.Body.Close()
	body, err = io.ReadAll(resp2.Body)
	require.NoError(t, err)
	assert.Equal(t, `{id:s,object:s,created:n,model:s,choices:[{index:n,text:s,logprobs:null,finish_reason:s,stop_reason:null,},],usage:{prompt_tokens:n,total_tokens:n,completion_tokens:n,prompt_tokens_details:null,},}`, shape(t, string(body)))
	assert.Contains(t, string(body), `"finish_reason":"length"`)
	assert.Contains(t, string(body), `"prompt_tokens":2,"total_tokens":4,"completion_tokens":2`)
}

func TestOtherEndpointsAndErrors(t *testing.T) {
	base := startSim(t, "-max-model-len", "64")
	resp, err := http.Get(base + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	resp, err = http.Get(base + "/v1/models")
	require.NoError(t, err)
	var models struct {
		Object string
		Data   []struct{ ID, Object, OwnedBy string }
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&models))
	resp.Body.Close()
	assert.Equal(t, "list", models.Object)
	require.Len(t, models.Data, 1)
	assert.Equal(t, model, models.Data[0].ID)

	for body, code := range map[string]int{
		`{"model":"other","prompt":"x"}`:                http.StatusNotFound,
		`{"prompt":"x","max_tokens":100}`:               http.StatusBadRequest,
		`{"prompt":"x","max_tokens":0}`:                 http.StatusBadRequest,
		`not json`:                                      http.StatusBadRequest,
		`{"max_tokens":1}`:                              http.StatusBadRequest,
		`{"prompt":"x","max_tokens":1,"stream":false}`:  http.StatusOK,
		`{"prompt":"x","max_tokens":1,"stream":true}`:   http.StatusOK,
		`{"prompt":"x","max_tokens":60,"stream":false}`: http.StatusOK,
	} {
		resp := post(t, base+"/v1/completions", body)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, code, resp.StatusCode, body)
	}
}

// metrics fetches /metrics and checks it line by line: every family has
// HELP then TYPE, every sample belongs to the family just declared.
func metrics(t *testing.T, base string) (types map[string]string, samples map[string]float64, text string) {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "text/plain; version=0.0.4; charset=utf-8", resp.Header.Get("Content-Type"))
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	types, samples = parseExposition(t, string(b))
	return types, samples, string(b)
}

var sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$`)

func parseExposition(t *testing.T, text string) (map[string]string, map[string]float64) {
	t.Helper()
	types := map[string]string{}
	samples := map[string]float64{}
	var help, family string
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "# HELP "):
			help = strings.Fields(line)[2]
		case strings.HasPrefix(line, "# TYPE "):
			f := strings.Fields(line)
			require.Len(t, f, 4, line)
			require.Equal(t, help, f[2], "TYPE follows its HELP")
			family = f[2]
			types[family] = f[3]
		case strings.HasPrefix(line, "#"):
		default:
			m := sampleRE.FindStringSubmatch(line)
			require.NotNil(t, m, "bad sample line %q", line)
			name := m[1]
			require.True(t, name == family || (types[family] == "histogram" && (name == family+"_bucket" || name == family+"_count" || name == family+"_sum")),
				"sample %s outside its family %s", name, family)
			v, err := strconv.ParseFloat(m[3], 64)
			require.NoError(t, err, line)
			samples[name+m[2]] = v
		}
	}
	return types, samples
}

// buckets returns the le values of a histogram in exposition order.
func buckets(text, family string) []string {
	re := regexp.MustCompile(regexp.QuoteMeta(family) + `_bucket\{[^}]*le="([^"]+)"`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestMetricsMatchFixtureAndTraffic(t *testing.T) {
	base := startSim(t)
	fixture, err := os.ReadFile("../../testdata/fixtures/vllm/metrics-v1.prom")
	require.NoError(t, err)
	fxTypes, _ := parseExposition(t, string(fixture))

	// Traffic: prompts of known word counts, known outputs.
	type call struct {
		path, body       string
		prompt, max      int
		length           bool
		stream, withUsag bool
	}
	calls := []call{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"one two three four"}],"max_tokens":5,"stream":true}`, 4, 5, false, true, false},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"one two"}],"max_tokens":7,"ignore_eos":true}`, 2, 7, true, false, false},
		{"/v1/completions", `{"prompt":"a b c d e f","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`, 6, 3, false, true, true},
		{"/v1/completions", `{"prompt":"a","max_tokens":1,"ignore_eos":true}`, 1, 1, true, false, false},
	}
	var prompt, gen, stops, lengths, itl int
	done := make(chan struct{}, len(calls))
	for _, c := range calls {
		prompt += c.prompt
		gen += c.max
		itl += c.max - 1
		if c.length {
			lengths++
		} else {
			stops++
		}
		go func() {
			defer func() { done <- struct{}{} }()
			resp, err := http.Post(base+c.path, "application/json", strings.NewReader(c.body))
			if !assert.NoError(t, err) {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	for range calls {
		<-done
	}

	// The engine counts a request finished after its last byte left, so a
	// client can be done before the counters are: read /metrics until the
	// last request is counted (a busy machine widens that gap).
	l := `{engine="0",model_name="` + model + `"}`
	var (
		types map[string]string
		s     map[string]float64
		text  string
	)
	require.Eventually(t, func() bool {
		types, s, text = metrics(t, base)
		return s["vllm:e2e_request_latency_seconds_count"+l] == float64(len(calls)) && s["vllm:num_requests_running"+l] == 0
	}, 10*time.Second, 10*time.Millisecond, "every request counted finished")
	for name, typ := range fxTypes {
		assert.Equal(t, typ, types[name], "family %s", name)
	}
	assert.Len(t, types, len(fxTypes), "same families as the fixture")
	for name, typ := range fxTypes {
		if typ == "histogram" {
			assert.Equal(t, buckets(string(fixture), name), buckets(text, name), "buckets of %s", name)
		}
	}
	// Same label sets, same order, as the fixture for a few key series.
	for _, prefix := range []string{`vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name=`, `vllm:request_success_total{engine="0",finished_reason="stop",model_name=`, `vllm:num_requests_running{engine="0",model_name=`} {
		assert.Contains(t, string(fixture), prefix)
		assert.Contains(t, text, prefix)
	}

	r := func(reason string) string {
		return `{engine="0",finished_reason="` + reason + `",model_name="` + model + `"}`
	}
	assert.Equal(t, float64(prompt), s["vllm:prompt_tokens_total"+l])
	assert.Equal(t, float64(gen), s["vllm:generation_tokens_total"+l])
	assert.Equal(t, float64(stops), s["vllm:request_success_total"+r("stop")])
	assert.Equal(t, float64(lengths), s["vllm:request_success_total"+r("length")])
	assert.Zero(t, s["vllm:request_success_total"+r("abort")])
	assert.Zero(t, s["vllm:num_preemptions_total"+l])
	assert.Zero(t, s["vllm:num_requests_running"+l])
	assert.Zero(t, s["vllm:num_requests_waiting"+l])
	assert.Zero(t, s["vllm:kv_cache_usage_perc"+l])
	n := float64(len(calls))
	for _, h := range []string{"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_time_per_output_token_seconds", "vllm:request_queue_time_seconds"} {
		assert.Equal(t, n, s[h+"_count"+l], h)
		assert.Equal(t, n, s[h+`_bucket{engine="0",le="+Inf",model_name="`+model+`"}`], h)
	}
	assert.Equal(t, float64(itl), s["vllm:inter_token_latency_seconds_count"+l])
	assert.Equal(t, float64(prompt), s["vllm:request_prompt_tokens_sum"+l])
	assert.Equal(t, float64(gen), s["vllm:request_generation_tokens_sum"+l])
	assert.Positive(t, s["vllm:time_to_first_token_seconds_sum"+l])
	// Buckets are cumulative.
	var prev float64
	for _, le := range buckets(text, "vllm:e2e_request_latency_seconds") {
		v := s[`vllm:e2e_request_latency_seconds_bucket{engine="0",le="`+le+`",model_name="`+model+`"}`]
		assert.GreaterOrEqual(t, v, prev)
		prev = v
	}
}

func TestClientDisconnectAborts(t *testing.T) {
	base := startSim(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"go on"}],"max_tokens":2000,"stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	for range 3 { // role chunk, blank, first token
		_, err := br.ReadString('\n')
		require.NoError(t, err)
	}
	_, s, _ := metrics(t, base)
	l := `{engine="0",model_name="` + model + `"}`
	assert.Equal(t, 1.0, s["vllm:num_requests_running"+l])
	assert.Positive(t, s["vllm:kv_cache_usage_perc"+l])
	cancel()
	resp.Body.Close()

	abort := `vllm:request_success_total{engine="0",finished_reason="abort",model_name="` + model + `"}`
	require.Eventually(t, func() bool {
		_, s, _ := metrics(t, base)
		return s[abort] == 1 && s["vllm:num_requests_running"+l] == 0 && s["vllm:kv_cache_usage_perc"+l] == 0
	}, 5*time.Second, 10*time.Millisecond)
	_, s, _ = metrics(t, base)
	assert.Less(t, s["vllm:generation_tokens_total"+l], 2000.0, "generation stopped")
}

func TestShutdownEndsOpenStreams(t *testing.T) {
	args := []string{"-addr", "127.0.0.1:0", "-decode-base", "1ms"}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, io.Discard, ready) }()
	base := "http://" + <-ready
	resp := post(t, base+"/v1/completions", `{"prompt":"x","max_tokens":3000,"stream":true}`)
	br := bufio.NewReader(resp.Body)
	_, err := br.ReadString('\n')
	require.NoError(t, err)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("run did not stop")
	}
	rest, _ := io.ReadAll(br)
	assert.NotContains(t, string(rest), "[DONE]", "stream cut, not completed")
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
}

func TestFlags(t *testing.T) {
	o, err := parseFlags([]string{
		"-profile", "fp8", "-kv-blocks", "100", "-max-num-seqs", "8", "-chunked-prefill=false",
		"-max-num-batched-tokens", "512", "-prefill-priority", "-seed", "9", "-decode-base", "20ms", "-hook", "udp://127.0.0.1:4321",
	}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8000", o.addr)
	assert.Equal(t, "fp8", o.cfg.Profile)
	assert.Equal(t, 100, o.cfg.KVBlocks)
	assert.Equal(t, 8, o.cfg.MaxNumSeqs)
	assert.False(t, o.cfg.ChunkedPrefill)
	assert.Equal(t, o.cfg.MaxModelLen, o.cfg.MaxNumBatchedTokens, "raised to max-model-len without chunked prefill")
	assert.True(t, o.cfg.PrefillPriority)
	assert.Equal(t, uint64(9), o.cfg.Seed)
	assert.Equal(t, 20*time.Millisecond, o.cfg.Cost.DecodeBase)
	assert.Equal(t, "udp://127.0.0.1:4321", o.hook)

	err = run(context.Background(), []string{"-profile", "int4"}, io.Discard, nil)
	assert.ErrorContains(t, err, "profile")
}

// The exposition parses with the Prometheus library the collector's vllm
// source uses, with the fixture's families and types.
func TestMetricsParseWithExpfmt(t *testing.T) {
	base := startSim(t)
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"a b c","max_tokens":3}`))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp, err = http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	fams := decodeExposition(t, resp.Body)
	fixture, err := os.Open("../../testdata/fixtures/vllm/metrics-v1.prom")
	require.NoError(t, err)
	defer fixture.Close()
	for name, fam := range decodeExposition(t, fixture) {
		got, ok := fams[name]
		if assert.True(t, ok, "family %s missing", name) {
			assert.Equal(t, fam.GetType(), got.GetType(), name)
		}
	}
	assert.Equal(t, 3.0, fams["vllm:generation_tokens_total"].GetMetric()[0].GetCounter().GetValue())
}

func decodeExposition(t *testing.T, r io.Reader) map[string]*dto.MetricFamily {
	t.Helper()
	dec := expfmt.NewDecoder(r, expfmt.NewFormat(expfmt.TypeTextPlain))
	fams := map[string]*dto.MetricFamily{}
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			return fams
		}
		require.NoError(t, err)
		fams[mf.GetName()] = mf
	}
}

// POST /admin/degrade makes the replica's streams freeze mid-decode (a
// lower bound on the longest gap: it cannot pass by the machine being slow);
// POST /admin/heal ends it.
func TestAdminDegradeAndHeal(t *testing.T) {
	base := startSim(t)
	maxGap := func() time.Duration {
		resp := post(t, base+"/v1/chat/completions",
			`{"model":"`+model+`","stream":true,"max_tokens":24,"messages":[{"role":"user","content":"hi"}]}`)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		br := bufio.NewReader(resp.Body)
		var last time.Time
		var gap time.Duration
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				break
			}
			if !strings.HasPrefix(line, "data: ") {
				continue
			}
			if now := time.Now(); !last.IsZero() {
				gap = max(gap, now.Sub(last))
			}
			last = time.Now()
		}
		return gap
	}

	resp := post(t, base+"/admin/degrade?freeze=300ms&every=8", "")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.JSONEq(t, `{"freeze":"300ms","every":8}`, string(body))
	assert.GreaterOrEqual(t, maxGap(), 300*time.Millisecond, "a decode step froze mid-stream")

	resp = post(t, base+"/admin/heal", "")
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.JSONEq(t, `{"freeze":"0s","every":0}`, string(body))
	// (That a healed engine's steps cost what they did is the engine's test.)

	for _, q := range []string{"freeze=soon", "freeze=1s&every=0", "freeze=1s&every=x"} {
		resp = post(t, base+"/admin/degrade?"+q, "")
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, q)
	}
}
