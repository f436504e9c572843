// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

// The table's sampling decisions: a session kept early (a TTFT breach, a
// stall), its verdict at the end, and the verdicts of traces whose sessions
// share a trace.

import (
	"hash/maphash"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"
)

func (t *Table[S]) checkTTFT(s *entry[S], out *[]Report[S]) {
	if ttft, ok := s.TTFT(); ok && t.cfg.Sampling.TTFT > 0 && ttft > t.cfg.Sampling.TTFT {
		t.keepEarly(s, ReasonTTFT, s.FirstTokenTime, out)
	}
}

// keepEarly keeps s before its end, for reason r, reached at engine time
// at; the reasons are recomputed from the final figures at the end
// (decide). A session opened by a token has only a random trace, which no
// other span shares: its keep is held until the start brings the real one
// (releaseHeldKeep), and never reported if the start does not come.
func (t *Table[S]) keepEarly(s *entry[S], r Reason, at int64, out *[]Report[S]) {
	s.Reasons |= r
	if s.Keep {
		return
	}
	s.Keep = true
	s.Threshold = t.ruleThreshold(s)
	if !s.HasStart {
		s.keepHeld = true
		s.ensureExtra().keptAt = at
		return
	}
	t.traceKeep(s, at, out)
}

// releaseHeldKeep reports the keep of s held since before its start, now
// that the start gave it its trace (and the caller's head-sampling
// threshold). The verdict is as old as the keep, or the first token when
// the start shows a TTFT breach.
func (t *Table[S]) releaseHeldKeep(s *entry[S], out *[]Report[S]) {
	s.keepHeld = false
	s.Threshold = t.ruleThreshold(s)
	at := s.extra.keptAt
	if s.Reasons&ReasonTTFT != 0 {
		at = min(at, s.FirstTokenTime)
	}
	t.traceKeep(s, at, out)
}

// traceKeep marks the trace of the kept session s kept and reports it, so
// that its held spans are released.
func (t *Table[S]) traceKeep(s *entry[S], at int64, out *[]Report[S]) {
	r := t.traceRecord(s)
	if !r.kept || sampling.ThresholdLessThan(s.Threshold, r.th) {
		r.th = s.Threshold
	}
	r.kept = true
	*out = append(*out, Report[S]{
		Kind: ReportKeptEarly, Session: &s.Session, State: &s.state, entry: s,
		Trace: TraceVerdict{Kept: true, Threshold: r.th}, At: at,
	})
}

// ruleThreshold is the threshold of a session a rule keeps: every one,
// unless the caller's head sampler kept the trace at a probability of its
// own, which the spans must go on saying (OTEP 235).
func (t *Table[S]) ruleThreshold(s *entry[S]) sampling.Threshold {
	if up, ok := s.upstreamThreshold(); ok {
		return up
	}
	return sampling.AlwaysSampleThreshold
}

// decide sets the final verdict. The reasons are those the final figures
// match: a freeze its alert reported is a reason of its own (freeze), apart
// from the runs of slow gaps (stall); an early keep that no final figure
// bears out (a TTFT an earlier first token undid, a freeze withdrawn and
// not reinstated) is kept as corrected:
// kept when a rule matches, else when another session of the trace was
// kept (a keep holds for the whole trace), else by the consistent draw
// on the session's randomness (OTEP 235), at the lower of NormalPercent
// and the caller's own head-sampling probability. ref is the keep of the
// session's trace.
func (t *Table[S]) decide(s *entry[S], e *End, ref traceRef) {
	p := t.cfg.Sampling
	var r Reason
	if ttft, ok := s.TTFT(); ok && p.TTFT > 0 && ttft > p.TTFT {
		r |= ReasonTTFT
	}
	if tpot, ok := s.TPOT(e.CompletionTokens); ok && p.TPOT > 0 && tpot > p.TPOT {
		r |= ReasonTPOT
	}
	if p.Stalls && s.StallCount > s.Freezes {
		r |= ReasonStall
	}
	if p.Stalls && s.Freezes > 0 {
		r |= ReasonFreeze
	}
	if p.Errors && s.Outcome == OutcomeError {
		r |= ReasonError
	}
	if p.Errors && s.Outcome == OutcomeTimeout {
		r |= ReasonTimeout
	}
	if p.QueueTime > 0 && e.Timing.Known() && e.Timing.Queue > p.QueueTime {
		r |= ReasonQueue
	}
	normal := t.normal
	if up, ok := s.upstreamThreshold(); ok && sampling.ThresholdGreater(up, normal) {
		normal = up
	}
	traceTh, traceKept := t.traceKept(s.TraceID, ref)
	switch {
	case r != 0:
		s.Keep, s.Threshold, s.Reasons = true, t.ruleThreshold(s), r
	case s.Keep:
		s.Threshold, s.Reasons = t.ruleThreshold(s), ReasonCorrected
	case traceKept:
		s.Keep, s.Threshold, s.Reasons = true, traceTh, ReasonTrace
	case normal.ShouldSample(s.randomness()):
		s.Keep, s.Threshold, s.Reasons = true, normal, ReasonProbabilistic
	default:
		s.Keep, s.Threshold, s.Reasons = false, normal, 0
	}
	if s.Keep && traceKept && sampling.ThresholdLessThan(traceTh, s.Threshold) {
		// Every kept span of a trace carries one threshold: the lowest.
		s.Threshold = traceTh
	}
}

