// Package metrics serves a mount's Prometheus metrics. Everything is read
// at scrape time from the tierer and the chunk cache (their own counters
// and a summary of the log directory's partitions): nothing here counts
// by itself, and each mount has its own registry. Names follow Kafka's
// tiered-storage metrics where they mean the same (RemoteCopyLagBytes is
// tierfs_remote_copy_lag_bytes).
package metrics

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/cm"
	"github.com/tierfs/tierfs/internal/tiered"
	"github.com/tierfs/tierfs/tiering"
)

// Tiering is what the metrics read from the tierer.
type Tiering interface {
	Summary() ([]tiering.PartitionSummary, error)
	Counters() *tiering.Counters
	LastErrors() map[string]tiering.PartitionError
}

// Page is one mount's metrics page: a registry of its metrics (the
// tierer's counters, the chunk memory's, the Go runtime's and the
// process's, and what callers register) and the series of each partition,
// which partitionsPage writes itself.
type Page struct {
	Registry *prometheus.Registry

	parts *partitionsPage // nil without a tierer
	log   *slog.Logger
	gzips sync.Pool // *gzip.Writer, each of a scrape at a time
	bufs  sync.Pool // *bufio.Writer, each of a scrape at a time
}

// New makes the page of one mount: the tierer's and the chunk memory's
// metrics (either may be nil: a mount without a remote), and the Go
// runtime's and the process's.
func New(t Tiering, pool *chunkxfer.Pool, log *slog.Logger) *Page {
	p := &Page{Registry: registry(t, pool), log: log}
	if t != nil {
		p.parts = &partitionsPage{t: t, log: log}
	}
	return p
}

func registry(t Tiering, pool *chunkxfer.Pool) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if t != nil {
		reg.MustRegister(reserved{})
		c := t.Counters()
		counter(reg, "tierfs_remote_copy_segments_total", "Segments shipped to the store and verified.", c.ShippedSegments.Load)
		counter(reg, "tierfs_remote_copy_bytes_total", "Bytes of segments shipped to the store and verified.", c.ShippedBytes.Load)
		counter(reg, "tierfs_evicted_segments_total", "Segments whose local bytes were freed.", c.EvictedSegments.Load)
		counter(reg, "tierfs_evicted_bytes_total", "Local bytes freed by eviction.", c.FreedBytes.Load)
		for cause := range tiered.NumCauses {
			l := prometheus.Labels{"cause": cause.String()}
			if cause != tiered.CauseHydrate {
				labelled(reg, "tierfs_moves_total", "Evicted segments changed through the mount (by cause: write, truncate), whose bytes then came back to local disk. Opening for writing, fsync and a truncate to the same size start none.", l, c.Moves[cause].Load)
			}
			labelled(reg, "tierfs_hydrated_segments_total", "Evicted segments brought back to local disk, by cause: a move (write, truncate) or tierfs hydrate.", l, c.HydratedSegments[cause].Load)
			labelled(reg, "tierfs_hydrated_bytes_total", "Bytes of evicted segments brought back to local disk, by cause: a move (write, truncate) or tierfs hydrate.", l, c.HydratedBytes[cause].Load)
		}
		counter(reg, "tierfs_status_partition_scans_total", "Partitions tierfs status and these metrics scanned again because they changed since their last scan (the others are read as last scanned).", c.ViewScans.Load)
		counter(reg, "tierfs_partition_scans_total", "Partitions a tiering pass listed and looked at again (a settled partition whose directory did not change is not, between full scans).", c.PartitionScans.Load)
		counter(reg, "tierfs_mapped_segments_total", "Segments found whole in the store, shipped by another broker, and mapped onto its objects.", c.MappedSegments.Load)
		counter(reg, "tierfs_mapped_bytes_total", "Bytes of segments (or their heads) mapped onto another broker's objects instead of being uploaded.", c.MappedBytes.Load)
		counter(reg, "tierfs_index_races_total", "Appends to a partition's index in the store that another broker's append beat; each cost a retry of the append, never an upload.", c.IndexRaces.Load)
		counter(reg, "tierfs_uploads_wasted_segments_total", "Uploads made needless by another broker's upload of the same offsets (mapped onto that instead, and deleted).", c.WastedSegments.Load)
		counter(reg, "tierfs_uploads_wasted_bytes_total", "Bytes of uploads made needless by another broker's upload of the same offsets.", c.WastedBytes.Load)
		counter(reg, "tierfs_uploads_overlap_bytes_total", "Bytes at the head of uploads that another broker's upload holds too (kept in the object, unindexed, until the segment is deleted).", c.OverlapBytes.Load)
		counter(reg, "tierfs_remote_delete_segments_total", "Remote copies deleted after the broker deleted their segment.", c.DeletedSegments.Load)
		counter(reg, "tierfs_tiering_errors_total", "Failed tiering steps (ship, evict, delete); the last one of each partition is in tierfs_partition_last_error_timestamp_seconds and tierfs status.", c.Errors.Load)
	}
	if pool != nil {
		s := pool.Stats()
		// A chunk not in memory is fetched: misses are these requests
		// (one metric, not two of the same counter).
		counter(reg, "tierfs_remote_fetch_requests_total", "Chunks fetched from the store to serve reads and read-ahead: the chunk memory's misses.", s.Misses.Load)
		counter(reg, "tierfs_remote_fetch_bytes_total", "Verified bytes fetched from the store to serve reads and read-ahead.", s.FetchedBytes.Load)
		counter(reg, "tierfs_remote_block_fetch_requests_total", "Fetches of a few blocks (256 KiB each) alone, for the first read of a run: the chunk (or piece) that holds them is fetched after them, except for a reader in turns.", s.BlockFetches.Load)
		counter(reg, "tierfs_remote_piece_fetch_requests_total", "Of tierfs_remote_fetch_requests_total, the fetches of a piece of a chunk (whole blocks), made while the chunk memory is too small for a chunk per reader reading in order.", s.PieceFetches.Load)
		counter(reg, "tierfs_remote_fetch_errors_total", "Chunk fetches that failed after retries (readers got EIO).", s.FetchErrors.Load)
		counter(reg, "tierfs_cache_hits_total", "Chunk reads served from the chunk memory (a chunk fetched ahead, kept, or being fetched for another reader).", s.Hits.Load)
		counter(reg, "tierfs_read_ahead_skipped_total", "Read-ahead chunks not fetched because the chunk memory had no room to spare for them.", s.AheadSkipped.Load)
		counter(reg, "tierfs_read_ahead_wasted_total", "Read-ahead chunks evicted before any read used them.", s.AheadWasted.Load)
		counter(reg, "tierfs_chunk_memory_claims_revoked_total", "Chunks a sequential reader was in the middle of, taken back after it was idle for 250 ms because a read needed the room.", s.Revoked.Load)
		counter(reg, "tierfs_chunk_memory_waits_total", "Reads that waited for chunk memory (all of it held by other reads).", s.Waits.Load)
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tierfs_chunk_memory_wait_seconds_total", Help: "Time reads waited for chunk memory, in all."},
			func() float64 { return float64(s.WaitNanos.Load()) / 1e9 }))
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tierfs_chunk_memory_limit_bytes", Help: "The chunk memory budget (--cache-bytes)."},
			func() float64 { return float64(pool.Limit()) }))
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tierfs_chunk_memory_room_bytes", Help: "What of the chunk memory budget the chunks may use now: the budget less what the rest of the mount kept at the last garbage collection (at least a quarter of it)."},
			func() float64 { return float64(pool.Room()) }))
		reg.MustRegister(&chunkMemory{pool: pool})
	}
	return reg
}

