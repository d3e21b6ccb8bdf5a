package tiering

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

func logDir(t *testing.T) (string, map[string][]int64, map[string][32]byte) {
	root := filepath.Join(t.TempDir(), "kafka-logs")
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 2, Segments: 4, Batches: 12, Records: 8, ValueSize: 900, Unflushed: 1, Age: time.Hour}.Write(root)
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string][32]byte{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			sums[p] = sha256.Sum256(b)
		}
		return nil
	})
	return root, bases, sums
}

func newTierer(t *testing.T, root string, s store.Store, retention int64) *Tierer {
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: s, Policy: Policy{ShipAfter: 10 * time.Minute}, LocalRetentionBytes: retention, ChunkSize: 64 << 10, BlockSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func TestShipAndEvict(t *testing.T) {
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
		t.Run(name, func(t *testing.T) {
			root, bases, sums := logDir(t)
			s := mk(t)
			tr := newTierer(t, root, s, 1) // keep (almost) nothing local
			rep := tr.RunOnce(context.Background())
			if len(rep.Errors) > 0 {
				t.Fatal(rep.Errors)
			}
			// Two rolled, flushed segments per partition ship; the
			// last rolled one is not flushed and the active one stays.
			if rep.Shipped != 4 || rep.Evicted != 4 || rep.Waiting["an earlier segment waits"] != 2 || rep.Waiting["not flushed"] != 2 {
				t.Fatalf("report %+v", rep)
			}
			for part, bs := range bases {
				for i, base := range bs {
					path := filepath.Join(root, part, kafkaName(base, ".log"))
					st, _, err := tr.copies.stateOf(path)
					if err != nil {
						t.Fatal(err)
					}
					want := StateLocal
					if i < 2 {
						want = StateRemote
					}
					if st != want {
						t.Errorf("%s: state %s, want %s", path, st, want)
					}
					var sb syscall.Stat_t
					syscall.Stat(path, &sb)
					// What stays allocated is at most the partial last block
					// and an xattr block.
					if want == StateRemote && sb.Blocks*512 > 8192 {
						t.Errorf("%s: %d blocks still allocated", path, sb.Blocks)
					}
					// Index files always stay local.
					if b, _ := os.ReadFile(filepath.Join(root, part, kafkaName(base, ".index"))); sha256.Sum256(b) != sums[filepath.Join(root, part, kafkaName(base, ".index"))] {
						t.Errorf("%s .index changed", path)
					}
				}
			}
			// Evicted files keep size and mtime, and read back exactly
			// through the store.
			for path, sum := range sums {
				if !strings.HasSuffix(path, ".log") {
					continue
				}
				st, _, _ := tr.copies.stateOf(path)
				if st != StateRemote {
					continue
				}
				r := openStoreCopy(t, tr, path)
				fi, _ := os.Stat(path)
				buf := make([]byte, fi.Size())
				n, err := r.ReadAt(buf, 0)
				r.Close()
				if int64(n) != fi.Size() || sha256.Sum256(buf) != sum {
					t.Fatalf("%s: remote read %d bytes, %v", path, n, err)
				}
				if time.Since(fi.ModTime()) < 50*time.Minute {
					t.Fatalf("%s: mtime not kept: %v", path, fi.ModTime())
				}
			}
			// The partition's index covers the shipped segments and was shipped too.
			f, err := idx.OpenFile(filepath.Join(root, ".tierfs", "idx", "orders-0", idx.FileName))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b0 := bases["orders-0"]
			if e, _, ok := f.LookupOffset(b0[1] + 3); !ok || e.FirstOffset > b0[1]+3 || !strings.Contains(string(e.RDI), kafkaName(b0[1], "")[:20]) {
				t.Fatalf("index lookup: %+v %v", e, ok)
			}
			if _, err := s.Head(context.Background(), "orders-0/"+idx.FileName); err != nil {
				t.Fatalf("index file not shipped: %v", err)
			}
			// The remote indexes are in the store only: nothing here
			// reads a local copy.
			if ri, _ := filepath.Glob(filepath.Join(root, ".tierfs", "idx", "orders-0", "*.r*index")); len(ri) > 0 {
				t.Fatalf("local remote indexes written: %v", ri)
			}
			// A segment of one index entry has no remote indexes
			// (TestRemoteIndexesOfManyEntries has some).
			stem := strings.TrimSuffix(recordKey(t, filepath.Join(root, "orders-0", kafkaName(b0[0], ".log"))), ".log")
			for _, kind := range []string{".rindex", ".rtimeindex"} {
				if _, err := s.Head(context.Background(), stem+kind); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("%s of a segment of one index entry: %v", kind, err)
				}
			}
			// A second pass has nothing to do.
			if rep := tr.RunOnce(context.Background()); rep.Shipped+rep.Evicted+rep.Recovered != 0 || len(rep.Errors) > 0 {
				t.Fatalf("second pass: %+v", rep)
			}
		})
	}
}

