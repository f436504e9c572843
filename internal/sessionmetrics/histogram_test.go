// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sessionmetrics

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExplicitIndexEdges(t *testing.T) {
	// Buckets are (prev, bound]: a value equal to a bound belongs to the bucket it closes.
	tests := []struct {
		name   string
		bounds []float64
		v      float64
		want   int
	}{
		{"zero", tpotBounds, 0, 0},
		{"first bound", tpotBounds, 0.01, 0},
		{"just above first bound", tpotBounds, math.Nextafter(0.01, 1), 1},
		{"80 ms slow threshold", tpotBounds, 0.08, 4},
		{"just above 80 ms", tpotBounds, math.Nextafter(0.08, 1), 5},
		{"between 0.1 and 0.15", tpotBounds, 0.12, 6},
		{"last bound", tpotBounds, 2.5, 13},
		{"above last bound", tpotBounds, 2.6, 14},
		{"ttft 1 ms", ttftBounds, 0.001, 0},
		{"ttft 10 s", ttftBounds, 10, 15},
		{"ttft 11 s", ttftBounds, 11, 16},
		{"duration 1.28 s", durationBounds, 1.28, 7},
		{"tokens 1", tokenBounds, 1, 0},
		{"tokens 2", tokenBounds, 2, 1},
		{"tokens 4", tokenBounds, 4, 1},
		{"tokens 5", tokenBounds, 5, 2},
		{"tokens 2^26", tokenBounds, 67108864, 13},
		{"tokens 2^26+1", tokenBounds, 67108865, 14},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, explicitIndex(tt.bounds, tt.v))
		})
	}
}

// A duration of exactly a bound (in nanoseconds) must land in the bucket that bound closes; this
// depends on seconds() rounding once.
func TestSecondsHitBoundsExactly(t *testing.T) {
	for _, bounds := range [][]float64{ttftBounds, tpotBounds, durationBounds} {
		for i, b := range bounds {
			d := time.Duration(math.Round(b * 1e9))
			assert.Equal(t, b, seconds(d), "%v", d)
			assert.Equal(t, i, explicitIndex(bounds, seconds(d)), "%v", d)
			assert.Equal(t, i+1, explicitIndex(bounds, seconds(d+1)), "%v + 1ns", d)
		}
	}
}

func TestMapToIndex(t *testing.T) {
	// Bucket i holds (base^i, base^(i+1)], base = 2^(2^-scale). Expected values computed by hand
	// (ceil(log2(v)·2^scale) - 1, logarithms to 50 digits).
	tests := []struct {
		v     float64
		scale int32
		want  int32
	}{
		// scale 0: base 2.
		{1, 0, -1},
		{2, 0, 0},
		{3, 0, 1},
		{4, 0, 1},
		{0.5, 0, -2},
		{0.75, 0, -1},
		// scale -1: base 4.
		{1, -1, -1},
		{2, -1, 0},
		{4, -1, 0},
		{5, -1, 1},
		{16, -1, 1},
		{17, -1, 2},
		{0.25, -1, -2},
		{0.001, -1, -5}, // log2(0.001) = -9.966; base-2 index -10; -10 >> 1 = -5
		// scale -10: base 2^1024, every normal value in one of two buckets.
		{1, -10, -1},
		{math.MaxFloat64, -10, 0},
		{math.SmallestNonzeroFloat64, -10, -2},
		// scale 1: base √2 ≈ 1.41421.
		{1, 1, -1},
		{1.4, 1, 0},
		{1.5, 1, 1},
		{2, 1, 1},
		{2.5, 1, 2},
		{3, 1, 3},
		{1000, 1, 19}, // log2(1000)·2 = 19.93
		// scale 3: base 2^(1/8) ≈ 1.09051.
		{1.5, 3, 4},    // log2(1.5)·8 = 4.680
		{0.1, 3, -27},  // log2(0.1)·8 = -26.575
		{0.08, 3, -30}, // log2(0.08)·8 = -29.151
		{0.125, 3, -25},
		// scale 20, where every histogram starts.
		{1, 20, -1},
		{2, 20, 1<<20 - 1},
		{0.5, 20, -1<<20 - 1},
		{1.5, 20, 613377},   // log2(1.5)·2^20 = 613377.639
		{3, 20, 1661953},    // log2(3)·2^20 = 1661953.639
		{0.1, 20, -3483295}, // log2(0.1)·2^20 = -3483294.074
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, mapToIndex(tt.v, tt.scale), "mapToIndex(%v, %d)", tt.v, tt.scale)
	}
}

