package metrics

import (
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tierfs/tierfs/tiering"
)

// manyPartitions is a Tiering of n partitions that never change.
type manyPartitions struct {
	sums []tiering.PartitionSummary
	c    tiering.Counters
}

func (m *manyPartitions) Summary() ([]tiering.PartitionSummary, error) { return m.sums, nil }
func (m *manyPartitions) Counters() *tiering.Counters                  { return &m.c }
func (m *manyPartitions) LastErrors() map[string]tiering.PartitionError {
	return nil
}

// BenchmarkScrape2000Partitions is one scrape of a mount's metrics page
// with 2,000 partitions, the tierer's summary at no cost: what the
// Prometheus client spends on the partitions' series.
func BenchmarkScrape2000Partitions(b *testing.B) {
	m := &manyPartitions{}
	for i := range 2000 {
		m.sums = append(m.sums, tiering.PartitionSummary{Name: fmt.Sprintf("topic-%d", i), Segments: 50, Remote: 50, InStore: 50 * 3700})
	}
	h := promhttp.HandlerFor(Registry(m, nil, slog.New(slog.DiscardHandler)), promhttp.HandlerOpts{})
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
		io.Copy(io.Discard, w.Body)
	}
}
