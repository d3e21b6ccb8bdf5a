package store_test

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/chunkxfer/store/s3test"
	"github.com/tierfs/tierfs/chunkxfer/store/storetest"
)

func TestMem(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return store.NewMem(nil) })
}

func TestDir(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		d, err := store.NewDir(filepath.Join(t.TempDir(), "remote"))
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}

// A deferred view of the dir store is a store like any other.
func TestDirDeferred(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		d, err := store.NewDir(filepath.Join(t.TempDir(), "remote"))
		if err != nil {
			t.Fatal(err)
		}
		return d.Deferred()
	})
}

func TestS3(t *testing.T) {
	srv := s3test.StartT(t)
	var n atomic.Int32
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := srv.NewStore(context.Background(), fmt.Sprintf("bucket-%d", n.Add(1)), "tierfs/")
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// A directory store's puts leave no temporary file behind, whether the
// key is new (an unnamed file linked in) or replaced (renamed over), and
// a replaced object gets a new ETag.
func TestDirPutsLeaveNoTemporaries(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "remote")
	d, err := store.NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, body string) store.ObjectInfo {
		t.Helper()
		info, err := d.Put(ctx, key, strings.NewReader(body), int64(len(body)))
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	a := put("p/a", "first")
	b := put("p/a", "second, longer")
	if a.ETag == b.ETag || b.Size != 14 {
		t.Fatalf("replaced: %+v then %+v", a, b)
	}
	if got, err := store.ReadAll(d.Get(ctx, "p/a", 0, -1, store.GetOptions{})); err != nil || string(got) != "second, longer" {
		t.Fatalf("read back %q %v", got, err)
	}
	if h, _ := d.Head(ctx, "p/a"); h.ETag != b.ETag {
		t.Fatalf("head %s, put said %s", h.ETag, b.ETag)
	}
	var left []string
	filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err == nil && !de.IsDir() && !strings.HasSuffix(p, "putif.lock") && p != filepath.Join(root, "p", "a") {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}