// TestEvictFinishesAfterCrash: a file marked remote whose bytes were not
// yet freed (a crash between the two steps) is finished on the next pass.
func TestEvictFinishesAfterCrash(t *testing.T) {
	root, bases, sums := logDir(t)
	tr := newTierer(t, root, store.NewMem(nil), 0) // ship, do not evict
	if rep := tr.RunOnce(context.Background()); rep.Shipped != 4 || rep.Evicted != 0 {
		t.Fatalf("report %+v", rep)
	}
	path := filepath.Join(root, "orders-1", kafkaName(bases["orders-1"][0], ".log"))
	rec, _, _ := readRecord(path)
	rec.State = StateRemote
	if err := writeRecord(path, rec); err != nil {
		t.Fatal(err)
	}
	rep := tr.RunOnce(context.Background())
	if rep.Recovered != 1 {
		t.Fatalf("report %+v", rep)
	}
	var sb syscall.Stat_t
	syscall.Stat(path, &sb)
	fi, _ := os.Stat(path)
	if sb.Blocks*512 > 8192 || fi.ModTime().UnixNano() != rec.MtimeNs {
		t.Fatalf("not finished: %d blocks, mtime %v", sb.Blocks, fi.ModTime())
	}
	r := openStoreCopy(t, tr, path)
	buf := make([]byte, fi.Size())
	r.ReadAt(buf, 0)
	if sha256.Sum256(buf) != sums[path] {
		t.Fatal("remote bytes differ")
	}
}

// TestChangedSegmentIsNotFreed: a shipped file written to afterwards is
// not freed; its stale record is dropped and it ships again.
func TestChangedSegmentIsNotFreed(t *testing.T) {
	root, bases, _ := logDir(t)
	tr := newTierer(t, root, store.NewMem(nil), 0)
	tr.RunOnce(context.Background())
	path := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".log"))
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte("more"))
	f.Close()
	old := time.Now().Add(-time.Hour)
	os.Chtimes(path, old, old)
	if err := tr.evictor.Evict(path); err == nil {
		t.Fatal("evicted a changed file")
	}
	if st, _, _ := tr.copies.stateOf(path); st != StateLocal {
		t.Fatalf("state %s after a refused evict", st)
	}
	data, _ := os.ReadFile(path)
	if !bytes.HasSuffix(data, []byte("more")) {
		t.Fatal("local bytes lost")
	}
}

