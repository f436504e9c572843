// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"

import (
	"math"
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/exphist"
)

// The TTFT histograms are base-2 exponential ones at scale 2 (four buckets
// an octave, a bucket 19% wide) over [2^-12 s, 2^8 s): 0.24 ms to 256 s,
// read with internal/exphist as engine_health reads the session metrics.
const (
	ttftScale   = 2
	ttftOffset  = -12 << ttftScale
	ttftBuckets = 20 << ttftScale
)

type ttftHist [ttftBuckets]uint32

// add counts d in its bucket: the one whose (lower, upper] holds it.
// math.Frexp, not math.Log2: the snapshot does this for every session in
// flight, under the lock.
func (h *ttftHist) add(d time.Duration) {
	i := ttftOffset
	if sec := d.Seconds(); sec > 0 {
		frac, exp := math.Frexp(sec) // sec = frac·2^exp, frac in [0.5, 1)
		m := 2 * frac                // sec = m·2^(exp-1), m in [1, 2)
		i = (exp - 1) << ttftScale
		switch {
		case m == 1:
			i-- // a power of two is the upper bound of the bucket below
		case m > ttftQuarter[2]:
			i += 3
		case m > ttftQuarter[1]:
			i += 2
		case m > ttftQuarter[0]:
			i++
		}
	}
	h[min(max(i-ttftOffset, 0), ttftBuckets-1)]++
}

// ttftQuarter are the bucket bounds within an octave at scale 2:
// 2^(1/4), 2^(2/4), 2^(3/4).
var ttftQuarter = [3]float64{math.Exp2(0.25), math.Exp2(0.5), math.Exp2(0.75)}

// ttftMinute is one engine's TTFTs by the second their first token came
// in, over the last minute.
type ttftMinute struct {
	seconds [60]int64
	hists   [60]ttftHist
}

func (m *ttftMinute) add(at int64, d time.Duration) {
	sec := at / int64(time.Second)
	i := int(sec % 60)
	if m.seconds[i] != sec {
		m.seconds[i] = sec
		m.hists[i] = ttftHist{}
	}
	m.hists[i].add(d)
}

// sumInto adds the seconds of the minute before now to h; it reports
// whether any was.
func (m *ttftMinute) sumInto(now int64, h *ttftHist) bool {
	nowSec := now / int64(time.Second)
	found := false
	for i := range m.seconds {
		if s := m.seconds[i]; s > nowSec-60 && s <= nowSec {
			for j, c := range m.hists[i] {
				h[j] += c
			}
			found = true
		}
	}
	return found
}

// quantiles are h's p50 and p99 in ms; NaN for an empty h.
func (h *ttftHist) quantiles() (p50, p99 float64, n uint64) {
	hist := exphist.Histogram{Scale: ttftScale, Offset: ttftOffset, Counts: make([]uint64, ttftBuckets)}
	for i, c := range h {
		hist.Counts[i] = uint64(c)
		hist.Count += uint64(c)
	}
	if hist.Count == 0 {
		return math.NaN(), math.NaN(), 0
	}
	return hist.Quantile(0.5) * 1e3, hist.Quantile(0.99) * 1e3, hist.Count
}