// mapToIndex maps v at scale with the shared tables.
func mapToIndex(v float64, scale int32) int32 { return expoTables().index(v, scale) }

// lowerBoundary is the OTel specification's inverse mapping: base^index, the exclusive lower
// bound of bucket index.
func lowerBoundary(index, scale int32) float64 {
	if scale <= 0 {
		return math.Ldexp(1, int(index)<<-scale)
	}
	return math.Exp(float64(index) * math.Ln2 / float64(int64(1)<<scale))
}

// Around each boundary, values a little above belong to the bucket, values a little below to the
// previous one, and the boundary itself (exact for powers of two) to the previous one.
func TestMapToIndexAgreesWithSpecBoundaries(t *testing.T) {
	for scale := int32(-4); scale <= expoMaxScale; scale++ {
		for _, v := range []float64{1e-9, 0.001, 0.08, 0.1, 1, 3, 1000, 6.7e7} {
			i := mapToIndex(v, scale)
			lo, hi := lowerBoundary(i, scale), lowerBoundary(i+1, scale)
			assert.Truef(t, lo < v*(1+1e-12) && v <= hi*(1+1e-12),
				"scale %d: %v in bucket %d = (%v, %v]", scale, v, i, lo, hi)
			b := lowerBoundary(i, scale)
			assert.Equal(t, i, mapToIndex(b*(1+1e-9), scale), "scale %d just above %v", scale, b)
			assert.Equal(t, i-1, mapToIndex(b*(1-1e-9), scale), "scale %d just below %v", scale, b)
		}
		for e := -20; e <= 20; e++ {
			p := math.Ldexp(1, e)
			want := int32(e)<<max(scale, 0)>>max(-scale, 0) - 1
			if scale < 0 {
				want = (int32(e) - 1) >> -scale
			}
			assert.Equal(t, want, mapToIndex(p, scale), "scale %d: 2^%d", scale, e)
		}
	}
}

func expoOf(maxSize int, values ...float64) histogram {
	h := newExponential(maxSize)
	for _, v := range values {
		h.record(v, 1)
	}
	return h
}

