// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

// The table's work on a session's events: its start (the engine's clock
// and the caller's trace), its tokens (gaps, the window, stalls and
// freezes).

import (
	"math"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// fillStart fills in what a start event says. A session opened by an
// earlier token (HasStart false) moves from the random trace it was given
// to the real one.
func (t *Table[S]) fillStart(s *entry[S], ev *tokenevent.Event) {
	s.HasStart = true
	s.StartTime = int64(ev.TimeUnixNano)
	if trace := pcommon.TraceID(ev.TraceID); !trace.IsEmpty() && trace != s.TraceID {
		t.traceRemove(s, false, sampling.NeverSampleThreshold)
		s.TraceID = trace
		t.traceAdd(s)
	}
	if !ev.SpanID.IsEmpty() {
		s.SpanID = pcommon.SpanID(ev.SpanID)
	}
	s.ParentSpanID = pcommon.SpanID(ev.ParentSpanID)
	s.Model, s.Operation, s.Engine = ev.Model, ev.Operation, ev.Engine
	s.PromptTokens = promptTokens(ev.PromptTokens)
	t.setSource(s, ev.Engine)
	if len(ev.Attributes) > 0 {
		x := s.ensureExtra()
		x.attributes = append(x.attributes[:0], ev.Attributes...)
	}
	if ev.TraceState != "" {
		t.readTraceState(s, ev.TraceState)
	}
	if ev.NoStream {
		// Tokens that overtook the start were taken for a stream.
		s.NoStream = true
		s.FirstTokenTime, s.MaxGap, s.WindowTPOTMax = 0, 0, 0
		t.clocks[s.slot].lastTokenSeen = 0
	}
	if s.FirstTokenTime != 0 && s.FirstTokenTime < s.StartTime {
		t.Counters.OutOfOrder++
	}
}

// readTraceState keeps the caller's tracestate and its OTel entry's
// randomness (rv) and head-sampling threshold (th), which the verdict
// honors (OTEP 235).
func (t *Table[S]) readTraceState(s *entry[S], raw string) {
	w3c, err := sampling.NewW3CTraceState(raw)
	if err != nil {
		t.Counters.InvalidTraceStates++
		return
	}
	x := s.ensureExtra()
	x.traceState = raw
	ot := w3c.OTelValue()
	x.rv, x.hasRV = ot.RValueRandomness()
	x.upstream, x.hasUpstream = ot.TValueThreshold()
}

// setSource points s at the watermark of the source named engine.
func (t *Table[S]) setSource(s *entry[S], engine string) {
	if s.source != nil {
		if cur := t.sources[engine]; cur == s.source {
			return
		}
		t.releaseSource(s)
	}
	src := t.sources[engine]
	if src == nil {
		src = &source{key: engine}
		t.sources[engine] = src
	}
	src.sessions++
	s.source = src
}

func (t *Table[S]) releaseSource(s *entry[S]) {
	src := s.source
	s.source = nil
	if src.sessions--; src.sessions == 0 {
		delete(t.sources, src.key)
	}
}

// seqNew marks seq seen and reports whether it was new. The latest 64 seqs
// are remembered; an older one is taken for a duplicate, as it cannot be
// told from one.
func (s *Session) seqNew(seq int64) bool {
	switch back := s.seqNext - 1 - seq; {
	case back < 0:
		if shift := -back; shift >= 64 {
			s.seqSeen = 0
		} else {
			s.seqSeen <<= uint(shift)
		}
		s.seqSeen |= 1
		s.seqNext = seq + 1
		return true
	case back >= 64:
		return false
	default:
		bit := uint64(1) << uint(back)
		if s.seqSeen&bit != 0 {
			return false
		}
		s.seqSeen |= bit
		return true
	}
}

func (t *Table[S]) token(s *entry[S], at, count, now int64, out *[]Report[S]) {
	if s.Chunks < math.MaxInt32 {
		s.Chunks++
	}
	s.Tokens += count
	c := &t.clocks[s.slot]
	c.lastSeen = now
	if s.NoStream {
		// The whole response at once: its tokens count, its time is the
		// request's end, and there is nothing to time between them.
		s.LastTokenTime = max(s.LastTokenTime, at)
		return
	}
	if s.inFreeze && at >= s.LastTokenTime {
		if at-s.LastTokenTime <= t.freezeAfter {
			// Made before the freeze began, only delivered late: no freeze.
			t.withdrawFreeze(s)
		} else {
			// The first token after the freeze closes its gap, as long as
			// the alert said: confirmed. The tokens after it (the fast gap
			// that ends the episode among them) are no late ones.
			s.inFreeze = false
		}
	}
	if x := s.extra; x != nil && x.withdrawnSince != 0 && at > x.withdrawnSince+t.freezeAfter && at >= s.LastTokenTime {
		// The first token past the withdrawn alert's moment closes the gap
		// that moment fell in: longer than the freeze time, the session
		// froze there after all (its last tokens were only late).
		alertAt := x.withdrawnSince + t.freezeAfter
		x.withdrawnSince = 0
		if at-s.LastTokenTime > t.freezeAfter && !s.inStall {
			t.reinstateFreeze(s, Stall{DetectedAt: alertAt, Since: s.LastTokenTime, Freeze: true})
		}
	}
	if !s.inStall {
		c.lastTokenSeen = now
	}
	if s.FirstTokenTime == 0 {
		s.FirstTokenTime, s.LastTokenTime = at, at
		if s.StartTime != 0 && at < s.StartTime {
			t.Counters.OutOfOrder++
		}
		t.obs.FirstToken(&s.Session, &s.state)
		t.checkTTFT(s, out)
		return
	}
	if at < s.LastTokenTime {
		t.Counters.OutOfOrder++
		s.FirstTokenTime = min(s.FirstTokenTime, at)
		return
	}
	gap := time.Duration(at - s.LastTokenTime)
	if count != 1 {
		// Most events are one token: no division for them.
		gap /= time.Duration(count)
	}
	if gap > t.cfg.Stall.Gap && s.slowRun == 0 {
		s.slowSince = s.LastTokenTime
	}
	s.LastTokenTime = at
	s.MaxGap = max(s.MaxGap, gap)
	t.pushGap(s, gap, count)
	t.obs.Gap(&s.Session, &s.state, gap, count)
	if gap <= t.cfg.Stall.Gap {
		s.slowRun = 0
		if s.inStall {
			s.inStall, s.inFreeze = false, false
			c.lastTokenSeen = now
		}
		return
	}
	s.slowRun = int32(min(int64(s.slowRun)+count, math.MaxInt32))
	if !s.inStall && int(s.slowRun) >= t.cfg.Stall.Consecutive {
		c.lastTokenSeen = 0
		t.stall(s, Stall{DetectedAt: at, Since: s.slowSince, Gaps: t.latestGaps(s, t.cfg.Stall.Consecutive)}, out)
	}
}

// window returns s's window of per-token gaps.
func (t *Table[S]) window(s *entry[S]) []uint32 {
	w := t.cfg.Window
	return t.gaps[int(s.slot)*w : (int(s.slot)+1)*w : (int(s.slot)+1)*w]
}

// pushGap adds n per-token gaps of g to s's window and updates its
// maximum window TPOT.
func (t *Table[S]) pushGap(s *entry[S], g time.Duration, n int64) {
	gaps := t.window(s)
	us := uint32(min(g/time.Microsecond, 1<<32-1))
	for range min(n, int64(len(gaps))) {
		// The slot overwritten is 0 until the window is full.
		s.gapSum += uint64(us) - uint64(gaps[s.gapNext])
		gaps[s.gapNext] = us
		// A compare, not a modulo: a division per token.
		if s.gapNext++; int(s.gapNext) == len(gaps) {
			s.gapNext = 0
		}
		s.gapLen = uint16(min(int(s.gapLen)+1, len(gaps)))
	}
	// Full windows only: over a partial one, a single long early gap
	// would set the maximum. WindowTPOT (gapSum/len µs, rounded down)
	// exceeds the maximum m µs exactly when gapSum ≥ (m+1)·len: the mean
	// is divided out only when it is a new maximum.
	if size := uint64(len(gaps)); uint64(s.gapLen) == size && s.gapSum >= (uint64(s.WindowTPOTMax/time.Microsecond)+1)*size {
		s.WindowTPOTMax, _ = s.WindowTPOT()
	}
}

// latestGaps returns up to n of s's latest gaps, oldest first.
func (t *Table[S]) latestGaps(s *entry[S], n int) []time.Duration {
	gaps := t.window(s)
	n = min(n, int(s.gapLen))
	out := make([]time.Duration, n)
	for i := range n {
		j := (int(s.gapNext) - n + i + len(gaps)) % len(gaps)
		out[i] = time.Duration(gaps[j]) * time.Microsecond
	}
	return out
}

func (t *Table[S]) stall(s *entry[S], st Stall, out *[]Report[S]) {
	s.inStall, s.inFreeze = true, st.Freeze
	t.countStall(s, st)
	*out = append(*out, Report[S]{
		Kind: ReportStalled, Session: &s.Session, State: &s.state, entry: s,
		Stall: st, StallCount: int(s.StallCount), Chunks: s.Chunks,
	})
	if t.cfg.Sampling.Stalls {
		r := ReasonStall
		if st.Freeze {
			r = ReasonFreeze
		}
		t.keepEarly(s, r, st.DetectedAt, out)
	}
}

// countStall counts the episode st in s's figures and records it.
func (t *Table[S]) countStall(s *entry[S], st Stall) {
	s.StallCount++
	if st.Freeze {
		s.Freezes++
	}
	if len(s.Stalls()) < t.cfg.Stall.MaxRecords {
		x := s.ensureExtra()
		x.stalls = append(x.stalls, st)
	}
}

// withdrawFreeze takes back the open freeze of s: a token stamped before it
// began has arrived. Its alert has gone out; the session's figures, span
// and verdict no longer count it, unless the gap its alert's moment falls
// in proves longer than the freeze time (reinstateFreeze).
func (t *Table[S]) withdrawFreeze(s *entry[S]) {
	s.inStall, s.inFreeze = false, false
	s.StallCount--
	s.Freezes--
	x := s.ensureExtra()
	if len(x.stalls) > int(s.StallCount) {
		x.stalls = x.stalls[:s.StallCount]
	}
	x.withdrawnSince = s.LastTokenTime
	t.Counters.WithdrawnFreezes++
}

// reinstateFreeze counts again the freeze withdrawn from s, as st: its
// last tokens came late, but the session froze at the alert's moment all
// the same. No second alert goes out (the first was right); the episode
// lasts until a fast gap, as a freeze does.
func (t *Table[S]) reinstateFreeze(s *entry[S], st Stall) {
	s.inStall = true
	t.clocks[s.slot].lastTokenSeen = 0
	t.countStall(s, st)
	t.Counters.ReinstatedFreezes++
}

// promptTokens is an event's prompt tokens as a Session keeps them: -1
// when unknown, at most MaxInt32.
func promptTokens(n int64) int32 {
	if n < 0 {
		return -1
	}
	return int32(min(n, math.MaxInt32))
}
