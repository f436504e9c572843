// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"slices"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// Outcome is how a session ended.
type Outcome uint8

const (
	// OutcomeActive: the session has not ended.
	OutcomeActive Outcome = iota
	// OutcomeCompleted: an end event without error.
	OutcomeCompleted
	// OutcomeError: an end event with an error type.
	OutcomeError
	// OutcomeAborted: the client went away (finish reason "abort").
	OutcomeAborted
	// OutcomeTimeout: no event for the idle timeout.
	OutcomeTimeout
	// OutcomeEvicted: pushed out of a full table.
	OutcomeEvicted
	// OutcomeShutdown: still active when the collector stopped.
	OutcomeShutdown
)

var outcomeNames = [...]string{"active", "completed", "error", "aborted", "timeout", "evicted", "shutdown"}

func (o Outcome) String() string { return outcomeNames[o] }

// finishReasonAbort is the finish reason vLLM (and the proxy) give an
// aborted request; finishReasonError the one newer vLLM gives a request
// that failed in the engine.
const (
	finishReasonAbort = "abort"
	finishReasonError = "error"
)

// ErrorTypeEngine is the error type of a session whose engine said it
// failed without saying how (finish_reason "error"), as the proxy names
// an engine's error sent mid-stream.
const ErrorTypeEngine = "engine_error"

// Reason is the set of sampling rules that kept a session.
type Reason uint16

const (
	ReasonTTFT Reason = 1 << iota
	ReasonTPOT
	ReasonStall
	ReasonError
	ReasonTimeout
	// ReasonProbabilistic: kept by the NormalPercent draw, no rule matched.
	ReasonProbabilistic
	// ReasonTrace: no rule matched, but another session of its trace was
	// kept; a keep holds for the whole trace.
	ReasonTrace
	// ReasonCorrected: kept early (a TTFT breach, a freeze) on figures that
	// late or reordered events later contradicted (an earlier first token;
	// a token made before the freeze, with no freeze in the gap the alert
	// fell in), so no rule matches at the end; the trace had been released
	// as kept, and a keep is not undone.
	ReasonCorrected
	// ReasonQueue: the engine said the request waited in its queue longer
	// than SamplingConfig.QueueTime.
	ReasonQueue
	// ReasonFreeze: a freeze was reported while it lasted (Session.Freezes),
	// and the session's tokens did not contradict it. ReasonStall is for the
	// other stall episodes, the runs of slow gaps.
	ReasonFreeze
)

var reasonNames = [...]string{"ttft", "tpot", "stall", "error", "timeout", "probabilistic", "trace", "corrected", "queue", "freeze"}

// String lists the reasons joined by commas, e.g. "ttft,stall".
func (r Reason) String() string {
	var b []byte
	for i, name := range reasonNames {
		if r&(1<<i) != 0 {
			if len(b) > 0 {
				b = append(b, ',')
			}
			b = append(b, name...)
		}
	}
	return string(b)
}

// Stall is one stall episode, as recorded when it was detected.
type Stall struct {
	// DetectedAt is the engine time of the token that completed the run of
	// slow gaps or, for a freeze, the last token's time plus
	// StallConsecutive×StallGap (when the freeze began to count).
	DetectedAt int64
	// Since is the time of the last token before the episode.
	Since int64
	// Gaps are the per-token gaps of the run that triggered it (empty for a
	// freeze without tokens).
	Gaps []time.Duration
	// Freeze is set when no token arrived for StallConsecutive×StallGap.
	Freeze bool
}