func TestExponentialDownscale(t *testing.T) {
	tests := []struct {
		name       string
		maxSize    int
		values     []float64
		wantScale  int32
		wantOffset int32
		wantCounts []uint64
		wantZero   uint64
	}{
		{
			name: "one value stays at scale 20", maxSize: 160, values: []float64{1.5},
			wantScale: 20, wantOffset: 613377, wantCounts: []uint64{1},
		},
		{
			// 1 is bucket -1 and 2 is bucket 2^20-1 at scale 20; two buckets need scale 0,
			// where 1 ∈ (0.5, 1] = bucket -1 and 2 ∈ (1, 2] = bucket 0.
			name: "1 and 2 in two buckets", maxSize: 2, values: []float64{1, 2},
			wantScale: 0, wantOffset: -1, wantCounts: []uint64{1, 1},
		},
		{
			// Adding 4 (bucket 1 at scale 0) needs three buckets: scale -1, base 4, where
			// 1 ∈ (1/4, 1] = bucket -1 and 2, 4 ∈ (1, 4] = bucket 0.
			name: "then 4 halves the scale again", maxSize: 2, values: []float64{1, 2, 4},
			wantScale: -1, wantOffset: -1, wantCounts: []uint64{1, 2},
		},
		{
			// Scale 0 buckets: 0.3 → -2 (0.25, 0.5]; 1 → -1; 3 → 1 (2, 4]; 7 → 2 (4, 8].
			// Four buckets -2..2 need 5 slots > 4, so scale -1: -2>>1=-1, -1>>1=-1, 1>>1=0, 2>>1=1.
			name: "merge in place with a gap", maxSize: 4, values: []float64{1, 3, 0.3, 7},
			wantScale: -1, wantOffset: -1, wantCounts: []uint64{2, 1, 1},
		},
		{
			// Growing downwards: 8 then 1 at maxSize 4. Scale 0: 8 → 2, 1 → -1: range 4 fits.
			name: "grow below the offset", maxSize: 4, values: []float64{8, 1},
			wantScale: 0, wantOffset: -1, wantCounts: []uint64{1, 0, 0, 1},
		},
		{
			name: "zeros go to the zero bucket", maxSize: 4, values: []float64{0, 0, 1},
			wantScale: 20, wantOffset: -1, wantCounts: []uint64{1}, wantZero: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := expoOf(tt.maxSize, tt.values...)
			assert.Equal(t, tt.wantScale, h.scale, "scale")
			assert.Equal(t, tt.wantOffset, h.offset, "offset")
			assert.Equal(t, tt.wantCounts, h.counts, "counts")
			assert.Equal(t, tt.wantZero, h.zeroCount, "zero count")
			assert.Equal(t, uint64(len(tt.values)), h.count)
		})
	}
}

// Against a reference: whatever the order of values, the final buckets hold exactly what mapping
// every value at the final scale gives, the final scale is the largest that fits, and min, max,
// sum and count are right.
func TestExponentialMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, maxSize := range []int{2, 3, 8, 20, 160} {
		for trial := 0; trial < 20; trial++ {
			values := make([]float64, 200)
			for i := range values {
				values[i] = math.Exp(r.Float64()*20 - 12) // about 6e-6 .. 3e3
			}
			h := newExponential(maxSize)
			weights := uint64(0)
			sum := 0.0
			for i, v := range values {
				n := uint64(i%3 + 1)
				h.record(v, n)
				weights += n
				sum += v * float64(n)
			}
			require.LessOrEqual(t, len(h.counts), maxSize)
			want := map[int32]uint64{}
			lo, hi := int32(math.MaxInt32), int32(math.MinInt32)
			for i, v := range values {
				idx := mapToIndex(v, h.scale)
				want[idx] += uint64(i%3 + 1)
				lo, hi = min(lo, idx), max(hi, idx)
			}
			assert.Equal(t, lo, h.offset)
			assert.Len(t, h.counts, int(hi-lo+1))
			for i, c := range h.counts {
				assert.Equal(t, want[h.offset+int32(i)], c, "bucket %d", h.offset+int32(i))
			}
			if h.scale < expoMaxScale {
				finer := h.scale + 1
				flo, fhi := int32(math.MaxInt32), int32(math.MinInt32)
				for _, v := range values {
					idx := mapToIndex(v, finer)
					flo, fhi = min(flo, idx), max(fhi, idx)
				}
				assert.Greater(t, int(fhi-flo+1), maxSize, "scale %d+1 would have fitted", h.scale)
			}
			assert.Equal(t, weights, h.count)
			assert.InDelta(t, sum, h.sum, 1e-9*sum)
			assert.Equal(t, minOf(values), h.min)
			assert.Equal(t, maxOf(values), h.max)
		}
	}
}

func minOf(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = min(m, x)
	}
	return m
}

