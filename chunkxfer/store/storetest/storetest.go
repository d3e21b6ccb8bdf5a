// Package storetest is the conformance suite every store.Store passes:
// the same test body runs against the in-memory store, the directory
// store and a real S3 server.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

// MinPart is S3's smallest part but for the last.
const MinPart = 5 << 20

// Run runs the suite; open returns an empty store for each subtest.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	for _, c := range []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"PutGetHead", testPutGetHead},
		{"Ranges", testRanges},
		{"IfMatch", testIfMatch},
		{"PutIf", testPutIf},
		{"ListDelete", testListDelete},
		{"Keys", testKeys},
		{"Multipart", testMultipart},
		{"MultipartAbort", testMultipartAbort},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open(t)) })
	}
}

func data(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func get(t *testing.T, s store.Store, key string, off, n int64) []byte {
	t.Helper()
	b, err := store.ReadAll(s.Get(context.Background(), key, off, n, store.GetOptions{}))
	if err != nil {
		t.Fatalf("get %s [%d,+%d): %v", key, off, n, err)
	}
	return b
}

func put(t *testing.T, s store.Store, key string, b []byte) store.ObjectInfo {
	t.Helper()
	info, err := s.Put(context.Background(), key, bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return info
}

func testPutGetHead(t *testing.T, s store.Store) {
	ctx := context.Background()
	b := data(100_000, 1)
	info := put(t, s, "seg/00000000000000000000.log", b)
	if info.ETag == "" || info.Size != int64(len(b)) {
		t.Fatalf("put info %+v", info)
	}
	if got := get(t, s, "seg/00000000000000000000.log", 0, -1); !bytes.Equal(got, b) {
		t.Fatal("get returned other bytes")
	}
	h, err := s.Head(ctx, "seg/00000000000000000000.log")
	if err != nil || h.Size != int64(len(b)) || h.ETag != info.ETag {
		t.Fatalf("head %+v %v (put etag %s)", h, err, info.ETag)
	}
	if _, err := s.Head(ctx, "seg/missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("head of a missing key: %v", err)
	}
	if _, err := s.Get(ctx, "seg/missing", 0, -1, store.GetOptions{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get of a missing key: %v", err)
	}
	// An empty object.
	put(t, s, "empty", nil)
	if got := get(t, s, "empty", 0, -1); len(got) != 0 {
		t.Fatalf("empty object has %d bytes", len(got))
	}
	// Replacing changes the etag.
	info2 := put(t, s, "seg/00000000000000000000.log", b[:10])
	if info2.ETag == info.ETag {
		t.Fatal("etag did not change on replace")
	}
	if got := get(t, s, "seg/00000000000000000000.log", 0, -1); !bytes.Equal(got, b[:10]) {
		t.Fatal("replaced object has old bytes")
	}
}

func testRanges(t *testing.T, s store.Store) {
	b := data(10_000, 2)
	put(t, s, "r", b)
	for _, c := range [][2]int64{{0, 1}, {1, 100}, {9_999, 1}, {5_000, -1}, {0, 10_000}, {9_000, 5_000}, {10_000, -1}, {10_000, 10}, {3, 0}} {
		end := int64(len(b))
		if c[1] >= 0 && c[0]+c[1] < end {
			end = c[0] + c[1]
		}
		if got := get(t, s, "r", c[0], c[1]); !bytes.Equal(got, b[c[0]:end]) {
			t.Errorf("range [%d,+%d): %d bytes, want %d", c[0], c[1], len(got), end-c[0])
		}
	}
	if _, err := store.ReadAll(s.Get(context.Background(), "r", 20_000, 10, store.GetOptions{})); err == nil {
		t.Error("range past the end: no error")
	}
}

func testIfMatch(t *testing.T, s store.Store) {
	ctx := context.Background()
	info := put(t, s, "m", []byte("first"))
	b, err := store.ReadAll(s.Get(ctx, "m", 1, 3, store.GetOptions{IfMatch: info.ETag}))
	if err != nil || string(b) != "irs" {
		t.Fatalf("if-match get: %q %v", b, err)
	}
	put(t, s, "m", []byte("second"))
	if _, err := store.ReadAll(s.Get(ctx, "m", 0, 3, store.GetOptions{IfMatch: info.ETag})); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("get with a stale etag: %v", err)
	}
}

func testPutIf(t *testing.T, s store.Store) {
	ctx := context.Background()
	putIf := func(key, body string, cond store.PutCond) (store.ObjectInfo, error) {
		return s.PutIf(ctx, key, bytes.NewReader([]byte(body)), int64(len(body)), cond)
	}
	first, err := putIf("c", "0", store.PutCond{IfNoneMatch: true})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := putIf("c", "x", store.PutCond{IfNoneMatch: true}); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("create over an object: %v", err)
	}
	if _, err := putIf("c", "x", store.PutCond{}); err == nil {
		t.Fatal("a put with no condition passed")
	}
	second, err := putIf("c", "1", store.PutCond{IfMatch: first.ETag})
	if err != nil {
		t.Fatalf("if-match put: %v", err)
	}
	if _, err := putIf("c", "x", store.PutCond{IfMatch: first.ETag}); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("put with a stale etag: %v", err)
	}
	if got := string(get(t, s, "c", 0, -1)); got != "1" {
		t.Fatalf("after a failed put: %q", got)
	}
	if _, err := putIf("missing", "x", store.PutCond{IfMatch: first.ETag}); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("if-match put of a missing object: %v", err)
	}
	if h, err := s.Head(ctx, "c"); err != nil || h.ETag != second.ETag {
		t.Fatalf("head after put: %+v %v (put said %s)", h, err, second.ETag)
	}
	// Compare and swap from several writers: no increment is lost.
	const writers, each = 4, 5
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < each; {
				h, err := s.Head(ctx, "c")
				if err != nil {
					t.Error(err)
					return
				}
				b := get(t, s, "c", 0, -1)
				var n int
				fmt.Sscan(string(b), &n)
				if _, err := s.PutIf(ctx, "c", bytes.NewReader([]byte(fmt.Sprint(n+1))), int64(len(fmt.Sprint(n+1))), store.PutCond{IfMatch: h.ETag}); err == nil {
					done++
				} else if !errors.Is(err, store.ErrPrecondition) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := string(get(t, s, "c", 0, -1)); got != fmt.Sprint(1+writers*each) {
		t.Fatalf("after %d compare-and-swap increments: %s", writers*each, got)
	}
}

