package tiering

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// objects lists the store's keys under prefix.
func objects(t *testing.T, s store.Store, prefix string) []string {
	t.Helper()
	infos, err := s.List(context.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range infos {
		out = append(out, o.Key)
	}
	return out
}

func mustPass(t *testing.T, tr *Tierer) Report {
	t.Helper()
	rep := tr.RunOnce(context.Background())
	if len(rep.Errors) > 0 {
		t.Fatal(rep.Errors)
	}
	return rep
}

// openStoreCopy opens the store copy of the file at path, whatever its
// record's state.
func openStoreCopy(t *testing.T, tr *Tierer, path string) remoteSource {
	t.Helper()
	rec, _, err := readRecord(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := tr.copies.openSource(rec)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func readAll(t *testing.T, tr *Tierer, path string) []byte {
	t.Helper()
	r := openStoreCopy(t, tr, path)
	defer r.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, fi.Size())
	if n, err := r.ReadAt(b, 0); int64(n) != fi.Size() {
		t.Fatalf("%s: read %d of %d: %v", path, n, fi.Size(), err)
	}
	return b
}

// TestBrokerDeletionDeletesRemoteCopy follows Kafka's deletion of a
// segment: renamed to .deleted (still readable, objects kept), unlinked
// while a reader holds it open (kept), closed (objects, index entries and
// remote indexes go; nothing else does).
func TestBrokerDeletionDeletesRemoteCopy(t *testing.T) {
	root, bases, sums := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1)
	mustPass(t, tr)
	seg := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".log"))
	rec, _, _ := readRecord(seg)
	prefix := strings.TrimSuffix(rec.Key, ".log")
	before := objects(t, s, prefix)
	// The .log and its manifest, which holds its batch list, its index
	// files and the leader-epoch-checkpoint (a small segment's).
	if len(before) != 2 {
		t.Fatalf("objects of the segment: %v", before)
	}
	all := objects(t, s, "")

	deleted := seg + ".deleted"
	if err := os.Rename(seg, deleted); err != nil {
		t.Fatal(err)
	}
	if rep := mustPass(t, tr); rep.Deleted != 0 {
		t.Fatalf("a renamed segment's copy was deleted: %+v", rep)
	}
	if got := readAll(t, tr, deleted); string(got) == "" || sha(got) != sums[seg] {
		t.Fatal("renamed segment does not read back")
	}
	held, err := os.Open(deleted)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(deleted); err != nil {
		t.Fatal(err)
	}
	if rep := mustPass(t, tr); rep.Deleted != 0 {
		t.Fatalf("the copy of an unlinked but open segment was deleted: %+v", rep)
	}
	held.Close()
	if rep := mustPass(t, tr); rep.Deleted != 1 {
		t.Fatalf("report %+v", rep)
	}
	if left := objects(t, s, prefix); len(left) != 0 {
		t.Fatalf("objects left: %v", left)
	}
	// Its objects (its .log's manifest, with its batch list, among them)
	// went, and nothing else (TestRemoteIndexesOfManyEntries: remote
	// indexes and a larger object's .batches go too).
	for _, suffix := range []string{".log.tierfs-manifest"} {
		if !slices.Contains(before, prefix+suffix) {
			t.Errorf("no %s among the segment's objects %v", suffix, before)
		}
	}
	if got, want := len(objects(t, s, "")), len(all)-len(before); got != want {
		t.Fatalf("%d objects in the store, want %d", got, want)
	}
	f, err := idx.OpenFile(filepath.Join(root, ".tierfs", "idx", "orders-0", idx.FileName))
	if err != nil {
		t.Fatal(err)
	}
	f.View(func(x *idx.Index) {
		if x.Tombstones() == 0 {
			t.Error("no tombstones")
		}
		for _, e := range x.All() {
			if strings.HasPrefix(string(e.RDI), rec.Key) {
				t.Errorf("live entry of the deleted segment: %+v", e)
			}
		}
	})
	f.Close()
	if _, err := s.Head(context.Background(), prefix+".rindex"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("remote index of the deleted segment: %v", err)
	}
	shipped := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][1], ".log"))
	if sha(readAll(t, tr, shipped)) != sums[shipped] {
		t.Fatal("the other segment no longer reads back")
	}
	if _, err := tr.manifests.get(rec.Key); !os.IsNotExist(err) {
		t.Fatalf("manifest copy left: %v", err)
	}
	if rep := mustPass(t, tr); rep.Deleted != 0 {
		t.Fatalf("third pass: %+v", rep)
	}
}

