package chunkxfer

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

// ReaderOptions tune a Reader.
type ReaderOptions struct {
	// ReadAhead is how many chunks past a sequential read are fetched in
	// the background (0: none).
	ReadAhead int
	// Attempts bounds the tries of one chunk (each on top of the store's
	// own request retries); a reader waits for them. Default 2.
	Attempts int
}

// Reader reads a remote object at any offset, a chunk at a time. Every
// byte it returns was in a chunk whose CRC32C matched the manifest; a
// mismatch that persists through retries is an error, never wrong bytes.
//
// The chunks are the Pool's, shared with every other Reader of the same
// object. Between reads a Reader holds at most the chunk it is in the
// middle of (its claim), which the Pool takes back once the Reader has
// been idle a while and another read needs the room; its read-ahead is
// fetched into the Pool.
type Reader struct {
	m     *Manifest
	pool  *Pool
	opts  ReaderOptions
	fetch fetcher
	// fetchBlocks fetches and checks blocks b0 to b1 into buf.
	fetchBlocks func(ctx context.Context, b0, b1 int, buf []byte) error
	closed      atomic.Bool

	lastEnd atomic.Int64 // end of the last read, for sequential detection
	fetches atomic.Int64 // chunk GETs this Reader made (for tests and metrics)
	// blockFetches counts the GETs of blocks of first reads.
	blockFetches atomic.Int64
	claim        *claim // the chunk it is in the middle of; GUARDED_BY(pool.mu)
	want         int    // the furthest chunk a sequential pass reached; GUARDED_BY(pool.mu)
}

// NewReader opens key through its manifest.
func NewReader(ctx context.Context, s store.Store, key string, pool *Pool, opts ReaderOptions) (*Reader, error) {
	m, err := LoadManifest(ctx, s, key)
	if err != nil {
		return nil, err
	}
	return NewReaderFor(s, m, pool, opts), nil
}

// NewReaderFor reads the object a manifest describes (a copy kept
// locally, so opening needs no request). Every GET carries the
// manifest's ETag: if the object was replaced, reads fail with
// store.ErrPrecondition rather than return other bytes.
func NewReaderFor(s store.Store, m *Manifest, pool *Pool, opts ReaderOptions) *Reader {
	r := &Reader{m: m, pool: pool, opts: opts}
	policy := retryPolicyOf(opts.Attempts)
	r.fetch = func(ctx context.Context, i int, buf []byte) error {
		r.fetches.Add(1)
		return fetchChunkWith(ctx, policy, s, m, i, buf)
	}
	r.fetchBlocks = func(ctx context.Context, b0, b1 int, buf []byte) error {
		return fetchBlocksWith(ctx, policy, s, m, b0, b1, buf)
	}
	r.lastEnd.Store(-1)
	return r
}

// Size is the object's size.
func (r *Reader) Size() int64 { return r.m.Size }

// Manifest is the object's manifest.
func (r *Reader) Manifest() *Manifest { return r.m }

// Fetches counts the chunk GETs this Reader made so far (a chunk another
// Reader fetched is not counted here).
func (r *Reader) Fetches() int64 { return r.fetches.Load() }

// BlockFetches counts the GETs of blocks this Reader made for the first
// reads of runs (see readBlocks).
func (r *Reader) BlockFetches() int64 { return r.blockFetches.Load() }