func testListDelete(t *testing.T, s store.Store) {
	ctx := context.Background()
	keys := []string{"p/a-0/00000000000000000000.log", "p/a-0/00000000000000000100.log", "p/a-1/x", "p/b", "q/a", "pz"}
	for i, k := range keys {
		put(t, s, k, data(10+i, uint64(i)))
	}
	list := func(prefix string) []string {
		t.Helper()
		infos, err := s.List(ctx, prefix)
		if err != nil {
			t.Fatalf("list %q: %v", prefix, err)
		}
		var out []string
		for _, i := range infos {
			out = append(out, i.Key)
			if i.Size != int64(10+slices.Index(keys, i.Key)) {
				t.Errorf("list: %s has size %d", i.Key, i.Size)
			}
		}
		return out
	}
	if got := list("p/"); !slices.Equal(got, keys[:4]) {
		t.Errorf("list p/: %v", got)
	}
	if got := list("p/a-"); !slices.Equal(got, keys[:3]) {
		t.Errorf("list p/a-: %v", got)
	}
	if got := list("p"); !slices.Equal(got, []string{keys[0], keys[1], keys[2], keys[3], "pz"}) {
		t.Errorf("list p: %v", got)
	}
	if got := list("nothing/"); len(got) != 0 {
		t.Errorf("list nothing/: %v", got)
	}
	for _, k := range keys[:3] {
		if err := s.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(ctx, keys[0]); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if got := list(""); !slices.Equal(got, []string{"p/b", "pz", "q/a"}) {
		t.Errorf("list after delete: %v", got)
	}
}

func testKeys(t *testing.T, s store.Store) {
	for _, k := range []string{"a b/c+d%e=f&g", "ünïcode/ключ", "x/y/z/deep/key.log.deleted", "topic-0/00000000000000000000.timeindex"} {
		b := []byte(k)
		put(t, s, k, b)
		if got := get(t, s, k, 0, -1); !bytes.Equal(got, b) {
			t.Errorf("key %q: got %q", k, got)
		}
	}
	for _, k := range []string{"", "/abs", "a//b", "a/../b", "./a", "a/", "nul\x00"} {
		if _, err := s.Put(context.Background(), k, bytes.NewReader(nil), 0); err == nil {
			t.Errorf("key %q accepted", k)
		}
	}
}

func testMultipart(t *testing.T, s store.Store) {
	ctx := context.Background()
	b := data(3*MinPart+12345, 3)
	id, err := s.CreateMultipart(ctx, "big/object")
	if err != nil {
		t.Fatal(err)
	}
	ups, err := s.ListMultipart(ctx, "big/")
	if err != nil || len(ups) != 1 || ups[0].UploadID != id || ups[0].Key != "big/object" {
		t.Fatalf("list multipart: %+v %v", ups, err)
	}
	// Parts in parallel and out of order.
	parts := make([]store.Part, 4)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 3; i >= 0; i-- {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lo, hi := i*MinPart, min((i+1)*MinPart, len(b))
			p, err := s.UploadPart(ctx, "big/object", id, int32(i+1), bytes.NewReader(b[lo:hi]), int64(hi-lo))
			if err != nil {
				errs <- err
				return
			}
			parts[i] = p
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	listed, err := s.ListParts(ctx, "big/object", id)
	if err != nil || len(listed) != 4 {
		t.Fatalf("list parts: %+v %v", listed, err)
	}
	for i, p := range listed {
		if p.Number != int32(i+1) || p.ETag != parts[i].ETag || p.Size != parts[i].Size {
			t.Errorf("listed part %+v, uploaded %+v", p, parts[i])
		}
	}
	// A wrong etag is refused and leaves the upload in place.
	bad := slices.Clone(parts)
	bad[1].ETag = parts[0].ETag
	if _, err := s.CompleteMultipart(ctx, "big/object", id, bad); err == nil {
		t.Fatal("complete with a wrong etag accepted")
	}
	info, err := s.CompleteMultipart(ctx, "big/object", id, parts)
	if err != nil || info.ETag == "" {
		t.Fatalf("complete: %+v %v", info, err)
	}
	if got := get(t, s, "big/object", 0, -1); !bytes.Equal(got, b) {
		t.Fatal("completed object differs")
	}
	if got := get(t, s, "big/object", MinPart-10, 20); !bytes.Equal(got, b[MinPart-10:MinPart+10]) {
		t.Fatal("range across parts differs")
	}
	if ups, err := s.ListMultipart(ctx, ""); err != nil || len(ups) != 0 {
		t.Fatalf("uploads left after complete: %+v %v", ups, err)
	}
}

func testMultipartAbort(t *testing.T, s store.Store) {
	ctx := context.Background()
	id, err := s.CreateMultipart(ctx, "ab/x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.UploadPart(ctx, "ab/x", id, 1, bytes.NewReader([]byte("hello")), 5); err != nil {
		t.Fatal(err)
	}
	if err := s.AbortMultipart(ctx, "ab/x", id); err != nil {
		t.Fatal(err)
	}
	if ups, err := s.ListMultipart(ctx, "ab/"); err != nil || len(ups) != 0 {
		t.Fatalf("uploads after abort: %+v %v", ups, err)
	}
	if _, err := s.UploadPart(ctx, "ab/x", id, 2, bytes.NewReader([]byte("x")), 1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("part after abort: %v", err)
	}
	if _, err := s.ListParts(ctx, "ab/x", id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("list parts after abort: %v", err)
	}
	if _, err := s.Head(ctx, "ab/x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("aborted upload made an object: %v", err)
	}
	// A body shorter than its size is an error, not a short part.
	id2, _ := s.CreateMultipart(ctx, "ab/y")
	if _, err := s.UploadPart(ctx, "ab/y", id2, 1, bytes.NewReader([]byte("abc")), 10); err == nil {
		t.Error("short part body accepted")
	}
	s.AbortMultipart(ctx, "ab/y", id2)
}
