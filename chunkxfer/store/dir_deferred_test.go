package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
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
	put := func(s Store, key string) { t.Helper(); putKey(t, s, key) }
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

// A deferred put of a new object leaves its bytes to the next Flush,
// which syncs them before any directory; a Flush that fails keeps them
// for the next. A Flush does not return before the Flushes that took
// puts before it are done, and it does not wait for them to start its
// own syncs.
func TestDirDeferredSyncsFilesAtFlush(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "remote")
	d, err := NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var log []string
	var failFiles error
	block := make(chan struct{})
	blocking := make(chan struct{}, 1)
	d.syncFiles = func(paths []string) error {
		if slices.Contains(paths, filepath.Join(root, "p-9", "slow")) {
			blocking <- struct{}{}
			<-block
		}
		mu.Lock()
		defer mu.Unlock()
		if failFiles != nil {
			return failFiles
		}
		for _, p := range paths {
			rel, _ := filepath.Rel(root, p)
			log = append(log, "file "+rel)
		}
		return syncAll(paths)
	}
	d.syncDir = func(dir string) error {
		mu.Lock()
		defer mu.Unlock()
		rel, _ := filepath.Rel(root, dir)
		log = append(log, "dir "+rel)
		return syncPath(dir)
	}
	put := func(s Store, key string) { t.Helper(); putKey(t, s, key) }
	v := d.Deferred()
	put(v, "p-0/a")
	put(v, "p-0/b")
	put(v, "p-0/b") // a rename over the first: synced by the put itself
	if len(log) != 0 {
		t.Fatalf("deferred puts synced %v", log)
	}
	failFiles = errors.New("injected EIO")
	if err := d.Flush(ctx); !errors.Is(err, failFiles) {
		t.Fatalf("flush: %v", err)
	}
	if got := d.Unsynced(); !slices.Equal(got, []string{filepath.Join(root, "p-0")}) {
		t.Fatalf("unsynced after a failed flush: %v", got)
	}
	failFiles = nil
	if err := d.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	slices.Sort(log[:2])
	if !slices.Equal(log, []string{"file p-0/a", "file p-0/b", "dir p-0"}) {
		t.Fatalf("flush synced %v, want both files, then their directory", log)
	}

	// One Flush is slow; a second, with puts of its own, syncs them
	// meanwhile, and returns only after the first.
	log = nil
	put(v, "p-9/slow")
	first := make(chan error)
	go func() { first <- d.Flush(ctx) }()
	<-blocking
	put(v, "p-1/c")
	second := make(chan error)
	go func() { second <- d.Flush(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(log)
		mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second flush waited for the first to sync its own puts")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-second:
		t.Fatalf("the second flush returned (%v) before the first was done", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(block)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if got := d.Unsynced(); len(got) != 0 {
		t.Fatalf("unsynced: %v", got)
	}
}

// putKey puts an object whose bytes are its key.
func putKey(t *testing.T, s Store, key string) {
	t.Helper()
	if _, err := s.Put(context.Background(), key, bytes.NewReader([]byte(key)), int64(len(key))); err != nil {
		t.Fatal(err)
	}
}
