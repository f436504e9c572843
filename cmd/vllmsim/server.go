// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/otelcol-llm/otelcol-llm/cmd/vllmsim/internal/sim"
)

// server is the HTTP layer: vLLM's OpenAI-compatible endpoints over an
// Engine.
type server struct {
	eng              *sim.Engine
	model            string
	defaultMaxTokens int
	now              func() time.Time
	// perRequestMetrics adds vLLM's per-request timing object to the final
	// usage chunk and to whole responses (--enable-per-request-metrics).
	perRequestMetrics bool
	// tenantHeader names the request header read into the request's tenant
	// (the attribution truth's label); gpu, when set, adds the DCGM-shaped
	// power series to /metrics.
	tenantHeader string
	gpu          *sim.GPU
}

func newServer(eng *sim.Engine, defaultMaxTokens int) *server {
	return &server{eng: eng, model: eng.Config().Model, defaultMaxTokens: defaultMaxTokens, now: time.Now}
}

func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.completion(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.completion(w, r, false) })
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /admin/degrade", s.degradation)
	mux.HandleFunc("POST /admin/degrade", s.degrade)
	mux.HandleFunc("POST /admin/heal", func(w http.ResponseWriter, r *http.Request) {
		_ = s.eng.Degrade(sim.Degradation{})
		s.degradation(w, r)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if s.eng.WriteMetrics(w) == nil && s.gpu != nil {
			_ = s.eng.WriteDCGM(w, *s.gpu)
		}
	})
	return mux
}

// request is the subset of the OpenAI request body the simulator reads.
type request struct {
	Model               string          `json:"model"`
	Messages            []message       `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	IgnoreEOS bool `json:"ignore_eos"`
}

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// countWords counts the words of a JSON string, array of strings, or array
// of content parts ({"type":"text","text":...}).
func countWords(raw json.RawMessage) int {
	if len(raw) == 0 {
		return 0
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return len(strings.Fields(s))
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return 0
	}
	n := 0
	for _, it := range items {
		var part struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(it, &part) == nil && part.Text != "" {
			n += len(strings.Fields(part.Text))
			continue
		}
		n += countWords(it)
	}
	return n
}

type errorBody struct {
	Object  string `json:"object"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    int    `json:"code"`
}

func writeError(w http.ResponseWriter, code int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(errorBody{Object: "error", Message: msg, Type: typ, Code: code})
}

