package chunkxfer

import (
	"container/list"
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"time"

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

// Reader reads a remote object at any offset, a chunk at a time, or a
// piece of a chunk when the Pool's budget is short for its readers (see
// Pool.pieceSize). Every byte it returns was in a chunk whose CRC32C
// matched the manifest, or in blocks whose CRC32Cs did; a mismatch that
// persists through retries is an error, never wrong bytes.
//
// The chunks and pieces are the Pool's, shared with every other Reader
// of the same object. Between reads a Reader holds at most the one it is
// in the middle of (its claim), which the Pool takes back once the
// Reader has been idle a while and another read needs the room; its
// read-ahead is fetched into the Pool.
type Reader struct {
	m     *Manifest
	pool  *Pool
	opts  ReaderOptions
	fetch fetcher
	// fetchBlocks fetches and checks blocks b0 to b1 into buf.
	fetchBlocks func(ctx context.Context, b0, b1 int, buf []byte) error
	closed      atomic.Bool

	lastEnd atomic.Int64 // end of the last read, for sequential detection
	fetches atomic.Int64 // chunk and piece GETs this Reader made (for tests and metrics)
	// blockFetches counts the GETs of blocks of first reads.
	blockFetches atomic.Int64
	claim        *claim // the piece it is in the middle of; GUARDED_BY(pool.mu)
	// want is where the furthest piece a sequential pass reached
	// starts. GUARDED_BY(pool.mu)
	want int64
	// activeElem is the Reader in pool.active (nil when it has not read
	// in order within its span); activeAt is when it last did.
	// GUARDED_BY(pool.mu)
	activeElem *list.Element
	activeAt   time.Time
	// turn is its last pause between reads in order of at least
	// activeSpan/4 (a reader in turns: see span). GUARDED_BY(pool.mu)
	turn time.Duration
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
	r.fetch = func(ctx context.Context, id chunkID, buf []byte) error {
		r.fetches.Add(1)
		if id.size == m.ChunkSize {
			return fetchChunkWith(ctx, policy, s, m, id.i, buf)
		}
		// A piece smaller than a chunk: whole blocks (see Pool.pieceSize).
		pool.stats.PieceFetches.Add(1)
		b0 := int(id.start() / m.BlockSize)
		b1 := int((id.start() + int64(len(buf)) - 1) / m.BlockSize)
		return fetchBlocksWith(ctx, policy, s, m, b0, b1, buf)
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

// Fetches counts the GETs of chunks (and of pieces of them, see
// Pool.pieceSize) this Reader made so far (one another Reader fetched is
// not counted here).
func (r *Reader) Fetches() int64 { return r.fetches.Load() }

// BlockFetches counts the GETs of blocks this Reader made for the first
// reads of runs (see readBlocks).
func (r *Reader) BlockFetches() int64 { return r.blockFetches.Load() }

// Close stops read-ahead and lets the Reader's claim go; fetches under
// way end in the Pool.
func (r *Reader) Close() error {
	r.closed.Store(true)
	r.pool.leave(r)
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
	r.pool.reading.Add(1)
	defer r.pool.reading.Add(-1)
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
		h, start, err := r.piece(ctx, pos, m)
		if err != nil {
			return n, err
		}
		n += copy(p[n:], h.Bytes()[pos-start:])
		h.Release()
	}
	r.after(off+int64(n), m)
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Slice returns up to n bytes at off without copying when they lie in
// one chunk (or piece of one): a slice of the verified bytes, which stay
// as they are until release is called (exactly once; callers must not
// write to them). ok is false when the range spans chunks or pieces; use
// ReadAt then.
func (r *Reader) Slice(ctx context.Context, off int64, n int) (b []byte, release func(), ok bool, err error) {
	if off < 0 || off >= r.m.Size || n <= 0 {
		return nil, nil, false, nil
	}
	i := int(off / r.m.ChunkSize)
	end := min(off+int64(n), r.m.Size)
	if int((end-1)/r.m.ChunkSize) != i {
		return nil, nil, false, nil
	}
	m := r.mode(off)
	if _, _, _, ok := r.blocksFor(off, end, m); ok {
		return nil, nil, false, nil // ReadAt reads its blocks alone
	}
	r.pool.reading.Add(1)
	defer r.pool.reading.Add(-1)
	h, start, err := r.piece(ctx, off, m)
	if err != nil {
		return nil, nil, true, err
	}
	if end > start+int64(len(h.Bytes())) {
		// A piece smaller than the range: ReadAt finds it again, and
		// the one after it.
		h.Release()
		return nil, nil, false, nil
	}
	r.after(end, m)
	return h.Bytes()[off-start : end-start], h.Release, true, nil
}

// maxBlockRead bounds the blocks a first read fetches on their own:
// a read that needs more waits for its whole chunk.
const maxBlockRead = 2

// readBlocks serves a read that starts a run (at no particular place,
// or at offset 0) and whose chunk is in no one's memory from the blocks
// that hold it (Manifest.BlockSize): one GET of a few hundred KiB and a
// check of each block, not of a whole chunk, so the first byte waits for
// about one small GET. The chunk (or piece) that holds the read's end is
// fetched ahead right after (if memory is free for it): the reads that
// follow find it, as mountpoint-s3 ramps a reader from a small first
// request to whole parts. A reader in turns gets its blocks alone and
// nothing ahead (Pool.firstRead). ok is false where it does not apply
// (no blocks in the manifest, a read of more than maxBlockRead blocks or
// across chunks, a chunk or piece holding off fetched or being fetched,
// no room to read ahead, or no memory free now); then the read goes to
// the chunk (or piece) as before.
func (r *Reader) readBlocks(ctx context.Context, p []byte, off int64, m readMode) (n int, ok bool, err error) {
	end := min(off+int64(len(p)), r.m.Size)
	b0, b1, ahead, ok := r.blocksFor(off, end, m)
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
	// The chunk (or piece) where the next read goes, after the blocks,
	// not beside them: on a shared link (and CPU) its GET would slow the
	// blocks' down.
	if ahead && end < r.m.Size {
		r.pool.prefetch(r, end)
	}
	if err != nil {
		return 0, true, fmt.Errorf("read %s: %w", r.m.Key, err)
	}
	r.pool.stats.FetchedBytes.Add(size)
	return copy(p, buf[off-from:end-from]), true, nil
}

// blocksFor says whether a read of mode m of [off, end) is served by
// readBlocks, from which blocks, and whether the piece after them is
// fetched ahead (Pool.firstRead).
func (r *Reader) blocksFor(off, end int64, m readMode) (b0, b1 int, ahead, ok bool) {
	if r.m.Blocks() == 0 || m == readSequential || end <= off {
		return 0, 0, false, false
	}
	b0, b1 = int(off/r.m.BlockSize), int((end-1)/r.m.BlockSize)
	if (end-1)/r.m.ChunkSize != off/r.m.ChunkSize || b1-b0+1 > maxBlockRead || r.pool.covers(r, off) {
		return 0, 0, false, false
	}
	alone, ahead := r.pool.firstRead(r, m)
	return b0, b1, ahead, alone
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
// past it unless the read was at a random offset: ReadAhead chunks, or
// one piece when the pool's readers get pieces smaller than a chunk
// (their share of the memory has no room for more).
func (r *Reader) after(end int64, m readMode) {
	r.lastEnd.Store(end)
	if m == readRandom {
		return
	}
	if end >= r.m.Size {
		r.pool.leave(r) // nothing ahead: not one of the readers now
		return
	}
	w, fits, turns := r.pool.inOrder(r)
	ahead := r.opts.ReadAhead
	switch {
	case !fits:
		ahead = 0 // it would be evicted before the reader's next turn
	case turns && m == readStart:
		ahead = 0 // the broker's look at a batch, seconds before its run (Pool.firstRead)
	case w < r.m.ChunkSize:
		ahead = min(ahead, 1)
	}
	next := (end + w - 1) / w * w // the piece holding end was just read
	for range ahead {
		if next >= r.m.Size || r.closed.Load() {
			return
		}
		var ok bool
		if next, ok = r.pool.prefetch(r, next); !ok {
			return // no room: read-ahead shrinks before any read waits
		}
	}
}

// pieceID is the piece of w bytes (a chunk, or a piece of one) that
// holds pos.
func (r *Reader) pieceID(w, pos int64) chunkID {
	return chunkID{key: r.m.Key, etag: r.m.ETag, size: w, i: int(pos / w)}
}

// pieceLen is piece id's length: its size, or less at the object's end.
func (r *Reader) pieceLen(id chunkID) int64 { return min(id.size, r.m.Size-id.start()) }

// piece holds the verified chunk, or piece of one, that holds pos, from
// the Pool or fetched once for every Reader of the object; start is
// where it starts in the object.
func (r *Reader) piece(ctx context.Context, pos int64, m readMode) (h Pin, start int64, err error) {
	h, start, err = r.pool.read(ctx, r, pos, m)
	if err != nil {
		return Pin{}, 0, fmt.Errorf("read %s: %w", r.m.Key, err)
	}
	return h, start, nil
}
