// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"slices"
)

// Percentile returns the p-th percentile (0..100) of sorted, computed like
// numpy.percentile's default method ("linear", type 7 of Hyndman & Fan):
// the virtual index is (n-1)*p/100 and values are linearly interpolated
// between its floor and ceiling neighbors. The interpolation uses numpy's
// own lerp form (a + (b-a)*t, or b - (b-a)*(1-t) when t >= 0.5) so results
// agree bit-for-bit in ordinary cases. sorted must be ascending; NaN if empty.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	idx := float64(n-1) * p / 100
	lo := math.Floor(idx)
	i := int(lo)
	if i >= n-1 {
		return sorted[n-1]
	}
	t := idx - lo
	a, b := sorted[i], sorted[i+1]
	d := b - a
	if t >= 0.5 {
		return b - d*(1-t)
	}
	return a + d*t
}

// Summary is the distribution of one metric, in milliseconds.
type Summary struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	Std   float64 `json:"std"`
	Min   float64 `json:"min"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// Summarize sorts xs in place and returns its summary, or nil when empty.
// The std is the population standard deviation (numpy's np.std default).
func Summarize(xs []float64) *Summary {
	if len(xs) == 0 {
		return nil
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	s := &Summary{
		Count: len(xs),
		Mean:  mean,
		Std:   math.Sqrt(ss / float64(len(xs))),
		Min:   xs[0],
		P50:   Percentile(xs, 50),
		P90:   Percentile(xs, 90),
		P95:   Percentile(xs, 95),
		P99:   Percentile(xs, 99),
		Max:   xs[len(xs)-1],
	}
	return s
}
