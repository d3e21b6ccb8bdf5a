package metrics

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tierfs/tierfs/tiering"
)

// clientPartitions collects the partitions' series through the
// Prometheus client, as the page did before it wrote them itself: what
// the page must equal.
type clientPartitions struct{ m Tiering }

func (c clientPartitions) Describe(ch chan<- *prometheus.Desc) { reserved{}.Describe(ch) }

func (c clientPartitions) Collect(ch chan<- prometheus.Metric) {
	desc := func(f family) *prometheus.Desc { return prometheus.NewDesc(f.name, f.help, f.labels, nil) }
	gauge := func(f family, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc(f), prometheus.GaugeValue, v, labels...)
	}
	sums, err := c.m.Summary()
	failed := 0.0
	if err != nil {
		failed = 1
	}
	gauge(famScrapeError, failed)
	for _, s := range sums {
		gauge(famSegments, float64(s.Local), s.Name, tiering.StateLocal.String())
		gauge(famSegments, float64(s.Shipped), s.Name, tiering.StateShipped.String())
		gauge(famSegments, float64(s.Remote), s.Name, tiering.StateRemote.String())
		gauge(famLagBytes, float64(s.LagBytes), s.Name)
		gauge(famLagSegments, float64(s.LagSegments), s.Name)
		gauge(famRemoteSize, float64(s.InStore), s.Name)
		gauge(famLocalSize, float64(s.OnDisk), s.Name)
	}
	for part, e := range c.m.LastErrors() {
		gauge(famLastError, float64(e.Time.UnixNano())/1e9, part)
	}
}

// failing is a Tiering whose summary fails.
type failing struct{ manyPartitions }

func (f *failing) Summary() ([]tiering.PartitionSummary, error) {
	return nil, errors.New("the log directory is gone")
}

// scrape reads page as a scraper that asks for encoding would.
func scrape(t *testing.T, page *Page, encoding string) string {
	t.Helper()
	r := httptest.NewRequest("GET", "/metrics", nil)
	r.Header.Set("Accept-Encoding", encoding)
	w := httptest.NewRecorder()
	page.ServeHTTP(w, r)
	if w.Code != 200 || w.Header().Get("Content-Type") != textFormat {
		t.Fatalf("answer %d, %q", w.Code, w.Header().Get("Content-Type"))
	}
	body := io.Reader(w.Body)
	if got := w.Header().Get("Content-Encoding"); got != "" {
		if got != "gzip" || !strings.Contains(encoding, "gzip") {
			t.Fatalf("Content-Encoding %q for Accept-Encoding %q", got, encoding)
		}
		gz, err := gzip.NewReader(body)
		if err != nil {
			t.Fatal(err)
		}
		body = gz
	}
	b, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// canonical lists a family's HELP, TYPE and samples, the samples sorted.
func canonical(mf *dto.MetricFamily) string {
	var samples []string
	for _, m := range mf.GetMetric() {
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
		}
		samples = append(samples, fmt.Sprintf("{%s} %v", strings.Join(labels, ","), m.GetGauge().GetValue()))
	}
	slices.Sort(samples)
	return fmt.Sprintf("HELP %q\nTYPE %v\n%s", mf.GetHelp(), mf.GetType(), strings.Join(samples, "\n"))
}

