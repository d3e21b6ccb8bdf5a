package metrics

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tierfs/tierfs/tiering"
)

// manyPartitions is a Tiering of n partitions that never change.
type manyPartitions struct {
	sums []tiering.PartitionSummary
	c    tiering.Counters
	errs map[string]tiering.PartitionError
}

func (m *manyPartitions) Summary() ([]tiering.PartitionSummary, error) { return m.sums, nil }
func (m *manyPartitions) Counters() *tiering.Counters                  { return &m.c }
func (m *manyPartitions) LastErrors() map[string]tiering.PartitionError {
	return m.errs
}

// discard is a ResponseWriter that keeps nothing but its header.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return io.Discard.Write(b) }
func (d *discard) WriteHeader(int)             {}

// BenchmarkScrape2000Partitions is one scrape of a mount's metrics page
// with 2,000 partitions, the tierer's summary at no cost: what the page
// spends on the partitions' series, as written and as gzip (what
// Prometheus asks for).
func BenchmarkScrape2000Partitions(b *testing.B) {
	m := &manyPartitions{}
	for i := range 2000 {
		m.sums = append(m.sums, tiering.PartitionSummary{Name: fmt.Sprintf("topic-%d", i), Segments: 50, Remote: 50, InStore: 50 * 3700})
	}
	page := New(m, nil, slog.New(slog.DiscardHandler))
	for _, enc := range []string{"identity", "gzip"} {
		b.Run(enc, func(b *testing.B) {
			r := httptest.NewRequest("GET", "/metrics", nil)
			r.Header.Set("Accept-Encoding", enc)
			for b.Loop() {
				page.ServeHTTP(&discard{h: http.Header{}}, r)
			}
		})
	}
}
