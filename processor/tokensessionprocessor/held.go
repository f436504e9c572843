// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"time"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// heldOutput is a kept session whose span and summary wait: for its
// engine's next scrape (the pre-emption count's bracket), for its engine
// span (the timing), for the engine's share (shares.go), or for several.
type heldOutput struct {
	s   *session.Session
	end session.End
	// scrapeUntil and timingUntil are when (collector time) each wait ends
	// at the latest; 0 when the session does not wait for it (or no longer).
	scrapeUntil, timingUntil int64
	// share: it waits for the engine's share; the share join ends the wait
	// (the share came, or its wait is over), so that the outputs and the
	// counters take the same share.
	share bool
}

// maxHeld bounds the kept sessions whose outputs wait; beyond it a session's
// outputs go at once, without what they would have waited for.
const maxHeld = 10_000

// maxEngineWait bounds the wait for a scrape after a session's end.
const maxEngineWait = 30 * time.Second

// heldOutputs are the kept sessions whose outputs wait, in the order they
// ended. The fold calls it under its lock.
type heldOutputs struct {
	engines *engineContext
	list    []*heldOutput
}

// hold holds back the outputs of the kept session s, ended by e, at
// collector time now, when it waits for something:
//   - its engine is scraped but not yet since s ended: the pre-emptions
//     during a session are counted between the scrapes that bracket it, and
//     without the one after, the count would be a guess. Two scrape
//     intervals at most (maxEngineWait);
//   - its engine span, for the timing, until timingUntil (0: it does not
//     wait for one);
//   - the engine's share, when share is set.
//
// It returns the held output, nil when s does not wait; full when s would
// have waited but maxHeld outputs already do.
func (hs *heldOutputs) hold(s *session.Session, e *session.End, timingUntil int64, share bool, now int64) (h *heldOutput, full bool) {
	h = &heldOutput{timingUntil: timingUntil, share: share}
	if interval, pending := hs.engines.scrapePending(s.Engine, s.EndedAt(e)); pending {
		h.scrapeUntil = now + min(2*interval, int64(maxEngineWait))
	}
	if h.scrapeUntil == 0 && h.timingUntil == 0 && !h.share {
		return nil, false
	}
	if len(hs.list) >= maxHeld {
		return nil, true
	}
	h.s, h.end = s.Clone(), *e
	hs.list = append(hs.list, h)
	return h, false
}

// release hands write the held sessions that wait no more, at collector
// time now: their engine was scraped since they ended (or is forgotten),
// their timing came and their share's wait ended, or the waits are over;
// all of them with force (shutdown).
func (hs *heldOutputs) release(now int64, force bool, write func(*session.Session, *session.End)) {
	waiting := hs.list[:0]
	for _, h := range hs.list {
		if h.scrapeUntil != 0 {
			// Scraped since the session ended, or forgotten.
			_, pending := hs.engines.scrapePending(h.s.Engine, h.s.EndedAt(&h.end))
			if !pending || now >= h.scrapeUntil {
				h.scrapeUntil = 0
			}
		}
		if h.timingUntil != 0 && now >= h.timingUntil {
			h.timingUntil = 0
		}
		if force || (h.scrapeUntil == 0 && h.timingUntil == 0 && !h.share) {
			write(h.s, &h.end)
			continue
		}
		waiting = append(waiting, h)
	}
	clear(hs.list[len(waiting):])
	hs.list = waiting
}

// len counts the outputs waiting.
func (hs *heldOutputs) len() int { return len(hs.list) }