func TestEligibility(t *testing.T) {
	root, _, _ := logDir(t)
	parts, err := Scan(root)
	if err != nil || len(parts) != 2 {
		t.Fatalf("scan: %v %v", parts, err)
	}
	os.MkdirAll(filepath.Join(root, "orders-0.0123456789abcdef0123456789abcdef-delete"), 0o755)
	os.MkdirAll(filepath.Join(root, "__cluster_metadata-0"), 0o755)
	if parts, _ := Scan(root); len(parts) != 2 {
		t.Fatalf("scan picked up %d dirs", len(parts))
	}
	cp, err := ReadCheckpoints(root)
	if err != nil {
		t.Fatal(err)
	}
	p := Policy{ShipAfter: 10 * time.Minute}
	segs := parts[0].Segments
	now := time.Now()
	for i, want := range []string{"", "", "not flushed", "active segment"} {
		ok, why := p.Eligible(segs[i], cp, now)
		if ok != (want == "") || !strings.HasPrefix(why, want) {
			t.Errorf("segment %d: %v %q, want %q", i, ok, why, want)
		}
	}
	if ok, why := p.Eligible(segs[0], cp, segs[0].Mtime.Add(time.Minute)); ok || !strings.HasPrefix(why, "younger") {
		t.Errorf("young segment: %v %q", ok, why)
	}
	delete(cp.HighWatermark, segs[0].TP)
	if ok, why := p.Eligible(segs[0], cp, now); ok || !strings.HasPrefix(why, "above the high watermark") {
		t.Errorf("no high watermark: %v %q", ok, why)
	}
	cp, _ = ReadCheckpoints(root)
	idxPath := sidecar(segs[0], ".index")
	data, _ := os.ReadFile(idxPath)
	os.WriteFile(idxPath, append(data, make([]byte, 80)...), 0o644)
	if ok, why := p.Eligible(segs[0], cp, now); ok || !strings.Contains(why, "not trimmed") {
		t.Errorf("untrimmed index: %v %q", ok, why)
	}
	if !(&Tierer{}).Tiered("orders-0/00000000000000000000.log") || (&Tierer{}).Tiered("orders-0/00000000000000000000.index") ||
		(&Tierer{}).Tiered("__cluster_metadata-0/00000000000000000000.log") || (&Tierer{}).Tiered("00000000000000000000.log") {
		t.Error("Tiered")
	}
	_ = math.MaxInt64
}

func kafkaName(base int64, ext string) string {
	return strings.TrimSuffix(filepath.Base(sidecar(Segment{Dir: "/x", path: "/x/y", Base: base}, ".log")), ".log") + ext
}

// TestEvictChecksTheCopyIsStillThere: a shipped segment whose object
// vanished from the store is not freed; it ships again.
func TestEvictChecksTheCopyIsStillThere(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 0)
	tr.RunOnce(context.Background())
	path := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".log"))
	rec, _, _ := readRecord(path)
	if err := s.Delete(context.Background(), rec.Key); err != nil {
		t.Fatal(err)
	}
	if err := tr.evictor.Evict(path); err == nil {
		t.Fatal("evicted with the remote copy gone")
	}
	if st, _, _ := tr.copies.stateOf(path); st != StateLocal {
		t.Fatalf("state %s", st)
	}
	if rep := tr.RunOnce(context.Background()); rep.Shipped != 1 {
		t.Fatalf("not shipped again: %+v", rep)
	}
}

// TestHeldFileIsNotFreed: a file held by a direct reader (a handle the
// file system serves by passthrough) keeps its bytes until the hold ends;
// the retention pass says why in the partition's last error.
func TestHeldFileIsNotFreed(t *testing.T) {
	root, bases, sums := logDir(t)
	tr := newTierer(t, root, store.NewMem(nil), 0)
	tr.RunOnce(context.Background())
	path := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".log"))
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	release := tr.Hold(st.Ino)
	if err := tr.evictor.Evict(path); !errors.Is(err, ErrHeldOpen) {
		t.Fatalf("evict of a held file: %v", err)
	}
	if s, _, _ := tr.copies.stateOf(path); s != StateShipped {
		t.Fatalf("state %s after a refused evict", s)
	}
	if b, _ := os.ReadFile(path); sha256.Sum256(b) != sums[path] {
		t.Fatal("local bytes changed")
	}
	// Under retention the refusal is the partition's last error.
	tr.cfg.LocalRetentionBytes = 1
	tr.RunOnce(context.Background())
	if e := tr.LastErrors()["orders-0"]; !strings.Contains(e.Err, "reads it directly") {
		t.Fatalf("last error %+v", e)
	}
	release()
	release() // a second call is harmless
	if err := tr.evictor.Evict(path); err != nil {
		t.Fatal(err)
	}
	if s, _, _ := tr.copies.stateOf(path); s != StateRemote {
		t.Fatalf("state %s after the hold ended", s)
	}
}

