package chunkxfer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/ristretto/v2"
	"golang.org/x/sync/singleflight"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

// Cache holds verified chunks of remote objects, bounded in bytes. One
// Cache is shared by every Reader of a process.
type Cache struct {
	c     *ristretto.Cache[string, []byte]
	stats CacheStats
}

// CacheStats count the chunk reads of every Reader of a Cache, for
// metrics. A read served from a reader's own window of neighbouring
// chunks counts as neither a hit nor a miss.
type CacheStats struct {
	Hits, Misses atomic.Int64 // chunks found in the cache, chunks fetched
	FetchedBytes atomic.Int64 // verified bytes fetched from the store
	FetchErrors  atomic.Int64 // chunk fetches that failed (after retries)
}

// Stats are the cache's running counts.
func (c *Cache) Stats() *CacheStats { return &c.stats }

// NewCache makes a cache of at most maxBytes of chunk data.
func NewCache(maxBytes int64) (*Cache, error) {
	c, err := ristretto.NewCache(&ristretto.Config[string, []byte]{
		// Ten counters per expected entry (ristretto's advice), with
		// entries of at least 64 KiB.
		NumCounters: max(1000, 10*maxBytes/(64<<10)),
		MaxCost:     maxBytes,
		BufferItems: 64,
		Metrics:     true,
	})
	if err != nil {
		return nil, err
	}
	return &Cache{c: c}, nil
}

// Close releases the cache.
func (c *Cache) Close() { c.c.Close() }

// UsedBytes is the chunk data held now.
func (c *Cache) UsedBytes() int64 {
	m := c.c.Metrics
	if m == nil {
		return -1
	}
	return int64(m.CostAdded() - m.CostEvicted())
}

// ReaderOptions tune a Reader.
type ReaderOptions struct {
	// ReadAhead is how many chunks past a sequential read are fetched in
	// the background (0: none).
	ReadAhead int
	// Attempts bounds the tries of one chunk (each on top of the store's
	// own request retries); a reader waits for them. Default 2.
	Attempts int
	Log      *slog.Logger
}

// Reader reads a remote object at any offset, a chunk at a time. Every
// byte it returns was in a chunk whose CRC32C matched the manifest; a
// mismatch that persists through retries is an error, never wrong bytes.
type Reader struct {
	s      store.Store
	m      *Manifest
	cache  *Cache
	opts   ReaderOptions
	flight singleflight.Group
	prefix string

	lastEnd atomic.Int64 // end of the last read, for sequential detection
	ahead   sync.Map     // chunk index -> struct{}: read-ahead in flight

	// The window holds the chunks around the read position: the one
	// being read and those fetched ahead. It does not depend on the
	// shared cache admitting them (ristretto's TinyLFU refuses new
	// entries once full, which would make a sequential reader fetch
	// every chunk once per read).
	winMu  sync.Mutex
	window map[int][]byte // GUARDED_BY(winMu)
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	fetches atomic.Int64 // chunk GETs made (for tests and metrics)
}

// NewReader opens key through its manifest.
func NewReader(ctx context.Context, s store.Store, key string, cache *Cache, opts ReaderOptions) (*Reader, error) {
	m, err := LoadManifest(ctx, s, key)
	if err != nil {
		return nil, err
	}
	return NewReaderFor(s, m, cache, opts), nil
}

// NewReaderFor reads the object a manifest describes (a copy kept
// locally, so opening needs no request). Every GET carries the
// manifest's ETag: if the object was replaced, reads fail with
// store.ErrPrecondition rather than return other bytes.
func NewReaderFor(s store.Store, m *Manifest, cache *Cache, opts ReaderOptions) *Reader {
	bg, cancel := context.WithCancel(context.Background())
	r := &Reader{s: s, m: m, cache: cache, opts: opts, ctx: bg, cancel: cancel,
		prefix: m.Key + "\x00" + m.ETag + "\x00"}
	r.lastEnd.Store(-1)
	r.window = map[int][]byte{}
	return r
}

// Size is the object's size.
func (r *Reader) Size() int64 { return r.m.Size }

// Manifest is the object's manifest.
func (r *Reader) Manifest() *Manifest { return r.m }

// Fetches counts the chunk GETs made so far.
func (r *Reader) Fetches() int64 { return r.fetches.Load() }

// Close stops read-ahead.
func (r *Reader) Close() error {
	r.cancel()
	r.wg.Wait()
	return nil
}