// traceKept reports whether the trace id of an active session, ref its
// keep, was kept, by an active session or (TraceMemory) an ended one, and
// its threshold.
func (t *Table[S]) traceKept(id pcommon.TraceID, ref traceRef) (sampling.Threshold, bool) {
	th, kept := ref.th, ref.kept
	if t.memory != nil {
		if mth, mkept := t.memory(id); mkept && (!kept || sampling.ThresholdLessThan(mth, th)) {
			th, kept = mth, true
		}
	}
	return th, kept
}

func (t *Table[S]) traceHash(id pcommon.TraceID) uint64 { return maphash.Comparable(t.seed, id) }

// isTrace is whether a position in traces is that of trace id.
func (t *Table[S]) isTrace(id pcommon.TraceID) func(pos int) bool {
	return func(pos int) bool {
		if pos >= traceRecordPos {
			return t.traceRecords[pos-traceRecordPos].id == id
		}
		return t.slots[pos].TraceID == id
	}
}

// traceRefAt is the keep of the trace at pos in traces (ok: found).
func (t *Table[S]) traceRefAt(pos int, ok bool) traceRef {
	if !ok || pos < traceRecordPos {
		return traceRef{}
	}
	return t.traceRecords[pos-traceRecordPos].traceRef
}

// traceRef returns the keep of trace id, of an active session.
func (t *Table[S]) traceRef(id pcommon.TraceID) traceRef {
	return t.traceRefAt(t.traces.find(t.traceHash(id), t.isTrace(id)))
}

// traceRecord returns the record of the trace of the active session s,
// made when its trace was indexed by s alone.
func (t *Table[S]) traceRecord(s *entry[S]) *traceRecord {
	h := t.traceHash(s.TraceID)
	pos, _ := t.traces.find(h, t.isTrace(s.TraceID))
	if pos >= traceRecordPos {
		return &t.traceRecords[pos-traceRecordPos]
	}
	t.traceRecords = append(t.traceRecords, traceRecord{id: s.TraceID, active: 1})
	t.traces.move(h, pos, traceRecordPos+len(t.traceRecords)-1)
	return &t.traceRecords[len(t.traceRecords)-1]
}

// traceAdd puts the new session s (its slot set) on its trace.
func (t *Table[S]) traceAdd(s *entry[S]) {
	h := t.traceHash(s.TraceID)
	if _, ok := t.traces.find(h, t.isTrace(s.TraceID)); !ok {
		t.traces.add(h, int(s.slot))
		return
	}
	t.traceRecord(s).active++
}

// traceRemove takes s off its trace, counting its keep (with threshold th)
// into the trace's, and returns the trace's verdict.
func (t *Table[S]) traceRemove(s *entry[S], kept bool, th sampling.Threshold) TraceVerdict {
	return t.traceRemoveRef(s, t.traceRef(s.TraceID), kept, th)
}

// traceRemoveRef is traceRemove with r, the trace's keep, looked up
// already.
func (t *Table[S]) traceRemoveRef(s *entry[S], r traceRef, kept bool, th sampling.Threshold) TraceVerdict {
	if kept && (!r.kept || sampling.ThresholdLessThan(th, r.th)) {
		r.th = th
	}
	r.kept = r.kept || kept
	v := TraceVerdict{Kept: r.kept, Threshold: r.th}
	if !v.Kept {
		v.Threshold = sampling.NeverSampleThreshold
	}
	h := t.traceHash(s.TraceID)
	pos, _ := t.traces.find(h, t.isTrace(s.TraceID))
	if pos < traceRecordPos {
		t.traces.remove(h, pos)
		v.Done = true
		return v
	}
	rec := &t.traceRecords[pos-traceRecordPos]
	if rec.active--; rec.active > 0 {
		rec.traceRef = r
		return v
	}
	t.traces.remove(h, pos)
	last := len(t.traceRecords) - 1
	if i := pos - traceRecordPos; i != last {
		t.traces.move(t.traceHash(t.traceRecords[last].id), traceRecordPos+last, pos)
		t.traceRecords[i] = t.traceRecords[last]
	}
	t.traceRecords = t.traceRecords[:last]
	v.Done = true
	return v
}