// TestHoldWaitsForEviction: a hold taken while an eviction holds the gate
// waits for it, so the holder then sees the file remote.
func TestHoldWaitsForEviction(t *testing.T) {
	g := NewGate()
	unlock := g.Lock(7)
	held := make(chan struct{})
	go func() {
		release := g.Hold(7)
		close(held)
		release()
	}()
	select {
	case <-held:
		t.Fatal("hold taken during an exclusive lock")
	case <-time.After(50 * time.Millisecond):
	}
	if g.Held(7) {
		t.Fatal("held during an exclusive lock")
	}
	unlock()
	<-held
	if g.Held(7) || len(g.locks) != 0 {
		t.Fatalf("after release: held %v, %d locks left", g.Held(7), len(g.locks))
	}
}

// recordKey is the object key of a shipped or evicted file's record.
func recordKey(t *testing.T, path string) string {
	t.Helper()
	rec, has, err := readRecord(path)
	if err != nil || !has {
		t.Fatalf("%s: no record (%v)", path, err)
	}
	return rec.Key
}

// tinySegments writes a log dir of topic "s": partitions of segments
// one-batch segments each (the last one active), and a tierer over s
// that ships them in its next pass.
func tinySegments(t *testing.T, s store.Store, partitions, segments int) (root string, tr *Tierer) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "kafka-logs")
	if _, err := (kafkatest.LogDir{Topic: "s", Partitions: partitions, Segments: segments, Batches: 1, Records: 8, ValueSize: 450, Age: time.Hour}).Write(root); err != nil {
		t.Fatal(err)
	}
	tr = newTierer(t, root, s, 1<<40)
	tr.cfg.Policy.ShipAfter = 0
	return root, tr
}

// What shipping a small segment asks of the store, per segment: its
// objects are put once each, and the only read is the check of the
// uploaded copy (a shipment catalogued just now has nothing in the store
// to look for first).
func TestShipRequestsPerSegment(t *testing.T) {
	s := store.NewMem(nil)
	_, tr := tinySegments(t, s, 1, 11)
	rep := tr.RunOnce(context.Background())
	if len(rep.Errors) > 0 || rep.Shipped != 10 {
		t.Fatalf("pass: %+v", rep)
	}
	ships, _ := tr.shipments.all()
	puts, gets, heads := s.Calls(store.OpPut), s.Calls(store.OpGet), s.Calls(store.OpHead)
	others := s.Calls(store.OpCreateMultipart) + s.Calls(store.OpList)
	// A shipment lists what its segment put in the store: its object
	// with its manifest, which holds the segment's batch list, index
	// files and leader-epoch-checkpoint (those have no keys of their own),
	// and its .batches name.
	listed := map[string]bool{}
	objects, attached, held := 0, 0, 0
	for _, sh := range ships {
		for _, k := range ownObjects(sh) {
			listed[k] = true
			objects++
			if log, ok := strings.CutSuffix(k, ".batches"); ok {
				if m, err := chunkxfer.LoadManifest(context.Background(), s, log+".log"); err == nil && m.Attached != nil {
					if _, err := idx.ParseBatches(k, m.Attached); err != nil {
						t.Errorf("%s: %v", k, err)
					}
					attached++
				}
				continue
			}
			if obj, ok := chunkxfer.ManifestOf(k); ok {
				m, err := chunkxfer.LoadManifest(context.Background(), s, obj)
				if err != nil {
					t.Errorf("%s: %v", k, err)
					continue
				}
				if !strings.HasSuffix(obj, ".log") {
					t.Errorf("%s: a manifest of its own for a small segment's %s", k, filepath.Ext(obj))
					continue
				}
				for _, kind := range []string{".index", ".timeindex", ".leader-epoch-checkpoint"} {
					if _, ok := m.File(kind); !ok {
						t.Errorf("%s holds no %s: %v", k, kind, m.Files)
					}
				}
				held += len(m.Files)
				continue
			}
			if _, err := s.Head(context.Background(), k); err != nil {
				t.Errorf("listed object %s: %v", k, err)
			}
		}
	}
	stored, err := s.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range stored {
		if !listed[o.Key] && !strings.HasSuffix(o.Key, idx.FileName) {
			t.Errorf("%s is in the store but in no shipment", o.Key)
		}
	}
	if attached != rep.Shipped {
		t.Errorf("%d batch lists held by their object's manifest, want one a segment", attached)
	}
	if held < 3*rep.Shipped {
		t.Errorf("%d files held by the manifests of %d segments", held, rep.Shipped)
	}
	// Each segment's object and its manifest, and the partition's index
	// once for the pass's segments (a commit of them all).
	if objects != 3*rep.Shipped || puts != 2*rep.Shipped+1 {
		t.Errorf("%d puts for %d objects listed (%d files held by manifests, %d batch lists in manifests) of %d segments", puts, objects, held, attached, rep.Shipped)
	}
	if gets != rep.Shipped {
		t.Errorf("%d gets for %d segments, want one each (the check of the copy)", gets, rep.Shipped)
	}
	if others != 0 {
		t.Errorf("%d multipart or list requests", others)
	}
	if heads > 1 {
		t.Errorf("%d heads, want at most one (the partition's index, once a pass)", heads)
	}
}

