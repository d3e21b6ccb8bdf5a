package tiering

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/tiered"
)

// What a pass that scans only what may have changed believes (the
// partitions as partScans keep them, the records as records keep them)
// equals a fresh full scan, after each step of a random sequence of the
// changes a broker and a mount make: rolls, deletions (renamed to
// .deleted, then removed), writes and truncates through the mount,
// passes that ship and evict, and restarts (a new tierer over the same
// state, as after kill -9).
func TestPassViewEqualsFullScan(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { testPassView(t, seed) })
	}
}

func testPassView(t *testing.T, seed uint64) {
	root := filepath.Join(t.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 4, Segments: 4, Batches: 4, Records: 8, ValueSize: 200, Age: time.Hour}).Write(root); err != nil {
		t.Fatal(err)
	}
	s := store.NewMem(nil)
	clock := time.Now()
	now := func() time.Time { return clock }
	start := func() *Tierer {
		tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: s, ChunkSize: 64 << 10,
			RescanInterval: time.Hour, LocalRetentionBytes: 3000, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	tr := start()
	defer func() { tr.Close() }()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 23))
	part := func() string { return fmt.Sprintf("orders-%d", r.IntN(4)) }
	logs := func(p string) []string {
		l, _ := filepath.Glob(filepath.Join(root, p, "*.log"))
		return l
	}
	next := int64(100000)
	for step := range 60 {
		clock = clock.Add(3 * time.Second)
		var what string
		switch op := r.IntN(7); op {
		case 0: // a roll
			p := part()
			next += 1000
			what = "roll " + p
			os.WriteFile(filepath.Join(root, p, fmt.Sprintf("%020d.log", next)), []byte("new"), 0o644)
		case 1: // a deletion, in two steps as Kafka does
			p := part()
			if l := logs(p); len(l) > 2 {
				what = "delete " + l[0]
				os.Rename(l[0], l[0]+".deleted")
				tr.RunOnce(ctx)
				os.Remove(l[0] + ".deleted")
			}
		case 2, 3: // a write or a truncate through the mount
			p := part()
			l := logs(p)
			if len(l) < 2 {
				continue
			}
			path := l[r.IntN(len(l)-1)]
			what = "change " + path
			f, fd, ino := openTiered(t, tr, path, p+"/"+filepath.Base(path))
			fi, err := fd.Stat()
			if err != nil {
				t.Fatal(err)
			}
			if op == 2 {
				_, err = f.WriteAt([]byte("changed"), 10, func() (int, error) { return fd.WriteAt([]byte("changed"), 10) })
			} else {
				err = f.Truncate(fi.Size()/2, func() error { return fd.Truncate(fi.Size() / 2) })
			}
			if err != nil {
				t.Fatalf("step %d, %s: %v", step, what, err)
			}
			if m := tr.moves.of(ino); m != nil {
				m.Wait()
			}
			f.Close()
			fd.Close()
		case 4: // kill -9 and a restart
			what = "restart"
			tr.Close()
			tr = start()
		default:
			what = "pass"
		}
		tr.RunOnce(ctx)
		checkPassView(t, tr, root, fmt.Sprintf("step %d (%s)", step, what))
	}
}

// checkPassView compares the partitions and records a pass would use
// with a full scan and the records on disk.
func checkPassView(t *testing.T, tr *Tierer, root, at string) {
	t.Helper()
	// The summary (status, metrics) equals one of a full scan with the
	// records on disk.
	sum, err := tr.Summary()
	if err != nil {
		t.Fatal(err)
	}
	want, err := Summarize(root, func(seg Segment) tiered.State {
		rec, has, _ := readRecord(seg.LogPath())
		if !has {
			return StateLocal
		}
		return rec.State
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%+v", sum) != fmt.Sprintf("%+v", want) {
		t.Fatalf("%s: summary\n%+v\na full scan's\n%+v", at, sum, want)
	}
	parts, from, _, err := tr.scans.scan(root, false, tr.cfg.Now())
	if err != nil {
		t.Fatal(err)
	}
	// What eviction reads of each partition, kept in its scan or not,
	// equals what the records on disk say (asked twice: the second
	// may be kept).
	for i, p := range parts {
		var want rolledLocal
		for _, seg := range p.Segments {
			rec, has, _ := readRecord(seg.LogPath())
			switch st := stateOf(seg, rec, has); {
			case st.Has && st.State == StateRemote:
			case st.Has && st.State == StateShipped:
				want.shipped = append(want.shipped, seg)
				fallthrough
			default:
				want.bytes += seg.Size
			}
		}
		for range 2 {
			if got, errs := tr.evictor.localOf(p, from[i], tr.cfg.Now()); len(errs) > 0 || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s: eviction reads %s as %+v (%v), the records on disk say %+v", at, p.Name, got, errs, want)
			}
		}
	}
	full, err := Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != len(full) {
		t.Fatalf("%s: %d partitions, a full scan %d", at, len(parts), len(full))
	}
	slices.SortFunc(parts, func(a, b Partition) int { return cmpString(a.Name, b.Name) })
	for i, p := range parts {
		f := full[i]
		if p.Name != f.Name || len(p.Segments) != len(f.Segments) {
			t.Fatalf("%s: %s has %d segments, a full scan of %s %d", at, p.Name, len(p.Segments), f.Name, len(f.Segments))
		}
		for j, seg := range p.Segments {
			fs := f.Segments[j]
			if seg.LogPath() != fs.LogPath() || seg.Ino != fs.Ino || seg.Size != fs.Size || !seg.Mtime.Equal(fs.Mtime) {
				t.Fatalf("%s: %s is %d bytes (ino %d, mtime %v), a full scan says %d (ino %d, mtime %v)", at, seg.LogPath(), seg.Size, seg.Ino, seg.Mtime, fs.Size, fs.Ino, fs.Mtime)
			}
			got, _ := tr.records.of(seg)
			rec, has, _ := readRecord(seg.LogPath())
			if want := stateOf(seg, rec, has); got != want || has && !got.names(rec.Key) {
				t.Fatalf("%s: the record of %s is %+v, on disk %+v (%+v)", at, seg.LogPath(), got, want, rec)
			}
		}
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
