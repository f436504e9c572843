// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// words are short, common English words; with the usual BPE tokenizers each
// one, preceded by a space, is a single token, so N words ~ N prompt tokens.
var words = strings.Fields(`the of and to in is was for on are with as his they be at one have this from
or had by hot word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make thing see
him two has look more day could go come did number sound no most people my over know water than call
first who may down side been now find any new work part take get place made live where after back little
only round man year came show every good me give our under name very through just form sentence great
think say help low line differ turn cause much mean before move right boy old too same tell does set three
want air well also play small end put home read hand port large spell add even land here must big high
such follow act why ask men change went light kind off need house picture try us again animal point mother
world near build self earth father head stand own page should country found answer school grow study still
learn plant cover food sun four between state keep eye never last let thought city tree cross farm hard
start might story saw far sea draw left late run while press close night real life few north open seem
together next white children begin got walk example ease paper group always music those both mark often
letter until mile river car feet care second book carry took science eat room friend began idea fish
mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual young ready
above ever red list though feel talk bird soon body dog family direct pose leave song measure door product
black short numeral class wind question happen complete ship area half rock order fire south problem piece
told knew pass since top whole king space heard best hour better true during hundred five remember step
early hold west ground interest reach fast verb sing listen six table travel less morning ten simple
several vowel toward war lay against pattern slow center love person money serve appear road map rain rule`)

// RequestSpec is one request to issue, drawn deterministically from the seed.
type RequestSpec struct {
	Index       int
	Warmup      bool
	Long        bool
	PromptWords int
	MaxTokens   int
	Prompt      string
	// TraceID and ParentSpanID are sent as a traceparent when set
	// (-traceparent).
	TraceID      [16]byte
	ParentSpanID [8]byte
}

