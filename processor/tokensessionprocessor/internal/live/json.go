// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"

import (
	"math"
	"time"
	"unicode/utf8"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// The live view's snapshot as JSON, the names as it shows them and the
// filter that picks by them.

// liveMaxName bounds each name the view shows (session ID, model, engine,
// operation, error type, attribute value), so that a snapshot's size does
// not depend on what the senders send: a longer one is cut, on a rune
// boundary, and ends in liveCut. Filters match the names as shown.
const (
	liveMaxName = 256
	liveCut     = "…"
)

// liveName is name as the view shows it: itself, or cut to liveMaxName
// bytes. The cut one is a new string, which does not keep the long one.
func liveName(name string) string {
	if len(name) <= liveMaxName {
		return name
	}
	i := liveMaxName
	for i > 0 && !utf8.RuneStart(name[i]) {
		i--
	}
	return name[:i] + liveCut
}

// Filter picks the sessions, engines and ended sessions a snapshot
// lists, by their names as shown: "" matches every engine or model.
type Filter struct {
	Engine, Model string
}

func (f Filter) match(k liveKey) bool {
	return (f.Engine == "" || f.Engine == k.engine) && (f.Model == "" || f.Model == k.model)
}

// liveKey is an engine and a model, as shown: what a pass over the table
// tallies, and the TTFT minutes are kept by.
type liveKey struct {
	engine, model string
}

// liveEnded is an ended session as the view lists it, its names as shown
// (liveName).
type liveEnded struct {
	id, model, engine, operation, errorType string
	outcome                                 session.Outcome
	traceID                                 [16]byte
	endedAt                                 int64 // collector time
	ttft, tpot, duration, maxGap            time.Duration
	hasTTFT, hasTPOT                        bool
	tokens                                  int64
	stalls                                  int32
	keep                                    bool
	reasons                                 session.Reason
}

// The snapshot as JSON. Durations are in milliseconds; a figure not known
// (a TTFT before the first token) is null.

type Snapshot struct {
	Time       time.Time     `json:"time"`
	IntervalMs float64       `json:"interval_ms"`
	TraceURL   string        `json:"trace_url,omitempty"`
	Filter     FilterJSON    `json:"filter"`
	InFlight   int           `json:"in_flight"`
	Matching   int           `json:"matching"`
	Sessions   []SessionJSON `json:"sessions"`
	Engines    []EngineJSON  `json:"engines"`
	// EnginesLeftOut are the engines the filter picks past max_engines;
	// SessionsUntallied the sessions it picks that no engine's totals
	// count, past maxLiveCells engine-and-model pairs in flight.
	EnginesLeftOut    int         `json:"engines_left_out"`
	SessionsUntallied int         `json:"sessions_untallied"`
	Recent            []EndedJSON `json:"recent"`
}

type FilterJSON struct {
	Engine string `json:"engine,omitempty"`
	Model  string `json:"model,omitempty"`
}

type SessionJSON struct {
	ID           string            `json:"id"`
	Model        string            `json:"model"`
	Engine       string            `json:"engine"`
	Operation    string            `json:"operation"`
	Phase        string            `json:"phase"`
	AgeMs        float64           `json:"age_ms"`
	TTFTMs       *float64          `json:"ttft_ms"`
	WaitingMs    *float64          `json:"waiting_ms"`
	Tokens       int64             `json:"tokens"`
	TokensPerSec float64           `json:"tokens_per_s"`
	GapMs        float64           `json:"gap_ms"`
	MaxGapMs     float64           `json:"max_gap_ms"`
	Stalls       int32             `json:"stalls"`
	TraceID      string            `json:"trace_id"`
	Sampled      bool              `json:"sampled"`
	KeepReason   string            `json:"keep_reason,omitempty"`
	Attributes   map[string]string `json:"attributes,omitempty"`
}

type EngineJSON struct {
	Engine       string   `json:"engine"`
	InFlight     int      `json:"in_flight"`
	Waiting      int      `json:"waiting"`
	Decoding     int      `json:"decoding"`
	Stalled      int      `json:"stalled"`
	Frozen       int      `json:"frozen"`
	TokensPerSec float64  `json:"tokens_per_s"`
	MaxWaitingMs float64  `json:"max_waiting_ms"`
	TTFTP50Ms    *float64 `json:"ttft_p50_ms"`
	TTFTP99Ms    *float64 `json:"ttft_p99_ms"`
	TTFTCount    uint64   `json:"ttft_count"`
}

type EndedJSON struct {
	ID         string    `json:"id"`
	Model      string    `json:"model"`
	Engine     string    `json:"engine"`
	Operation  string    `json:"operation"`
	Outcome    string    `json:"outcome"`
	ErrorType  string    `json:"error_type,omitempty"`
	Ended      time.Time `json:"ended"`
	TTFTMs     *float64  `json:"ttft_ms"`
	TPOTMs     *float64  `json:"tpot_ms"`
	DurationMs float64   `json:"duration_ms"`
	MaxGapMs   float64   `json:"max_gap_ms"`
	Tokens     int64     `json:"tokens"`
	Stalls     int32     `json:"stalls"`
	TraceID    string    `json:"trace_id"`
	Sampled    bool      `json:"sampled"`
	KeepReason string    `json:"keep_reason,omitempty"`
}

// ms is d in milliseconds, to the µs.
func millis(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func msPtr(d time.Duration, ok bool) *float64 {
	if !ok {
		return nil
	}
	v := millis(d)
	return &v
}

// sessionJSON copies what the view shows of s, in phase at engine time
// engineNow, with the start attributes allow names; called under the lock,
// as the session may be reused after it.
func sessionJSON(s *session.Session, phase session.Phase, engineNow int64, allow map[string]struct{}) SessionJSON {
	age := time.Duration(max(0, engineNow-s.StartedAt()))
	out := SessionJSON{
		ID: liveName(s.ID), Model: liveName(s.Model), Engine: liveName(s.Engine), Operation: liveName(s.Operation),
		Phase: phase.String(),
		AgeMs: millis(age), Tokens: s.Tokens, MaxGapMs: millis(s.MaxGap), Stalls: s.StallCount,
		TraceID: traceHex(s.TraceID), Sampled: s.Keep,
	}
	if s.Keep {
		out.KeepReason = s.Reasons.String()
	}
	if ttft, ok := s.TTFT(); ok {
		out.TTFTMs = msPtr(ttft, true)
	}
	if phase == session.PhaseWaiting {
		out.WaitingMs = msPtr(age, true)
		out.GapMs = millis(age)
	} else {
		out.GapMs = millis(time.Duration(max(0, engineNow-s.LastTokenTime)))
		if w, ok := s.WindowTPOT(); ok && w > 0 && phase != session.PhaseFrozen {
			out.TokensPerSec = math.Round(float64(time.Second)/float64(w)*10) / 10
		}
	}
	if allow != nil {
		for _, a := range s.Attributes() {
			if _, ok := allow[a.Key]; ok {
				if out.Attributes == nil {
					out.Attributes = make(map[string]string)
				}
				out.Attributes[a.Key] = liveName(a.Value)
			}
		}
	}
	return out
}

func (e *liveEnded) json() EndedJSON {
	out := EndedJSON{
		ID: e.id, Model: e.model, Engine: e.engine, Operation: e.operation, Outcome: e.outcome.String(),
		ErrorType: e.errorType, Ended: time.Unix(0, e.endedAt).UTC(),
		TTFTMs: msPtr(e.ttft, e.hasTTFT), TPOTMs: msPtr(e.tpot, e.hasTPOT), DurationMs: millis(e.duration),
		MaxGapMs: millis(e.maxGap), Tokens: e.tokens, Stalls: e.stalls, TraceID: traceHex(e.traceID), Sampled: e.keep,
	}
	if e.keep {
		out.KeepReason = e.reasons.String()
	}
	return out
}

const hexDigits = "0123456789abcdef"

func traceHex(id [16]byte) string {
	var b [32]byte
	for i, c := range id {
		b[2*i], b[2*i+1] = hexDigits[c>>4], hexDigits[c&0xf]
	}
	return string(b[:])
}
