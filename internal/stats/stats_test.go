package stats

import "testing"

func TestQuantile(t *testing.T) {
	cases := []struct {
		v    []float64
		q    float64
		want float64
	}{
		{nil, 0.5, 0},
		{[]float64{7}, 0.99, 7},
		{[]float64{3, 1, 2}, 0.5, 2},
		{[]float64{4, 1, 3, 2}, 0.5, 2.5},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 0.9, 10},
		{[]float64{10, 20}, 0.99, 19.9},
		{[]float64{5, 1}, 0, 1},
		{[]float64{5, 1}, 1, 5},
	}
	for _, c := range cases {
		if got := Quantile(c.v, c.q); got != c.want {
			t.Errorf("Quantile(%v, %v) = %v, want %v", c.v, c.q, got, c.want)
		}
	}
}
