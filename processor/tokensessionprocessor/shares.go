// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"math"

	"github.com/otelcol-llm/otelcol-llm/internal/attribution"
	"github.com/otelcol-llm/otelcol-llm/internal/sessionmetrics"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// The engine's own share of a request's busy time comes on the session's
// end (an engine whose hook sees its steps), or, where another process sees
// the steps, as a share event: vLLM's engine core schedules them, its API
// server sends the session. The engine core knows the request by vLLM's
// internal id only, so the share is named by it, and the session's start
// names the same id in its llm.engine.request_id attribute. The two come
// over different connections, the share before or after the end; they are
// joined here.
//
// A session whose start names an id and whose end brought no share waits
// for it (attribution::share_wait at most): its counting in llm.engine.time
// (the account closed on its engine's steps at its end, counted later),
// and a kept one's span and summary (heldOutput), wait with it, since
// neither can be corrected once sent. A share that comes before its session
// ended waits as long for it, as an early engine span does. Without the
// share the session keeps the collector's estimate.
//
// The collector's own share is final only once the engine's steps the
// session was in are settled (attribution::settle_after after they
// ended): every session with an account waits for that too, here, in the
// same way.

// awaitedShare is an ended session waiting for its engine's share.
type awaitedShare struct {
	id string
	// acct is the session's account, closed (attributor.close) and not yet
	// counted; counted says whether there is one to count.
	acct    shareAccount
	counted bool
	prompt  int64
	// share is the session's share so far: the collector's (final once
	// settled), or the engine's once it came (fromEngine).
	share      session.EngineShare
	fromEngine bool
	// waitShare: it waits for the engine's share (its id, until the wait
	// ends); settling: for its collector share's steps to settle.
	waitShare, settling bool
	held                *heldOutput // its outputs, when kept and held
	wait                            // done: no longer waiting for the engine's share
}

// earlyShare is an engine's share that came before its session ended.
type earlyShare struct {
	id    string
	share session.EngineShare
	wait
}

// shareJoin joins share events to sessions by their engine request id. The
// fold calls it under its lock; it counts what it joins, gives up on or
// drops, and has the attributor count each session once, with its final
// share.
type shareJoin struct {
	wait, max int64
	attr      *attributor
	telemetry *processorTelemetry

	awaited map[string]*awaitedShare
	// settling are the ended sessions whose collector share is not final
	// yet, by their account.
	settling map[*attribution.Account]*awaitedShare
	// queue is every awaited session in order of until (the wait is the
	// same for all), for expiry; earlyQueue likewise.
	queue      []*awaitedShare
	early      map[string]*earlyShare
	earlyQueue []*earlyShare
}

func newShareJoin(cfg AttributionConfig, attr *attributor, telemetry *processorTelemetry) shareJoin {
	return shareJoin{
		wait: int64(cfg.ShareWait), max: int64(cfg.MaxPendingShares), attr: attr, telemetry: telemetry,
		awaited: make(map[string]*awaitedShare), early: make(map[string]*earlyShare),
		settling: make(map[*attribution.Account]*awaitedShare),
	}
}

// engineRequestID is the engine's id of s's request, named by its start;
// "" when none was.
func engineRequestID(s *session.Session) string {
	for _, a := range s.Attributes() {
		if a.Key == tokenevent.AttrEngineRequestID {
			return a.Value
		}
	}
	return ""
}

// pending counts the sessions and shares waiting.
func (j *shareJoin) pending() int64 { return int64(len(j.awaited) + len(j.early)) }

// settlingBound is how many times max_pending_shares sessions may wait for
// their steps to settle: every session does, for settle_after, so the
// bound is the session rate's, not the engine shares'.
const settlingBound = 4

// ended closes the account acc of the session s, ended by e, at collector
// time now, with the engine's share if it came already. A session whose
// start named its engine request id and that has no engine share yet
// waits for it, and one whose collector share is not settled yet waits
// for that: the returned awaitedShare is its place, and its account is
// counted when both are done; nil when it does not wait, its account
// counted now. live is the session's metric series.
func (j *shareJoin) ended(s *session.Session, e *session.End, acc *shareAccount, live *sessionmetrics.Live, now int64) *awaitedShare {
	id := ""
	if e.Share.Source != session.ShareEngine {
		id = engineRequestID(s)
	}
	if id != "" {
		if sh := j.takeEarly(id); sh != nil {
			e.Share = sh.share
			j.telemetry.share(shareJoined)
			id = ""
		}
	}
	counted, final := j.attr.close(s, e, acc, live, now)
	settling := counted && !final
	if id != "" && j.pending() >= j.max {
		j.telemetry.share(shareOverflow)
		id = ""
	}
	if settling && int64(len(j.settling)) >= settlingBound*j.max {
		// No room to wait: the share so far, counted now; its steps
		// still to settle go to the others in them.
		j.telemetry.share(shareOverflow)
		settling = false
	}
	if id == "" && !settling {
		if counted {
			j.attr.count(acc, int64(s.PromptTokens), &e.Share)
		}
		return nil
	}
	a := &awaitedShare{
		id: id, counted: counted, prompt: int64(s.PromptTokens), share: e.Share, fromEngine: e.Share.Source == session.ShareEngine,
		waitShare: id != "", settling: settling, wait: wait{until: now + j.wait},
	}
	if counted {
		a.acct = *acc // the session's state goes to a next session
		*acc = shareAccount{}
	}
	if id != "" {
		if old := j.awaited[id]; old != nil {
			// Two sessions named one id: the later takes the share, the
			// earlier keeps its place in the queue until its wait ends.
			delete(j.awaited, id)
			old.id = ""
		}
		j.awaited[id] = a
		j.queue = append(j.queue, a)
	} else {
		a.done = true
	}
	if settling {
		j.settling[a.acct.share] = a
	}
	return a
}

