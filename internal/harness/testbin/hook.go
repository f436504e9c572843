// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package testbin

import (
	"strings"
	"time"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// HookSession is one chat session as an engine hook sends it: the start,
// the first token TTFT later, Tokens tokens 20 ms apart in all, then the
// end (model llama-3.1-8b, engine vllm-0).
type HookSession struct {
	ID                   string
	TraceID              [16]byte // zero: the session gets a random trace
	SpanID, ParentSpanID [8]byte
	Start                time.Time
	TTFT                 time.Duration
	Tokens               int
}

// Lines are the session's NDJSON lines (wire schema v1), without newlines.
func (s HookSession) Lines() []string {
	at := uint64(s.Start.UnixNano())
	evs := []tokenevent.Event{{
		Kind: tokenevent.KindStart, SessionID: s.ID, TimeUnixNano: at, TraceID: s.TraceID,
		SpanID: s.SpanID, ParentSpanID: s.ParentSpanID, Model: "llama-3.1-8b", Operation: tokenevent.OperationChat,
		Engine: "vllm-0", PromptTokens: 200, Count: 1, CompletionTokens: -1,
	}}
	t := at + uint64(s.TTFT)
	for range s.Tokens {
		evs = append(evs, tokenevent.Event{
			Kind: tokenevent.KindToken, SessionID: s.ID, TimeUnixNano: t, Count: 1,
			PromptTokens: -1, CompletionTokens: -1,
		})
		t += uint64(20 * time.Millisecond)
	}
	evs = append(evs, tokenevent.Event{
		Kind: tokenevent.KindEnd, SessionID: s.ID, TimeUnixNano: t,
		CompletionTokens: int64(s.Tokens), FinishReason: "stop", PromptTokens: -1, Count: 1,
	})
	lines := make([]string, len(evs))
	for i := range evs {
		lines[i] = strings.TrimSpace(string(tokenevent.AppendJSON(nil, &evs[i])))
	}
	return lines
}