// TestShipBatchCommit: a pass commits the segments it uploaded in one
// put of the partition's index. When that put loses a race, each
// segment is decided again and appended on its own; when it fails, none
// is marked shipped, and the next pass commits them without uploading
// anything again. Either way the store's index holds each offset once.
func TestShipBatchCommit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		passes int // until all are shipped
	}{
		{"race", store.ErrPrecondition, 1},
		{"failure", errors.New("injected"), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := store.NewMem(nil)
			root, tr := tinySegments(t, s, 1, 11)
			s.Inject(store.Fault{Op: store.OpPut, KeyPrefix: "s-0/" + idx.FileName, Times: 1, Err: tc.err})
			rep := tr.RunOnce(context.Background())
			if tc.passes == 1 {
				if len(rep.Errors) > 0 || rep.Shipped != 10 {
					t.Fatalf("pass: %+v", rep)
				}
				if n := tr.Counters().IndexRaces.Load(); n != 1 {
					t.Errorf("%d races counted, want 1", n)
				}
			} else {
				if len(rep.Errors) == 0 || rep.Shipped != 0 {
					t.Fatalf("a failed commit: %+v", rep)
				}
				for _, seg := range scanSegments(t, root) {
					if r, ok, _ := readRecord(seg); ok && r.State == StateShipped {
						t.Fatalf("%s is marked shipped though the index was not put", seg)
					}
				}
				logPuts := s.Calls(store.OpPut)
				rep = tr.RunOnce(context.Background())
				if len(rep.Errors) > 0 || rep.Shipped != 10 {
					t.Fatalf("the next pass: %+v", rep)
				}
				// The index alone (each small segment's batch list is in
				// its manifest, found with it; a segment of one index
				// entry has no remote indexes): no file's bytes again.
				if puts := s.Calls(store.OpPut) - logPuts; puts != 1 {
					t.Errorf("the next pass made %d puts, want 1 (no file uploaded again)", puts)
				}
			}
			segs := scanSegments(t, root)
			for _, seg := range segs[:len(segs)-1] {
				if r, ok, err := readRecord(seg); !ok || err != nil || r.State != StateShipped {
					t.Fatalf("%s: %+v %v %v", seg, r, ok, err)
				}
			}
			last, _ := kafka.ParseSegmentName(filepath.Base(segs[len(segs)-1]))
			checkIndexOnce(t, s, "s-0", 0, last.BaseOffset)
		})
	}
}

