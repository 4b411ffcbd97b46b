// Package stats summarises benchmark samples.
package stats

import (
	"math"
	"slices"
)

// Median of v, 0 for none.
func Median(v []float64) float64 { return Quantile(v, 0.5) }

// Quantile q (0..1) of v by linear interpolation between closest ranks, 0
// for none.
func Quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}