// TestDeletedTopic: a topic dir renamed -delete keeps its copies; once it
// is removed, every object of the partition goes, its index included.
func TestDeletedTopic(t *testing.T) {
	root, _, _ := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1)
	mustPass(t, tr)
	if len(objects(t, s, "orders-1/")) == 0 {
		t.Fatal("nothing shipped")
	}
	gone := filepath.Join(root, "orders-1.0b6f2e1c0f0e4b7a9d3c2b1a09f8e7d6-delete")
	if err := os.Rename(filepath.Join(root, "orders-1"), gone); err != nil {
		t.Fatal(err)
	}
	if rep := mustPass(t, tr); rep.Deleted != 0 {
		t.Fatalf("copies deleted while the dir still exists: %+v", rep)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	if rep := mustPass(t, tr); rep.Deleted != 2 {
		t.Fatalf("report %+v", rep)
	}
	if left := objects(t, s, "orders-1/"); len(left) != 0 {
		t.Fatalf("objects left: %v", left)
	}
	if _, err := os.Stat(filepath.Join(root, ".tierfs", "idx", "orders-1")); !os.IsNotExist(err) {
		t.Fatalf("index dir left: %v", err)
	}
	if len(objects(t, s, "orders-0/")) == 0 {
		t.Fatal("the other partition lost its objects")
	}
}

// TestDeletionResumesAfterFailure: a delete that fails half way is
// finished by a later pass, and the index does not come back.
func TestDeletionResumesAfterFailure(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1)
	mustPass(t, tr)
	seg := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".log"))
	rec, _, _ := readRecord(seg)
	os.Remove(seg)
	s.Inject(store.Fault{Op: store.OpDelete, KeyPrefix: rec.Key, Skip: 1, Times: 1, Err: errors.New("injected")})
	rep := tr.RunOnce(context.Background())
	if len(rep.Errors) != 1 || rep.Deleted != 0 {
		t.Fatalf("report %+v", rep)
	}
	sh, err := tr.shipments.all()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, x := range sh {
		if x.State == ShipmentDeleting {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d shipments deleting", n)
	}
	// A new tierer (a restart) finishes it.
	tr.Close()
	tr = newTierer(t, root, s, 1)
	if rep := mustPass(t, tr); rep.Deleted != 1 {
		t.Fatalf("report %+v", rep)
	}
	if left := objects(t, s, strings.TrimSuffix(rec.Key, ".log")); len(left) != 0 {
		t.Fatalf("objects left: %v", left)
	}
}