// TestPartitionsPage: the partitions' series the page writes are those
// the Prometheus client wrote for the same summaries (names that need
// escaping, a failed partition, a summary that fails), the whole page
// parses as one, gzip or not, and no collector can take a partitions'
// family name.
func TestPartitionsPage(t *testing.T) {
	at := time.Date(2026, 12, 7, 14, 0, 0, 123456789, time.UTC)
	ok := &manyPartitions{
		sums: []tiering.PartitionSummary{
			{Name: "orders-0", Segments: 5, Local: 1, Shipped: 2, Remote: 2, OnDisk: 3 << 20, InStore: 1 << 40, LagSegments: 1, LagBytes: 12345},
			{Name: `a"b\c-1`, Segments: 1, Local: 1, OnDisk: 4096},
			{Name: "line\nfeed-2"},
			{Name: "orders-10", Segments: 1e6, Remote: 1e6, InStore: 1 << 62},
		},
		errs: map[string]tiering.PartitionError{"orders-0": {Time: at}, `a"b\c-1`: {Time: at.Add(time.Hour)}},
	}
	for _, tc := range []struct {
		name string
		m    Tiering
	}{
		{"summaries", ok},
		{"none", &manyPartitions{}},
		{"failed", &failing{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := prometheus.NewRegistry()
			want.MustRegister(clientPartitions{tc.m})
			wantFams, err := want.Gather()
			if err != nil {
				t.Fatal(err)
			}
			page := New(tc.m, nil, slog.New(slog.DiscardHandler))
			NewFUSEOps(page.Registry) // a registry with more in it
			text := scrape(t, page, "identity")
			// The runtime's metrics change from one scrape to the next.
			ours := func(page string) string { return page[strings.Index(page, "# HELP "+famScrapeError.name):] }
			if gz := scrape(t, page, "deflate, gzip;q=0.9"); ours(gz) != ours(text) {
				t.Errorf("the page in gzip differs:\n%s\nplain:\n%s", gz, text)
			}
			parser := expfmt.NewTextParser(model.UTF8Validation)
			got, err := parser.TextToMetricFamilies(strings.NewReader(text))
			if err != nil {
				t.Fatalf("the page does not parse: %v\n%s", err, text)
			}
			if got["go_goroutines"] == nil {
				t.Error("no go_goroutines on the page")
			}
			for _, mf := range wantFams {
				g := got[mf.GetName()]
				if g == nil {
					t.Errorf("no %s on the page", mf.GetName())
					continue
				}
				if c, w := canonical(g), canonical(mf); c != w {
					t.Errorf("%s:\n%s\nwant\n%s", mf.GetName(), c, w)
				}
			}
			if tc.name == "failed" {
				if v := got["tierfs_partitions_scrape_error"].GetMetric()[0].GetGauge().GetValue(); v != 1 {
					t.Errorf("tierfs_partitions_scrape_error %v after a failed summary", v)
				}
			}
		})
	}
	for _, gz := range []string{"", "identity", "gzip;q=0", "gzip; q=0.0", "br"} {
		r := httptest.NewRequest("GET", "/metrics", nil)
		r.Header.Set("Accept-Encoding", gz)
		w := httptest.NewRecorder()
		New(ok, nil, slog.New(slog.DiscardHandler)).ServeHTTP(w, r)
		if w.Header().Get("Content-Encoding") != "" {
			t.Errorf("Accept-Encoding %q: Content-Encoding %q", gz, w.Header().Get("Content-Encoding"))
		}
	}
	page := New(ok, nil, slog.New(slog.DiscardHandler))
	for _, f := range partitionFamilies() {
		if err := page.Registry.Register(prometheus.NewGauge(prometheus.GaugeOpts{Name: f.name, Help: f.help})); err == nil {
			t.Errorf("a gauge %s registered beside the page's own", f.name)
		}
	}
}

// TestPageGatherFails: a registry that cannot gather answers 500.
func TestPageGatherFails(t *testing.T) {
	page := New(&manyPartitions{}, nil, slog.New(slog.DiscardHandler))
	page.Registry.MustRegister(broken{})
	w := httptest.NewRecorder()
	page.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 500 {
		t.Errorf("answer %d", w.Code)
	}
}

// broken is a collector whose metric cannot be gathered.
type broken struct{}

func (broken) Describe(ch chan<- *prometheus.Desc) { ch <- prometheus.NewDesc("x", "x", nil, nil) }
func (broken) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(prometheus.NewDesc("x", "x", nil, nil), errors.New("cannot read x"))
}
