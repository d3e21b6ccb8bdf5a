package store_test

import (
	"context"
	"fmt"
	"path/filepath"
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
