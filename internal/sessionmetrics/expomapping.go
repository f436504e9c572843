// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sessionmetrics

import (
	"math"
	"math/big"
	"sync"
)

// Exponential histogram scales. A new histogram starts at the finest scale and only ever
// downscales; at scale -10 every positive normal float64 fits in two buckets.
const expoMaxScale = 20

// tableMaxScale is the finest scale mapped by table lookup; finer scales use the logarithm.
// Histograms spanning more than an octave in 160 buckets settle at scale 7 or below, so the
// tables cover the steady state and the logarithm serves only the first observations.
const tableMaxScale = 10

// The OTel base-2 exponential mapping puts a positive value v in bucket i with
// base^i < v ≤ base^(i+1), base = 2^(2^-scale). With v = (1 + M/2^52)·2^E (M the 52-bit mantissa
// field, E the unbiased exponent):
//   - scale ≤ 0: i = E >> -scale, or (E-1) >> -scale for an exact power of two (M = 0); exact.
//   - 0 < scale ≤ tableMaxScale: i = E·2^scale + j, where j is the number of sub-octave
//     boundaries 2^(k/2^scale), 0 < k < 2^scale, below 1 + M/2^52, found by table lookup; exact.
//   - scale > tableMaxScale: the logarithm, which may be off by one bucket within about one ulp of
//     a boundary, as the specification allows.
//
// mappingTables holds, for each scale 1..tableMaxScale, the sub-octave boundaries as mantissa
// thresholds and a linear index into them.
type mappingTables [tableMaxScale + 1]scaleTable

type scaleTable struct {
	// bounds[k] is the smallest mantissa M with 1 + M/2^52 > 2^(k/2^scale), for 0 < k < 2^scale;
	// bounds[0] = 0 and bounds[2^scale] = 2^52, a sentinel above every mantissa.
	bounds []uint64
	// linear[M >> (51-scale)] is j for the smallest mantissa of that slice of the octave. The
	// 2^(scale+1) slices are narrower than the narrowest bucket (2^(2^-scale) - 1 > ln2·2^-scale),
	// so a slice holds at most one boundary and one comparison finishes the lookup.
	linear []uint16
}

// expoTables builds the tables once, on first use by an exponential histogram (about 0.3 ms,
// 24 KiB kept).
var expoTables = sync.OnceValue(buildMappingTables)

func buildMappingTables() *mappingTables {
	const prec = 256
	n := 1 << tableMaxScale
	// The boundaries at the finest table scale, 2^(k/n), as mantissa thresholds, computed with
	// 256-bit floats: the error is ~2^-245, and no boundary but k = 0 is a dyadic rational.
	finest := make([]uint64, n+1)
	root := new(big.Float).SetPrec(prec).SetInt64(2)
	for range tableMaxScale {
		root.Sqrt(root)
	}
	one := new(big.Float).SetPrec(prec).SetInt64(1)
	b := new(big.Float).SetPrec(prec).SetInt64(1)
	x := new(big.Float).SetPrec(prec)
	for k := 1; k < n; k++ {
		b.Mul(b, root)
		x.Sub(b, one)
		x.SetMantExp(x, 52)
		m, _ := x.Uint64() // truncates: floor((b-1)·2^52)
		finest[k] = m + 1
	}
	finest[n] = 1 << 52

	t := new(mappingTables)
	for s := 1; s <= tableMaxScale; s++ {
		step := 1 << (tableMaxScale - s)
		bounds := make([]uint64, 1<<s+1)
		for k := range bounds {
			bounds[k] = finest[k*step]
		}
		linear := make([]uint16, 1<<(s+1))
		j := 0
		for i := range linear {
			m := uint64(i) << (51 - s)
			for bounds[j+1] <= m {
				j++
			}
			linear[i] = uint16(j)
		}
		t[s] = scaleTable{bounds: bounds, linear: linear}
	}
	return t
}

// index maps a positive finite v to its bucket index at scale.
func (t *mappingTables) index(v float64, scale int32) int32 {
	bits := math.Float64bits(v)
	biased := int32(bits>>52) & 0x7ff
	if biased == 0 {
		return mapToIndexLog(v, scale) // subnormal
	}
	e := biased - 1023
	mant := bits & (1<<52 - 1)
	if mant == 0 {
		if scale <= 0 {
			return (e - 1) >> -scale
		}
		return e<<scale - 1
	}
	if scale <= 0 {
		return e >> -scale
	}
	if scale <= tableMaxScale {
		st := &t[scale]
		j := int32(st.linear[mant>>(51-scale)])
		if mant >= st.bounds[j+1] {
			j++
		}
		return e<<scale + j
	}
	return mapToIndexLog(v, scale)
}

// scaleFactors[s] = 2^s / ln 2, so that ln(x)·scaleFactors[s] = log2(x)·2^s.
var scaleFactors = func() (f [expoMaxScale + 1]float64) {
	for s := range f {
		f[s] = math.Ldexp(math.Log2E, s)
	}
	return f
}()

// mapToIndexLog is the mapping by logarithm, as in the specification and the OTel Go SDK; it also
// handles subnormal values. With v = frac·2^exp, frac in [0.5, 1): for scale ≤ 0 the index is the
// base-2 exponent (exp-1, or exp-2 for an exact power of two) shifted right by -scale; for
// scale > 0 it is exp·2^scale + ceil(log2(frac)·2^scale) - 1.
func mapToIndexLog(v float64, scale int32) int32 {
	frac, exp := math.Frexp(v)
	if scale <= 0 {
		e := int32(exp) - 1
		if frac == 0.5 {
			e--
		}
		return e >> -scale
	}
	if frac == 0.5 {
		return (int32(exp)-1)<<scale - 1
	}
	// int32 truncates toward zero, which is the ceiling of this negative product.
	return int32(exp)<<scale + int32(math.Log(frac)*scaleFactors[scale]) - 1
}
