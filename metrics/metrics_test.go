package metrics

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/cm"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/tiering"
)

// TestMetricsOfATierer: a tierer ships and evicts a synthetic log dir; a
// scrape then shows the partitions' segments by state, the lag, the sizes
// and the counters, and reads of an evicted segment show up as fetches.
func TestMetricsOfATierer(t *testing.T) {
	root := filepath.Join(t.TempDir(), "kafka-logs")
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 2, Segments: 4, Batches: 12, Records: 8, ValueSize: 900, Unflushed: 1, Age: time.Hour}.Write(root)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := chunkxfer.NewPool(64<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	var requests store.Requests
	tr, err := tiering.New(tiering.Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: store.Counted(store.NewMem(nil), &requests),
		Policy: tiering.Policy{ShipAfter: time.Minute}, LocalRetentionBytes: 1, ChunkSize: 64 << 10, Pool: cache})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if rep := tr.RunOnce(context.Background()); len(rep.Errors) > 0 || rep.Evicted != 4 {
		t.Fatalf("pass: %+v", rep)
	}
	// Read an evicted segment back: two chunk fetches at least.
	r, _, err := tr.OpenIfRemote(filepath.Join(root, "orders-0", name(bases["orders-0"][0])))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(io.NewSectionReader(r, 0, 1<<30)); err != nil {
		t.Fatal(err)
	}
	r.Close()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	page := New(tr, cache, log)
	RegisterStore(page.Registry, &requests)
	if err := Serve(ctx, addr, page, log); err != nil {
		t.Fatal(err)
	}
	if err := Serve(ctx, addr, New(tr, cache, log), log); err == nil {
		t.Fatal("a second server on a taken address")
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`tierfs_segments{partition="orders-0",state="remote"} 2`,
		`tierfs_segments{partition="orders-1",state="local"} 2`,
		// The last rolled segment of each partition is not flushed: lag.
		`tierfs_remote_copy_lag_segments{partition="orders-0"} 1`,
		`tierfs_remote_copy_segments_total 4`,
		`tierfs_evicted_segments_total 4`,
		`tierfs_tiering_errors_total 0`,
		`tierfs_remote_fetch_errors_total 0`,
		`tierfs_partitions_scrape_error 0`,
		`tierfs_chunk_memory_limit_bytes 6.7108864e+07`,
		`tierfs_chunk_memory_room_bytes 6.7108864e+07`,
		`tierfs_chunk_memory_bytes{kind="in_use"} 0`,
		`tierfs_chunk_memory_waits_total 0`,
		`tierfs_remote_piece_fetch_requests_total 0`,
		`tierfs_chunk_memory_readers `,
		`go_goroutines `,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in the scrape", want)
		}
	}
	for _, positive := range []string{"tierfs_remote_copy_bytes_total", "tierfs_remote_fetch_bytes_total", "tierfs_remote_fetch_requests_total",
		`tierfs_chunk_memory_bytes{kind="cache"}`,
		`tierfs_remote_log_size_bytes{partition="orders-0"}`, `tierfs_local_log_size_bytes{partition="orders-1"}`, `tierfs_remote_copy_lag_bytes{partition="orders-1"}`,
		`tierfs_store_requests_total{op="put"}`, `tierfs_store_requests_total{op="put_if"}`, `tierfs_store_requests_total{op="get"}`} {
		if v := value(text, positive); v <= 0 {
			t.Errorf("%s = %v, want > 0", positive, v)
		}
	}
	// Every request is under one op, and the scrape saw them all.
	var sum float64
	for op := store.OpAny + 1; op < store.NumOps; op++ {
		v := value(text, `tierfs_store_requests_total{op="`+op.String()+`"}`)
		if v < 0 {
			t.Errorf("no requests of %v in the scrape", op)
		}
		sum += v
	}
	if sum != float64(requests.Total()) {
		t.Errorf("the scrape counts %v requests, the store %d", sum, requests.Total())
	}
}

// TestMetricsWithoutRemote: a mount without a remote has runtime metrics
// only.
func TestMetricsWithoutRemote(t *testing.T) {
	reg := New(nil, nil, slog.New(slog.DiscardHandler)).Registry
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "tierfs_") {
			t.Errorf("%s without a remote", mf.GetName())
		}
	}
}

// value is the value of the sample named exactly name (with its labels),
// or -1.
func value(text, name string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v
			}
		}
	}
	return -1
}

func name(base int64) string { return fmt.Sprintf("%020d.log", base) }

func TestFUSEOps(t *testing.T) {
	reg := New(nil, nil, slog.New(slog.DiscardHandler)).Registry
	o := NewFUSEOps(reg)
	o.ObserveOp("lookup", 20*time.Microsecond, fuse.OK)
	o.ObserveOp("lookup", 30*time.Microsecond, fuse.ENOENT)
	o.ObserveOp("lookup", 30*time.Microsecond, fuse.ENOENT)
	o.ObserveOp("read_remote", 5*time.Millisecond, fuse.EIO)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + ","
			}
			switch mf.GetName() {
			case "tierfs_fuse_requests_total":
				got[labels] = m.GetCounter().GetValue()
			case "tierfs_fuse_request_duration_seconds":
				got["count:"+labels] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"op=lookup,result=ok,": 1, "op=lookup,result=ENOENT,": 2, "op=read_remote,result=EIO,": 1,
		"count:op=lookup,": 3, "count:op=read_remote,": 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

// TestMetricsOfChangeManagement: a file deleted and another replaced by a
// rename show up as events, retained files and bytes.
func TestMetricsOfChangeManagement(t *testing.T) {
	root, cmroot := t.TempDir(), t.TempDir()
	m := cm.New(cm.Config{})
	if err := m.Attach(root, cmroot); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, f := range []string{"a", "b", "c"} {
		os.WriteFile(filepath.Join(root, f), []byte(strings.Repeat(f, 5000)), 0o644)
	}
	dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	leave, _ := m.Enter()
	if err := m.Unlink(dfd, "a", "a"); err != nil {
		t.Fatal(err)
	}
	if err := m.Rename(dfd, "b", "b", dfd, "c", "c", 0); err != nil {
		t.Fatal(err)
	}
	leave()
	reg := New(nil, nil, slog.New(slog.DiscardHandler)).Registry
	RegisterCM(reg, m)
	m.Events("", 0, time.Time{}, 0) // waits for the filer
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			if c := mt.GetCounter(); c != nil {
				got[mf.GetName()] = c.GetValue()
			} else if g := mt.GetGauge(); g != nil {
				got[mf.GetName()] = g.GetValue()
			}
		}
	}
	for name, want := range map[string]float64{
		"tierfs_cm_events_total":         4, // 2 changes, 2 filed records
		"tierfs_cm_retained_files_total": 2,
		"tierfs_cm_retained_bytes_total": 10000,
		"tierfs_cm_files":                2,
		"tierfs_cm_errors_total":         0,
		"tierfs_cm_pending_files":        0,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	if got["tierfs_cm_bytes"] < 8192 {
		t.Errorf("tierfs_cm_bytes = %v", got["tierfs_cm_bytes"])
	}
}
