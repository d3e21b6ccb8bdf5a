package benchutil

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

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
	if got, want := r.Per(nil, 10), "4.70 (put 3.00, head 1.10, get 0.40, put_if 0.20)"; got != want {
		t.Errorf("Per from the start: %q, want %q", got, want)
	}
	if got := r.Per(r, 10); got != "0" {
		t.Errorf("nothing made: %q", got)
	}
}

// Scrape, Metric and ReadStoreRequests read a mount's metrics text.
func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `# HELP tierfs_store_requests_total Requests.
# TYPE tierfs_store_requests_total counter
tierfs_store_requests_total{op="get"} 4
tierfs_store_requests_total{op="put"} 1.5e+06
tierfs_remote_copy_segments_total 12
tierfs_segments{partition="orders-0",state="remote"} 3
`)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	samples, err := Scrape(addr)
	if err != nil || samples[`tierfs_segments{partition="orders-0",state="remote"}`] != 3 || len(samples) != 4 {
		t.Fatalf("Scrape: %v, %v", samples, err)
	}
	if v, err := Metric(addr, "tierfs_remote_copy_segments_total"); v != 12 || err != nil {
		t.Errorf("Metric: %v, %v", v, err)
	}
	if _, err := Metric(addr, "tierfs_missing_total"); err == nil {
		t.Error("Metric of a missing name: no error")
	}
	r, err := ReadStoreRequests(addr)
	if err != nil || len(r) != 2 || r["get"] != 4 || r["put"] != 1.5e6 {
		t.Errorf("ReadStoreRequests: %v, %v", r, err)
	}
}