// Session is one request, streamed or not. The Table owns it: an Observer
// may read it during a call, and a Report's user until it releases the
// Report; none may keep it afterwards (it is reused).
//
// Its size matters (the target is at most 512 B per in-flight session): the
// word-sized fields come first and the small ones last so that no padding
// sits between them, the gap window lives in the Table's dense array, and
// what few sessions have sits behind one pointer (extra). 240 B
// (TestSessionSize); the Table's entry adds the Observer's state beside it
// (the token_session processor's: 48 B, the entry 288, a size class).
type Session struct {
	ID           string
	TraceID      pcommon.TraceID
	SpanID       pcommon.SpanID
	ParentSpanID pcommon.SpanID
	Model        string
	Operation    string
	Engine       string

	// Engine times in Unix ns; 0 when not seen.
	StartTime, FirstTokenTime, LastTokenTime int64
	// Tokens is the sum of the token events' counts.
	Tokens int64
	MaxGap time.Duration
	// WindowTPOTMax is the highest window TPOT over full windows (a session
	// with fewer gaps than the window has none).
	WindowTPOTMax time.Duration

	// Threshold is part of the verdict (see Keep).
	Threshold sampling.Threshold

	// extra holds the start attributes and the stall records; nil until a
	// session has either, and kept (emptied) when the Session is reused.
	extra *extra

	// gapSum is the sum of the window's gaps (in the Table's gap window),
	// kept as they are pushed: the window TPOT is checked on every token.
	gapSum uint64
	// slowSince is the time of the token after which the run of slow gaps
	// (slowRun) began.
	slowSince int64
	// seqNext is 1 + the highest token seq seen (0 before any); seqSeen
	// marks which of the 64 seqs up to it were seen, bit i for seqNext-1-i.
	seqNext int64
	seqSeen uint64
	// source is the watermark of the source whose events the session
	// comes from (its engine).
	source *source

	// PromptTokens is -1 when unknown; a count beyond MaxInt32 (no model's
	// context) is taken as MaxInt32, which keeps the field 4 B.
	PromptTokens int32
	// Chunks counts the token events (at most MaxInt32).
	Chunks     int32
	StallCount int32
	// Freezes are the stall episodes counted in StallCount that were freezes
	// reported while they lasted (their alerts went out), less those later
	// contradicted.
	Freezes int32
	// slowRun counts the consecutive slow per-token gaps.
	slowRun int32
	// slot is the session's index in the table's dense arrays.
	slot int32
	// gapNext is the window position the next gap goes to; gapLen how many
	// of the window's gaps are set.
	gapNext uint16
	gapLen  uint16

	// HasStart is false while the session was created by a token event that
	// overtook its start (UDP reordering).
	HasStart bool
	// NoStream: the request was not streamed (one response with every
	// token): no first token, TPOT, gaps or stalls are measured.
	NoStream bool
	// Verdict, final at the end; Keep may be set early (TTFT, stall).
	Keep    bool
	Reasons Reason
	Outcome Outcome
	inStall bool
	// inFreeze: the open stall episode is a freeze, withdrawn if a token
	// stamped before it began arrives late.
	inFreeze bool
	// keepHeld: kept early before its start came; reported when it comes
	// (extra.keptAt is when the keep was reached).
	keepHeld bool
}

// extra is what most sessions do not have: start attributes (the proxy
// sends none) and stall records. Behind one pointer it costs a session 8 B
// instead of 48.
type extra struct {
	attributes []tokenevent.Attribute
	stalls     []Stall
	// moves are the session's moves to another replica, the first
	// tokenevent.MaxMigrations.
	moves []Move
	// traceState is the caller's tracestate, when it parsed; rv and
	// upstream its OTel entry's randomness and threshold, if present.
	traceState  string
	rv          sampling.Randomness
	upstream    sampling.Threshold
	hasRV       bool
	hasUpstream bool
	// keptAt is when (engine time) a session opened by a token was kept
	// early, while its keep is held for its start (Session.keepHeld).
	keptAt int64
	// withdrawnSince is the Since of the freeze last withdrawn, 0 when
	// none waits: it is reinstated if the gap its alert's moment falls in
	// turns out longer than the freeze time after all.
	withdrawnSince int64
}

// TraceState is the caller's W3C tracestate, "" when none was given (or
// it did not parse). The session span's tracestate is built on it.
func (s *Session) TraceState() string {
	if s.extra == nil {
		return ""
	}
	return s.extra.traceState
}

// randomness is the session's sampling randomness: the caller's explicit
// rv when it gave one, else the trace ID's (OTEP 235).
func (s *Session) randomness() sampling.Randomness {
	if x := s.extra; x != nil && x.hasRV {
		return x.rv
	}
	return sampling.TraceIDToRandomness(s.TraceID)
}