func maxOf(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func TestHistogramReset(t *testing.T) {
	h := expoOf(4, 1, 3, 0, 7)
	h.reset()
	assert.Equal(t, histogram{tables: expoTables(), maxSize: 4, scale: expoMaxScale, counts: h.counts[:0]}, h)
	h.record(1.5, 2)
	assert.Equal(t, []uint64{2}, h.counts)
	assert.Equal(t, int32(613377), h.offset)

	e := newExplicit(tpotBounds)
	e.record(0.2, 3)
	e.reset()
	assert.Equal(t, newExplicit(tpotBounds), e)
}

// Every table boundary is checked with exact integer arithmetic: with m = (2^52 + M)/2^52,
// m > 2^(k/2^s) ⇔ (2^52 + M)^(2^s) > 2^(k + 52·2^s). bounds[k] must be the smallest such M.
func TestMappingTablesExact(t *testing.T) {
	tables := expoTables()
	for s := 1; s <= tableMaxScale; s++ {
		st := &tables[s]
		require.Len(t, st.bounds, 1<<s+1)
		require.Equal(t, uint64(0), st.bounds[0])
		require.Equal(t, uint64(1)<<52, st.bounds[1<<s])
		above := func(m uint64, k int) bool {
			x := new(big.Int).SetUint64(1<<52 + m)
			x.Exp(x, big.NewInt(1<<s), nil)
			return x.Cmp(new(big.Int).Lsh(big.NewInt(1), uint(k+52<<s))) > 0
		}
		for k := 1; k < 1<<s; k++ {
			m := st.bounds[k]
			assert.True(t, above(m, k), "scale %d boundary %d: M=%d is not above", s, k, m)
			assert.False(t, above(m-1, k), "scale %d boundary %d: M-1=%d is already above", s, k, m-1)
		}
		for i, j := range st.linear {
			m := uint64(i) << (51 - s)
			assert.True(t, st.bounds[j] <= m && m < st.bounds[j+1], "scale %d linear[%d]", s, i)
		}
	}
}

// The table lookup agrees with the logarithm except within a relative 1e-12 of a boundary, where
// the logarithm may be off by one.
func TestTableMappingAgreesWithLogarithm(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	tables := expoTables()
	for scale := int32(-3); scale <= tableMaxScale+2; scale++ {
		for range 20000 {
			v := math.Exp(r.Float64()*60 - 30)
			got, want := tables.index(v, scale), mapToIndexLog(v, scale)
			if got != want {
				b := lowerBoundary(max(got, want), scale)
				assert.InEpsilon(t, b, v, 1e-12, "scale %d, v %v: table %d, log %d", scale, v, got, want)
			}
		}
	}
	// Subnormals take the logarithm path; 2^-1074 is a power of two.
	assert.Equal(t, int32(-1075), mapToIndex(math.SmallestNonzeroFloat64, 0))
	assert.Equal(t, int32(-1074<<3-1), mapToIndex(math.SmallestNonzeroFloat64, 3))
	assert.Equal(t, int32(-1073), mapToIndex(3*math.SmallestNonzeroFloat64, 0)) // 3·2^-1074 ∈ (2^-1073, 2^-1072]
}

func BenchmarkMapToIndex(b *testing.B) {
	vals := make([]float64, 1024)
	for i, g := range benchGaps {
		vals[i] = seconds(g)
	}
	for _, scale := range []int32{-2, 4, 14} {
		b.Run(fmt.Sprintf("scale=%d", scale), func(b *testing.B) {
			tables := expoTables()
			b.ReportAllocs()
			var sink int32
			i := 0
			for b.Loop() {
				sink += tables.index(vals[i&1023], scale)
				i++
			}
			_ = sink
		})
	}
}

// An explicit histogram counts each value in the bucket explicitIndex
// gives, whatever bucket the value before fell in (record checks the
// latest bucket before it searches).
func TestExplicitRecordLatestBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	h := newExplicit(tpotBounds)
	want := make([]uint64, len(tpotBounds)+1)
	for range 20_000 {
		var v float64
		switch rng.IntN(4) {
		case 0: // a bound itself, or just above it
			v = tpotBounds[rng.IntN(len(tpotBounds))]
			if rng.IntN(2) == 0 {
				v = math.Nextafter(v, math.Inf(1))
			}
		case 1:
			v = 0
		default:
			v = rng.Float64() * 3
		}
		n := uint64(1 + rng.IntN(3))
		h.record(v, n)
		want[explicitIndex(tpotBounds, v)] += n
	}
	assert.Equal(t, want, h.counts)
}