// buildPrompt returns n space-separated words. A short per-request prefix
// (request index) makes prompts differ from their first token, so
// prefix caching does not make long prompts artificially cheap.
func buildPrompt(r *rand.Rand, idx, n int) string {
	var b strings.Builder
	b.Grow(n * 6)
	fmt.Fprintf(&b, "%d", idx)
	for i := 1; i < n; i++ {
		b.WriteByte(' ')
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// endpointURL joins the base URL and the API path, accepting a base that
// already ends in /v1.
func endpointURL(base, endpoint string) string {
	base = strings.TrimRight(base, "/")
	if !strings.HasSuffix(base, "/v1") {
		base += "/v1"
	}
	if endpoint == EndpointCompletions {
		return base + "/completions"
	}
	return base + "/chat/completions"
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type requestBody struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages,omitempty"`
	Prompt        string        `json:"prompt,omitempty"`
	MaxTokens     int           `json:"max_tokens"`
	Stream        bool          `json:"stream"`
	StreamOptions streamOptions `json:"stream_options"`
	IgnoreEOS     bool          `json:"ignore_eos,omitempty"`
	Temperature   float64       `json:"temperature"`
}

func buildBody(cfg *Config, spec *RequestSpec) ([]byte, error) {
	b := requestBody{
		Model:         cfg.Model,
		MaxTokens:     spec.MaxTokens,
		Stream:        true,
		StreamOptions: streamOptions{IncludeUsage: true},
		IgnoreEOS:     cfg.IgnoreEOS,
	}
	if cfg.Endpoint == EndpointCompletions {
		b.Prompt = spec.Prompt
	} else {
		b.Messages = []chatMessage{{Role: "user", Content: spec.Prompt}}
	}
	return json.Marshal(b)
}

// Result is the client-side measurement of one request. Durations are
// measured from Start (taken just before the POST) with the monotonic clock.
type Result struct {
	Spec         *RequestSpec
	Start        time.Time
	End          time.Time // when the stream finished or failed
	OK           bool
	Interrupted  bool   // cancelled by shutdown: neither completed nor failed
	Err          string // short error class for failures
	TTFT         time.Duration
	E2E          time.Duration
	ITLs         []float64 // seconds, between successive content chunks
	OutputTokens int
	PromptTokens int // from usage, 0 if absent
	UsageSeen    bool
	ContentCount int // content chunks (incl. later empty-delta chunks such as the finish chunk)
	// Stalled: a stall breaker cut the stream (an engine_stalled error
	// event). ITLs then holds the gaps seen before the cut, the last one
	// ending at the error event: the client waited that long for nothing.
	Stalled bool
	// Attempt is 0 for a request's first sending, n for its n-th retry;
	// Retried marks an attempt that was cut and sent again.
	Attempt int
	Retried bool
}

// TPOT is (E2E − TTFT)/(output tokens − 1), 0 when there is at most one token.
func (r *Result) TPOT() time.Duration {
	if r.OutputTokens <= 1 {
		return 0
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1)
}

// sseChunk is the subset of a chat/completions stream chunk we read.
type sseChunk struct {
	Choices []struct {
		Delta struct {
			Content          *string         `json:"content"`
			ReasoningContent *string         `json:"reasoning_content"`
			Reasoning        *string         `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text *string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

func nonEmpty(s *string) bool { return s != nil && *s != "" }

// hasText reports whether a choice-bearing chunk carries generated output.
func (c *sseChunk) hasText() bool {
	for i := range c.Choices {
		ch := &c.Choices[i]
		if nonEmpty(ch.Delta.Content) || nonEmpty(ch.Delta.ReasoningContent) || nonEmpty(ch.Delta.Reasoning) ||
			nonEmpty(ch.Text) || (len(ch.Delta.ToolCalls) > 0 && string(ch.Delta.ToolCalls) != "null") {
			return true
		}
	}
	return false
}

// errInterrupted marks a request cancelled by shutdown of the run.
var errInterrupted = errors.New("interrupted")

// doRequest issues one streaming request and times it.
//
// Timing (vllm bench serve, with the role-only chunk skipped):
//   - TTFT: the first SSE message whose choices carry non-empty text
//     (content, reasoning or tool call); the leading role chunk
//     {"role":"assistant","content":""} is skipped.
//   - From then on every choice-bearing message is a content chunk (as in
//     vllm bench, so the finish chunk with an empty delta counts): ITL is the
//     gap between successive ones, E2E is the last one minus the start.
//   - The usage chunk (choices: []) sets output tokens and does not move E2E.
//   - Output tokens = usage.completion_tokens, else the number of content
//     chunks with non-empty text.
func doRequest(ctx context.Context, client *http.Client, cfg *Config, url string, spec *RequestSpec) *Result {
	res := &Result{Spec: spec}
	body, err := buildBody(cfg, spec)
	if err != nil {
		res.Err = "encode: " + err.Error()
		return res
	}
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body)) //nolint:gosec // G704: the -url flag is the server under test
	if err != nil {
		res.Err = "request: " + err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	if spec.TraceID != ([16]byte{}) {
		req.Header.Set("traceparent", traceparent(spec.TraceID, spec.ParentSpanID))
	}
	if tenant := cfg.ShortTenant; cfg.TenantHeader != "" {
		if spec.Long {
			tenant = cfg.LongTenant
		}
		if tenant != "" {
			req.Header.Set(cfg.TenantHeader, tenant)
		}
	}

	res.Start = time.Now()
	err = stream(client, req, res)
	res.End = time.Now()
	if err != nil {
		res.OK = false
		if ctx.Err() != nil && errors.Is(context.Cause(ctx), errInterrupted) {
			res.Interrupted = true
		}
		res.Err = classify(err)
		if res.Err == errTypeEngineStalled {
			res.Stalled = true
		} else {
			res.ITLs = nil
		}
		return res
	}
	res.OK = true
	return res
}

// maxTrailingBytes bounds what is read after [DONE] (servers send nothing
// there; a broken one cannot hold the client).
const maxTrailingBytes = 64 << 10

type httpStatusError struct{ code int }

func (e httpStatusError) Error() string { return fmt.Sprintf("http %d", e.code) }

var (
	errNoDone    = errors.New("stream ended without [DONE]")
	errNoContent = errors.New("no content chunks")
)

// streamError is an error event inside a 200 stream; typ is its type.
type streamError struct{ msg, typ string }

// errTypeEngineStalled is the error type of a stream the collector proxy's
// stall breaker cut: the engine froze, and another replica may answer.
const errTypeEngineStalled = "engine_stalled"

func (e streamError) Error() string { return "error event: " + e.msg }

// classify reduces an error to a short, low-cardinality class for counting.
func classify(err error) string {
	var hs httpStatusError
	var se streamError
	switch {
	case errors.As(err, &hs):
		return hs.Error()
	case errors.As(err, &se) && se.typ == errTypeEngineStalled:
		return errTypeEngineStalled
	case errors.As(err, &se):
		return "error event in stream"
	case errors.Is(err, errNoDone), errors.Is(err, errNoContent):
		return err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "broken stream (unexpected EOF)"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && len(s)-i < 60 {
		s = s[i+2:]
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

func stream(client *http.Client, req *http.Request, res *Result) error {
	resp, err := client.Do(req) //nolint:gosec // G704: the -url flag is the server under test
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return httpStatusError{resp.StatusCode}
	}

	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var (
		data      []byte // data of the event being assembled
		haveData  bool
		last      time.Time // last content chunk
		first     time.Time
		textCount int
		done      bool
		chunk     sseChunk
	)
	dispatch := func() error {
		payload := bytes.TrimSpace(data)
		data, haveData = data[:0], false
		if len(payload) == 0 {
			return nil
		}
		if bytes.Equal(payload, []byte("[DONE]")) {
			done = true
			return nil
		}
		now := time.Now()
		chunk = sseChunk{}
		if err := json.Unmarshal(payload, &chunk); err != nil {
			return fmt.Errorf("bad chunk JSON: %w", err)
		}
		if len(chunk.Error) > 0 && string(chunk.Error) != "null" {
			se := streamError{msg: string(chunk.Error)}
			var obj struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(chunk.Error, &obj) == nil {
				se.typ = obj.Type
			}
			if se.typ == errTypeEngineStalled && !first.IsZero() {
				res.ITLs = append(res.ITLs, now.Sub(last).Seconds())
			}
			return se
		}
		if len(chunk.Choices) > 0 {
			text := chunk.hasText()
			switch {
			case first.IsZero() && !text:
				// role-only (or empty) chunk before the first output: not timed.
			case first.IsZero():
				first, last = now, now
				res.TTFT = now.Sub(res.Start)
				res.ContentCount = 1
			default:
				res.ITLs = append(res.ITLs, now.Sub(last).Seconds())
				last = now
				res.ContentCount++
			}
			if text {
				textCount++
			}
		}
		if chunk.Usage != nil {
			res.UsageSeen = true
			res.OutputTokens = chunk.Usage.CompletionTokens
			res.PromptTokens = chunk.Usage.PromptTokens
		}
		return nil
	}

	for !done {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// very long line: collect the rest
			buf := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				buf = append(buf, line...)
			}
			line = buf
		}
		if len(line) > 0 {
			trimmed := bytes.TrimRight(line, "\r\n")
			switch {
			case len(trimmed) == 0: // event boundary
				if haveData {
					if derr := dispatch(); derr != nil {
						return derr
					}
				}
			case trimmed[0] == ':': // comment
			case bytes.HasPrefix(trimmed, []byte("data:")):
				v := trimmed[len("data:"):]
				if len(v) > 0 && v[0] == ' ' {
					v = v[1:]
				}
				if haveData {
					data = append(data, '\n')
				}
				data = append(data, v...)
				haveData = true
			default: // event:, id:, retry: — ignored
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if haveData {
					if derr := dispatch(); derr != nil {
						return derr
					}
				}
				if !done {
					return errNoDone
				}
				break
			}
			return err
		}
	}
	// Read on to the end of the body, as vllm bench serve does: closing it
	// unread would close the connection (no reuse, a new connection in the
	// next request's TTFT) and tell a proxy that the client went away while
	// it was still finishing the stream. Nothing is timed after [DONE].
	_, _ = io.Copy(io.Discard, io.LimitReader(br, maxTrailingBytes))
	if first.IsZero() {
		return errNoContent
	}
	res.E2E = last.Sub(res.Start)
	if !res.UsageSeen || res.OutputTokens <= 0 {
		res.OutputTokens = textCount
	}
	return nil
}
