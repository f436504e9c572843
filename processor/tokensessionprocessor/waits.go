// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

// wait is an entry of a join's queue (the engine spans', the engine
// shares'): until when it waits, in collector time, and whether it was met
// or given up on.
type wait struct {
	until int64
	done  bool
}

func (w *wait) waiting() *wait { return w }

// expireWaits drops from the front of queue, whose entries wait in the
// order of their deadlines, those done already and those due at now,
// handing each due one to expired, and returns what is left.
func expireWaits[T interface{ waiting() *wait }](queue []T, now int64, expired func(T)) []T {
	n := 0
	for _, e := range queue {
		if w := e.waiting(); !w.done {
			if w.until > now {
				break
			}
			expired(e)
		}
		n++
	}
	clear(queue[:n])
	return queue[n:]
}
