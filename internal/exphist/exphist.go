// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package exphist reads OTel base-2 exponential histograms: where a
// bucket's bounds lie, and the positive range of a data point as a value
// that merges with others and estimates quantiles. engine_health reads the
// TTFT histograms it judges with it, and the demo its report's figures.
package exphist // import "github.com/otelcol-llm/otelcol-llm/internal/exphist"

import (
	"math"

	"go.opentelemetry.io/collector/pdata/pmetric"
)

// Base is the ratio of a bucket's upper bound to its lower at scale:
// 2^(2^-scale).
func Base(scale int32) float64 { return math.Exp2(math.Exp2(-float64(scale))) }

// Bounds are the bounds of the positive bucket index at scale: it holds the
// values in (lower, upper] = (base^index, base^(index+1)].
func Bounds(scale, index int32) (lower, upper float64) {
	return lowerBound(scale, index), lowerBound(scale, index+1)
}

// lowerBound is the lower bound of the positive bucket index at scale,
// 2^(index·2^-scale): exact where it is a power of two (2 s at scale 4 is
// 2, where base^index misses it by a few ulps and a value of exactly 2 s,
// a threshold, would fall in the bucket above).
func lowerBound(scale, index int32) float64 {
	return math.Exp2(float64(index) * math.Exp2(-float64(scale)))
}

// Histogram is the positive range of a base-2 exponential histogram:
// Counts[i] is bucket Offset+i (see Bounds). What it holds are durations,
// so negative values never occur and the zero bucket only holds exact
// zeros.
type Histogram struct {
	Scale     int32
	ZeroCount uint64
	Offset    int32
	Counts    []uint64
	Count     uint64
	Sum       float64
}

// Of reads a data point; Counts is a copy.
func Of(dp pmetric.ExponentialHistogramDataPoint) Histogram {
	return Histogram{
		Scale:     dp.Scale(),
		ZeroCount: dp.ZeroCount(),
		Offset:    dp.Positive().Offset(),
		Counts:    dp.Positive().BucketCounts().AsRaw(),
		Count:     dp.Count(),
		Sum:       dp.Sum(),
	}
}

// downscale merges buckets pairwise by times steps (scale − steps).
func (h Histogram) downscale(steps int32) Histogram {
	if steps <= 0 || len(h.Counts) == 0 {
		h.Scale -= max(steps, 0)
		return h
	}
	first := h.Offset >> steps
	last := (h.Offset + int32(len(h.Counts)) - 1) >> steps
	counts := make([]uint64, last-first+1)
	for i, c := range h.Counts {
		counts[((h.Offset+int32(i))>>steps)-first] += c
	}
	h.Offset, h.Counts, h.Scale = first, counts, h.Scale-steps
	return h
}

// Merge adds o to h at the coarser of the two scales.
func (h Histogram) Merge(o Histogram) Histogram {
	if h.Count == 0 {
		return o
	}
	if o.Count == 0 {
		return h
	}
	scale := min(h.Scale, o.Scale)
	a, b := h.downscale(h.Scale-scale), o.downscale(o.Scale-scale)
	if len(a.Counts) == 0 {
		a.Offset = b.Offset
	}
	first, last := a.Offset, a.Offset+int32(len(a.Counts))-1
	if len(b.Counts) > 0 {
		first = min(first, b.Offset)
		last = max(last, b.Offset+int32(len(b.Counts))-1)
	}
	counts := make([]uint64, max(last-first+1, 0))
	for i, c := range a.Counts {
		counts[a.Offset+int32(i)-first] += c
	}
	for i, c := range b.Counts {
		counts[b.Offset+int32(i)-first] += c
	}
	return Histogram{
		Scale: scale, ZeroCount: a.ZeroCount + b.ZeroCount, Offset: first, Counts: counts,
		Count: a.Count + b.Count, Sum: a.Sum + b.Sum,
	}
}

// Quantile estimates the q-quantile (0..1) the way llmload computes its
// percentiles from raw values (numpy's linear method: rank q·(n−1),
// interpolated between the two order statistics around it), with each
// order statistic estimated from its bucket: the c values of a bucket are
// taken to sit at the midpoints of c equal log-slices of it, since values
// within a base-2 exponential bucket spread evenly on a log scale far
// better than on a linear one. Each estimate lies in the right bucket, so
// the relative error is below base−1 (4.4% at scale 4) and typically a
// fraction of it. NaN when empty.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	rank := q * float64(h.Count-1)
	lo := math.Floor(rank)
	a := h.orderStatistic(uint64(lo))
	if rank == lo {
		return a
	}
	b := h.orderStatistic(uint64(lo) + 1)
	return a + (b-a)*(rank-lo)
}

// orderStatistic estimates the k-th smallest value (0-based).
func (h Histogram) orderStatistic(k uint64) float64 {
	if k < h.ZeroCount {
		return 0
	}
	cum := h.ZeroCount
	for i, c := range h.Counts {
		if k < cum+c {
			frac := (float64(k-cum) + 0.5) / float64(c)
			return lowerBound(h.Scale, h.Offset+int32(i)) * math.Pow(Base(h.Scale), frac)
		}
		cum += c
	}
	// k beyond the buckets (Count and the buckets disagree): the top.
	return lowerBound(h.Scale, h.Offset+int32(len(h.Counts)))
}

// CDF returns the histogram's cumulative distribution at the upper bound of
// every non-empty bucket: x values and the share of values at or below
// them.
func (h Histogram) CDF() (xs, ps []float64) {
	if h.Count == 0 {
		return nil, nil
	}
	cum := float64(h.ZeroCount)
	for i, c := range h.Counts {
		if c == 0 {
			continue
		}
		if len(xs) == 0 {
			xs, ps = append(xs, lowerBound(h.Scale, h.Offset+int32(i))), append(ps, cum/float64(h.Count))
		}
		cum += float64(c)
		xs = append(xs, lowerBound(h.Scale, h.Offset+int32(i)+1))
		ps = append(ps, cum/float64(h.Count))
	}
	return xs, ps
}

// RelativeBucketWidth is base − 1: the largest relative error of a value
// placed anywhere in its bucket.
func (h Histogram) RelativeBucketWidth() float64 { return Base(h.Scale) - 1 }
