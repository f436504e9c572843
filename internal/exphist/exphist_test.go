// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package exphist

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// histOf buckets positive values at scale the way the OTel spec maps them:
// value v goes to index ceil(log2(v)·2^scale) − 1, i.e. (base^i, base^(i+1)].
func histOf(vals []float64, scale int32) Histogram {
	h := Histogram{Scale: scale}
	idx := func(v float64) int32 { return int32(math.Ceil(math.Log2(v)*math.Exp2(float64(scale)))) - 1 }
	lo, hi := idx(vals[0]), idx(vals[0])
	for _, v := range vals {
		lo, hi = min(lo, idx(v)), max(hi, idx(v))
	}
	h.Offset, h.Counts = lo, make([]uint64, hi-lo+1)
	for _, v := range vals {
		h.Counts[idx(v)-lo]++
		h.Count++
		h.Sum += v
	}
	return h
}

// numpyLinear is the client's percentile (llmload's Percentile).
func numpyLinear(sorted []float64, q float64) float64 {
	r := q * float64(len(sorted)-1)
	lo := math.Floor(r)
	i := int(lo)
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (sorted[i+1]-sorted[i])*(r-lo)
}

func TestQuantileWithinBucketWidth(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 7, 100, 5000} {
		vals := make([]float64, n)
		for i := range vals {
			vals[i] = math.Exp(rng.NormFloat64()*1.5 - 1) // TTFT-like: ms to seconds
		}
		for _, scale := range []int32{2, 4, 6} {
			h := histOf(vals, scale)
			sorted := slices.Sorted(slices.Values(vals))
			for _, q := range []float64{0, 0.01, 0.5, 0.9, 0.99, 1} {
				want := numpyLinear(sorted, q)
				got := h.Quantile(q)
				assert.InEpsilon(t, want, got, h.RelativeBucketWidth(), "n %d scale %d q %g", n, scale, q)
			}
		}
	}
	assert.True(t, math.IsNaN(Histogram{}.Quantile(0.5)))
}

func TestQuantileOfKnownBuckets(t *testing.T) {
	// Scale 0: bucket i is (2^i, 2^(i+1)]. One value in (1,2], three in (2,4].
	h := Histogram{Scale: 0, Offset: 0, Counts: []uint64{1, 3}, Count: 4}
	// Order statistics sit at the log-midpoints of equal slices: 2^0.5;
	// 2·2^(1/6), 2·2^(3/6), 2·2^(5/6).
	assert.InDelta(t, math.Sqrt2, h.Quantile(0), 1e-12)
	assert.InDelta(t, 2*math.Exp2(0.5), h.Quantile(2.0/3), 1e-12)
	// Rank 1.5 lies halfway between the 2nd and 3rd.
	assert.InDelta(t, (2*math.Exp2(1.0/6)+2*math.Exp2(0.5))/2, h.Quantile(0.5), 1e-12)
	// Exact zeros come first.
	h.ZeroCount, h.Count = 2, 6
	assert.Equal(t, 0.0, h.Quantile(0.2))
}

func TestMergeIsTheHistogramOfTheUnion(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a, b := make([]float64, 300), make([]float64, 200)
	for i := range a {
		a[i] = 0.01 + rng.Float64()
	}
	for i := range b {
		b[i] = 0.5 + 8*rng.Float64()
	}
	got := histOf(a, 5).Merge(histOf(b, 3))
	want := histOf(append(slices.Clone(a), b...), 3)
	require.Equal(t, int32(3), got.Scale)
	assert.Equal(t, want.Count, got.Count)
	assert.InDelta(t, want.Sum, got.Sum, 1e-9)
	// Same buckets, give or take zero-count edges.
	trim := func(h Histogram) (int32, []uint64) {
		c := h.Counts
		off := h.Offset
		for len(c) > 0 && c[0] == 0 {
			c, off = c[1:], off+1
		}
		for len(c) > 0 && c[len(c)-1] == 0 {
			c = c[:len(c)-1]
		}
		return off, c
	}
	wo, wc := trim(want)
	gotOffset, gc := trim(got)
	assert.Equal(t, wo, gotOffset)
	assert.Equal(t, wc, gc)
	assert.Equal(t, got, got.Merge(Histogram{}), "merging an empty one changes nothing")
	assert.Equal(t, got, Histogram{}.Merge(got))
}

func TestCDF(t *testing.T) {
	h := Histogram{Scale: 0, Offset: 1, Counts: []uint64{1, 0, 3}, Count: 4}
	xs, ps := h.CDF()
	assert.Equal(t, []float64{2, 4, 16}, xs)
	assert.Equal(t, []float64{0, 0.25, 1}, ps)
}

// The bounds that are powers of two are exact: a duration threshold such
// as 1 s or 2 s is a bucket edge, not an ulp beside one.
func TestBoundsExactAtPowersOfTwo(t *testing.T) {
	for scale := int32(-2); scale <= 8; scale++ {
		for e := int32(-4); e <= 4; e++ {
			index := e << max(scale, 0) >> max(-scale, 0)
			if scale < 0 && e%(1<<-scale) != 0 {
				continue
			}
			lower, _ := Bounds(scale, index)
			assert.Equal(t, math.Ldexp(1, int(e)), lower, "scale %d, 2^%d", scale, e)
		}
	}
}

func TestBounds(t *testing.T) {
	lower, upper := Bounds(0, -2)
	assert.Equal(t, []float64{0.25, 0.5}, []float64{lower, upper})
	lower, upper = Bounds(4, 15)
	assert.InEpsilon(t, math.Exp2(15.0/16), lower, 1e-14)
	assert.Equal(t, 2.0, upper, "exact: 2^(16/16)")
	assert.InDelta(t, 0.04427, Histogram{Scale: 4}.RelativeBucketWidth(), 1e-5)
}

func TestOf(t *testing.T) {
	dp := pmetric.NewExponentialHistogramDataPoint()
	dp.SetScale(3)
	dp.SetZeroCount(2)
	dp.Positive().SetOffset(-5)
	dp.Positive().BucketCounts().FromRaw([]uint64{1, 0, 4})
	dp.SetCount(7)
	dp.SetSum(2.5)
	h := Of(dp)
	assert.Equal(t, Histogram{Scale: 3, ZeroCount: 2, Offset: -5, Counts: []uint64{1, 0, 4}, Count: 7, Sum: 2.5}, h)
	h.Counts[0] = 9
	assert.Equal(t, uint64(1), dp.Positive().BucketCounts().At(0), "Counts is a copy")
}

func BenchmarkQuantile(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	vals := make([]float64, 10000)
	for i := range vals {
		vals[i] = math.Exp(rng.NormFloat64()*1.5 - 1)
	}
	h := histOf(vals, 4)
	b.ReportAllocs()
	for b.Loop() {
		_ = h.Quantile(0.99)
	}
}