// The segments one pass commits together keep their local state in one
// append of each log: the partition's manifest copies in one line, their
// shipments in one line that catalogued them all before their uploads
// and one that marked them shipped, and a tierer that starts again reads
// them all.
func TestShipBatchLocalState(t *testing.T) {
	s := store.NewMem(nil)
	root, tr := tinySegments(t, s, 1, 11)
	if rep := tr.RunOnce(context.Background()); len(rep.Errors) > 0 || rep.Shipped != 10 {
		t.Fatalf("pass: %+v", rep)
	}
	lines := func(p string) int {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), "\n")
	}
	state := filepath.Join(root, ".tierfs")
	if n := lines(filepath.Join(state, "shipments", "s-0.klog")); n != 2 {
		t.Errorf("shipment log of 10 segments has %d lines, want 2", n)
	}
	if n := lines(filepath.Join(state, "manifests", "s-0.klog")); n != 1 {
		t.Errorf("manifest log of 10 segments has %d lines, want 1", n)
	}
	tr.Close()
	again := newTierer(t, root, s, 1<<40)
	shs, err := again.shipments.of("s-0")
	if err != nil || len(shs) != 10 {
		t.Fatalf("%d shipments read again, %v", len(shs), err)
	}
	for _, sh := range shs {
		if sh.State != ShipmentShipped {
			t.Errorf("%s: %v", sh.Key, sh.State)
		}
		if _, err := again.manifests.get(sh.Key); err != nil {
			t.Errorf("manifest copy of %s: %v", sh.Key, err)
		}
	}
}

// On the dir store a segment's objects are put without a directory sync
// each: the partition's index put makes their names durable, so nothing
// is left unsynced once a pass has shipped.
func TestShipDirStoreSyncsAtTheIndex(t *testing.T) {
	d, err := store.NewDir(filepath.Join(t.TempDir(), "remote"))
	if err != nil {
		t.Fatal(err)
	}
	_, tr := tinySegments(t, d, 2, 4)
	if rep := tr.RunOnce(context.Background()); len(rep.Errors) > 0 || rep.Shipped != 6 {
		t.Fatalf("pass: %+v", rep)
	}
	if u := d.Unsynced(); len(u) != 0 {
		t.Fatalf("directories left unsynced after the pass: %v", u)
	}
}

// scanSegments are the .log files under root, in offset order.
func scanSegments(t *testing.T, root string) []string {
	t.Helper()
	ps, err := filepath.Glob(filepath.Join(root, "*", "*.log"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(ps)
	return ps
}

// A pass catalogs the shipments of the segments it plans in one line,
// then uploads them. When one upload fails, those before it are
// committed, and the rest, catalogued and perhaps partly uploaded, ship
// at the next pass: the store's index holds each offset once, and every
// object in the store is named by a shipment.
func TestShipResumesCataloguedShipments(t *testing.T) {
	s := store.NewMem(nil)
	root, tr := tinySegments(t, s, 1, 11)
	// The fourth segment (base offset 24: 8 records a segment).
	s.Inject(store.Fault{Op: store.OpPut, KeyPrefix: "s-0/00000000000000000024-", Err: errors.New("injected")})
	rep := tr.RunOnce(context.Background())
	s.ClearFaults()
	if len(rep.Errors) != 1 || rep.Shipped != 3 {
		t.Fatalf("pass with a failed upload: %+v", rep)
	}
	shs, err := tr.shipments.of("s-0")
	if err != nil || len(shs) != 10 {
		t.Fatalf("%d shipments catalogued, want 10 (all the pass planned): %v", len(shs), err)
	}
	rep = tr.RunOnce(context.Background())
	if len(rep.Errors) > 0 || rep.Shipped != 7 {
		t.Fatalf("the next pass: %+v", rep)
	}
	segs := scanSegments(t, root)
	for _, seg := range segs[:len(segs)-1] {
		if r, ok, err := readRecord(seg); !ok || err != nil || r.State != StateShipped {
			t.Fatalf("%s: %+v %v %v", seg, r, ok, err)
		}
	}
	checkIndexOnce(t, s, "s-0", 0, 80)
	shs, err = tr.shipments.of("s-0")
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, sh := range shs {
		if sh.State != ShipmentShipped {
			t.Errorf("shipment %s is %s", sh.Key, sh.State)
		}
		for _, k := range ownObjects(sh) {
			named[k] = true
		}
	}
	objs, err := s.List(context.Background(), "s-0/")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if !named[o.Key] && o.Key != "s-0/"+idx.FileName {
			t.Errorf("%s is in the store, and no shipment names it", o.Key)
		}
	}
}