// TestRewrittenSegment: the log cleaner replaces a shipped segment with a
// cleaned one of the same base offset. The new version waits until the
// broker deletes the old one, whose copy then goes; the new one ships in
// its place. A partition in cleaner-offset-checkpoint is not tiered at all.
func TestRewrittenSegment(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 0)
	mustPass(t, tr)
	b0 := bases["orders-0"][0]
	seg := filepath.Join(root, "orders-0", kafkaName(b0, ".log"))
	old, _, _ := readRecord(seg)
	// The cleaner: .cleaned → .swap, old → .deleted, .swap → .log.
	cleaned := kafkatest.Segment(kafkatest.Batch{Base: b0 + 3, Records: 2, ValueSize: 50, TS: 1}, kafkatest.Batch{Base: b0 + 40, Records: 1, ValueSize: 50, TS: 2})
	if err := os.WriteFile(seg+".cleaned", cleaned, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Rename(seg+".cleaned", seg+".swap")
	os.Rename(seg, seg+".deleted")
	os.Rename(seg+".swap", seg)
	past := time.Now().Add(-time.Hour)
	os.Chtimes(seg, past, past)
	rep := mustPass(t, tr)
	if rep.Shipped != 0 || rep.Waiting["an earlier version of this segment is in the store"] != 1 {
		t.Fatalf("report %+v", rep)
	}
	os.Remove(seg + ".deleted")
	// The old version goes, and the cleaned one takes its place in the
	// index, before the later segments already shipped.
	rep = mustPass(t, tr)
	if rep.Deleted != 1 || rep.Shipped != 1 {
		t.Fatalf("report %+v", rep)
	}
	if left := objects(t, s, strings.TrimSuffix(old.Key, ".log")); len(left) != 0 {
		t.Fatalf("objects of the old version left: %v", left)
	}
	if st, _, _ := tr.copies.stateOf(seg); st != StateShipped {
		t.Fatalf("cleaned segment is %s", st)
	}
	if sha(readAll(t, tr, seg)) != sha(cleaned) {
		t.Fatal("cleaned segment does not read back")
	}
	f, err := idx.OpenFile(filepath.Join(root, ".tierfs", "idx", "orders-0", idx.FileName))
	if err != nil {
		t.Fatal(err)
	}
	e, _, ok := f.LookupOffset(b0 + 40)
	f.Close()
	now, _, _ := readRecord(seg)
	if !ok || !strings.HasPrefix(string(e.RDI), now.Key+"@") || e.LastOffset != b0+40 {
		t.Fatalf("index entry for the cleaned segment: %+v %v", e, ok)
	}
	// Once the partition is known to be compacted, nothing of it ships.
	os.WriteFile(filepath.Join(root, "cleaner-offset-checkpoint"), []byte("0\n1\norders 1 0\n"), 0o644)
	cp, err := ReadCheckpoints(root)
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := (Policy{}).Eligible(Segment{TP: kafka.TopicPartition{Topic: "orders", Partition: 1}, Next: 1 << 40}, cp, time.Now()); ok || !strings.HasPrefix(why, "compacted topic") {
		t.Fatalf("compacted partition eligible: %v %q", ok, why)
	}
}

func sha(b []byte) [32]byte { return sha256.Sum256(b) }

// TestRewrittenSegmentEmpty: the cleaner can leave an empty segment in
// place of a shipped one. It holds no offsets, so nothing in the store
// conflicts with it and nothing maps it: it ships as an empty object of
// its own (no index entries) and is evicted like any other.
func TestRewrittenSegmentEmpty(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1)
	mustPass(t, tr)
	seg := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][1], ".log"))
	os.Rename(seg, seg+".deleted")
	if err := os.WriteFile(seg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	os.Chtimes(seg, past, past)
	mustPass(t, tr)
	rec, has, _ := readRecord(seg)
	if !has || rec.State != StateRemote || len(rec.Extents) != 0 || rec.Size != 0 {
		t.Fatalf("record of the empty segment: %+v %v", rec, has)
	}
	if m, err := tr.manifests.get(rec.Key); err != nil || m.Size != 0 {
		t.Fatalf("manifest copy of the empty segment: %+v %v", m, err)
	}
	os.Remove(seg + ".deleted")
	if rep := mustPass(t, tr); rep.Deleted != 1 {
		t.Fatalf("the old version's copy: %+v", rep)
	}
	if got := readAll(t, tr, seg); len(got) != 0 {
		t.Fatalf("the empty segment reads %d bytes", len(got))
	}
}