// CM is what the metrics read from change management.
type CM interface {
	Stats() *cm.Stats
	Retained() (files int, bytes int64)
	Pending() int
}

// RegisterCM adds change management's metrics to reg.
func RegisterCM(reg *prometheus.Registry, c CM) {
	s := c.Stats()
	counter(reg, "tierfs_cm_events_total", "Change management events recorded (creates, writes, renames, truncates, deletes).", s.Events.Load)
	counter(reg, "tierfs_cm_retained_files_total", "Originals retained in the cmroot (content not retained before).", s.RetainedFiles.Load)
	counter(reg, "tierfs_cm_retained_bytes_total", "Bytes of originals retained in the cmroot.", s.RetainedBytes.Load)
	counter(reg, "tierfs_cm_deduplicated_total", "Originals whose content was already retained (kept once).", s.Deduplicated.Load)
	counter(reg, "tierfs_cm_expired_total", "Retained originals removed by retention (--cm-retain, --cm-max-bytes).", s.Expired.Load)
	counter(reg, "tierfs_cm_errors_total", "Changes refused because their original could not be retained, and events or originals not recorded.", s.Errors.Load)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tierfs_cm_bytes", Help: "Disk space the retained originals take."},
		func() float64 { _, b := c.Retained(); return float64(b) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tierfs_cm_files", Help: "Retained originals in the cmroot."},
		func() float64 { f, _ := c.Retained(); return float64(f) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tierfs_cm_pending_files", Help: "Originals waiting to be named by checksum."},
		func() float64 { return float64(c.Pending()) }))
}

// RegisterStore adds the requests a mount made to its store, by op:
// what an object store bills by.
func RegisterStore(reg *prometheus.Registry, r *store.Requests) {
	for op := store.OpAny + 1; op < store.NumOps; op++ {
		l := prometheus.Labels{"op": op.String()}
		labelled(reg, "tierfs_store_requests_total", "Requests made to the store, by op (get, head, put, put_if, delete, list, and the multipart upload's), whatever their outcome.", l, func() int64 { n, _ := r.Count(op); return n })
		labelled(reg, "tierfs_store_request_errors_total", "Of tierfs_store_requests_total, those that failed (a missing key and a failed condition included).", l, func() int64 { _, f := r.Count(op); return f })
	}
}

