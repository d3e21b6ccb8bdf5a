package tiering

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// A record is read again only when the scan shows its file changed (its
// ctime moved); one changed within recordSettle is not kept.
func TestRecordsFollowTheCtime(t *testing.T) {
	root, bases, _ := logDir(t)
	now := time.Now()
	rc := newRecords(func() time.Time { return now })
	p, err := ScanPartition(root, "orders-0")
	if err != nil {
		t.Fatal(err)
	}
	seg := p.Segments[0]
	if rs, err := rc.of(seg); err != nil || rs.Has {
		t.Fatalf("a local segment: has %v, %v", rs.Has, err)
	}
	if rc.size() != 0 {
		t.Fatal("kept a record whose ctime is younger than recordSettle")
	}
	now = now.Add(2 * recordSettle)
	rc.of(seg)
	if rc.size() != 1 {
		t.Fatal("did not keep a settled record")
	}
	// Shipped behind its back: the old ctime still gives what was read.
	rec := Record{State: StateShipped, Key: "k", Ino: seg.Ino, Size: seg.Size, MtimeNs: seg.Mtime.UnixNano()}
	if err := writeRecord(seg.LogPath(), rec); err != nil {
		t.Fatal(err)
	}
	if rs, _ := rc.of(seg); rs.Has {
		t.Fatal("read the record again though the ctime did not move")
	}
	// A scan after the change sees a new ctime, and the record.
	p, _ = ScanPartition(root, "orders-0")
	if p.Segments[0].Ctime == seg.Ctime {
		t.Skip("the file system kept the ctime through a setxattr")
	}
	got, _ := rc.of(p.Segments[0])
	if !got.Has || got.State != StateShipped || !got.names("k") || got.names("k2") || !got.SameFile {
		t.Fatalf("after the change: %+v", got)
	}
	// A record of another version of the file (Kafka truncated it
	// since) is not of the same file.
	if err := writeRecord(seg.LogPath(), Record{State: StateShipped, Key: "k", Ino: seg.Ino, Size: seg.Size + 1, MtimeNs: seg.Mtime.UnixNano()}); err != nil {
		t.Fatal(err)
	}
	p, _ = ScanPartition(root, "orders-0")
	if got, _ := rc.of(p.Segments[0]); !got.Has || got.SameFile {
		t.Fatalf("a record of another size: %+v", got)
	}
	rc.forget(seg.Ino)
	rc.keep(map[uint64]*Segment{})
	if rc.size() != 0 {
		t.Fatalf("%d records kept of files no scan saw", rc.size())
	}
	_ = bases
}