// TestRemoteIndexesOfManyEntries: an object of more than one index
// entry (a segment bigger than an entry's chunk) has its remote indexes
// in the store, one entry each per index entry, and they go with its
// other objects when the broker deletes the segment.
func TestRemoteIndexesOfManyEntries(t *testing.T) {
	root := filepath.Join(t.TempDir(), "kafka-logs")
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 3, Batches: 20, Records: 10, ValueSize: 100 << 10, Unflushed: 1, Age: time.Hour}.Write(root)
	if err != nil {
		t.Fatal(err)
	}
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1)
	if rep := mustPass(t, tr); rep.Shipped != 1 {
		t.Fatalf("report %+v", rep)
	}
	seg := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".log"))
	if fi, err := os.Stat(seg); err != nil || fi.Size() <= idx.DefaultChunkSize {
		t.Fatalf("segment %v, %v: not bigger than a chunk", fi, err)
	}
	stem := strings.TrimSuffix(recordKey(t, seg), ".log")
	offsets, err := store.ReadAll(s.Get(context.Background(), stem+".rindex", 0, -1, store.GetOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	ro, err := idx.ParseRemoteOffsetIndex(stem+".rindex", bases["orders-0"][0], offsets)
	if err != nil {
		t.Fatal(err)
	}
	times, err := store.ReadAll(s.Get(context.Background(), stem+".rtimeindex", 0, -1, store.GetOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := idx.ParseRemoteTimeIndex(stem+".rtimeindex", times)
	if err != nil {
		t.Fatal(err)
	}
	if len(ro) < 2 || len(rt) < 1 {
		t.Fatalf("remote indexes of %d and %d entries, want at least 2 and 1", len(ro), len(rt))
	}
	// An object this big has its batch list as an object of its own.
	if _, err := s.Head(context.Background(), stem+".batches"); err != nil {
		t.Fatalf("batch list of a large object: %v", err)
	}
	if err := os.Remove(seg); err != nil {
		t.Fatal(err)
	}
	if rep := mustPass(t, tr); rep.Deleted != 1 {
		t.Fatalf("report %+v", rep)
	}
	if left := objects(t, s, stem); len(left) != 0 {
		t.Fatalf("objects left: %v", left)
	}
}

// TestLargeFilesOfASegment: a segment's files that a manifest does not
// hold (one over 64 KiB: a producer snapshot of many producers) are
// objects of their own, listed in its shipment and deleted with it; the
// rest are held by its .log's manifest.
func TestLargeFilesOfASegment(t *testing.T) {
	root, bases, _ := logDir(t)
	seg := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".log"))
	snap := strings.TrimSuffix(seg, ".log") + ".snapshot"
	big := bytes.Repeat([]byte("producer"), 9<<10) // 72 KiB
	if err := os.WriteFile(snap, big, 0o644); err != nil {
		t.Fatal(err)
	}
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1)
	mustPass(t, tr)
	ctx := context.Background()
	key := recordKey(t, seg)
	stem := strings.TrimSuffix(key, ".log")
	m, err := chunkxfer.ReadManifest(ctx, s, key)
	if err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[string]bool{".index": true, ".timeindex": true, ".leader-epoch-checkpoint": true, ".snapshot": false} {
		if _, held := m.File(kind); held != want {
			t.Errorf("%s held by the .log's manifest: %v, want %v", kind, held, want)
		}
	}
	got, err := store.ReadAll(s.Get(ctx, stem+".snapshot", 0, -1, store.GetOptions{}))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("the snapshot's object: %d bytes, %v", len(got), err)
	}
	sh, err := tr.shipments.get("orders-0", key)
	if err != nil || !slices.Contains(sh.Objects, stem+".snapshot") || slices.Contains(sh.Objects, stem+".index") {
		t.Fatalf("shipment lists %v, %v", sh.Objects, err)
	}
	for _, f := range []string{seg, snap, strings.TrimSuffix(seg, ".log") + ".index", strings.TrimSuffix(seg, ".log") + ".timeindex"} {
		os.Remove(f)
	}
	if rep := mustPass(t, tr); rep.Deleted != 1 {
		t.Fatalf("report %+v", rep)
	}
	if left := objects(t, s, stem); len(left) != 0 {
		t.Fatalf("objects left: %v", left)
	}
}