// upstreamThreshold is the head-sampling threshold the caller's tracestate
// says the trace was sampled with, when it has one this session's
// randomness passes; ok is false otherwise.
func (s *Session) upstreamThreshold() (sampling.Threshold, bool) {
	if x := s.extra; x != nil && x.hasUpstream && x.upstream.ShouldSample(s.randomness()) {
		return x.upstream, true
	}
	return sampling.Threshold{}, false
}

// Attributes are the start event's extra attributes.
func (s *Session) Attributes() []tokenevent.Attribute {
	if s.extra == nil {
		return nil
	}
	return s.extra.attributes
}

// Stalls are the first MaxStallRecords stall episodes.
func (s *Session) Stalls() []Stall {
	if s.extra == nil {
		return nil
	}
	return s.extra.stalls
}

// Moves are the session's moves to another replica mid-answer (the move
// events), in the order they came; at most tokenevent.MaxMigrations.
func (s *Session) Moves() []Move {
	if s.extra == nil {
		return nil
	}
	return s.extra.moves
}

// Move is one move of the session's answer to another replica, as its
// move event said (the proxy's proxy::migrate).
type Move struct {
	// Time is when it moved (engine time, Unix ns).
	Time int64
	// To is the endpoint it moved to; Reason the error type of the failure
	// that moved it.
	To, Reason string
	// TokensCarried are the tokens delivered before it, carried to the
	// continuation.
	TokensCarried int64
}

// Clone returns a copy of s that may be kept after its Report is released:
// its attributes, stall records, moves and tracestate are its own.
func (s *Session) Clone() *Session {
	c := *s
	c.source = nil
	if s.extra != nil {
		x := *s.extra
		x.attributes = slices.Clone(x.attributes)
		// Each record's gaps are a slice of its own (never reused).
		x.stalls = slices.Clone(x.stalls)
		x.moves = slices.Clone(x.moves)
		c.extra = &x
	}
	return &c
}

func (s *Session) ensureExtra() *extra {
	if s.extra == nil {
		s.extra = new(extra)
	}
	return s.extra
}

// End is what the end event said. When the session ended without one
// (timeout, eviction, shutdown), CompletionTokens is -1 and Time is 0, or,
// for a session that had no token, when it was ended, on the engine's
// clock: the worst requests, stuck before their first token, last until
// the collector gave up on them.
type End struct {
	Time             int64
	CompletionTokens int64
	FinishReason     string
	ErrorType        string
	ResponseModel    string
	// Timing is the engine's split when the end event brought it.
	Timing Timing
	// Migrations is how often the answer's stream was moved to another
	// replica (the end event's), 0 when never.
	Migrations int64
	// Share is the session's share of its engine's time and energy, set by
	// the Table's user (internal/attribution) when the session ends.
	Share EngineShare
}

// EngineShare is a session's share of its engine's busy time (seconds,
// prefill and decode) and energy (joules, when HasEnergy). Source says
// who computed it: "engine" (the end event brought the engine's own),
// "collector" (internal/attribution's model); "" for none.
type EngineShare struct {
	Prefill, Decode float64
	Energy          float64
	HasEnergy       bool
	Source          string
}

// Sources of an EngineShare.
const (
	ShareEngine    = "engine"
	ShareCollector = "collector"
)

// EngineShareOf is the engine's own share an end or share event brought
// (its ns and mJ in seconds and joules).
func EngineShareOf(ev *tokenevent.Event) EngineShare {
	return EngineShare{
		Prefill: float64(ev.EngineTimePrefillNs) / 1e9, Decode: float64(ev.EngineTimeDecodeNs) / 1e9,
		Energy: float64(ev.EnergyMilliJ) / 1e3, HasEnergy: ev.HasEnergy, Source: ShareEngine,
	}
}

// Timing is the engine's own split of a request's time; a part it did not
// give is -1. Source is where it came from ("" for none: the zero Timing is
// no timing): the hook's end event, the engine's response (the proxy: vLLM's
// per-request metrics, or llama.cpp's timings with the queue derived), or
// the engine's span.
type Timing struct {
	Queue, Prefill, Decode time.Duration
	Source                 string
}