func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (s *server) completion(w http.ResponseWriter, r *http.Request, chat bool) {
	arrival := s.now()
	var req request
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
		return
	}
	if req.Model != "" && req.Model != s.model {
		writeError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	prompt := 0
	if chat {
		if len(req.Messages) == 0 {
			writeError(w, http.StatusBadRequest, "BadRequestError", "messages must not be empty")
			return
		}
		for _, m := range req.Messages {
			prompt += countWords(m.Content)
		}
	} else {
		if len(req.Prompt) == 0 {
			writeError(w, http.StatusBadRequest, "BadRequestError", "prompt is required")
			return
		}
		prompt = countWords(req.Prompt)
	}
	maxTokens := s.defaultMaxTokens
	if chat && req.MaxCompletionTokens != nil {
		maxTokens = *req.MaxCompletionTokens
	} else if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	prefix, object := "cmpl-", "text_completion"
	if chat {
		prefix, object = "chatcmpl-", "chat.completion"
	}
	id := newID(prefix)
	op := "text_completion"
	if chat {
		op = "chat"
	}
	sreq, err := s.eng.Submit(id, sim.Params{
		PromptTokens: max(prompt, 1), MaxTokens: maxTokens, IgnoreEOS: req.IgnoreEOS, Operation: op,
		TraceParent: r.Header.Get("traceparent"), Tenant: s.tenant(r),
	}, arrival)
	if err != nil {
		code := http.StatusBadRequest
		if errors.Is(err, sim.ErrStopped) {
			code = http.StatusServiceUnavailable
		}
		writeError(w, code, "BadRequestError", err.Error())
		return
	}
	usage := usageInfo{PromptTokens: sreq.Params.PromptTokens}
	c := chunker{id: id, created: arrival.Unix(), model: s.model}
	if !req.Stream {
		s.whole(w, r, sreq, chat, object, c, usage)
		return
	}

	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	send := func(v any) bool {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	first := true
	for {
		select {
		case <-r.Context().Done():
			s.eng.Abort(sreq, s.now())
			return
		case ev, ok := <-sreq.Events():
			if !ok {
				return // aborted or engine stopped: the stream just ends
			}
			usage.CompletionTokens = ev.Index
			var out []any
			if chat {
				if first {
					out = append(out, c.chat(delta{Role: "assistant"}, ""))
				}
				out = append(out, c.chat(delta{Content: ev.Text}, ev.Finish))
			} else {
				out = append(out, c.text(ev.Text, ev.Finish))
			}
			first = false
			if ev.Finish != "" && includeUsage {
				usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
				out = append(out, usageChunk{
					ID: id, Object: c.object(chat), Created: c.created, Model: s.model, Choices: []struct{}{}, Usage: usage,
					Metrics: s.metricsOf(sreq),
				})
			}
			for _, v := range out {
				if !send(v) {
					s.eng.Abort(sreq, s.now())
					return
				}
			}
			if ev.Finish != "" {
				_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
				_ = rc.Flush()
				return
			}
		}
	}
}

// whole serves a non-streaming request.
func (s *server) whole(w http.ResponseWriter, r *http.Request, sreq *sim.Request, chat bool, object string, c chunker, usage usageInfo) {
	var text strings.Builder
	finish := ""
	for finish == "" {
		select {
		case <-r.Context().Done():
			s.eng.Abort(sreq, s.now())
			return
		case ev, ok := <-sreq.Events():
			if !ok {
				writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "request aborted")
				return
			}
			text.WriteString(ev.Text)
			usage.CompletionTokens = ev.Index
			finish = ev.Finish
		}
	}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	resp := wholeResponse{
		ID: c.id, Object: object, Created: c.created, Model: c.model, Usage: wholeUsage{usageInfo: usage},
		Metrics: s.metricsOf(sreq),
	}
	if chat {
		resp.Choices = []any{chatWholeChoice{Message: chatMessage{Role: "assistant", Content: text.String(), ToolCalls: []struct{}{}}, FinishReason: finish}}
	} else {
		resp.Choices = []any{textWholeChoice{Text: text.String(), FinishReason: finish}}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func (s *server) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: s.model, Object: "model", Created: s.now().Unix(), OwnedBy: "vllm", Root: s.model, MaxModelLen: s.eng.Config().MaxModelLen}}})
}

// Wire shapes. Field order follows vLLM's pydantic models; see
// testdata/fixtures/vllm/sse-streams.txt.

type usageInfo struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type wholeUsage struct {
	usageInfo
	PromptTokensDetails *struct{} `json:"prompt_tokens_details"`
}

type usageChunk struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []struct{}         `json:"choices"`
	Usage   usageInfo          `json:"usage"`
	Metrics *perRequestMetrics `json:"metrics,omitempty"`
}

// perRequestMetrics is vLLM's PerRequestTimingMetrics (v0.25.0,
// build_per_request_timing_metrics): ms, measured in the engine; its
// "time to first token" runs from scheduling, so it is the prefill.
type perRequestMetrics struct {
	TimeToFirstTokenMs *float64 `json:"time_to_first_token_ms"`
	GenerationTimeMs   *float64 `json:"generation_time_ms"`
	QueueTimeMs        *float64 `json:"queue_time_ms"`
	MeanITLMs          *float64 `json:"mean_itl_ms"`
	TokensPerSecond    *float64 `json:"tokens_per_second"`
}