// The shipment catalog writes through to disk, and a new one (a mount
// started again) reads the same shipments back.
func TestShipmentCatalog(t *testing.T) {
	dir := t.TempDir()
	discard := slog.New(slog.DiscardHandler)
	c := newShipmentCatalog(func() string { return dir }, discard)
	if all, err := c.all(); err != nil || len(all) != 0 {
		t.Fatalf("empty: %v %v", all, err)
	}
	for i, s := range []Shipment{
		{State: ShipmentShipped, Partition: "a-0", Base: 20, Key: "a-0/00000000000000000020-1.log",
			Objects: []string{"a-0/00000000000000000020-1.log", "a-0/00000000000000000020-1.log.tierfs-manifest", "a-0/00000000000000000020-1.rindex", "a-0/00000000000000000010-9.log.refs/00000000000000000020-1"}},
		{State: ShipmentShipping, Partition: "a-0", Base: 0, Key: "a-0/00000000000000000000-2.log"},
		{State: ShipmentShipped, Partition: "b-0", Base: 5, Key: "b-0/00000000000000000005-3.log"},
	} {
		if err := c.put(s); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	// The objects of a segment are written from its stem on.
	if b, _ := os.ReadFile(filepath.Join(dir, "shipments", "a-0"+keyLogExt)); !strings.Contains(string(b), `"~.log.tierfs-manifest"`) || strings.Count(string(b), "00000000000000000020-1") != 3 {
		t.Fatalf("a-0's log:\n%s", b)
	}
	if err := c.put(Shipment{Partition: "a-0", Key: "a-0/x.log", Objects: []string{"~x"}}); err == nil {
		t.Fatal("an object that starts with the stem mark was put")
	}
	if err := c.put(Shipment{Partition: "a-0", Key: "a-0/x.log", Objects: []string{"^x"}}); err == nil {
		t.Fatal("an object that starts with the reference mark was put")
	}
	// The file's own references are kept as the object they reference
	// (never so written), and read back whole.
	ref := "a-0/00000000000000000010-9.log.refs/00000000000000000020-1"
	if k := c.byPart["a-0"]["a-0/00000000000000000020-1.log"]; !slices.Contains(k.Objects, refMark+"a-0/00000000000000000010-9.log") {
		t.Fatalf("kept objects: %q", k.Objects)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "shipments", "a-0"+keyLogExt)); !strings.Contains(string(b), `"`+ref+`"`) || strings.Contains(string(b), refMark) {
		t.Fatalf("a-0's log:\n%s", b)
	}
	if got, err := c.get("a-0", "a-0/00000000000000000020-1.log"); err != nil || !slices.Contains(got.Objects, ref) {
		t.Fatalf("get: %+v %v", got, err)
	}
	// A reference another file holds is kept whole.
	other := "b-0/00000000000000000001-9.log.refs/00000000000000000001-7"
	if err := c.put(Shipment{State: ShipmentShipped, Partition: "b-0", Base: 1, Key: "b-0/00000000000000000001-8.log", Objects: []string{other}}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.get("b-0", "b-0/00000000000000000001-8.log"); err != nil || len(got.Objects) != 1 || got.Objects[0] != other {
		t.Fatalf("get: %+v %v", got, err)
	}
	if err := c.remove("b-0", "b-0/00000000000000000001-8.log"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.get("a-0", "a-0/nothing.log"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("get of none: %v", err)
	}
	if !c.has("b-0", "b-0/00000000000000000005-3.log") {
		t.Fatal("has")
	}
	of, _ := c.of("a-0")
	if len(of) != 2 || of[0].Base != 0 || of[1].Base != 20 {
		t.Fatalf("of a-0: %+v", of)
	}
	if err := c.remove("b-0", "b-0/00000000000000000005-3.log"); err != nil {
		t.Fatal(err)
	}
	again := newShipmentCatalog(func() string { return dir }, discard)
	all, err := again.all()
	kept, _ := c.all()
	if err != nil || len(all) != 2 || all[0].Partition != "a-0" || len(kept) != 2 {
		t.Fatalf("read back: %+v %v", all, err)
	}
	if fmt.Sprint(all) != fmt.Sprint(kept) {
		t.Fatalf("read back\n%+v\nkept\n%+v", all, kept)
	}
	// One log per partition; a partition with no shipment left has none.
	if files, _ := filepath.Glob(filepath.Join(dir, "shipments", "*")); len(files) != 1 || filepath.Base(files[0]) != "a-0.klog" {
		t.Fatalf("shipment files: %v", files)
	}
	// A bad line is an error that names the log.
	bad := filepath.Join(dir, "shipments", "c-0.klog")
	os.WriteFile(bad, []byte("junk\nmore junk\n"), 0o644)
	if _, err := newShipmentCatalog(func() string { return dir }, discard).all(); err == nil || !strings.Contains(err.Error(), bad+": offset 0") {
		t.Fatalf("a bad shipment log: %v", err)
	}
}

// Shipments of older versions, one JSON file each, move into the
// partitions' logs at the first load, and read back the same.
func TestShipmentCatalogMigrates(t *testing.T) {
	dir := t.TempDir()
	discard := slog.New(slog.DiscardHandler)
	legacy := []Shipment{
		{State: ShipmentShipped, Partition: "a-0", Base: 20, Key: "a-0/00000000000000000020-1.log", Objects: []string{"a-0/00000000000000000020-1.log"}},
		{State: ShipmentDeleting, Partition: "a-0", Base: 0, Key: "a-0/00000000000000000000-2.log"},
		{State: ShipmentShipped, Partition: "b-0", Base: 5, Key: "b-0/00000000000000000005-3.log"},
	}
	for _, s := range legacy {
		p := filepath.Join(dir, "shipments", s.Partition, filepath.Base(s.Key)+".json")
		os.MkdirAll(filepath.Dir(p), 0o755)
		b, _ := json.Marshal(s)
		os.WriteFile(p, b, 0o644)
	}
	// A crash halfway through an earlier migration left a-0's log with
	// one of its shipments beside the file.
	half := newShipmentCatalog(func() string { return dir }, discard)
	l, _ := half.openLog("a-0")
	b, _ := json.Marshal(legacy[0])
	l.Put(legacy[0].Key, b)
	c := newShipmentCatalog(func() string { return dir }, discard)
	all, err := c.all()
	if err != nil || len(all) != 3 {
		t.Fatalf("migrated: %+v %v", all, err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "shipments", "*")); fmt.Sprint(files) != fmt.Sprint([]string{filepath.Join(dir, "shipments", "a-0.klog"), filepath.Join(dir, "shipments", "b-0.klog")}) {
		t.Fatalf("after migration: %v", files)
	}
	again, err := newShipmentCatalog(func() string { return dir }, discard).all()
	if err != nil || fmt.Sprint(again) != fmt.Sprint(all) {
		t.Fatalf("read back: %+v %v, want %+v", again, err, all)
	}
	if s, _ := c.get("a-0", legacy[0].Key); s.State != ShipmentShipped || len(s.Objects) != 1 {
		t.Fatalf("a-0 20: %+v", s)
	}
	// A bad legacy file is an error that names it.
	bad := filepath.Join(dir, "shipments", "c-0", "x.log.json")
	os.MkdirAll(filepath.Dir(bad), 0o755)
	os.WriteFile(bad, []byte("{"), 0o644)
	if _, err := newShipmentCatalog(func() string { return dir }, discard).all(); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("a torn legacy shipment: %v", err)
	}
}

// A pass that finds nothing to do reads no record and no shipment from
// disk: every segment's record comes from memory, every shipment's file
// is known alive from the scan.
func TestIdlePassReadsNothing(t *testing.T) {
	root, _, _ := logDir(t)
	tr := newTierer(t, root, store.NewMem(nil), 1<<40)
	tr.cfg.Policy.ShipAfter = 0
	ctx := context.Background()
	if rep := tr.RunOnce(ctx); rep.Shipped == 0 || len(rep.Errors) > 0 {
		t.Fatalf("first pass: %+v", rep)
	}
	later := time.Now().Add(time.Minute)
	tr.cfg.Now = func() time.Time { return later }
	tr.records.now = tr.cfg.Now
	tr.RunOnce(ctx) // the records of the shipped segments settle
	// Now every record and shipment on disk is made unreadable: an idle
	// pass that read one would fail.
	ships, _ := tr.shipments.all()
	for _, s := range ships {
		os.WriteFile(filepath.Join(tr.cfg.StateDir, "shipments", s.Partition+keyLogExt), []byte("junk\njunk\n"), 0o644)
	}
	n := tr.records.size()
	if n < len(ships) {
		t.Fatalf("%d records kept for %d shipments", n, len(ships))
	}
	if rep := tr.RunOnce(ctx); len(rep.Errors) > 0 || rep.Shipped != 0 || rep.Deleted != 0 {
		t.Fatalf("idle pass: %+v", rep)
	}
}

// A pass scans only the partitions that may have changed; a full scan
// every RescanInterval finds a change made in place, and says so.
func TestSettledPartitionsAreNotScanned(t *testing.T) {
	root := filepath.Join(t.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 3, Segments: 4, Batches: 6, Records: 8, ValueSize: 300, Age: time.Hour}).Write(root); err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	now := time.Now()
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: store.NewMem(nil), ChunkSize: 64 << 10,
		RescanInterval: time.Hour, Now: func() time.Time { return now }, Log: slog.New(slog.NewTextHandler(&logBuf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	scans := func() int64 { return tr.Counters().PartitionScans.Load() }
	pass := func(want Report) {
		t.Helper()
		rep := tr.RunOnce(ctx)
		if len(rep.Errors) > 0 || rep.Shipped != want.Shipped || rep.Deleted != want.Deleted {
			t.Fatalf("pass: %+v, want %d shipped, %d deleted", rep, want.Shipped, want.Deleted)
		}
	}
	pass(Report{Shipped: 9})
	if scans() != 3 {
		t.Fatalf("first pass scanned %d partitions", scans())
	}
	// The pass after one that shipped scans what it changed once more
	// (what a scan keeps, the allocated bytes, changed with the records).
	now = now.Add(time.Second)
	pass(Report{})
	if scans() != 6 {
		t.Fatalf("the pass after the shipping one scanned %d partitions, want 3", scans()-3)
	}
	now = now.Add(time.Second)
	pass(Report{})
	if scans() != 6 {
		t.Fatalf("an idle pass scanned %d partitions", scans()-6)
	}
	// A roll in orders-0: that partition only is scanned. Its segment
	// rolled now waits (not flushed, indexes not trimmed), so it is
	// scanned at every pass until it ships.
	p0 := filepath.Join(root, "orders-0")
	os.WriteFile(filepath.Join(p0, "00000000000000009999.log"), nil, 0o644)
	pass(Report{})
	if scans() != 7 {
		t.Fatalf("a pass after a roll scanned %d partitions, want 1", scans()-6)
	}
	pass(Report{})
	if scans() != 8 {
		t.Fatalf("a pass after a roll scanned %d partitions, want the one that waits", scans()-7)
	}
	// A rolled, shipped segment of orders-1 changed in place: no pass
	// sees it until the full scan, which logs it and forgets the stale
	// copy.
	s1, _ := filepath.Glob(filepath.Join(root, "orders-1", "*.log"))
	f, _ := os.OpenFile(s1[0], os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte("changed in place"))
	f.Close()
	before := scans()
	pass(Report{})
	if scans() != before+1 {
		t.Fatalf("a pass scanned %d partitions for a change in place (want orders-0 only)", scans()-before)
	}
	before = scans()
	now = now.Add(2 * time.Hour)
	tr.RunOnce(ctx)
	if scans() != before+3 {
		t.Fatalf("the full scan scanned %d partitions", scans()-before)
	}
	if !strings.Contains(logBuf.String(), "a full scan found a change in place") || !strings.Contains(logBuf.String(), filepath.Base(s1[0])) {
		t.Fatalf("the full scan did not say what it found:\n%s", logBuf.String())
	}
	if _, has, _ := readRecord(s1[0]); has {
		t.Fatal("the stale copy of the changed segment is still recorded")
	}
}

// A write to a rolled segment through an open tiered file, and a change
// the tierer makes, unsettle its partition at once: the next pass looks
// at it (and ships the changed segment again).
func TestTouchUnsettles(t *testing.T) {
	root := filepath.Join(t.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 2, Segments: 3, Batches: 6, Records: 8, ValueSize: 300, Age: time.Hour}).Write(root); err != nil {
		t.Fatal(err)
	}
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: store.NewMem(nil), ChunkSize: 64 << 10, RescanInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	tr.RunOnce(ctx)
	tr.RunOnce(ctx)
	before := tr.Counters().PartitionScans.Load()
	segs, _ := filepath.Glob(filepath.Join(root, "orders-1", "*.log"))
	f, fd, _ := openTiered(t, tr, segs[0], "orders-1/"+filepath.Base(segs[0]))
	defer fd.Close()
	defer f.Close()
	if _, err := f.WriteAt([]byte("x"), 0, func() (int, error) { return fd.WriteAt([]byte("x"), 0) }); err != nil {
		t.Fatal(err)
	}
	tr.RunOnce(ctx)
	if n := tr.Counters().PartitionScans.Load() - before; n != 1 {
		t.Fatalf("the pass after a write scanned %d partitions, want orders-1", n)
	}
	if _, has, _ := readRecord(segs[0]); has {
		t.Fatal("the changed segment's stale copy is still recorded")
	}
}

// A state dir an older version wrote (one file per shipment and per
// manifest copy, records naming their manifest file) keeps working: a
// new tierer reads every evicted file back, ships nothing again, and
// moves the files into the partitions' logs.
func TestLegacyStateDirKeepsWorking(t *testing.T) {
	root, _, sums := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1)
	if rep := mustPass(t, tr); rep.Evicted == 0 {
		t.Fatalf("first pass: %+v", rep)
	}
	state := tr.cfg.StateDir
	ships, _ := tr.shipments.all()
	states := map[string]storeState{}
	for _, sh := range ships {
		states[sh.Partition] = tr.share.loadStoreState(sh.Partition)
		if states[sh.Partition].ETag == "" {
			t.Fatalf("%s: no store state", sh.Partition)
		}
	}
	tr.Close()
	for part, st := range states {
		b, _ := json.Marshal(st)
		if err := os.WriteFile(filepath.Join(state, "idx", part, "store.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Rewrite the state as the old layout had it.
	type legacy struct{ path, key string }
	var mans []legacy
	for _, sh := range ships {
		mans = append(mans, legacy{filepath.Join(state, "manifests", sh.Partition, filepath.Base(sh.Key)+".json"), sh.Key})
	}
	for _, sh := range ships {
		sh.Manifest = filepath.Join("manifests", sh.Partition, filepath.Base(sh.Key)+".json")
		b, _ := json.Marshal(sh)
		p := filepath.Join(state, "shipments", sh.Partition, filepath.Base(sh.Key)+".json")
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := newTierer(t, root, s, 1)
	for _, m := range mans {
		mf, err := old.manifests.get(m.key)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(mf)
		os.MkdirAll(filepath.Dir(m.path), 0o755)
		os.WriteFile(m.path, b, 0o644)
	}
	old.Close()
	klogs, _ := filepath.Glob(filepath.Join(state, "*", "*"+keyLogExt))
	for _, p := range klogs {
		os.Remove(p)
	}
	for path := range sums {
		if rec, has, _ := readRecord(path); has {
			rec.Manifest = filepath.Join("manifests", filepath.Base(filepath.Dir(path)), filepath.Base(rec.Key)+".json")
			writeRecord(path, rec)
		}
	}

	tr2 := newTierer(t, root, s, 1)
	remote := 0
	for path, sum := range sums {
		if st, _, _ := tr2.copies.stateOf(path); st == StateRemote {
			remote++
			if sha(readAll(t, tr2, path)) != sum {
				t.Fatalf("%s reads back otherwise", path)
			}
		}
	}
	if remote == 0 {
		t.Fatal("nothing evicted to read back")
	}
	if rep := mustPass(t, tr2); rep.Shipped != 0 || rep.Deleted != 0 {
		t.Fatalf("pass over the old layout: %+v", rep)
	}
	left, _ := filepath.Glob(filepath.Join(state, "shipments", "*", "*.json"))
	lm, _ := filepath.Glob(filepath.Join(state, "manifests", "*", "*.json"))
	ls, _ := filepath.Glob(filepath.Join(state, "idx", "*", "store.json"))
	if left = append(append(left, lm...), ls...); len(left) != 0 {
		t.Fatalf("legacy files left: %v", left)
	}
	// The store states moved as they were: no partition was taken for
	// one another broker changed.
	for part, st := range states {
		if got := tr2.share.loadStoreState(part); got != st {
			t.Fatalf("%s: store state %+v after the move, was %+v", part, got, st)
		}
	}
	if all, _ := tr2.shipments.all(); len(all) != len(ships) {
		t.Fatalf("%d shipments after the move, want %d", len(all), len(ships))
	}
}

// all are every shipment, by partition and base offset.
func (c *shipmentCatalog) all() ([]Shipment, error) {
	parts, err := c.partitions(func(string) bool { return false })
	if err != nil {
		return nil, err
	}
	var out []Shipment
	for _, part := range parts {
		ss, err := c.of(part)
		if err != nil {
			return nil, err
		}
		out = append(out, ss...)
	}
	return out, nil
}

// Status and the metrics scan again only the partitions that changed
// since their last scan, whether a pass settled them or not (a backlog
// that waits, or ships, leaves every partition unsettled), and keep what
// they scanned: the next view scans nothing.
func TestViewScansWhatChanged(t *testing.T) {
	root := filepath.Join(t.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 4, Segments: 3, Batches: 6, Records: 8, ValueSize: 300, Age: time.Hour}).Write(root); err != nil {
		t.Fatal(err)
	}
	// Nothing is old enough to ship: every partition waits, unsettled.
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: store.NewMem(nil), ChunkSize: 64 << 10,
		RescanInterval: time.Hour, Policy: Policy{ShipAfter: 24 * time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	views := func() int64 { return tr.Counters().ViewScans.Load() }
	summary := func() []PartitionSummary {
		t.Helper()
		s, err := tr.Summary()
		if err != nil || len(s) != 4 {
			t.Fatalf("summary: %d partitions, %v", len(s), err)
		}
		return s
	}
	// Before any pass: every partition is scanned, once.
	summary()
	summary()
	if views() != 4 {
		t.Fatalf("two views before any pass scanned %d partitions, want 4", views())
	}
	tr.RunOnce(ctx)
	tr.RunOnce(ctx)
	before := views()
	first := summary()
	if views() != before {
		t.Fatalf("a view after passes that changed nothing scanned %d partitions", views()-before)
	}
	// A new segment in orders-2: that partition only, and only once.
	os.WriteFile(filepath.Join(root, "orders-2", "00000000000000009999.log"), nil, 0o644)
	got := summary()
	summary()
	if n := views() - before; n != 1 {
		t.Fatalf("views after a roll in one partition scanned %d partitions, want 1", n)
	}
	for i := range got {
		want := first[i].Segments
		if got[i].Name == "orders-2" {
			want++
		}
		if got[i].Segments != want {
			t.Fatalf("%s: %d segments, want %d", got[i].Name, got[i].Segments, want)
		}
	}
	// The pass still looks at every unsettled partition, and ships
	// nothing.
	if rep := tr.RunOnce(ctx); rep.Shipped != 0 || len(rep.Errors) > 0 {
		t.Fatalf("pass: %+v", rep)
	}
}

// A roll that a view saw before the pass that scanned the partition was
// done with it is not settled away: the view's scan is never settled, so
// the next pass scans the partition and finds the rolled segment.
func TestViewScanIsNeverSettled(t *testing.T) {
	root := filepath.Join(t.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 2, Batches: 2, Records: 4, ValueSize: 100, Age: time.Hour}).Write(root); err != nil {
		t.Fatal(err)
	}
	ps := newPartScans(slog.New(slog.DiscardHandler))
	now := time.Now()
	if _, _, scanned, err := ps.scan(root, false, now); err != nil || !scanned["orders-0"] {
		t.Fatalf("first scan: %v %v", scanned, err)
	}
	// The broker rolls while the pass works on what it scanned; a view
	// (a scrape) sees the roll first.
	os.WriteFile(filepath.Join(root, "orders-0", "00000000000000009999.log"), nil, 0o644)
	vs, n, err := ps.viewScans(root)
	if err != nil || n != 1 || len(vs) != 1 || len(vs[0].p.Segments) != 3 {
		t.Fatalf("view: %d scanned, %+v, %v", n, vs, err)
	}
	ps.settle("orders-0", true, time.Time{}) // the pass found nothing to do in what it had scanned
	_, _, scanned, err := ps.scan(root, false, now)
	if err != nil || !scanned["orders-0"] {
		t.Fatal("the next pass did not scan a partition whose roll only a view had seen")
	}
	// A pass's own scan still settles: the pass after it scans nothing.
	ps.settle("orders-0", true, time.Time{})
	if _, _, scanned, _ := ps.scan(root, false, now); scanned["orders-0"] {
		t.Fatal("a settled, unchanged partition was scanned again")
	}
}

// While one partition's shipment write is under way (its sync can take
// a journal commit), writes of other partitions and reads of any go on;
// and writes and removals at once, of one partition and of several,
// leave the catalog as a new one reads it back from disk.
func TestShipmentCatalogWritesAtOnce(t *testing.T) {
	dir := t.TempDir()
	discard := slog.New(slog.DiscardHandler)
	c := newShipmentCatalog(func() string { return dir }, discard)
	sh := func(part string, i int) Shipment {
		key := fmt.Sprintf("%s/%020d-1.log", part, i)
		return Shipment{State: ShipmentShipping, Partition: part, Base: int64(i), Key: key, Objects: []string{key}}
	}
	if err := c.put(sh("a-0", 0)); err != nil {
		t.Fatal(err)
	}
	_, unlock, err := c.writeLog("a-0", true) // a write of a-0 in progress
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		err := c.put(sh("b-0", 0))
		if err == nil && !c.has("a-0", sh("a-0", 0).Key) {
			err = errors.New("a-0's shipment is not read")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write of b-0 waited for one of a-0")
	}
	unlock()

	var wg sync.WaitGroup
	for g := range 8 {
		part := fmt.Sprintf("p-%d", g%3)
		wg.Go(func() {
			for i := range 40 {
				s := sh(part, g*1000+i)
				if err := c.put(s); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					if err := c.remove(part, s.Key); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	kept, err := c.all()
	if err != nil {
		t.Fatal(err)
	}
	all, err := newShipmentCatalog(func() string { return dir }, discard).all()
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 2+8*26 || fmt.Sprint(all) != fmt.Sprint(kept) {
		t.Fatalf("kept %d shipments, read back %d, or they differ", len(kept), len(all))
	}
}
