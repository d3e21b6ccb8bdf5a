package store

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// Puts through a deferred view sync no directory; the next conditional
// put (of any view) syncs each of their directories once, before its own
// object is in place, and then its own directory.
func TestDirDeferredSyncsAtTheNextConditionalPut(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "remote")
	d, err := NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var synced []string
	d.syncDir = func(dir string) error {
		mu.Lock()
		// What the index's directory holds when it is synced tells
		// whether the index was in place before the objects' names
		// were durable.
		_, err := os.Stat(filepath.Join(root, "p-0", "index"))
		rel, _ := filepath.Rel(root, dir)
		if err == nil && rel != "p-0" {
			rel += " (after the index)"
		}
		synced = append(synced, rel)
		mu.Unlock()
		return syncPath(dir)
	}
	put := func(s Store, key string) {
		t.Helper()
		if _, err := s.Put(ctx, key, bytes.NewReader([]byte(key)), int64(len(key))); err != nil {
			t.Fatal(err)
		}
	}
	v := d.Deferred()
	put(v, "p-0/a.log")
	put(v, "p-0/a.log.manifest")
	put(v, "p-1/b.log")
	put(v, "p-1/b.log") // again: a rename over the first
	if len(synced) != 0 {
		t.Fatalf("deferred puts synced %v", synced)
	}
	if got := d.Unsynced(); !slices.Equal(got, []string{filepath.Join(root, "p-0"), filepath.Join(root, "p-1")}) {
		t.Fatalf("unsynced %v", got)
	}
	if b, err := ReadAll(d.Get(ctx, "p-0/a.log", 0, -1, GetOptions{})); err != nil || string(b) != "p-0/a.log" {
		t.Fatalf("read through the other view: %q %v", b, err)
	}
	put(d, "p-2/c.log") // not deferred
	if !slices.Equal(synced, []string{"p-2"}) {
		t.Fatalf("a plain put synced %v", synced)
	}
	synced = nil
	if _, err := v.PutIf(ctx, "p-0/index", bytes.NewReader([]byte("i")), 1, PutCond{IfNoneMatch: true}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(synced[:2])
	if !slices.Equal(synced, []string{"p-0", "p-1", "p-0"}) {
		t.Fatalf("the conditional put synced %v, want p-0 and p-1 before its own p-0", synced)
	}
	if got := d.Unsynced(); len(got) != 0 {
		t.Fatalf("unsynced after the conditional put: %v", got)
	}
	// A directory removed before the flush is skipped.
	put(v, "p-3/d.log")
	if err := os.RemoveAll(filepath.Join(root, "p-3")); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(ctx); err != nil || len(d.Unsynced()) != 0 {
		t.Fatalf("flush of a removed directory: %v, %v", err, d.Unsynced())
	}
}