// metricsOf is the per-request metrics of a finished request, nil when the
// server does not send them.
func (s *server) metricsOf(r *sim.Request) *perRequestMetrics {
	if !s.perRequestMetrics {
		return nil
	}
	queue, prefill, decode := r.Timing()
	ms := func(d time.Duration) *float64 {
		if d < 0 {
			return nil
		}
		v := float64(d) / float64(time.Millisecond)
		return &v
	}
	m := &perRequestMetrics{TimeToFirstTokenMs: ms(prefill), GenerationTimeMs: ms(decode), QueueTimeMs: ms(queue)}
	if n := r.Generated(); n > 1 && decode >= 0 {
		m.MeanITLMs = ms(decode / time.Duration(n-1))
	}
	if prefill >= 0 && decode >= 0 && prefill+decode > 0 {
		v := float64(r.Generated()) / (prefill + decode).Seconds()
		m.TokensPerSecond = &v
	}
	return m
}

type delta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Delta        delta           `json:"delta"`
	Logprobs     *struct{}       `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason,omitempty"` // only on the finish chunk
}

type chatChunk struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
}

type textChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   *string   `json:"stop_reason"`
}

type textChunk struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	Usage   *usageInfo   `json:"usage"`
}

type chatMessage struct {
	Role      string     `json:"role"`
	Content   string     `json:"content"`
	ToolCalls []struct{} `json:"tool_calls"`
}

type chatWholeChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     *struct{}   `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
	StopReason   *string     `json:"stop_reason"`
}

type textWholeChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason string    `json:"finish_reason"`
	StopReason   *string   `json:"stop_reason"`
}

type wholeResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []any              `json:"choices"`
	Usage   wholeUsage         `json:"usage"`
	Metrics *perRequestMetrics `json:"metrics,omitempty"`
}

type chunker struct {
	id      string
	created int64
	model   string
}

func (c chunker) object(chat bool) string {
	if chat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

func (c chunker) chat(d delta, finish string) chatChunk {
	ch := chatChoice{Delta: d}
	if finish != "" {
		ch.FinishReason = &finish
		ch.StopReason = json.RawMessage("null")
	}
	return chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model, Choices: []chatChoice{ch}}
}

func (c chunker) text(text, finish string) textChunk {
	ch := textChoice{Text: text}
	if finish != "" {
		ch.FinishReason = &finish
	}
	return textChunk{ID: c.id, Object: "text_completion", Created: c.created, Model: c.model, Choices: []textChoice{ch}}
}

// degradationJSON is how the admin endpoints show a sim.Degradation.
type degradationJSON struct {
	Freeze string `json:"freeze"`
	Every  int    `json:"every"`
}

// degrade is POST /admin/degrade?freeze=500ms&every=4: from the next step on,
// every 4th step with decodes in it lasts 500 ms longer, so every stream the
// replica serves freezes mid-decode now and then. Not part of vLLM's API: it
// is how a test or the demo makes one replica go bad.
func (s *server) degrade(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	freeze, err := time.ParseDuration(q.Get("freeze"))
	if err != nil {
		http.Error(w, fmt.Sprintf("freeze: want a duration such as 500ms, got %q", q.Get("freeze")), http.StatusBadRequest)
		return
	}
	every := 1
	if v := q.Get("every"); v != "" {
		if _, err := fmt.Sscanf(v, "%d", &every); err != nil {
			http.Error(w, fmt.Sprintf("every: want a step count, got %q", v), http.StatusBadRequest)
			return
		}
	}
	if err := s.eng.Degrade(sim.Degradation{Freeze: freeze, Every: every}); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.degradation(w, r)
}

// degradation answers with the engine's degradation now.
func (s *server) degradation(w http.ResponseWriter, _ *http.Request) {
	d := s.eng.Degradation()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(degradationJSON{Freeze: d.Freeze.String(), Every: d.Every})
}

// tenant is the request's tenant header ("" without one or without
// -tenant-header).
func (s *server) tenant(r *http.Request) string {
	if s.tenantHeader == "" {
		return ""
	}
	return r.Header.Get(s.tenantHeader)
}
