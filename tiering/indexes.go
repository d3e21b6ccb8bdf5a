package tiering

import (
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/tierfs/tierfs/idx"
)

// partIndexes are the partitions' local index files (idx/<partition>/
// in the state dir), open once each, and a lock per partition that
// orders every change to its index (local and in the store).
type partIndexes struct {
	dir func() string // the state dir (known once the mount holds it)
	log *slog.Logger

	mu    sync.Mutex
	files map[string]*idx.File // by partition; GUARDED_BY(mu)
	locks partitionLocks       // a change of a partition's index holds its lock
}

// partitionLocks is a mutex for each partition, made at its first use and
// kept for good (about 100 bytes each).
type partitionLocks struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex // GUARDED_BY(mu)
}

// lock holds partition's mutex until unlock.
func (p *partitionLocks) lock(partition string) (unlock func()) {
	p.mu.Lock()
	m := p.m[partition]
	if m == nil {
		if p.m == nil {
			p.m = map[string]*sync.Mutex{}
		}
		m = &sync.Mutex{}
		p.m[partition] = m
	}
	p.mu.Unlock()
	m.Lock()
	return m.Unlock
}

func newPartIndexes(dir func() string, log *slog.Logger) *partIndexes {
	return &partIndexes{dir: dir, log: log, files: map[string]*idx.File{}}
}

// lock holds the partition's index for a change until unlock.
func (x *partIndexes) lock(partition string) (unlock func()) { return x.locks.lock(partition) }

// path is the directory of a partition's index.
func (x *partIndexes) path(partition string) string {
	return filepath.Join(x.dir(), "idx", partition)
}

// file is the partition's index file, opened (and made) at the first
// use; a torn tail a crash left is cut off.
func (x *partIndexes) file(partition string) (*idx.File, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if f := x.files[partition]; f != nil {
		return f, nil
	}
	dir := x.path(partition)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := idx.OpenFile(filepath.Join(dir, idx.FileName))
	if err != nil {
		return nil, err
	}
	if f.Cut() > 0 {
		x.log.Warn("cut a torn tail off an index file", "path", f.Path(), "bytes", f.Cut())
	}
	removeLegacyRemoteIndexes(dir)
	x.files[partition] = f
	return f, nil
}

// forget closes the partition's index file, if open: it is replaced or
// removed on disk (the next file opens it again).
func (x *partIndexes) forget(partition string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if f := x.files[partition]; f != nil {
		f.Close()
		delete(x.files, partition)
	}
}

// close closes every index file.
func (x *partIndexes) close() {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, f := range x.files {
		f.Close()
	}
	x.files = map[string]*idx.File{}
}

// batchLists are the batch lists of objects in the store, as read from
// it (an object's list never changes), kept for a while: at most
// maxBatchLists, then all are let go.
type batchLists struct {
	mu    sync.Mutex
	byKey map[string][]idx.BatchRef // GUARDED_BY(mu)
}

const maxBatchLists = 1024

func (b *batchLists) get(key string) ([]idx.BatchRef, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	bs, ok := b.byKey[key]
	return bs, ok
}

func (b *batchLists) put(key string, bs []idx.BatchRef) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byKey == nil || len(b.byKey) >= maxBatchLists {
		b.byKey = map[string][]idx.BatchRef{}
	}
	b.byKey[key] = bs
}

// removeLegacyRemoteIndexes removes the local copies of remote indexes
// (*.rindex, *.rtimeindex) that versions before 2026-12 kept beside the
// index file. Nothing read them; the store's copies stay.
func removeLegacyRemoteIndexes(dir string) {
	for _, pat := range []string{"*.rindex", "*.rtimeindex"} {
		old, _ := filepath.Glob(filepath.Join(dir, pat))
		for _, p := range old {
			os.Remove(p)
		}
	}
}