// Sources of a Timing.
const (
	TimingHook       = tokenevent.TimingHook
	TimingResponse   = tokenevent.TimingResponse
	TimingLlamaCpp   = tokenevent.TimingLlamaCpp
	TimingEngineSpan = "engine_span"
)

// Known reports whether t holds a timing.
func (t Timing) Known() bool { return t.Source != "" }

// maxTimingExcess is how far the engine's parts may exceed the session's
// duration (clocks of two processes, rounding) before they are taken for
// nonsense.
const maxTimingExcess = time.Second

// Plausible reports whether t can be the split of a session that lasted d:
// no part negative, and the parts together no longer than d plus a second.
func (t Timing) Plausible(d time.Duration) bool {
	var sum time.Duration
	for _, p := range [...]time.Duration{t.Queue, t.Prefill, t.Decode} {
		if p < -1 {
			return false
		}
		sum += max(p, 0)
	}
	return sum <= d+maxTimingExcess
}

// TTFT is the time from start to first token; ok is false without both
// (a request not streamed has no first token).
func (s *Session) TTFT() (d time.Duration, ok bool) {
	if s.StartTime == 0 || s.FirstTokenTime == 0 {
		return 0, false
	}
	return time.Duration(max(s.FirstTokenTime-s.StartTime, 0)), true
}

// TPOT is (last token − first token)/(output tokens − 1), with output
// tokens from completion_tokens when given (outputTokens ≥ 0), else the sum
// of the chunks' counts. ok is false with fewer than two output tokens.
func (s *Session) TPOT(outputTokens int64) (d time.Duration, ok bool) {
	n := outputTokens
	if n < 0 {
		n = s.Tokens
	}
	if n < 2 || s.FirstTokenTime == 0 {
		return 0, false
	}
	return time.Duration(max(s.LastTokenTime-s.FirstTokenTime, 0) / (n - 1)), true
}

// WindowTPOT is the mean of the latest Window per-token gaps; ok is false
// before the first gap.
func (s *Session) WindowTPOT() (d time.Duration, ok bool) {
	if s.gapLen == 0 {
		return 0, false
	}
	return time.Duration(s.gapSum/uint64(s.gapLen)) * time.Microsecond, true
}

// Duration is from start (or the first event seen) to the last token or end.
func (s *Session) duration(end int64) time.Duration {
	from := s.StartTime
	if from == 0 {
		from = s.FirstTokenTime
	}
	to := max(end, s.LastTokenTime)
	if from == 0 || to < from {
		return 0
	}
	return time.Duration(to - from)
}

// Duration is from start to the end event, or to the last token when the
// session ended without one.
func (s *Session) Duration(e *End) time.Duration { return s.duration(e.Time) }

// ErrorType is error.type of the session: the end event's, else the
// outcome's for a session that did not complete (timeout, aborted,
// evicted, shutdown); "" for a completed one.
func (s *Session) ErrorType(e *End) string {
	if e.ErrorType != "" {
		return e.ErrorType
	}
	switch s.Outcome {
	case OutcomeTimeout, OutcomeAborted, OutcomeEvicted, OutcomeShutdown:
		return s.Outcome.String()
	}
	return ""
}

// OutputTokens is completion_tokens when the end event gave it, else the
// sum of the token events' counts; -1 when neither is known.
func (s *Session) OutputTokens(e *End) int64 {
	if e.CompletionTokens >= 0 {
		return e.CompletionTokens
	}
	if s.Chunks > 0 {
		return s.Tokens
	}
	return -1
}

// StartedAt is when the session started, on the engine's clock: its start
// event, or its first token when the start has not come.
func (s *Session) StartedAt() int64 {
	if s.StartTime != 0 {
		return s.StartTime
	}
	return s.FirstTokenTime
}

// EndedAt is when the session's span ends: the last token, or the end
// event for a session without tokens.
func (s *Session) EndedAt(e *End) int64 {
	switch {
	case s.LastTokenTime != 0:
		return s.LastTokenTime
	case e.Time != 0:
		return e.Time
	}
	return s.StartedAt()
}

// reset clears s for reuse, keeping its extra (emptied when s ended).
func (s *Session) reset() {
	*s = Session{extra: s.extra, PromptTokens: -1}
}
