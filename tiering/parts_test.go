package tiering

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx"
)

// Claims of a path, an inode and an object key never stand for one
// another, whatever their names.
func TestClaimKindsDoNotCollide(t *testing.T) {
	c := newClaims()
	if !c.take(pathClaim("7")) || !c.take(inodeClaim(7)) || !c.take(objectClaim("7")) {
		t.Fatal("a claim of one kind blocked another kind")
	}
	if c.take(pathClaim("7")) || c.take(inodeClaim(7)) || c.take(objectClaim("7")) {
		t.Fatal("a claim was taken twice")
	}
	c.release(inodeClaim(7))
	if !c.take(inodeClaim(7)) || c.take(pathClaim("7")) {
		t.Fatal("release let go of the wrong claim")
	}
	done := c.startShipping(7)
	if !c.shippingIno(7) || c.shippingIno(8) {
		t.Fatal("shipping inodes")
	}
	done()
	if c.shippingIno(7) {
		t.Fatal("still shipping")
	}
}

// A change is told to the open files of its inode only.
func TestHandlesTellTheirInodeOnly(t *testing.T) {
	h := newHandles()
	a1, a2, b := &openFile{ino: 1}, &openFile{ino: 1}, &openFile{ino: 2}
	for _, f := range []*openFile{a1, a2, b} {
		h.add(f)
	}
	h.changed(1)
	if a1.epoch.Load() != 1 || a2.epoch.Load() != 1 || b.epoch.Load() != 0 {
		t.Fatalf("epochs %d %d %d", a1.epoch.Load(), a2.epoch.Load(), b.epoch.Load())
	}
	h.remove(a1)
	h.changed(1)
	if a1.epoch.Load() != 1 || a2.epoch.Load() != 2 || h.open() != 2 {
		t.Fatalf("after remove: epochs %d %d, %d open", a1.epoch.Load(), a2.epoch.Load(), h.open())
	}
	h.remove(a2)
	h.remove(b)
	if h.open() != 0 || len(h.byIno) != 0 {
		t.Fatalf("%d open, %d inodes", h.open(), len(h.byIno))
	}
}

func TestMovesRegistry(t *testing.T) {
	ms := newMoves(nil)
	if ms.of(3) != nil || ms.count() != 0 {
		t.Fatal("empty registry")
	}
	m := &Move{}
	ms.add(3, m)
	if ms.of(3) != m || ms.of(4) != nil || ms.count() != 1 {
		t.Fatal("after add")
	}
	ms.remove(3)
	ms.remove(3)
	if ms.of(3) != nil || ms.count() != 0 {
		t.Fatalf("after remove: %d", ms.count())
	}
}

func TestPartStatus(t *testing.T) {
	now := time.Unix(100, 0)
	ps := newPartStatus(func() time.Time { return now })
	err := errors.New("boom")
	if got := ps.noteErr("a-0", err); got != err {
		t.Fatal("noteErr does not return its error")
	}
	ps.noteKept("a-0", segmentAt("/x/a-0/00000000000000000010.log"), "not flushed")
	ps.noteKept("a-0", segmentAt("/x/a-0/00000000000000000020.log"), "later")
	ps.noteKept("b-0", segmentAt("/x/b-0/00000000000000000000.log"), "held open")
	all := ps.all()
	if all["a-0"].Err != "boom" || !all["a-0"].Time.Equal(now) || all["a-0"].Kept != "00000000000000000010.log: not flushed" || all["b-0"].Kept == "" {
		t.Fatalf("%+v", all)
	}
	ps.noteKept("b-0", Segment{}, "")
	if _, ok := ps.all()["b-0"]; ok {
		t.Fatal("a new pass did not clear the kept reason")
	}
}

// A partition's lock orders its changes; index files open once and
// again after forget.
func TestPartIndexes(t *testing.T) {
	dir := t.TempDir()
	x := newPartIndexes(func() string { return dir }, slog.New(slog.DiscardHandler))
	// Local copies of remote indexes that older versions kept go at the
	// first open.
	legacy := filepath.Join(dir, "idx", "a-0", "00000000000000000000.rindex")
	os.MkdirAll(filepath.Dir(legacy), 0o755)
	os.WriteFile(legacy, make([]byte, 8), 0o644)
	os.WriteFile(strings.TrimSuffix(legacy, ".rindex")+".rtimeindex", make([]byte, 12), 0o644)
	f1, err := x.file("a-0")
	if err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "idx", "a-0", "*.r*index")); len(left) > 0 {
		t.Fatalf("legacy remote indexes left: %v", left)
	}
	if f2, _ := x.file("a-0"); f2 != f1 {
		t.Fatal("opened twice")
	}
	if f1.Path() != filepath.Join(dir, "idx", "a-0", idx.FileName) {
		t.Fatalf("path %s", f1.Path())
	}
	x.forget("a-0")
	if f3, _ := x.file("a-0"); f3 == f1 {
		t.Fatal("forget kept the file")
	}
	var mu sync.Mutex
	in, most := 0, 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock := x.lock("a-0")
			mu.Lock()
			in++
			most = max(most, in)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			in--
			mu.Unlock()
			unlock()
		}()
	}
	wg.Wait()
	if most != 1 {
		t.Fatalf("%d held one partition's lock at once", most)
	}
	x.close()
}

func TestBatchListsAreBounded(t *testing.T) {
	var b batchLists
	for i := range maxBatchLists + 10 {
		b.put(fmt.Sprint(i), []idx.BatchRef{{}})
	}
	if len(b.byKey) > maxBatchLists {
		t.Fatalf("%d lists kept", len(b.byKey))
	}
	if _, ok := b.get(fmt.Sprint(maxBatchLists + 9)); !ok {
		t.Fatal("the newest list is gone")
	}
}