func counter(reg *prometheus.Registry, name, help string, load func() int64) {
	labelled(reg, name, help, nil, load)
}

func labelled(reg *prometheus.Registry, name, help string, labels prometheus.Labels, load func() int64) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return float64(load()) }))
}

// textFormat is the format of every page: Prometheus's text format,
// version 0.0.4, which every scraper reads whatever it asks for first
// (a scraper takes the format from the answer's Content-Type).
const textFormat = "text/plain; version=0.0.4; charset=utf-8"

// ServeHTTP writes the page: the registry's families, then the
// partitions'. It is compressed with gzip when the scraper accepts it.
// A registry that fails to gather answers 500, as promhttp's default
// does; a log directory that cannot be summarized is
// tierfs_partitions_scrape_error 1.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mfs, err := p.Registry.Gather()
	if err != nil {
		p.log.Warn("metrics: cannot gather", "err", err)
		http.Error(w, "An error has occurred while gathering metrics:\n\n"+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", textFormat)
	h.Add("Vary", "Accept-Encoding")
	var out io.Writer = w
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		h.Set("Content-Encoding", "gzip")
		gz, _ := p.gzips.Get().(*gzip.Writer)
		if gz == nil {
			gz = gzip.NewWriter(w)
		} else {
			gz.Reset(w)
		}
		defer func() {
			gz.Close()
			p.gzips.Put(gz)
		}()
		out = gz
	}
	bw, _ := p.bufs.Get().(*bufio.Writer)
	if bw == nil {
		bw = bufio.NewWriterSize(out, 32<<10)
	} else {
		bw.Reset(out)
	}
	defer p.bufs.Put(bw)
	enc := expfmt.NewEncoder(bw, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			p.log.Warn("metrics: cannot write the page", "err", err)
			return
		}
	}
	if p.parts != nil {
		err = p.parts.write(bw)
	} else {
		err = bw.Flush()
	}
	if err != nil {
		p.log.Debug("metrics: cannot write the page", "err", err)
	}
}

// acceptsGzip tells whether an Accept-Encoding header accepts gzip (not
// with q=0).
func acceptsGzip(header string) bool {
	for part := range strings.SplitSeq(header, ",") {
		coding, params, _ := strings.Cut(part, ";")
		if strings.TrimSpace(coding) != "gzip" {
			continue
		}
		q, ok := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q=")
		return !ok || strings.Trim(q, "0.") != ""
	}
	return false
}

// Serve answers GET /metrics on addr with page until ctx ends. It returns
// once it listens, so an address in use is an error at mount time.
func Serve(ctx context.Context, addr string, page http.Handler, log *slog.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", page)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", l.Addr().String())
	return nil
}

var descChunkMemory = prometheus.NewDesc("tierfs_chunk_memory_bytes", "Chunk memory by kind: in_flight (being fetched), in_use (being read), windows (the chunk a sequential reader is in the middle of, kept for it between its reads), read_ahead (fetched ahead, not read yet), cache (read and kept), free (buffers kept to be filled again). Together at most tierfs_chunk_memory_limit_bytes.",
	[]string{"kind"}, nil)

var descChunkMemoryReaders = prometheus.NewDesc("tierfs_chunk_memory_readers", "Readers of remote files that read in order within the last 2 seconds (or, for a reader in turns, twice its last pause between turns, up to a minute) and have not reached their file's end. While fewer than half of them are reading, two pieces of each fit in half the chunk memory (see docs/design.md).", nil, nil)

// chunkMemory reports the chunk memory by kind, and its readers, from
// one look at it.
type chunkMemory struct{ pool *chunkxfer.Pool }

func (c *chunkMemory) Describe(ch chan<- *prometheus.Desc) {
	ch <- descChunkMemory
	ch <- descChunkMemoryReaders
}

func (c *chunkMemory) Collect(ch chan<- prometheus.Metric) {
	u := c.pool.Usage()
	for _, k := range []struct {
		kind  string
		bytes int64
	}{{"in_flight", u.InFlight}, {"in_use", u.InUse}, {"windows", u.Windows}, {"read_ahead", u.ReadAhead}, {"cache", u.Cache}, {"free", u.Free}} {
		ch <- prometheus.MustNewConstMetric(descChunkMemory, prometheus.GaugeValue, float64(k.bytes), k.kind)
	}
	ch <- prometheus.MustNewConstMetric(descChunkMemoryReaders, prometheus.GaugeValue, float64(u.Readers))
}
