package metrics

import (
	"bufio"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierfs/tierfs/internal/tiered"
	"github.com/tierfs/tierfs/tiering"
)

// The partitions' series are written as text by partitionsPage, not
// collected through the Prometheus client: a mount holds thousands of
// partitions, seven series each, and the client builds, checks, sorts and
// encodes an object per series at every scrape (at 2,000 partitions 17
// ms of CPU and 10 MB of garbage a scrape, which the collector then pays
// for again in a heap of 100 MiB of catalog). Written here, a scrape
// allocates nothing per series.
//
// The families, in the order they are written. Their names are reserved
// in the registry (reserved), so no collector can add a second family of
// the same name to the page.
type family struct {
	name, help string
	labels     []string // the label names, in order
}

var (
	famScrapeError = family{"tierfs_partitions_scrape_error", "1 if the log directory could not be summarized for this scrape.", nil}
	famSegments    = family{"tierfs_segments", "Segments of a partition by tiering state (local, shipped: in the store and local, remote: in the store only).",
		[]string{"partition", "state"}}
	famLagBytes    = family{"tierfs_remote_copy_lag_bytes", "Bytes of rolled segments not shipped yet.", []string{"partition"}}
	famLagSegments = family{"tierfs_remote_copy_lag_segments", "Rolled segments not shipped yet.", []string{"partition"}}
	famRemoteSize  = family{"tierfs_remote_log_size_bytes", "Bytes of the partition's segments that have a copy in the store.", []string{"partition"}}
	famLocalSize   = family{"tierfs_local_log_size_bytes", "Bytes of the partition's segment files allocated on the local disk.", []string{"partition"}}
	famLastError   = family{"tierfs_partition_last_error_timestamp_seconds", "When tiering last failed for the partition (its message: tierfs status).", []string{"partition"}}
)

// partitionFamilies are the families partitionsPage writes.
func partitionFamilies() []family {
	return []family{famScrapeError, famSegments, famLagBytes, famLagSegments, famRemoteSize, famLocalSize, famLastError}
}

// reserved describes the partitions' families and collects nothing: it
// holds their names in the registry.
type reserved struct{}

func (reserved) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range partitionFamilies() {
		ch <- prometheus.NewDesc(f.name, f.help, f.labels, nil)
	}
}

func (reserved) Collect(chan<- prometheus.Metric) {}

// partitionsPage writes each partition's series, read from the tierer at
// scrape time.
type partitionsPage struct {
	t   Tiering
	log *slog.Logger
}

// write writes the partitions' families to w in Prometheus's text format
// (version 0.0.4), the partitions in the order of the tierer's summary.
func (p *partitionsPage) write(w *bufio.Writer) error {
	sums, err := p.t.Summary()
	failed := int64(0)
	if err != nil {
		p.log.Warn("metrics: cannot summarize the log directory", "err", err)
		failed = 1
	}
	var line [256]byte // one sample; a longer one grows it
	header(w, famScrapeError)
	w.Write(sample(line[:0], famScrapeError, float64(failed)))

	// tierfs_segments is by partition and state, states in the order of
	// their names (as the Prometheus client sorts them).
	states := []struct {
		state tiered.State
		count func(s *tiering.PartitionSummary) int
	}{
		{tiering.StateLocal, func(s *tiering.PartitionSummary) int { return s.Local }},
		{tiering.StateRemote, func(s *tiering.PartitionSummary) int { return s.Remote }},
		{tiering.StateShipped, func(s *tiering.PartitionSummary) int { return s.Shipped }},
	}
	header(w, famSegments)
	for i := range sums {
		for _, st := range states {
			w.Write(sample(line[:0], famSegments, float64(st.count(&sums[i])), sums[i].Name, st.state.String()))
		}
	}
	for _, f := range []struct {
		fam   family
		value func(s *tiering.PartitionSummary) int64
	}{
		{famLagBytes, func(s *tiering.PartitionSummary) int64 { return s.LagBytes }},
		{famLagSegments, func(s *tiering.PartitionSummary) int64 { return int64(s.LagSegments) }},
		{famRemoteSize, func(s *tiering.PartitionSummary) int64 { return s.InStore }},
		{famLocalSize, func(s *tiering.PartitionSummary) int64 { return s.OnDisk }},
	} {
		header(w, f.fam)
		for i := range sums {
			w.Write(sample(line[:0], f.fam, float64(f.value(&sums[i])), sums[i].Name))
		}
	}
	errs := p.t.LastErrors()
	if len(errs) > 0 {
		parts := make([]string, 0, len(errs))
		for part := range errs {
			parts = append(parts, part)
		}
		slices.Sort(parts)
		header(w, famLastError)
		for _, part := range parts {
			w.Write(sample(line[:0], famLastError, float64(errs[part].Time.UnixNano())/1e9, part))
		}
	}
	return w.Flush()
}

// header writes a family's HELP and TYPE lines.
func header(w io.StringWriter, f family) {
	w.WriteString("# HELP ")
	w.WriteString(f.name)
	w.WriteString(" ")
	w.WriteString(helpEscaper.Replace(f.help))
	w.WriteString("\n# TYPE ")
	w.WriteString(f.name)
	w.WriteString(" gauge\n")
}

// sample appends one line of f with the values of its labels, in the
// order of f.labels.
func sample(b []byte, f family, v float64, values ...string) []byte {
	b = append(b, f.name...)
	if len(values) > 0 {
		b = append(b, '{')
		for i, l := range f.labels {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, l...)
			b = append(b, '=', '"')
			b = appendLabelValue(b, values[i])
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, ' ')
	b = appendValue(b, v)
	return append(b, '\n')
}

// helpEscaper escapes a HELP text as the text format requires.
var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

// appendLabelValue appends v escaped as a label value of the text
// format: a backslash, a double quote and a line feed are escaped.
func appendLabelValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			b = append(b, '\\', '\\')
		case '"':
			b = append(b, '\\', '"')
		case '\n':
			b = append(b, '\\', 'n')
		default:
			b = append(b, c)
		}
	}
	return b
}

// appendValue appends v as the Prometheus client writes a sample's value.
func appendValue(b []byte, v float64) []byte {
	switch {
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}
