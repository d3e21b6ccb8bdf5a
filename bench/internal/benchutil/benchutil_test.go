package benchutil

import "testing"

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{0.59, 0.28}, 0.435},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(c.xs); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

func TestStoreRequestsPer(t *testing.T) {
	r0 := StoreRequests{"put": 10, "get": 4, "head": 1}
	r := StoreRequests{"put": 30, "get": 4, "head": 11, "put_if": 2}
	if got, want := r.Per(r0, 10), "3.20 (put 2.00, head 1.00, put_if 0.20)"; got != want {
		t.Errorf("Per: %q, want %q", got, want)
	}
	if got := r.Per(r, 10); got != "0" {
		t.Errorf("nothing made: %q", got)
	}
}
