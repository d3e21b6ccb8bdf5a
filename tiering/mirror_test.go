package tiering

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
)

// TestMirror: a reader's root shows what a leader shipped, byte-exact
// through the store, follows new shipments and deletions, and writes
// nothing to the store.
func TestMirror(t *testing.T) {
	root, bases, sums := logDir(t)
	// An empty sidecar (Kafka makes empty .txnindex files) is stored as
	// its manifest alone, and mirrored as an empty file.
	txn := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".txnindex"))
	if err := os.WriteFile(txn, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := store.NewMem(nil)
	leader := newTierer(t, root, s, 1)
	mustPass(t, leader)
	readerRoot := filepath.Join(t.TempDir(), "reader")
	os.MkdirAll(readerRoot, 0o755)
	reader, err := New(Config{Root: readerRoot, StateDir: filepath.Join(t.TempDir(), "state"), Store: s, ChunkSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	writes := func() int {
		return s.Calls(store.OpPut) + s.Calls(store.OpUploadPart) + s.Calls(store.OpCreateMultipart) + s.Calls(store.OpDelete)
	}
	before := writes()
	ctx := context.Background()
	rep := reader.mirror.Mirror(ctx)
	if len(rep.Errors) > 0 {
		t.Fatal(rep.Errors)
	}
	// Every segment the leader shipped, with its sidecars.
	shipped := 0
	for _, p := range []string{"orders-0", "orders-1"} {
		for _, base := range bases[p] {
			seg := filepath.Join(root, p, kafkaName(base, ".log"))
			rec, has, _ := readRecord(seg)
			if !has {
				continue
			}
			shipped++
			mirrored := filepath.Join(readerRoot, p, kafkaName(base, ".log"))
			if st, _, err := reader.copies.stateOf(mirrored); err != nil || st != StateRemote {
				t.Fatalf("%s: state %s %v", mirrored, st, err)
			}
			if sha(readAll(t, reader, mirrored)) != sums[seg] {
				t.Fatalf("%s reads other bytes", mirrored)
			}
			if blocks(t, mirrored) > 8192 {
				t.Errorf("%s holds local bytes", mirrored)
			}
			if fi, err := os.Stat(mirrored); err != nil || fi.Size() != rec.Size {
				t.Errorf("%s: %v, size %d of %d", mirrored, err, fi.Size(), rec.Size)
			}
			mirroredIndexes(t, root, readerRoot, p, base, sums)
		}
		// Held by a manifest (a small file), read back byte for byte.
		mirroredEpochs(t, root, readerRoot, p)
	}
	if fi, err := os.Stat(filepath.Join(readerRoot, "orders-0", kafkaName(bases["orders-0"][0], ".txnindex"))); err != nil || fi.Size() != 0 {
		t.Errorf("the empty .txnindex was not mirrored: %v", err)
	}
	if shipped == 0 || rep.Segments != shipped {
		t.Fatalf("%d shipped, %d mirrored", shipped, rep.Segments)
	}
	if again := reader.mirror.Mirror(ctx); again.Added+again.Removed != 0 || len(again.Errors) > 0 {
		t.Fatalf("a second pass changed things: %+v", again)
	}
	// A reader pass never ships: its root's segments are all remote.
	if r := reader.RunOnce(ctx); r.Shipped != 0 || len(r.Errors) > 0 {
		t.Fatalf("a tiering pass on the reader: %+v", r)
	}
	if n := writes() - before; n != 0 {
		t.Fatalf("the reader wrote to the store %d times", n)
	}
	// The leader's segment 0 goes (retention): the reader follows.
	seg0 := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".log"))
	for _, ext := range []string{".log", ".index", ".timeindex"} {
		os.Remove(strings.TrimSuffix(seg0, ".log") + ext)
	}
	mustPass(t, leader)
	rep = reader.mirror.Mirror(ctx)
	if rep.Removed < 1 || len(rep.Errors) > 0 {
		t.Fatalf("after a deletion: %+v", rep)
	}
	for _, ext := range []string{".log", ".index", ".timeindex", ".txnindex"} {
		if _, err := os.Stat(filepath.Join(readerRoot, "orders-0", kafkaName(bases["orders-0"][0], ext))); !os.IsNotExist(err) {
			t.Errorf("deleted segment's %s still mirrored: %v", ext, err)
		}
	}
	if _, err := os.Stat(filepath.Join(readerRoot, "orders-0", "leader-epoch-checkpoint")); err != nil {
		t.Errorf("the partition's leader-epoch-checkpoint went with a segment: %v", err)
	}
	if again := reader.mirror.Mirror(ctx); again.Added+again.Removed != 0 || len(again.Errors) > 0 {
		t.Fatalf("a pass after the deletion changed things: %+v", again)
	}
}

