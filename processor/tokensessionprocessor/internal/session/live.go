// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

// Phase is where an active session stands, for the live view.
type Phase uint8

const (
	// PhaseWaiting: no token yet (queued or in prefill), or a request not
	// streamed, whose tokens come at its end.
	PhaseWaiting Phase = iota
	// PhaseDecoding: tokens are coming.
	PhaseDecoding
	// PhaseStalled: a stall episode of slow gaps is open (the stall rule
	// of StallConfig), or a freeze whose first token since has come.
	PhaseStalled
	// PhaseFrozen: no token for the freeze time while the engine's clock,
	// as the session's source shows it, moved on past it (Tick's freeze).
	PhaseFrozen
)

var phaseNames = [...]string{"waiting", "decoding", "stalled", "frozen"}

func (p Phase) String() string { return phaseNames[p] }

// Scan calls fn for every active session, in no order, with its phase and
// the engine's clock as the session's source shows it at collector time
// now (Unix ns): the time the session's gaps and age are measured against.
// It reads each session's figures without changing anything; fn must not
// keep s after it returns, nor call into the table.
//
// The cost is one pass over the active sessions, with no allocation: the
// live view runs it only while someone watches.
func (t *Table[S]) Scan(now int64, fn func(s *Session, phase Phase, engineNow int64)) {
	slack := int64(t.cfg.Stall.DeliverySlack)
	for _, s := range t.slots {
		engineNow := now
		if src := s.source; src != nil && src.engineTime != 0 {
			engineNow = src.engineNow(now, slack)
		}
		fn(&s.Session, s.phase(), engineNow)
	}
}

// phase is s's phase now.
func (s *Session) phase() Phase {
	switch {
	case s.inFreeze:
		return PhaseFrozen
	case s.inStall:
		return PhaseStalled
	case s.FirstTokenTime == 0:
		return PhaseWaiting
	default:
		return PhaseDecoding
	}
}
