package tiering

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/tiered"
)

// TestSummaryKeepsRolledSegments: a view's summary of a partition asks
// the state of each rolled segment once their records have settled, and
// of its active segment alone after that, while the scan is reused; a
// new scan of the partition asks them all again. Each summary equals
// one made afresh.
func TestSummaryKeepsRolledSegments(t *testing.T) {
	root := filepath.Join(t.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 5, Batches: 2, Records: 4, ValueSize: 100, Age: time.Hour}).Write(root); err != nil {
		t.Fatal(err)
	}
	ps := newPartScans(nil)
	vs, _, err := ps.viewScans(root)
	if err != nil || len(vs) != 1 || vs[0].s == nil {
		t.Fatalf("view: %+v %v", vs, err)
	}
	p, sc := vs[0].p, vs[0].s
	n := len(p.Segments)
	asked := 0
	states := map[uint64]tiered.State{p.Segments[0].Ino: StateRemote, p.Segments[1].Ino: StateShipped}
	state := func(seg Segment) tiered.State {
		asked++
		if st, ok := states[seg.Ino]; ok {
			return st
		}
		return StateLocal
	}
	fresh := func() string {
		return fmt.Sprintf("%+v", summarize([]Partition{p}, func(seg Segment) tiered.State { return states[seg.Ino] }))
	}
	ctimes := time.Unix(0, p.Segments[n-2].Ctime)
	for i, tc := range []struct {
		now  time.Time
		want int
	}{
		{ctimes, n},                   // records too young to keep: all asked
		{ctimes, n},                   // again
		{ctimes.Add(recordSettle), n}, // settled: all asked, and kept
		{ctimes.Add(recordSettle), 1}, // the active segment alone
		{ctimes.Add(time.Hour), 1},    // and again
	} {
		asked = 0
		got := summarizeScan(p, sc, state, tc.now)
		if asked != tc.want {
			t.Errorf("summary %d: asked %d states, want %d", i, asked, tc.want)
		}
		if s := fmt.Sprintf("%+v", []PartitionSummary{got}); s != fresh() {
			t.Errorf("summary %d: %s, afresh %s", i, s, fresh())
		}
	}
	// A scan of its own (a pass's, or a view's after a change) keeps
	// nothing of the one before.
	asked = 0
	summarizeScan(p, newScan(sc.dir, p), state, ctimes.Add(time.Hour))
	if asked != n {
		t.Errorf("a new scan asked %d states, want %d", asked, n)
	}
	// Without a scan (a pass replaced it while the view read), nothing
	// is kept.
	asked = 0
	summarizeScan(p, nil, state, ctimes.Add(time.Hour))
	summarizeScan(p, nil, state, ctimes.Add(time.Hour))
	if asked != 2*n {
		t.Errorf("no scan: asked %d states, want %d", asked, 2*n)
	}
}

// BenchmarkSummaryAtRest: a summary (a scrape's, a status's) of 200
// partitions of 50 shipped segments that did not change since the last.
func BenchmarkSummaryAtRest(b *testing.B) {
	root := filepath.Join(b.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 200, Segments: 50, Batches: 1, Records: 1, ValueSize: 100, Age: time.Hour}).Write(root); err != nil {
		b.Fatal(err)
	}
	tr, err := New(Config{Root: root, StateDir: filepath.Join(b.TempDir(), "state"), Store: store.NewMem(nil), ChunkSize: 64 << 10, RescanInterval: time.Hour,
		Now: func() time.Time { return time.Now().Add(time.Minute) }})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	tr.RunOnce(context.Background())
	tr.RunOnce(context.Background())
	if _, err := tr.Summary(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := tr.Summary(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIdlePass: a pass over 200 partitions of 50 segments, all
// shipped and evicted and settled, none changed since: what a mount at
// rest spends every --tier-interval.
func BenchmarkIdlePass(b *testing.B) {
	root := filepath.Join(b.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 200, Segments: 50, Batches: 1, Records: 1, ValueSize: 100, Age: time.Hour}).Write(root); err != nil {
		b.Fatal(err)
	}
	tr, err := New(Config{Root: root, StateDir: filepath.Join(b.TempDir(), "state"), Store: store.NewMem(nil), ChunkSize: 64 << 10, RescanInterval: time.Hour,
		LocalRetentionBytes: 1, Now: func() time.Time { return time.Now().Add(time.Minute) }})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	for range 3 {
		if rep := tr.RunOnce(context.Background()); len(rep.Errors) > 0 {
			b.Fatal(rep.Errors)
		}
	}
	if rep := tr.RunOnce(context.Background()); rep.Shipped+rep.Evicted+rep.Deleted > 0 || len(rep.Errors) > 0 {
		b.Fatalf("not at rest: %+v", rep)
	}
	scans := tr.Counters().PartitionScans.Load()
	for b.Loop() {
		tr.RunOnce(context.Background())
	}
	b.ReportMetric(float64(tr.Counters().PartitionScans.Load()-scans)/float64(b.N), "scans/op")
}

// BenchmarkFirstPass: a tierer started again over 200 partitions of 50
// segments, all shipped and evicted and settled, and its first pass:
// what a restart of the mount (after a clean stop or kill -9) spends
// before it is at rest.
func BenchmarkFirstPass(b *testing.B) {
	root := filepath.Join(b.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 200, Segments: 50, Batches: 1, Records: 1, ValueSize: 100, Age: time.Hour}).Write(root); err != nil {
		b.Fatal(err)
	}
	st := store.NewMem(nil)
	cfg := Config{Root: root, StateDir: filepath.Join(b.TempDir(), "state"), Store: st, ChunkSize: 64 << 10, RescanInterval: time.Hour,
		LocalRetentionBytes: 1, Now: func() time.Time { return time.Now().Add(time.Minute) }}
	tr, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for range 3 {
		if rep := tr.RunOnce(context.Background()); len(rep.Errors) > 0 {
			b.Fatal(rep.Errors)
		}
	}
	tr.Close()
	for b.Loop() {
		if err := restartAtRest(cfg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/10000, "µs/segment")
}

// restartAtRest starts a tierer on cfg, runs its first pass, which must
// find nothing to do, and closes it.
func restartAtRest(cfg Config) error {
	tr, err := New(cfg)
	if err != nil {
		return err
	}
	defer tr.Close()
	if rep := tr.RunOnce(context.Background()); rep.Shipped+rep.Evicted+rep.Deleted > 0 || len(rep.Errors) > 0 {
		return fmt.Errorf("not at rest: %+v", rep)
	}
	return nil
}