// TestMirrorAnOlderLayout: a store written before a small segment's
// files were held by its .log's manifest, where each is an object or a
// manifest of its own, is mirrored as before.
func TestMirrorAnOlderLayout(t *testing.T) {
	root, bases, sums := logDir(t)
	s := store.NewMem(nil)
	leader := newTierer(t, root, s, 1)
	mustPass(t, leader)
	ctx := context.Background()
	up := &chunkxfer.Uploader{Store: s, ChunkSize: 64 << 10, JournalDir: t.TempDir(), InlineMax: -1}
	for _, p := range []string{"orders-0", "orders-1"} {
		for i, base := range bases[p] {
			seg := filepath.Join(root, p, kafkaName(base, ".log"))
			rec, has, _ := readRecord(seg)
			if !has {
				continue
			}
			m, err := chunkxfer.ReadManifest(ctx, s, rec.Key)
			if err != nil || len(m.Files) == 0 {
				t.Fatalf("%s: %v, holds %d files", rec.Key, err, len(m.Files))
			}
			// Objects of their own (InlineMax -1: none held by its manifest).
			for _, f := range m.Files {
				src := strings.TrimSuffix(seg, ".log") + f.Name
				if f.Name == ".leader-epoch-checkpoint" {
					src = filepath.Join(root, p, "leader-epoch-checkpoint")
				}
				if _, err := up.UploadSmall(ctx, src, strings.TrimSuffix(rec.Key, ".log")+f.Name, true); err != nil {
					t.Fatal(err)
				}
			}
			if i == 0 {
				editHeldFiles(t, s, rec.Key, func([]chunkxfer.File) []chunkxfer.File { return nil })
			}
		}
	}
	readerRoot := filepath.Join(t.TempDir(), "reader")
	reader, err := New(Config{Root: readerRoot, StateDir: filepath.Join(t.TempDir(), "state"), Store: s, ChunkSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if rep := reader.mirror.Mirror(ctx); len(rep.Errors) > 0 || rep.Segments == 0 {
		t.Fatalf("%+v", rep)
	}
	for _, p := range []string{"orders-0", "orders-1"} {
		for _, base := range bases[p] {
			if _, has, _ := readRecord(filepath.Join(root, p, kafkaName(base, ".log"))); !has {
				continue
			}
			mirroredIndexes(t, root, readerRoot, p, base, sums)
		}
		mirroredEpochs(t, root, readerRoot, p)
	}
	if again := reader.mirror.Mirror(ctx); again.Added+again.Removed != 0 || len(again.Errors) > 0 {
		t.Fatalf("a second pass changed things: %+v", again)
	}
}

// mirroredIndexes checks that the reader's root holds the index files
// of partition p's segment base as the leader's root does.
func mirroredIndexes(t *testing.T, root, readerRoot, p string, base int64, sums map[string][32]byte) {
	t.Helper()
	for _, ext := range []string{".index", ".timeindex"} {
		b, err := os.ReadFile(filepath.Join(readerRoot, p, kafkaName(base, ext)))
		if err != nil || sha(b) != sums[filepath.Join(root, p, kafkaName(base, ext))] {
			t.Errorf("%s: %v, or other bytes", kafkaName(base, ext), err)
		}
	}
}

// mirroredEpochs checks that the reader's root holds partition p's
// leader-epoch-checkpoint as the leader's root does.
func mirroredEpochs(t *testing.T, root, readerRoot, p string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(readerRoot, p, "leader-epoch-checkpoint"))
	want, _ := os.ReadFile(filepath.Join(root, p, "leader-epoch-checkpoint"))
	if err != nil || len(want) == 0 || !bytes.Equal(got, want) {
		t.Errorf("%s: leader-epoch-checkpoint %q, %v; want %q", p, got, err, want)
	}
}
