package tiering

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/internal/tiered"
)

func blocks(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestHydrate: an evicted segment comes back byte-exact with its inode,
// size and mtime; damaged or failing downloads leave it remote and
// readable; a hydration tierfs died in is undone by the next pass.
func TestHydrate(t *testing.T) {
	root, bases, sums := logDir(t)
	s := store.NewMem(nil)
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: s, Policy: Policy{ShipAfter: 1000 * time.Hour}, ChunkSize: 64 << 10, ShipRate: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	mustPass(t, tr)
	ctx := context.Background()
	rel := "orders-0/" + kafkaName(bases["orders-0"][1], ".log")
	p := filepath.Join(root, rel)
	before, _ := os.Stat(p)
	var ino uint64
	if st, err := tr.EvictNow(ctx, rel, nil); err != nil || st != StateRemote {
		t.Fatalf("evict: %s %v", st, err)
	}
	if blocks(t, p) > 8192 {
		t.Fatal("not freed")
	}
	ino = before.Sys().(*syscall.Stat_t).Ino

	// A damaged chunk, then a failing store: the file stays remote, its
	// bytes freed, and reads from the store are right.
	for _, f := range []store.Fault{{Op: store.OpGet, FlipAt: 100, Times: 100}, {Op: store.OpGet, Err: errors.New("injected outage"), Times: 100}} {
		s.Inject(f)
		if st, err := tr.HydrateNow(ctx, rel, nil); err == nil || st != StateRemote {
			t.Fatalf("hydrate with fault %+v: %s %v", f, st, err)
		}
		s.ClearFaults()
		if st, _, _ := tr.copies.stateOf(p); st != StateRemote {
			t.Fatalf("state after a failed hydrate: %s", st)
		}
		mustPass(t, tr) // undoes what the failed hydration wrote
		if blocks(t, p) > 8192 {
			t.Fatalf("a failed hydration left %d bytes allocated", blocks(t, p))
		}
		if sha(readAll(t, tr, p)) != sums[p] {
			t.Fatal("remote bytes wrong after a failed hydrate")
		}
	}

	// Its indexes were removed: the one the store has comes back, the
	// one it lacks is rebuilt.
	ixPath, tixPath := strings.TrimSuffix(p, ".log")+".index", strings.TrimSuffix(p, ".log")+".timeindex"
	os.Remove(ixPath)
	os.Remove(tixPath)
	rec0, _, _ := readRecord(p)
	// (A small segment's index files are held by its .log's manifest,
	// without keys of their own.)
	if m, err := chunkxfer.ReadManifest(ctx, s, rec0.Key); err != nil {
		t.Fatal(err)
	} else if _, ok := m.File(".index"); !ok {
		t.Fatalf("the .index is not held by the .log's manifest: %+v", m.Files)
	}
	editHeldFiles(t, s, rec0.Key, func(fs []chunkxfer.File) []chunkxfer.File {
		return slices.DeleteFunc(fs, func(f chunkxfer.File) bool { return f.Name == ".timeindex" })
	})
	gen := tr.Counters().HydratedSegments[tiered.CauseHydrate].Load()
	var done, total int64
	st, err := tr.HydrateNow(ctx, rel, func(d, tot int64) { done, total = d, tot })
	if err != nil || st != StateShipped {
		t.Fatalf("hydrate: %s %v", st, err)
	}
	if n := tr.Counters().HydratedSegments[tiered.CauseHydrate].Load(); done != total || total == 0 || n != gen+1 {
		t.Errorf("progress %d/%d, hydrations %d", done, total, n)
	}
	after, _ := os.Stat(p)
	b, _ := os.ReadFile(p)
	if sha(b) != sums[p] || after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) || after.Sys().(*syscall.Stat_t).Ino != ino {
		t.Fatalf("hydrated file: %d bytes, mtime %v (want %v), right bytes %v", after.Size(), after.ModTime(), before.ModTime(), sha(b) == sums[p])
	}
	if blocks(t, p) < before.Size() {
		t.Errorf("only %d bytes allocated", blocks(t, p))
	}
	if b, err := os.ReadFile(ixPath); err != nil || sha(b) != sums[ixPath] {
		t.Errorf("the .index was not restored from the store: %v", err)
	}
	if b, err := os.ReadFile(tixPath); err != nil || len(b) == 0 {
		t.Errorf("the .timeindex was not rebuilt: %v", err)
	} else if _, err := kafka.ParseTimeIndex(tixPath, bases["orders-0"][1], b); err != nil {
		t.Errorf("rebuilt .timeindex: %v", err)
	}
	// Its remote copy is still good: it is evicted again without an
	// upload, and hydrating a local file does nothing.
	puts := s.Calls(store.OpPut) + s.Calls(store.OpUploadPart)
	if st, err := tr.EvictNow(ctx, rel, nil); err != nil || st != StateRemote {
		t.Fatalf("evict again: %s %v", st, err)
	}
	if n := s.Calls(store.OpPut) + s.Calls(store.OpUploadPart); n != puts {
		t.Errorf("evicting a hydrated segment uploaded %d times", n-puts)
	}
	other := "orders-0/" + kafkaName(bases["orders-0"][0], ".log")
	if st, err := tr.HydrateNow(ctx, other, nil); err != nil || st == StateRemote {
		t.Errorf("hydrate of a local segment: %s %v", st, err)
	}

	// tierfs died during a hydration: the record is unfreed and some
	// bytes are in. The next pass frees them; the file is remote again.
	if _, err := tr.HydrateNow(ctx, rel, nil); err != nil {
		t.Fatal(err)
	}
	tr.EvictNow(ctx, rel, nil)
	rec, _, _ := readRecord(p)
	rec.Freed = false
	writeRecord(p, rec)
	f, _ := os.OpenFile(p, os.O_WRONLY, 0)
	f.WriteAt(make([]byte, 4096), 0)
	f.Close()
	rep := mustPass(t, tr)
	if rep.Recovered != 1 || blocks(t, p) > 8192 {
		t.Fatalf("recovered %d, %d bytes allocated", rep.Recovered, blocks(t, p))
	}
	if fi, _ := os.Stat(p); !fi.ModTime().Equal(before.ModTime()) {
		t.Errorf("mtime %v after recovery", fi.ModTime())
	}
	if sha(readAll(t, tr, p)) != sums[p] {
		t.Fatal("remote bytes wrong after recovery")
	}
}