// ReadAt implements io.ReaderAt.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	return r.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt that gives up when ctx ends.
func (r *Reader) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read %s: negative offset %d", r.m.Key, off)
	}
	if off >= r.m.Size {
		return 0, io.EOF
	}
	// Near-sequential counts: the kernel's readahead can have several
	// requests in flight and they may arrive slightly out of order.
	last := r.lastEnd.Load()
	sequential := last >= 0 && off >= last-r.m.ChunkSize && off <= last+r.m.ChunkSize
	n := 0
	for n < len(p) && off+int64(n) < r.m.Size {
		pos := off + int64(n)
		i := int(pos / r.m.ChunkSize)
		chunk, err := r.chunk(ctx, i)
		if err != nil {
			return n, err
		}
		n += copy(p[n:], chunk[pos-int64(i)*r.m.ChunkSize:])
	}
	end := off + int64(n)
	r.lastEnd.Store(end)
	if sequential || off == 0 {
		r.readAhead(int(end / r.m.ChunkSize))
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Slice returns up to n bytes at off without copying when they lie in
// one chunk: a slice of the verified chunk, which is never written again
// (callers must not write to it either). ok is false when the range
// spans chunks; use ReadAt then.
func (r *Reader) Slice(ctx context.Context, off int64, n int) (b []byte, ok bool, err error) {
	if off < 0 || off >= r.m.Size || n <= 0 {
		return nil, false, nil
	}
	i := int(off / r.m.ChunkSize)
	lo := off - int64(i)*r.m.ChunkSize
	end := min(off+int64(n), r.m.Size)
	if int((end-1)/r.m.ChunkSize) != i {
		return nil, false, nil
	}
	last := r.lastEnd.Load()
	sequential := last >= 0 && off >= last-r.m.ChunkSize && off <= last+r.m.ChunkSize
	chunk, err := r.chunk(ctx, i)
	if err != nil {
		return nil, true, err
	}
	r.lastEnd.Store(end)
	if sequential || off == 0 {
		r.readAhead(int(end / r.m.ChunkSize))
	}
	return chunk[lo : lo+(end-off)], true, nil
}

// windowGet returns chunk i if it is in the window.
func (r *Reader) windowGet(i int) ([]byte, bool) {
	r.winMu.Lock()
	defer r.winMu.Unlock()
	b, ok := r.window[i]
	return b, ok
}

// windowPut keeps chunk i, dropping chunks outside [i-1, i+ReadAhead+1]
// relative to the newest one read: the window holds at most
// ReadAhead+3 chunks.
func (r *Reader) windowPut(i int, b []byte, reading bool) {
	r.winMu.Lock()
	defer r.winMu.Unlock()
	r.window[i] = b
	if !reading {
		return
	}
	for k := range r.window {
		if k < i-1 || k > i+r.opts.ReadAhead+1 {
			delete(r.window, k)
		}
	}
}

// chunk returns verified chunk i from the window, the cache or the
// store; concurrent misses of one chunk make one request.
func (r *Reader) chunk(ctx context.Context, i int) ([]byte, error) {
	return r.chunkFor(ctx, i, true)
}

func (r *Reader) chunkFor(ctx context.Context, i int, reading bool) ([]byte, error) {
	if b, ok := r.windowGet(i); ok {
		if reading {
			r.windowPut(i, b, true)
		}
		return b, nil
	}
	key := r.prefix + strconv.Itoa(i)
	stats := &r.cache.stats
	if b, ok := r.cache.c.Get(key); ok {
		stats.Hits.Add(1)
		r.windowPut(i, b, reading)
		return b, nil
	}
	ch := r.flight.DoChan(key, func() (any, error) {
		if b, ok := r.cache.c.Get(key); ok {
			stats.Hits.Add(1)
			return b, nil
		}
		_, n := r.m.ChunkRange(i)
		buf := make([]byte, n)
		r.fetches.Add(1)
		stats.Misses.Add(1)
		// The fetch outlives one caller giving up: others may wait on it.
		policy := defaultRetry
		policy.attempts = r.opts.Attempts
		if policy.attempts <= 0 {
			policy.attempts = 2
		}
		if err := fetchChunkWith(r.ctx, policy, r.s, r.m, i, buf); err != nil {
			stats.FetchErrors.Add(1)
			return nil, err
		}
		stats.FetchedBytes.Add(n)
		// The window serves this reader; the cache serves re-reads
		// (it may refuse the chunk: then a re-read fetches it again).
		r.cache.c.Set(key, buf, n)
		return buf, nil
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, fmt.Errorf("read %s: %w", r.m.Key, res.Err)
		}
		b := res.Val.([]byte)
		r.windowPut(i, b, reading)
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// readAhead fetches chunks from..from+ReadAhead-1 in the background.
func (r *Reader) readAhead(from int) {
	for i := from; i < from+r.opts.ReadAhead && i < r.m.Chunks(); i++ {
		if _, busy := r.ahead.LoadOrStore(i, struct{}{}); busy {
			continue
		}
		if _, ok := r.windowGet(i); ok {
			r.ahead.Delete(i)
			continue
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.ahead.Delete(i)
			if _, err := r.chunkFor(r.ctx, i, false); err != nil && r.ctx.Err() == nil && r.opts.Log != nil {
				r.opts.Log.Debug("read-ahead failed", "key", r.m.Key, "chunk", i, "err", err)
			}
		}()
	}
}
