package tiering

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// replica is one broker's copy of partition orders-0, written as a
// broker does: the same batches as every other replica, appended to the
// active segment, which rolls at this replica's own points.
type replica struct {
	root    string
	id      string
	rollAt  map[int]bool // batch numbers that start a new segment
	batches [][]byte     // the stream, shared by all replicas
	n       int          // batches written
	bases   []int64
	offs    []int64 // base offset of each batch of the stream
}

func newReplica(t *testing.T, id string, stream [][]byte, offs []int64, every int) *replica {
	r := &replica{root: filepath.Join(t.TempDir(), "broker-"+id), id: id, rollAt: map[int]bool{}, batches: stream, offs: offs}
	for i := every; i < len(stream); i += every {
		r.rollAt[i] = true
	}
	if err := os.MkdirAll(filepath.Join(r.root, "orders-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(r.root, "meta.properties"), []byte("version=1\nnode.id="+id+"\n"), 0o644)
	return r
}

func (r *replica) segPath(base int64) string {
	return filepath.Join(r.root, "orders-0", kafkaName(base, ".log"))
}

// grow appends the stream's batches up to n, rolling where this replica
// rolls; rolled segments look an hour old, and the checkpoints say all is
// flushed and replicated up to the active segment.
func (r *replica) grow(t *testing.T, n int) {
	t.Helper()
	for ; r.n < n; r.n++ {
		if r.n == 0 || r.rollAt[r.n] {
			if len(r.bases) > 0 {
				old := time.Now().Add(-time.Hour)
				os.Chtimes(r.segPath(r.bases[len(r.bases)-1]), old, old)
			}
			r.bases = append(r.bases, r.offs[r.n])
		}
		f, err := os.OpenFile(r.segPath(r.bases[len(r.bases)-1]), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(r.batches[r.n])
		f.Close()
	}
	active := r.bases[len(r.bases)-1]
	end := r.offs[len(r.offs)-1] + 1
	if r.n < len(r.offs) {
		end = r.offs[r.n]
	}
	for name, body := range map[string]string{
		"recovery-point-offset-checkpoint": fmt.Sprintf("0\n1\norders 0 %d\n", active),
		"replication-offset-checkpoint":    fmt.Sprintf("0\n1\norders 0 %d\n", end),
		"log-start-offset-checkpoint":      "0\n0\n",
	} {
		if err := os.WriteFile(filepath.Join(r.root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// want is what segment base holds: the stream's batches from its base
// to the next segment's.
func (r *replica) want(i int) []byte {
	var out []byte
	for j := 0; j < r.n; j++ {
		if r.offs[j] >= r.bases[i] && (i+1 == len(r.bases) || r.offs[j] < r.bases[i+1]) {
			out = append(out, r.batches[j]...)
		}
	}
	return out
}

func shareTierer(t *testing.T, r *replica, s store.Store, role Role) *Tierer {
	return replicaTierer(t, r, s, func(c *Config) { c.Role = role })
}

// replicaTierer is the tierer of a replica's log dir on store s: ship
// after 10 minutes, keep 1 byte local, 64 KiB chunks, and what more
// set says.
func replicaTierer(t *testing.T, r *replica, s store.Store, set func(*Config)) *Tierer {
	t.Helper()
	cfg := Config{Root: r.root, StateDir: filepath.Join(r.root, ".tierfs"), Store: s,
		Policy: Policy{ShipAfter: 10 * time.Minute}, LocalRetentionBytes: 1, ChunkSize: 64 << 10}
	set(&cfg)
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// checkReplica reads every segment of a replica back, whatever its
// state, and returns its local and remote segment counts and the bytes
// its .log files hold on disk.
func checkReplica(t *testing.T, tr *Tierer, r *replica) (local, remote int, onDisk int64) {
	t.Helper()
	for i, base := range r.bases {
		p := r.segPath(base)
		want := r.want(i)
		st, _, err := tr.copies.stateOf(p)
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		if st == StateRemote {
			remote++
			got = readAll(t, tr, p)
			checkSlices(t, tr, p, want)
		} else {
			local++
			got, _ = os.ReadFile(p)
		}
		if sha(got) != sha(want) {
			t.Errorf("broker %s: %s (%s) does not read back: %d bytes, want %d", r.id, filepath.Base(p), st, len(got), len(want))
		}
		var sst syscall.Stat_t
		syscall.Stat(p, &sst)
		onDisk += sst.Blocks * 512
	}
	return local, remote, onDisk
}

// checkSlices reads the evicted file at path through an open tiered.File
// by 4 KiB slices: each range within one chunk of one object (its own or
// another broker's) is handed out without a copy, and holds want's bytes.
func checkSlices(t *testing.T, tr *Tierer, path string, want []byte) {
	t.Helper()
	f, fd, _ := openTiered(t, tr, path, path)
	defer fd.Close()
	defer f.Close()
	sliced := 0
	for off := 0; off < len(want); off += 4096 {
		b, release, ok, err := f.Slice(int64(off), 4096)
		if !ok {
			continue
		}
		if err != nil {
			t.Fatalf("slice %s at %d: %v", path, off, err)
		}
		if !bytes.Equal(b, want[off:min(off+4096, len(want))]) {
			t.Fatalf("slice %s at %d: wrong bytes", path, off)
		}
		release()
		sliced++
	}
	if sliced == 0 {
		t.Errorf("%s: no range was handed out without a copy", filepath.Base(path))
	}
}

// logBytes sums the sizes of the segment objects (.log) in the store.
func logBytes(t *testing.T, s store.Store) int64 {
	t.Helper()
	infos, err := s.List(context.Background(), "orders-0/")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, o := range infos {
		if strings.HasSuffix(o.Key, ".log") {
			n += o.Size
		}
	}
	return n
}

// fourRecordBatches is a stream of n batches of 4 records each, from
// offset first: the batches, their base offsets, and the stream's bytes
// before each batch (and in all, last).
func fourRecordBatches(n int, first int64, valueSize int) (stream [][]byte, offs, before []int64) {
	off, sum := first, int64(0)
	for range n {
		b := kafkatest.Encode(kafkatest.Batch{Base: off, Records: 4, ValueSize: valueSize, TS: 1000 + off, Epoch: 1})
		stream, offs, before = append(stream, b), append(offs, off), append(before, sum)
		off += 4
		sum += int64(len(b))
	}
	return stream, offs, append(before, sum)
}

// TestBrokersShareTheStore: three replicas of one partition, fed the
// same batches but rolling at different points, share a store. The
// leader ships; the followers map their segments onto its objects once
// the store holds all of a segment, and free them; every file of every
// broker reads back byte-exact; each batch is stored once. Then the
// leader changes mid-stream: the new leader ships only what the store
// lacks, from inside its segments. Deleting follows references: a
// leader's object goes only when no follower's file reads from it.
func TestBrokersShareTheStore(t *testing.T) {
	for name, mk := range map[string]func(t *testing.T) store.Store{
		"mem": func(t *testing.T) store.Store { return store.NewMem(nil) },
		"dir": func(t *testing.T) store.Store {
			d, err := store.NewDir(filepath.Join(t.TempDir(), "remote"))
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	} {
		t.Run(name, func(t *testing.T) { testBrokersShareTheStore(t, mk(t)) })
	}
}

func testBrokersShareTheStore(t *testing.T, s store.Store) {
	const total = 90
	var stream [][]byte
	var offs []int64
	var size []int64 // bytes of the stream up to batch i
	ts := time.Now().Add(-2 * time.Hour).UnixMilli()
	var off, sum int64
	for i := range total {
		recs := 3 + i%4
		b := kafkatest.Encode(kafkatest.Batch{Base: off, Records: recs, ValueSize: 6000, TS: ts + off, Epoch: 1, Attrs: int16(i % 2)})
		stream, offs = append(stream, b), append(offs, off)
		size = append(size, sum)
		off += int64(recs)
		sum += int64(len(b))
	}
	size = append(size, sum)
	b1 := newReplica(t, "1", stream, offs, 10)
	b2 := newReplica(t, "2", stream, offs, 7)
	// Broker 3's log diverged at batch 20 (the same offsets written in
	// another leader epoch, as after an unclean election).
	stream3 := append([][]byte(nil), stream...)
	stream3[20] = kafkatest.Encode(kafkatest.Batch{Base: offs[20], Records: 3 + 20%4, ValueSize: 6000, TS: ts + offs[20], Epoch: 2})
	b3 := newReplica(t, "3", stream3, offs, 13)
	t1 := shareTierer(t, b1, s, RoleLeader)
	t2 := shareTierer(t, b2, s, RoleFollower)
	t3 := shareTierer(t, b3, s, RoleFollower)
	for _, r := range []*replica{b1, b2, b3} {
		r.grow(t, 45)
	}
	_, _, before2 := checkReplica(t, t2, b2)
	// Followers first: nothing is in the store, nothing is mapped.
	if rep := mustPass(t, t2); rep.Shipped != 0 {
		t.Fatalf("a follower shipped: %+v", rep)
	}
	if why := t2.LastErrors()["orders-0"].Kept; !strings.Contains(why, "not in the store yet") {
		t.Fatalf("follower's reason: %q", why)
	}
	rep := mustPass(t, t1)
	if rep.Shipped != 4 { // segments 0..39 of 45 batches; 40.. is active
		t.Fatalf("leader: %+v", rep)
	}
	if got, want := logBytes(t, s), size[40]; got != want {
		t.Fatalf("store holds %d bytes of segments, want %d (batches 0..39 once)", got, want)
	}
	// The segments are small: their batch lists, which the followers
	// compare their own batches with, are in their manifests.
	if all, err := s.List(context.Background(), ""); err != nil || slices.ContainsFunc(all, func(o store.ObjectInfo) bool { return strings.HasSuffix(o.Key, ".batches") }) {
		t.Fatalf("a batch list stored as an object of its own: %v", err)
	}
	mustPass(t, t2)
	mustPass(t, t3)
	// b2 rolls at 7, 14, ..., 42: its segments up to batch 35 lie in what
	// the leader shipped; 35..41 does not (batch 40 is not shipped).
	l2, r2, after2 := checkReplica(t, t2, b2)
	if r2 != 5 || l2 != 2 {
		t.Fatalf("follower 2: %d remote, %d local segments", r2, l2)
	}
	if after2 >= before2/2 {
		t.Fatalf("follower 2 holds %d bytes on disk, %d before", after2, before2)
	}
	if why := t2.LastErrors()["orders-0"].Kept; !strings.Contains(why, "not in the store yet") {
		t.Fatalf("follower's reason: %q", why)
	}
	// Its copy of the index is the store's, and gives the remote offset
	// and time indexes of each of the leader's segments (kept in the
	// store only).
	dir := filepath.Join(b2.root, ".tierfs", "idx", "orders-0")
	local, _ := os.ReadFile(filepath.Join(dir, idx.FileName))
	remote, _ := store.ReadAll(s.Get(context.Background(), "orders-0/"+idx.FileName, 0, -1, store.GetOptions{}))
	if len(local) == 0 || !bytes.Equal(local, remote) {
		t.Fatalf("follower's index: %d bytes, the store's %d", len(local), len(remote))
	}
	x, _, err := idx.ParseIndex("index", local)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range b1.bases[:4] {
		next := b1.bases[i+1]
		if ri, err := x.BuildRemoteIndexes(b, next); err != nil || len(ri.Offsets) == 0 {
			t.Errorf("follower's remote indexes of %d: %d entries, %v", b, len(ri.Offsets), err)
		}
	}
	if ri, _ := filepath.Glob(filepath.Join(dir, "*.r*index")); len(ri) > 0 {
		t.Errorf("local remote indexes written: %v", ri)
	}
	l3, r3, _ := checkReplica(t, t3, b3)
	if r3 != 2 || l3 != 2 { // 0 and 26 mapped; 13 diverged; 39.. active
		t.Fatalf("follower 3: %d remote, %d local segments", r3, l3)
	}
	if why := t3.LastErrors()["orders-0"].Kept; !strings.Contains(why, "differs from the store's copy") || !strings.Contains(why, kafkaName(offs[13], ".log")) {
		t.Fatalf("diverged follower's reason: %q", why)
	}
	checkReplica(t, t1, b1)
	// A follower's evicted file is held by several of the leader's
	// objects, and reads across them.
	rec, _, _ := readRecord(b2.segPath(b2.bases[1])) // batches 7..13: objects 0.. and 10..
	if len(rec.Extents) != 2 || rec.Extents[0].Key == rec.Extents[1].Key {
		t.Fatalf("extents of a follower's segment: %+v", rec.Extents)
	}

	// The leader changes: broker 2 leads from here, broker 1 follows.
	t1.Close()
	t2.Close()
	t1 = shareTierer(t, b1, s, RoleFollower)
	t2 = shareTierer(t, b2, s, RoleLeader)
	for _, r := range []*replica{b1, b2, b3} {
		r.grow(t, total)
	}
	putsBefore := logBytes(t, s)
	rep = mustPass(t, t2)
	if rep.Shipped == 0 {
		t.Fatalf("new leader: %+v", rep)
	}
	// b2's segment 35..41 had 35..39 in the store: only 40.. went up.
	// Everything up to its active segment (84..) is stored, once.
	if got, want := logBytes(t, s), size[84]; got != want {
		t.Fatalf("store holds %d bytes of segments, want %d (batches 0..83 once; %d before)", got, want, putsBefore)
	}
	rec, _, _ = readRecord(b2.segPath(b2.bases[5]))
	if len(rec.Extents) != 2 || rec.Extents[1].Pos == 0 || rec.Extents[1].Key != rec.Key {
		t.Fatalf("new leader's segment across the change: %+v", rec)
	}
	mustPass(t, t1)
	mustPass(t, t3)
	for _, c := range []struct {
		tr *Tierer
		r  *replica
	}{{t1, b1}, {t2, b2}, {t3, b3}} {
		local, remote, _ := checkReplica(t, c.tr, c.r)
		if want := map[*replica]int{b3: 2}[c.r]; local != max(1, want) {
			t.Errorf("broker %s: %d local, %d remote", c.r.id, local, remote)
		}
	}

	// Broker 1 deletes its first segment (retention): its objects hold
	// bytes of brokers 2's and 3's files, so they stay.
	first := b1.segPath(b1.bases[0])
	rec1, _, _ := readRecord(first)
	os.Remove(first)
	mustPass(t, t1)
	if _, err := s.Head(context.Background(), rec1.Key); err != nil {
		t.Fatalf("an object others read from was deleted: %v", err)
	}
	refs := objects(t, s, rec1.Key+".refs/")
	if len(refs) != 3 { // broker 2's first two segments, broker 3's first
		t.Fatalf("references to %s: %v", rec1.Key, refs)
	}
	checkReplica(t, t2, b2)
	if _, err := t2.manifests.get(rec1.Key); err != nil {
		t.Fatalf("broker 2 has no copy of the manifest of %s it reads from: %v", rec1.Key, err)
	}
	// The others delete theirs (broker 2 the first two: its second also
	// reads from it); then the object goes at broker 1's next pass.
	os.Remove(b2.segPath(b2.bases[0]))
	os.Remove(b2.segPath(b2.bases[1]))
	os.Remove(b3.segPath(b3.bases[0]))
	mustPass(t, t2)
	mustPass(t, t3)
	if refs := objects(t, s, rec1.Key+".refs/"); len(refs) != 0 {
		t.Fatalf("references left: %v", refs)
	}
	for r, tr := range map[*replica]*Tierer{b2: t2, b3: t3} {
		if _, err := tr.manifests.get(rec1.Key); !os.IsNotExist(err) {
			t.Errorf("broker %s keeps its copy of the manifest of %s: %v", r.id, rec1.Key, err)
		}
	}
	mustPass(t, t1)
	if left := objects(t, s, strings.TrimSuffix(rec1.Key, ".log")); len(left) != 0 {
		t.Fatalf("objects of the deleted segment left: %v", left)
	}
}

// TestTwoLeadersRace: two mounts both believe they lead and ship the
// same partition at once. The index's compare-and-swap lets one win each
// append; the loser appends again what the store's index still lacks, or
// maps what the winner shipped and removes what it uploaded in vain.
// Losing is not an error. In the end each batch is stored once and both
// read back.
func TestTwoLeadersRace(t *testing.T) {
	s := store.NewMem(nil)
	stream, offs, size := fourRecordBatches(60, 0, 3000)
	b1 := newReplica(t, "1", stream, offs, 10)
	b2 := newReplica(t, "2", stream, offs, 7)
	b1.grow(t, 60)
	b2.grow(t, 60)
	t1 := shareTierer(t, b1, s, RoleLeader)
	t2 := shareTierer(t, b2, s, RoleLeader)
	for range 3 {
		done := make(chan Report)
		for _, tr := range []*Tierer{t1, t2} {
			go func() { done <- tr.RunOnce(context.Background()) }()
		}
		for range 2 {
			if errs := (<-done).Errors; len(errs) > 0 {
				t.Fatalf("a lost race is an error: %v", errs)
			}
		}
	}
	for _, tr := range []*Tierer{t1, t2} {
		if e := tr.LastErrors()["orders-0"]; e.Err != "" {
			t.Errorf("last error: %+v", e)
		}
	}
	mustPass(t, t1)
	mustPass(t, t2)
	mustPass(t, t1)
	c1, c2 := t1.Counters(), t2.Counters()
	overlap := c1.OverlapBytes.Load() + c2.OverlapBytes.Load()
	t.Logf("appends that lost the race: %d; uploads made needless: %d; bytes uploaded twice: %d", c1.IndexRaces.Load()+c2.IndexRaces.Load(), c1.WastedSegments.Load()+c2.WastedSegments.Load(), overlap)
	// b1 ships up to 50 (its active segment), b2 up to 56: each batch
	// once, but for the heads of uploads that lost a race to an upload of
	// the same offsets (kept rather than uploaded again).
	if got, want := logBytes(t, s), size[56]+overlap; got != want {
		t.Fatalf("store holds %d bytes of segments, want %d (each batch once, and %d bytes of uploads that lost a race)", got, want, overlap)
	}
	checkIndexOnce(t, s, "orders-0", offs[0], offs[56])
	for _, c := range []struct {
		tr *Tierer
		r  *replica
	}{{t1, b1}, {t2, b2}} {
		if local, _, _ := checkReplica(t, c.tr, c.r); local != 1 {
			t.Errorf("broker %s: %d segments local", c.r.id, local)
		}
	}
}

// TestAdoptRemote: an evicted file of one mount is taken over by another
// of the same store without its bytes; a description from another store,
// or of an object that changed, is refused.
func TestAdoptRemote(t *testing.T) {
	s := store.NewMem(nil)
	stream, offs, _ := fourRecordBatches(30, 0, 3000)
	b1 := newReplica(t, "1", stream, offs, 10)
	b1.grow(t, 30)
	t1 := shareTierer(t, b1, s, RoleLeader)
	t1.cfg.StoreID = "mem://one"
	mustPass(t, t1)
	src := b1.segPath(b1.bases[0])
	remoteCopyAt := func(path string) ([]byte, error) {
		rec, has, err := readRecord(path)
		if err != nil || !has {
			return nil, err
		}
		return t1.copies.remoteCopy(rec)
	}
	desc, err := remoteCopyAt(src)
	if err != nil || desc == nil {
		t.Fatalf("remote copy: %s %v", desc, err)
	}
	if d, _ := remoteCopyAt(b1.segPath(b1.bases[2])); d != nil {
		t.Fatal("the active segment has a remote copy")
	}
	b2 := newReplica(t, "2", stream, offs, 10)
	os.MkdirAll(filepath.Join(b2.root, "orders-0"), 0o755)
	t2 := shareTierer(t, b2, s, RoleLeader)
	rel := "orders-0/" + filepath.Base(src)
	t2.cfg.StoreID = "mem://two"
	if _, err := t2.AdoptRemote(context.Background(), rel, desc, 0o644); !errors.Is(err, ErrOtherStore) {
		t.Fatalf("another store's file: %v", err)
	}
	t2.cfg.StoreID = "mem://one"
	tmp, err := t2.AdoptRemote(context.Background(), rel, desc, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(b2.root, tmp), filepath.Join(b2.root, rel)); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, t2, filepath.Join(b2.root, rel))
	want := readAll(t, t1, src)
	if sha(got) != sha(want) {
		t.Fatal("the taken-over file does not read back")
	}
	if fi, _ := os.Stat(filepath.Join(b2.root, rel)); fi.Sys().(*syscall.Stat_t).Blocks > 16 {
		t.Fatalf("the taken-over file holds %d blocks", fi.Sys().(*syscall.Stat_t).Blocks)
	}
	rec, _, _ := readRecord(src)
	if refs := objects(t, s, rec.Key+".refs/"); len(refs) != 1 {
		t.Fatalf("references: %v", refs)
	}
	// A description whose object changed since is refused.
	var rc RemoteCopy
	json.Unmarshal(desc, &rc)
	rc.Extents[0].ETag = "stale"
	stale, _ := json.Marshal(rc)
	if _, err := t2.AdoptRemote(context.Background(), "orders-0/"+kafkaName(999, ".log"), stale, 0o644); err == nil {
		t.Fatal("a stale description was taken over")
	}
}

// TestShipResumesAfterIndexedCrash: tierfs died after a segment's
// entries went into the index but before its record was written. The
// next pass finds its own entries and finishes that shipment, even for
// a segment whose first batch follows its base offset (a cleaned one).
func TestShipResumesAfterIndexedCrash(t *testing.T) {
	s := store.NewMem(nil)
	stream, offs, _ := fourRecordBatches(20, 5, 2000) // the first batch is not at the segment's base
	r := newReplica(t, "1", stream, offs, 10)
	r.grow(t, 20)
	first := r.segPath(r.bases[0])
	renamed := filepath.Join(filepath.Dir(first), kafkaName(0, ".log"))
	if err := os.Rename(first, renamed); err != nil {
		t.Fatal(err)
	}
	r.bases[0] = 0
	tr := shareTierer(t, r, s, RoleLeader)
	tr.cfg.LocalRetentionBytes = 0
	if rep := mustPass(t, tr); rep.Shipped != 1 {
		t.Fatalf("first pass: %+v", rep)
	}
	rec, _, _ := readRecord(renamed)
	// The state of the crash: the shipment still shipping, no record.
	sh, err := tr.shipments.get("orders-0", rec.Key)
	if err != nil {
		t.Fatal(err)
	}
	sh.State = ShipmentShipping
	if err := tr.shipments.put(sh); err != nil {
		t.Fatal(err)
	}
	if err := unix.Removexattr(renamed, recordXattr); err != nil {
		t.Fatal(err)
	}
	// The mount starts again.
	tr.Close()
	tr = shareTierer(t, r, s, RoleLeader)
	tr.cfg.LocalRetentionBytes = 0
	rep := mustPass(t, tr)
	now, has, _ := readRecord(renamed)
	if rep.Shipped != 1 || !has || now.Key != rec.Key || len(now.Extents) != 0 {
		t.Fatalf("after the crash: %+v, record %+v (was %+v)", rep, now, rec)
	}
}

// TestHydrateAMappedSegment: a follower's evicted segment, held by two
// of the leader's objects, comes back local byte-exact and can be freed
// again without any upload.
func TestHydrateAMappedSegment(t *testing.T) {
	s := store.NewMem(nil)
	stream, offs, _ := fourRecordBatches(30, 0, 3000)
	b1 := newReplica(t, "1", stream, offs, 10)
	b2 := newReplica(t, "2", stream, offs, 7)
	b1.grow(t, 30)
	b2.grow(t, 30)
	t1 := shareTierer(t, b1, s, RoleLeader)
	t2 := shareTierer(t, b2, s, RoleFollower)
	mustPass(t, t1)
	mustPass(t, t2)
	p := b2.segPath(b2.bases[1]) // batches 7..13: two of the leader's objects
	rec, _, _ := readRecord(p)
	if rec.State != StateRemote || len(rec.Extents) != 2 {
		t.Fatalf("follower's segment: %+v", rec)
	}
	puts := logBytes(t, s)
	// Its local copies of the leader's manifests can go (with the last
	// other file that read from those objects, while this one was being
	// mapped): reads fetch them again.
	for _, e := range rec.Extents {
		if err := t2.manifests.remove(e.Key); err != nil {
			t.Fatal(err)
		}
	}
	if sha(readAll(t, t2, p)) != sha(b2.want(1)) {
		t.Fatal("without its manifest copies, the segment reads otherwise")
	}
	if err := t2.hydrator.Hydrate(context.Background(), p, nil); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	if sha(got) != sha(b2.want(1)) {
		t.Fatal("the hydrated segment differs")
	}
	if st, _, _ := t2.copies.stateOf(p); st != StateShipped {
		t.Fatalf("after hydrate: %s", st)
	}
	if err := t2.evictor.Evict(p); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := t2.copies.stateOf(p); st != StateRemote || logBytes(t, s) != puts {
		t.Fatalf("evicted again: %s, %d bytes of segments in the store (%d before)", st, logBytes(t, s), puts)
	}
	if sha(readAll(t, t2, p)) != sha(b2.want(1)) {
		t.Fatal("evicted again, it reads otherwise")
	}
}

// checkIndexOnce checks that the store's index of partition holds every
// offset in [from, to) in exactly one live entry, in order.
func checkIndexOnce(t *testing.T, s store.Store, partition string, from, to int64) {
	t.Helper()
	b, err := store.ReadAll(s.Get(context.Background(), partition+"/"+idx.FileName, 0, -1, store.GetOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	x, _, err := idx.ParseIndex("index", b)
	if err != nil {
		t.Fatal(err)
	}
	next := from
	for i := 0; i < x.Len(); i++ {
		e := x.Entry(i)
		if e.Deleted() {
			continue
		}
		if e.FirstOffset != next {
			t.Fatalf("index entry %d starts at offset %d, want %d (entries: %d)", i, e.FirstOffset, next, x.Len())
		}
		next = e.LastOffset + 1
	}
	if next < to {
		t.Fatalf("the index ends at offset %d, want %d", next, to)
	}
}

// A follower's partition settles once every rolled segment of it is
// mapped: an idle follower pass scans no partition, whatever the mount
// holds. A roll unsettles it; it is scanned at every pass while its new
// segment waits for the leader's upload, and settles again once mapped.
func TestFollowerSettles(t *testing.T) {
	s := store.NewMem(nil)
	var stream [][]byte
	var offs []int64
	ts := time.Now().Add(-2 * time.Hour).UnixMilli()
	var off int64
	for i := range 60 {
		recs := 3 + i%4
		stream = append(stream, kafkatest.Encode(kafkatest.Batch{Base: off, Records: recs, ValueSize: 2000, TS: ts + off, Epoch: 1}))
		offs = append(offs, off)
		off += int64(recs)
	}
	b1 := newReplica(t, "1", stream, offs, 10)
	b2 := newReplica(t, "2", stream, offs, 10)
	t1 := shareTierer(t, b1, s, RoleLeader)
	t2 := replicaTierer(t, b2, s, func(c *Config) { c.Role = RoleFollower; c.RescanInterval = time.Hour })
	scans := func() int64 { return t2.Counters().PartitionScans.Load() }
	b1.grow(t, 45)
	b2.grow(t, 45)
	if rep := mustPass(t, t1); rep.Shipped != 4 {
		t.Fatalf("leader: %+v", rep)
	}
	if rep := mustPass(t, t2); rep.Shipped != 4 {
		t.Fatalf("follower mapped %d segments, want 4", rep.Shipped)
	}
	mustPass(t, t2) // looks once more at what the mapping changed
	before := scans()
	for range 3 {
		mustPass(t, t2)
	}
	if n := scans() - before; n != 0 {
		t.Fatalf("idle follower passes scanned %d partitions, want none", n)
	}
	// Both roll at batch 50: the follower's new segment waits for the
	// leader, and its partition is looked at until it is mapped.
	b1.grow(t, 55)
	b2.grow(t, 55)
	before = scans()
	mustPass(t, t2)
	mustPass(t, t2)
	if n := scans() - before; n != 2 {
		t.Fatalf("follower passes while a segment waits scanned %d partitions, want 2", n)
	}
	if why := t2.LastErrors()["orders-0"].Kept; !strings.Contains(why, "not in the store yet") {
		t.Fatalf("follower's reason: %q", why)
	}
	if rep := mustPass(t, t1); rep.Shipped != 1 {
		t.Fatalf("leader: %+v", rep)
	}
	if rep := mustPass(t, t2); rep.Shipped != 1 {
		t.Fatalf("follower mapped %d segments, want 1", rep.Shipped)
	}
	mustPass(t, t2)
	before = scans()
	mustPass(t, t2)
	if n := scans() - before; n != 0 {
		t.Fatalf("an idle follower pass scanned %d partitions, want none", n)
	}
	if _, remote, _ := checkReplica(t, t2, b2); remote != 5 {
		t.Fatalf("follower: %d remote segments, want 5", remote)
	}
}

// TestFollowerMapsOntoAnOlderLayout: a store written before small files
// and batch lists went into manifests holds each segment's batch list as
// a .batches object and its small files as objects with version-1
// manifests. A follower of this version maps onto it as onto the new
// layout, and its files read back byte for byte.
func TestFollowerMapsOntoAnOlderLayout(t *testing.T) {
	ctx := context.Background()
	s := store.NewMem(nil)
	stream, offs, _ := fourRecordBatches(30, 0, 2000)
	b1 := newReplica(t, "1", stream, offs, 10)
	b2 := newReplica(t, "2", stream, offs, 10)
	t1 := shareTierer(t, b1, s, RoleLeader)
	t2 := shareTierer(t, b2, s, RoleFollower)
	b1.grow(t, 30)
	b2.grow(t, 30)
	if rep := mustPass(t, t1); rep.Shipped != 2 {
		t.Fatalf("leader: %+v", rep)
	}
	// Rewrite what the leader stored as the older version stored it.
	all, err := s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	rewritten := 0
	for _, o := range all {
		obj, ok := chunkxfer.ManifestOf(o.Key)
		if !ok {
			continue
		}
		raw, err := store.ReadAll(s.Get(ctx, o.Key, 0, -1, store.GetOptions{}))
		if err != nil {
			t.Fatal(err)
		}
		var m chunkxfer.Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		switch {
		case m.Attached != nil:
			if _, err := s.Put(ctx, batchesKey(obj), bytes.NewReader(m.Attached), int64(len(m.Attached))); err != nil {
				t.Fatal(err)
			}
			m.Attached = nil
		case m.Inline != nil:
			info, err := s.Put(ctx, obj, bytes.NewReader(m.Inline), int64(len(m.Inline)))
			if err != nil {
				t.Fatal(err)
			}
			m.Version, m.Inline, m.ETag = 1, nil, info.ETag
		default:
			continue
		}
		b, _ := json.Marshal(&m)
		if _, err := s.Put(ctx, o.Key, bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
		rewritten++
	}
	if rewritten == 0 {
		t.Fatal("nothing to rewrite: no manifest held a batch list or a small file")
	}
	mustPass(t, t2)
	if local, remote, _ := checkReplica(t, t2, b2); remote != 2 || local != 1 {
		t.Fatalf("follower on the older layout: %d remote, %d local segments (%q)", remote, local, t2.LastErrors()["orders-0"].Kept)
	}
}