// Close stops read-ahead and lets the Reader's claim go; fetches under
// way end in the Pool.
func (r *Reader) Close() error {
	r.closed.Store(true)
	r.pool.dropClaimOf(r)
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
	m := r.mode(off)
	if n, ok, err := r.readBlocks(ctx, p, off, m); ok {
		if err != nil {
			return 0, err
		}
		r.after(off+int64(n), m)
		if n < len(p) {
			return n, io.EOF
		}
		return n, nil
	}
	n := 0
	for n < len(p) && off+int64(n) < r.m.Size {
		pos := off + int64(n)
		i := int(pos / r.m.ChunkSize)
		h, err := r.chunk(ctx, i, m)
		if err != nil {
			return n, err
		}
		n += copy(p[n:], h.Bytes()[pos-int64(i)*r.m.ChunkSize:])
		h.Release()
	}
	r.after(off+int64(n), m)
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Slice returns up to n bytes at off without copying when they lie in
// one chunk: a slice of the verified chunk, which stays as it is until
// release is called (exactly once; callers must not write to it). ok is
// false when the range spans chunks; use ReadAt then.
func (r *Reader) Slice(ctx context.Context, off int64, n int) (b []byte, release func(), ok bool, err error) {
	if off < 0 || off >= r.m.Size || n <= 0 {
		return nil, nil, false, nil
	}
	i := int(off / r.m.ChunkSize)
	lo := off - int64(i)*r.m.ChunkSize
	end := min(off+int64(n), r.m.Size)
	if int((end-1)/r.m.ChunkSize) != i {
		return nil, nil, false, nil
	}
	m := r.mode(off)
	if _, _, _, ok := r.blocksFor(off, end, m); ok {
		return nil, nil, false, nil // ReadAt reads its blocks alone
	}
	h, err := r.chunk(ctx, i, m)
	if err != nil {
		return nil, nil, true, err
	}
	r.after(end, m)
	return h.Bytes()[lo : lo+(end-off)], h.Release, true, nil
}

// maxBlockRead bounds the blocks a first read fetches on their own:
// a read that needs more waits for its whole chunk.
const maxBlockRead = 2

// readBlocks serves a read that starts a run (at no particular place,
// or at offset 0) and whose chunk is in no one's memory from the blocks
// that hold it (Manifest.BlockSize): one GET of a few hundred KiB and a
// check of each block, not of a whole chunk, so the first byte waits for
// about one small GET. The whole chunk is fetched ahead right after
// (if memory is free for it): the reads that follow find it, as
// mountpoint-s3 ramps a reader from a small first request to whole
// parts. ok is false where it does not apply (no blocks in the
// manifest, a read of more than maxBlockRead blocks or across chunks,
// a chunk fetched or being fetched, or no memory free now); then the
// read goes to the chunk as before.
func (r *Reader) readBlocks(ctx context.Context, p []byte, off int64, m readMode) (n int, ok bool, err error) {
	end := min(off+int64(len(p)), r.m.Size)
	i, b0, b1, ok := r.blocksFor(off, end, m)
	if !ok {
		return 0, false, nil
	}
	from, size := r.m.blocksRange(b0, b1)
	buf, ok := r.pool.borrow(size)
	if !ok {
		return 0, false, nil
	}
	defer r.pool.repay(buf, size)
	r.blockFetches.Add(1)
	r.pool.stats.BlockFetches.Add(1)
	err = r.fetchBlocks(ctx, b0, b1, buf)
	// The chunk after the blocks, not beside them: on a shared link
	// (and CPU) its GET would slow the blocks' down.
	r.pool.prefetch(r.id(i), r.chunkLen(i), r.fetch)
	if err != nil {
		return 0, true, fmt.Errorf("read %s: %w", r.m.Key, err)
	}
	r.pool.stats.FetchedBytes.Add(size)
	return copy(p, buf[off-from:end-from]), true, nil
}

// blocksFor says whether a read of mode m of [off, end) is served by
// readBlocks, and from which chunk and blocks.
func (r *Reader) blocksFor(off, end int64, m readMode) (i, b0, b1 int, ok bool) {
	if r.m.Blocks() == 0 || m == readSequential || end <= off {
		return 0, 0, 0, false
	}
	i = int(off / r.m.ChunkSize)
	b0, b1 = int(off/r.m.BlockSize), int((end-1)/r.m.BlockSize)
	if int((end-1)/r.m.ChunkSize) != i || b1-b0+1 > maxBlockRead || r.pool.has(r.id(i)) {
		return 0, 0, 0, false
	}
	return i, b0, b1, true
}

// mode says how a read at off relates to the Reader's earlier reads. A
// read at offset 0 starts a pass, wherever the last one ended (a second
// consumer from offset 0 of a segment no bigger than a chunk ends its
// predecessor's pass within a chunk of 0). Else it is sequential when it
// starts near where the last one ended: the kernel's readahead can have
// several requests in flight, and they may arrive slightly out of order.
func (r *Reader) mode(off int64) readMode {
	last := r.lastEnd.Load()
	switch {
	case off == 0:
		return readStart
	case last >= 0 && off >= last-r.m.ChunkSize && off <= last+r.m.ChunkSize:
		return readSequential
	default:
		return readRandom
	}
}

// after notes a read of mode m that ended at end, and starts read-ahead
// past it unless the read was at a random offset.
func (r *Reader) after(end int64, m readMode) {
	r.lastEnd.Store(end)
	if m == readRandom {
		return
	}
	from := int(end / r.m.ChunkSize)
	if end%r.m.ChunkSize != 0 {
		from++ // the chunk holding end was just read
	}
	for i := from; i < from+r.opts.ReadAhead && i < r.m.Chunks() && !r.closed.Load(); i++ {
		if !r.pool.prefetch(r.id(i), r.chunkLen(i), r.fetch) {
			return // no room: read-ahead shrinks before any read waits
		}
	}
}

func (r *Reader) id(i int) chunkID {
	return chunkID{key: r.m.Key, etag: r.m.ETag, size: r.m.ChunkSize, i: i}
}

func (r *Reader) chunkLen(i int) int64 {
	_, n := r.m.ChunkRange(i)
	return n
}

// chunk holds verified chunk i, from the Pool or fetched once for every
// Reader of the object.
func (r *Reader) chunk(ctx context.Context, i int, m readMode) (Pin, error) {
	h, err := r.pool.read(ctx, r, i, m)
	if err != nil {
		return Pin{}, fmt.Errorf("read %s: %w", r.m.Key, err)
	}
	return h, nil
}