// TestHydrateEmptyIndex: an empty index file is shipped as its manifest
// alone (no object), and a hydration brings it back empty, as shipped,
// not rebuilt from the segment.
func TestHydrateEmptyIndex(t *testing.T) {
	root, bases, _ := logDir(t)
	rel := "orders-0/" + kafkaName(bases["orders-0"][1], ".log")
	p := filepath.Join(root, rel)
	ixPath := strings.TrimSuffix(p, ".log") + ".index"
	if err := os.Truncate(ixPath, 0); err != nil {
		t.Fatal(err)
	}
	s := store.NewMem(nil)
	tr := byHandTierer(t, root, s)
	ctx := context.Background()
	if st, err := tr.EvictNow(ctx, rel, nil); err != nil || st != StateRemote {
		t.Fatalf("evict: %s %v", st, err)
	}
	rec, _, _ := readRecord(p)
	key := strings.TrimSuffix(rec.Key, ".log") + ".index"
	for _, k := range []string{key, chunkxfer.ManifestKey(key)} {
		if _, err := s.Head(ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("an empty index held by the .log's manifest was stored as %s: %v", k, err)
		}
	}
	if m, err := chunkxfer.ReadManifest(ctx, s, rec.Key); err != nil {
		t.Fatal(err)
	} else if b, ok := m.File(".index"); !ok || len(b) != 0 {
		t.Fatalf("the .log's manifest holds the .index: %v, %d bytes", ok, len(b))
	}
	os.Remove(ixPath)
	if st, err := tr.HydrateNow(ctx, rel, nil); err != nil || st != StateShipped {
		t.Fatalf("hydrate: %s %v", st, err)
	}
	if b, err := os.ReadFile(ixPath); err != nil || len(b) != 0 {
		t.Fatalf("the .index came back with %d bytes (%v), want the empty one shipped", len(b), err)
	}
}

// TestHydrateRestoresAnOlderLayout: a store written before a small
// segment's index files were held by its .log's manifest keeps them as
// objects or manifests of their own (an empty one as its manifest alone,
// a small one holding its bytes); a hydration restores them from there.
func TestHydrateRestoresAnOlderLayout(t *testing.T) {
	root, bases, sums := logDir(t)
	rel := "orders-0/" + kafkaName(bases["orders-0"][1], ".log")
	p := filepath.Join(root, rel)
	ixPath, tixPath := strings.TrimSuffix(p, ".log")+".index", strings.TrimSuffix(p, ".log")+".timeindex"
	s := store.NewMem(nil)
	tr := byHandTierer(t, root, s)
	ctx := context.Background()
	if err := os.Truncate(ixPath, 0); err != nil {
		t.Fatal(err)
	}
	if st, err := tr.EvictNow(ctx, rel, nil); err != nil || st != StateRemote {
		t.Fatalf("evict: %s %v", st, err)
	}
	rec, _, _ := readRecord(p)
	up := &chunkxfer.Uploader{Store: s, ChunkSize: 64 << 10, JournalDir: t.TempDir()}
	for _, kind := range []string{".index", ".timeindex"} {
		if _, err := up.UploadSmall(ctx, strings.TrimSuffix(p, ".log")+kind, strings.TrimSuffix(rec.Key, ".log")+kind, true); err != nil {
			t.Fatal(err)
		}
	}
	editHeldFiles(t, s, rec.Key, func([]chunkxfer.File) []chunkxfer.File { return nil })
	want := sums[tixPath]
	os.Remove(ixPath)
	os.Remove(tixPath)
	if st, err := tr.HydrateNow(ctx, rel, nil); err != nil || st != StateShipped {
		t.Fatalf("hydrate: %s %v", st, err)
	}
	if b, err := os.ReadFile(ixPath); err != nil || len(b) != 0 {
		t.Errorf("the .index came back with %d bytes (%v), want the empty one shipped", len(b), err)
	}
	if b, err := os.ReadFile(tixPath); err != nil || sha(b) != want {
		t.Errorf("the .timeindex was not restored from its manifest: %v", err)
	}
}

// editHeldFiles rewrites the store's manifest of key with the files
// edit makes of those it holds.
func editHeldFiles(t *testing.T, s store.Store, key string, edit func([]chunkxfer.File) []chunkxfer.File) {
	t.Helper()
	ctx := context.Background()
	m, err := chunkxfer.ReadManifest(ctx, s, key)
	if err != nil {
		t.Fatal(err)
	}
	m.Files = edit(m.Files)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, chunkxfer.ManifestKey(key), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
}

// byHandTierer is a tierer of root on s that ships only when told to.
func byHandTierer(t *testing.T, root string, s store.Store) *Tierer {
	t.Helper()
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: s, Policy: Policy{ShipAfter: 1000 * time.Hour}, ChunkSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}