// giveUp settles a, whose outputs could not be held, with its share so
// far at once: the outputs and the counters take the same share.
func (j *shareJoin) giveUp(a *awaitedShare) {
	j.forget(a)
	if a.settling {
		delete(j.settling, a.acct.share)
		a.settling = false
	}
	j.settle(a)
	j.telemetry.share(shareOverflow)
}

// arrived takes a share event at collector time now: the awaited session
// of its id takes it; otherwise it waits for its session to end. It
// reports whether a held output no longer waits for it.
func (j *shareJoin) arrived(ev *tokenevent.Event, now int64) (released bool) {
	sh := session.EngineShareOf(ev)
	if a := j.awaited[ev.EngineRequestID]; a != nil {
		j.forget(a)
		a.share, a.fromEngine = sh, true
		j.telemetry.share(shareJoined)
		return j.settle(a)
	}
	if j.pending() >= j.max {
		j.telemetry.share(shareOverflow)
		return false
	}
	if old := j.early[ev.EngineRequestID]; old != nil {
		// A second share of one id: the later wins.
		old.done = true
		j.telemetry.share(shareOrphaned)
	}
	es := &earlyShare{id: ev.EngineRequestID, share: sh, wait: wait{until: now + j.wait}}
	j.early[es.id] = es
	j.earlyQueue = append(j.earlyQueue, es)
	return false
}

// settled takes an account the engine's steps made final: its session's
// collector share is its share unless the engine's came. It reports
// whether a held output no longer waits for it.
func (j *shareJoin) settled(acct *attribution.Account) (released bool) {
	a := j.settling[acct]
	if a == nil {
		return false
	}
	delete(j.settling, acct)
	a.settling = false
	if !a.fromEngine {
		a.share = collectorShare(acct)
	}
	return j.settle(a)
}

// settle moves a on as far as its share allows: its held outputs carry
// its final share once it has one (the engine's, or the collector's
// settled); its account is counted once the collector's is settled too
// (its energy is the collector's, which the engines' idle energy adds up
// with). It reports whether a held output no longer waits.
func (j *shareJoin) settle(a *awaitedShare) (released bool) {
	if a.waitShare || (a.settling && !a.fromEngine) {
		return false
	}
	if h := a.held; h != nil {
		h.end.Share = a.share
		h.share = false
		a.held = nil
		released = true
	}
	if a.counted && !a.settling {
		j.attr.count(&a.acct, a.prompt, &a.share)
		a.counted = false
	}
	return released
}

func (j *shareJoin) forget(a *awaitedShare) {
	a.done = true
	a.waitShare = false
	if a.id != "" && j.awaited[a.id] == a {
		delete(j.awaited, a.id)
	}
}

// takeEarly returns the share of id that came before its session ended,
// and forgets it; nil when none did.
func (j *shareJoin) takeEarly(id string) *earlyShare {
	sh := j.early[id]
	if sh == nil {
		return nil
	}
	delete(j.early, id)
	sh.done = true
	return sh
}

// expire settles, at collector time now, the sessions whose share did not
// come within the wait with the collector's estimate, and drops the shares
// whose session did not end within it. Each held output whose wait it ends
// is released by the caller's next release.
func (j *shareJoin) expire(now int64) {
	j.queue = expireWaits(j.queue, now, func(a *awaitedShare) {
		j.forget(a)
		j.settle(a)
		j.telemetry.share(shareExpired)
	})
	j.earlyQueue = expireWaits(j.earlyQueue, now, func(sh *earlyShare) {
		sh.done = true
		delete(j.early, sh.id)
		j.telemetry.share(shareOrphaned)
	})
}

// shutdown ends every wait, as at its end: the steps were settled whole
// before (attributor.settleAll).
func (j *shareJoin) shutdown() {
	for acct := range j.settling {
		j.settled(acct)
	}
	j.expire(math.MaxInt64)
}
