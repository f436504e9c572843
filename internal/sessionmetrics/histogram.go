// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sessionmetrics

// Bucket boundaries, in the metric's unit. Explicit buckets are (previous bound, bound], plus
// (last bound, +Inf), as in OTLP.
var (
	// ttftBounds are semconv's gen_ai.server.time_to_first_token boundaries.
	ttftBounds = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}
	// tpotBounds are semconv's gen_ai.server.time_per_output_token boundaries plus 0.08, so the
	// 80 ms slow-session threshold is a bucket edge. Also used for the inter-token latency.
	tpotBounds = []float64{0.01, 0.025, 0.05, 0.075, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}
	// durationBounds are semconv's gen_ai.server.request.duration boundaries.
	durationBounds = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	// tokenBounds are semconv's gen_ai.client.token.usage boundaries.
	tokenBounds = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// histogram is one data point of either kind. Values are never negative (callers clamp), so the
// exponential form has only the zero bucket and positive buckets.
type histogram struct {
	count    uint64
	sum      float64
	min, max float64

	// explicit
	bounds []float64 // shared, read-only; nil for an exponential histogram
	// last is the bucket of the latest value: a series' inter-token
	// latencies mostly fall in the same one, checked before the search.
	last int

	// counts are the bucket counts: len(bounds)+1 of them for explicit; for exponential, the
	// positive buckets with indexes offset .. offset+len(counts)-1.
	counts []uint64

	// exponential
	tables    *mappingTables
	maxSize   int
	scale     int32
	offset    int32
	zeroCount uint64
}

func newExplicit(bounds []float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func newExponential(maxSize int) histogram {
	return histogram{tables: expoTables(), maxSize: maxSize, scale: expoMaxScale}
}

// record adds n observations of v (n ≥ 1, v ≥ 0).
func (h *histogram) record(v float64, n uint64) {
	switch {
	case h.count == 0:
		h.min, h.max = v, v
	case v < h.min:
		h.min = v
	case v > h.max:
		h.max = v
	}
	h.count += n
	h.sum += v * float64(n)
	if b := h.bounds; b != nil {
		i := h.last
		if (i < len(b) && v > b[i]) || (i > 0 && v <= b[i-1]) {
			i = explicitIndex(b, v)
			h.last = i
		}
		h.counts[i] += n
		return
	}
	h.recordExponential(v, n)
}

// reset empties the histogram for the next delta interval, keeping its buckets' memory; an
// exponential one returns to the finest scale, as each delta point is an independent histogram.
func (h *histogram) reset() {
	h.count, h.sum, h.min, h.max = 0, 0, 0, 0
	if h.bounds != nil {
		clear(h.counts)
		h.last = 0
		return
	}
	h.counts = h.counts[:0]
	h.scale, h.offset, h.zeroCount = expoMaxScale, 0, 0
}

// explicitIndex returns the index of the bucket (bounds[i-1], bounds[i]] holding v: the first i
// with v ≤ bounds[i], or len(bounds) for the overflow bucket. A hand-written binary search: it
// inlines, unlike sort.SearchFloat64s with its closure.
func explicitIndex(bounds []float64, v float64) int {
	lo, hi := 0, len(bounds)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if bounds[mid] < v {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

func (h *histogram) recordExponential(v float64, n uint64) {
	if v == 0 {
		h.zeroCount += n
		return
	}
	idx := h.tables.index(v, h.scale)
	if len(h.counts) == 0 {
		h.offset = idx
		h.counts = append(h.counts, n)
		return
	}
	end := h.offset + int32(len(h.counts)) - 1
	if idx >= h.offset && idx <= end {
		h.counts[idx-h.offset] += n
		return
	}
	lo, hi := min(idx, h.offset), max(idx, end)
	var change int32
	for int64(hi)-int64(lo) >= int64(h.maxSize) {
		lo >>= 1
		hi >>= 1
		change++
	}
	if change > 0 {
		h.downscale(change)
		// Bucket i at scale s is the union of buckets 2i and 2i+1 at scale s+1, so shifting the
		// index is exact and agrees with the merged counts.
		idx >>= change
	}
	h.grow(idx)
	h.counts[idx-h.offset] += n
}

// downscale lowers the scale by change, merging each 2^change adjacent buckets into one.
func (h *histogram) downscale(change int32) {
	h.scale -= change
	newOffset := h.offset >> change
	last := -1
	// The target index j never exceeds i and grows by at most one per step, so merging in place
	// only overwrites buckets already read.
	for i, c := range h.counts {
		j := int((h.offset+int32(i))>>change - newOffset)
		if j != last {
			h.counts[j] = c
			last = j
		} else {
			h.counts[j] += c
		}
	}
	h.counts = h.counts[:last+1]
	h.offset = newOffset
}

// grow extends the bucket range to include idx, which the caller has checked fits in maxSize.
func (h *histogram) grow(idx int32) {
	end := h.offset + int32(len(h.counts)) - 1
	switch {
	case idx < h.offset:
		shift := int(h.offset - idx)
		old := len(h.counts)
		h.counts = append(h.counts, make([]uint64, shift)...)
		copy(h.counts[shift:], h.counts[:old])
		clear(h.counts[:shift])
		h.offset = idx
	case idx > end:
		h.counts = append(h.counts, make([]uint64, int(idx-end))...)
	}
}
