package store_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/chunkxfer/store/storetest"
)

// A counted store is a store like any other, the dir store's deferred
// view included.
func TestCounted(t *testing.T) {
	var r store.Requests
	storetest.Run(t, func(t *testing.T) store.Store { return store.Counted(store.NewMem(nil), &r) })
	if r.Total() == 0 {
		t.Fatal("the store suite made no request that was counted")
	}
	storetest.Run(t, func(t *testing.T) store.Store {
		d, err := store.NewDir(filepath.Join(t.TempDir(), "remote"))
		if err != nil {
			t.Fatal(err)
		}
		c := store.Counted(d, &r)
		dd, ok := c.(interface{ Deferred() store.Store })
		if !ok {
			t.Fatal("a counted dir store has no deferred view")
		}
		return dd.Deferred()
	})
}

// Each request is counted once under its op, and a failed one (a
// missing key, a failed condition) as failed too. A store without
// deferred puts gets no Deferred method from the count.
func TestCountedCountsEachOp(t *testing.T) {
	ctx := context.Background()
	var r store.Requests
	s := store.Counted(store.NewMem(nil), &r)
	if _, ok := s.(interface{ Deferred() store.Store }); ok {
		t.Fatal("a counted memory store claims deferred puts")
	}
	info, err := s.Put(ctx, "p/a", bytes.NewReader([]byte("abc")), 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutIf(ctx, "p/a", bytes.NewReader([]byte("x")), 1, store.PutCond{IfNoneMatch: true}); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("PutIf over an object: %v", err)
	}
	if _, err := s.PutIf(ctx, "p/a", bytes.NewReader([]byte("y")), 1, store.PutCond{IfMatch: info.ETag}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.ReadAll(s.Get(ctx, "p/a", 0, -1, store.GetOptions{})); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Head(ctx, "p/missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Head of a missing key: %v", err)
	}
	if _, err := s.List(ctx, "p/"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "p/a"); err != nil {
		t.Fatal(err)
	}
	want := map[store.Op][2]int64{
		store.OpPut: {1, 0}, store.OpPutIf: {2, 1}, store.OpGet: {1, 0},
		store.OpHead: {1, 1}, store.OpList: {1, 0}, store.OpDelete: {1, 0},
	}
	var total int64
	for op := range store.NumOps {
		n, failed := r.Count(op)
		if w := want[op]; n != w[0] || failed != w[1] {
			t.Errorf("%v: %d requests, %d failed; want %d, %d", op, n, failed, w[0], w[1])
		}
		total += n
	}
	if total != r.Total() || total != 7 {
		t.Errorf("total %d, Total() %d; want 7", total, r.Total())
	}
	if store.OpCompleteMultipart.String() != "complete_multipart" || store.Op(-1).String() != "unknown" {
		t.Errorf("op names: %q, %q", store.OpCompleteMultipart, store.Op(-1))
	}
}
