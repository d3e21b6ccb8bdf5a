package chunkxfer

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is the chunk memory of a process: one budget of bytes for every
// verified chunk of every remote object, shared by every Reader. A chunk
// is fetched once whoever reads it (one table, one fetch per chunk of an
// object), and it counts once however many readers hold it.
//
// Every chunk byte is in one of these kinds (see Usage):
//   - in flight: a buffer a fetch is filling (a chunk's, or the blocks
//     of a first read, see Reader);
//   - in use: a verified chunk a read is copying from or replying with;
//   - windows: a verified chunk a reader is in the middle of, held for it
//     between its reads (its claim);
//   - read ahead: a verified chunk fetched ahead of a reader, not read yet;
//   - cache: a verified chunk read before and kept for re-reads;
//   - free: a buffer of an evicted chunk, kept to be filled again.
//
// The sum never exceeds the room: the limit, less what the rest of the
// process takes of the same budget when its owner says so (SetRoom). A
// read that finds no room evicts
// cache, then read-ahead chunks, then waits in line (first come, first
// served) for a chunk in use to be released. Read-ahead never waits: it
// takes only room that is free or cached, never more than half the
// limit in flight, and never while a read waits, so a read waits only
// behind other reads.
//
// A buffer is filled again only after its chunk left the table with no
// holder (Pin counts holders), so a reader never sees another chunk's
// bytes.
type Pool struct {
	limit int64
	log   *slog.Logger
	ctx   context.Context // fetches outlive their first reader; Close ends them
	stop  context.CancelFunc
	stats PoolStats

	mu        sync.Mutex
	minRoom   int64              // the least room SetRoom leaves: MinRoom(limit), set by NewPool
	room      int64              // what used may reach now: limit, or less (SetRoom); GUARDED_BY(mu)
	used      int64              // bytes of every buffer below; GUARDED_BY(mu)
	chunks    map[chunkID]*chunk // fetching or ready (a failed chunk leaves at once); GUARDED_BY(mu)
	cached    list.List          // of *chunk: no holder, read before; front is newest; GUARDED_BY(mu)
	ahead     list.List          // of *chunk: no holder, not read yet; GUARDED_BY(mu)
	free      map[int64][][]byte // buffers by capacity (bufCap); GUARDED_BY(mu)
	freeBytes int64              // GUARDED_BY(mu)
	aheadBusy int64              // bytes of read-ahead fetches in flight; GUARDED_BY(mu)
	waiters   list.List          // of *waiter, first come first served; GUARDED_BY(mu)
	claims    list.List          // of *claim, least recently used first; GUARDED_BY(mu)
	timer     *time.Timer        // wakes waiters when a claim can be revoked; GUARDED_BY(mu)
	active    list.List          // of *Reader: read in order within their span, most recent first; GUARDED_BY(mu)
	reading   atomic.Int64       // reads in progress (in a Reader's ReadAt or Slice)
	claimIdle time.Duration      // a claim unused this long is revoked for a waiting read
	turnPiece int64              // the least piece of a reader in turns (DefaultTurnPiece)
	now       func() time.Time
	wg        sync.WaitGroup // fetches in flight
}

// PoolStats count the chunk reads of every Reader of a Pool, for metrics.
type PoolStats struct {
	Hits         atomic.Int64 // chunks a read found in memory (or being fetched for another)
	Misses       atomic.Int64 // chunks and pieces fetched from the store (reads and read-ahead)
	PieceFetches atomic.Int64 // of Misses, the pieces smaller than a chunk (see pieceSize)
	BlockFetches atomic.Int64 // GETs of a first read's blocks (see Reader)
	FetchedBytes atomic.Int64 // verified bytes fetched from the store
	FetchErrors  atomic.Int64 // chunk fetches that failed (after retries)
	AheadSkipped atomic.Int64 // read-ahead chunks not fetched for want of memory
	AheadWasted  atomic.Int64 // read-ahead chunks evicted before any read
	Revoked      atomic.Int64 // readers' claims revoked for a waiting read
	Waits        atomic.Int64 // reads that waited for memory
	WaitNanos    atomic.Int64 // total time reads waited for memory
}

// Usage is how the pool's bytes are used now, by kind.
type Usage struct {
	Limit, Room                                      int64
	InFlight, InUse, Windows, ReadAhead, Cache, Free int64
	Waiting                                          int // reads waiting for memory
	Chunks                                           int // chunks and pieces in the table
	Readers                                          int // Readers reading in order now (see pieceSize)
}

// Used is every kind's bytes together.
func (u Usage) Used() int64 { return u.InFlight + u.InUse + u.Windows + u.ReadAhead + u.Cache + u.Free }

// chunkID names a chunk of an object, or a piece of one: the i-th run
// of size bytes (see pieceSize).
type chunkID struct {
	key, etag string
	size      int64 // the manifest's chunk size, or a piece's size
	i         int
}

// start is where the chunk or piece starts in its object.
func (id chunkID) start() int64 { return int64(id.i) * id.size }

type chunkState uint8

const (
	chunkFetching chunkState = iota
	chunkReady
	chunkFailed
)

// chunk is one chunk of an object in the table.
type chunk struct {
	id     chunkID
	n      int64
	buf    []byte     // verified bytes once ready; GUARDED_BY(Pool.mu) until then
	state  chunkState // GUARDED_BY(Pool.mu)
	refs   int        // holders: reads waiting for it or reading it, and claims; GUARDED_BY(Pool.mu)
	claims int        // the holders that are claims (of readers between reads); GUARDED_BY(Pool.mu)
	read   bool       // a read has used it (else: fetched ahead); GUARDED_BY(Pool.mu)
	ahead  bool       // its fetch was a read-ahead; GUARDED_BY(Pool.mu)
	elem   *list.Element
	done   chan struct{} // closed when the fetch ends
	err    error         // set before done is closed
}

type waiter struct {
	n     int64
	buf   []byte // a free buffer handed over, or nil: allocate n
	ready chan struct{}
}

// DefaultClaimIdle is how long a reader's claim on the chunk it is in
// the middle of outlives its last read when another read waits for room.
// Under load a reader's next request can be queued in the kernel behind
// reads that wait for memory, so its claim looks idle though the reader
// is not; it is taken back soon enough that those reads do not wait long
// for it. (bench/tierload, 200 readers of 32 MiB segments, 256 MiB: with
// 1 s and 256 kernel background slots the run fetched 17.7 GB for 6.4 GB
// in 3 minutes and had not ended; with 250 ms and 1024 slots it ran at
// 663 MB/s, 1.9× one reader, with 16 claims taken back.)
const DefaultClaimIdle = 250 * time.Millisecond

// claim is a Reader's hold on the chunk it is in the middle of, kept
// between its reads so that the chunk is not evicted (and fetched again)
// before the reader is done with it. A reader has at most one; it lets
// it go before it waits for another chunk (so no reader holds memory
// while it waits), when it closes, and when the pool revokes it: unused
// for claimIdle while a read waits for room.
type claim struct {
	c    *chunk
	r    *Reader
	used time.Time
	elem *list.Element
}

// ErrBudget is a chunk larger than the whole memory budget.
var ErrBudget = errors.New("chunk does not fit in the memory budget")

// NewPool makes a pool of at most limit bytes of chunk memory.
func NewPool(limit int64, log *slog.Logger) (*Pool, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("chunk memory of %d bytes", limit)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Pool{limit: limit, room: limit, minRoom: MinRoom(limit), log: log, ctx: ctx, stop: stop, claimIdle: DefaultClaimIdle, turnPiece: DefaultTurnPiece, now: time.Now,
		chunks: map[chunkID]*chunk{}, free: map[int64][][]byte{}}, nil
}

// Limit is the budget.
func (p *Pool) Limit() int64 { return p.limit }

// MinRoom is the least room SetRoom leaves the chunks of a pool of limit
// bytes: a quarter of it, at least two default chunks (all of it when it
// is smaller), so that reads go on however much the rest of the process
// takes.
func MinRoom(limit int64) int64 {
	return min(limit, max(limit/4, 2*DefaultChunkSize))
}

// SetRoom sets how many bytes the chunks may use from now on: the budget
// less what the rest of the process uses of it, as its owner measures
// that (internal/memgov, after each garbage collection), within
// MinRoom(limit) and limit. Less room than is used lets free buffers and
// cached chunks go at once; the chunks that are held go as their
// holders let them go. More room serves the reads waiting for it. It
// returns the room set.
func (p *Pool) SetRoom(n int64) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n = min(p.limit, max(n, p.minRoom))
	grew := n > p.room
	p.room = n
	for p.used > p.room && (p.dropFree() || p.evict(false)) {
	}
	if grew {
		p.wake()
	}
	return n
}

// Room is what the chunks may use now (see SetRoom).
func (p *Pool) Room() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.room
}

// Used is the bytes the pool's buffers take now: what a garbage
// collection finds live of it.
func (p *Pool) Used() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// Stats are the pool's running counts.
func (p *Pool) Stats() *PoolStats { return &p.stats }

// Close ends the fetches in flight and waits for them.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.timer != nil {
		p.timer.Stop()
	}
	p.mu.Unlock()
	p.stop()
	p.wg.Wait()
}

// Usage counts the pool's bytes by kind.
func (p *Pool) Usage() Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trimActive()
	u := Usage{Limit: p.limit, Room: p.room, Free: p.freeBytes, Waiting: p.waiters.Len(), Chunks: len(p.chunks), Readers: p.active.Len()}
	for _, c := range p.chunks {
		switch {
		case c.state != chunkReady:
		case c.refs > c.claims:
			u.InUse += int64(cap(c.buf))
		case c.refs > 0:
			u.Windows += int64(cap(c.buf))
		case c.read:
			u.Cache += int64(cap(c.buf))
		default:
			u.ReadAhead += int64(cap(c.buf))
		}
	}
	// The rest is taken by fetches: buffers being filled.
	u.InFlight = p.used - u.Free - u.InUse - u.Windows - u.Cache - u.ReadAhead
	return u
}

// Pin is a chunk held by a read: its bytes stay as they are until
// Release, which must be called exactly once.
type Pin struct {
	p *Pool
	c *chunk
	b []byte
}

// Bytes are the chunk's verified bytes; the holder must not write them,
// nor use them after Release.
func (h Pin) Bytes() []byte { return h.b }

// Release lets the chunk go: kept for re-reads while room allows.
func (h Pin) Release() { h.p.release(h.c) }

// fetcher fetches chunk or piece id of an object into buf.
type fetcher func(ctx context.Context, id chunkID, buf []byte) error

// get holds chunk id, fetching it once if no one has (f fills it).
// It waits for memory in line with other reads, and gives up when ctx
// ends (the fetch goes on for the other holders, if any).
func (p *Pool) get(ctx context.Context, id chunkID, n int64, f fetcher) (Pin, error) {
	if n > p.limit {
		return Pin{}, fmt.Errorf("chunk %d of %s is %d bytes, the memory budget %d: %w", id.i, id.key, n, p.limit, ErrBudget)
	}
	p.mu.Lock()
	c := p.chunks[id]
	if c != nil {
		p.hold(c)
		p.stats.Hits.Add(1)
	} else {
		c = &chunk{id: id, n: n, refs: 1, done: make(chan struct{})}
		p.chunks[id] = c
		p.wg.Add(1)
		go p.fetch(c, f)
	}
	c.read = true
	p.mu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		p.release(c)
		return Pin{}, ctx.Err()
	}
	if c.err != nil {
		p.release(c)
		return Pin{}, c.err
	}
	return Pin{p: p, c: c, b: c.buf}, nil
}

// prefetch fetches the chunk or piece of r's object that holds pos
// ahead of a read, if memory is free for it without waiting or taking
// any from a read. It reports whether one holding pos is in the table
// now, and where that one ends.
func (p *Pool) prefetch(r *Reader, pos int64) (end int64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, in := p.pieceAt(r, pos, true)
	n := r.pieceLen(id)
	if in {
		return id.start() + n, true
	}
	if p.waiters.Len() > 0 || 2*(p.aheadBusy+n) > p.room {
		p.stats.AheadSkipped.Add(1)
		return 0, false
	}
	buf, ok := p.take(n, false)
	if !ok {
		p.stats.AheadSkipped.Add(1)
		return 0, false
	}
	c := &chunk{id: id, n: n, ahead: true, done: make(chan struct{})}
	p.chunks[id] = c
	p.aheadBusy += n
	p.wg.Add(1)
	go p.fetchInto(c, buf, r.fetch)
	return id.start() + n, true
}

// covers says whether a chunk or piece of r's object that holds pos is
// in the table: fetched, or being fetched.
func (p *Pool) covers(r *Reader, pos int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, in := p.holder(r, pos)
	return in
}

// activeSpan is the least time a Reader that read in order counts as
// one of the pool's readers after its last read (see pieceSize). A
// Reader that reads in turns counts for twice its last pause between
// turns (Reader.turn) when that is longer, up to maxActiveSpan: a
// consumer catching up reads a megabyte of each partition in turn, and
// a round over a thousand partitions takes 10-15 s (counted for 2 s,
// only those read in the last 2 s counted, and their pieces were sized
// for several times the memory there is:
// TestReadersInLongRoundsFetchWhatTheyRead).
const (
	activeSpan    = 2 * time.Second
	maxActiveSpan = time.Minute
)

// inOrder notes that r has just read in order, and returns the size of
// the pieces its reads get now, whether two of them for each reader
// fit in half the budget (else it reads nothing ahead: its read-ahead
// would be evicted before its next turn), and whether r reads in turns.
func (p *Pool) inOrder(r *Reader) (w int64, fits, turns bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if !r.activeAt.IsZero() {
		// A pause of a quarter of activeSpan or more is a turn
		// (shorter ones are a reader's own gaps, or the kernel's);
		// one longer than maxActiveSpan is a reader come back, not a
		// round.
		if gap := now.Sub(r.activeAt); gap >= activeSpan/4 && gap <= maxActiveSpan {
			r.turn = gap
		}
	}
	r.activeAt = now
	switch {
	case r.closed.Load(): // a read that ended after Close: leave let r go
	case r.activeElem != nil:
		p.active.MoveToFront(r.activeElem)
	default:
		r.activeElem = p.active.PushFront(r)
	}
	w, fits = p.pieceSize(r)
	return w, fits, r.turn > 0
}

// span is how long r counts as a reader after its last read in order.
func (r *Reader) span() time.Duration {
	return min(maxActiveSpan, max(activeSpan, 2*r.turn))
}

// forget stops counting r among the readers. GUARDED_BY(mu).
func (p *Pool) forget(r *Reader) {
	if r.activeElem != nil {
		p.active.Remove(r.activeElem)
		r.activeElem = nil
	}
}

// trimActive drops the readers that have not read in order within their
// span, from the longest idle: it stops at the first that still counts,
// so one that reads in long turns can keep others counted a little
// longer than theirs (smaller pieces for a while, never more bytes
// fetched). GUARDED_BY(mu).
func (p *Pool) trimActive() {
	now := p.now()
	for e := p.active.Back(); e != nil; e = p.active.Back() {
		r := e.Value.(*Reader)
		if now.Sub(r.activeAt) < r.span() {
			return
		}
		p.forget(r)
	}
}

// pieceSize is how much of r's object its reads fetch at a time: whole
// chunks while half the budget has room for two chunks of every reader
// that reads in order (within its span), its window and one ahead, or
// while at least half of those readers are reading now; else the chunk
// halved, while it stays whole blocks, until two pieces of each reader
// fit in half the budget (the other half is slack: reads in flight,
// pieces just read, readers that came since), but not below turnPiece
// for a reader in turns while such a piece for every read in progress
// fits in a quarter of the room. fits is false when even the smallest
// piece (a block, or turnPiece) is too large for that.
//
// Readers that all read at once each read the chunk they hold to its
// end (their claims keep it), so whole chunks cost nothing twice; with
// pieces, 200 of them on 256 MiB made 12 to 28 times the GETs and ran
// at a third of the speed (bench/tierload). Readers that read in turns (a
// consumer catching up on many partitions reads a megabyte of each in
// turn, one or two partitions at a time) are idle between turns, and
// with whole chunks each turn fetched a chunk evicted before the
// reader's next turn: four times the bytes read (bench/kafkacatchup).
// A piece is checked against its blocks' CRC32Cs. GUARDED_BY(mu).
func (p *Pool) pieceSize(r *Reader) (w int64, fits bool) { return p.pieceSizeOf(r, true) }

// pieceSizeOf is pieceSize, without turnPiece unless turn: a read that
// starts a pass at offset 0 is the broker looking for a batch at a
// segment's start (its header, 4 or 16 KiB), seconds before it sends
// the partition; a turn's megabyte fetched for it was evicted before
// that and fetched again (bench/kafkacatchup: 3 GETs and 1.5 bytes
// fetched per byte consumed for each 2 MiB segment). GUARDED_BY(mu).
func (p *Pool) pieceSizeOf(r *Reader, turn bool) (w int64, fits bool) {
	m := r.m
	w = m.ChunkSize
	if m.Blocks() == 0 {
		return w, true
	}
	p.trimActive()
	readers := int64(max(1, p.active.Len()))
	if 2*p.reading.Load() >= readers {
		return w, true // most of them read now: whole chunks
	}
	share := p.room / (4 * readers)
	least := int64(0)
	if turn && r.turn > 0 {
		// A reader in turns reads a turn's worth at a time: pieces
		// smaller than that only cost it more requests (see
		// DefaultTurnPiece), as long as such a piece for every read
		// in progress fits in a quarter of the room: readers that
		// only seem to be in turns (they paused because their reads
		// waited for memory, hundreds of them) would get far more
		// than the memory holds. An object of up to two turns' pieces
		// is read in one: a broker sends a small segment whole, the
		// kernel reading ahead to its end (bench/kafkacatchup: 2 MiB
		// segments in two GETs each, the first 1 MiB and the rest).
		switch fit := p.room / (4 * max(1, p.reading.Load())); {
		case m.Size <= 2*p.turnPiece && 2*p.turnPiece <= fit:
			least = 2 * p.turnPiece
		case p.turnPiece <= fit:
			least = p.turnPiece
		}
	}
	for w > share && w/2 >= least {
		half, ok := m.halfPiece(w)
		if !ok {
			break
		}
		w = half
	}
	return w, w <= share
}

// DefaultTurnPiece is the least piece a reader in turns gets (a reader
// that paused between its reads in order: Reader.turn), however short
// its share of the memory: a Kafka consumer's turn of a partition
// (max.partition.fetch.bytes, 1 MiB). Smaller pieces fetch no fewer
// bytes a turn, only in more requests, one after another: a catch-up on
// 1,000 partitions from versitygw with 256 MiB made 28,200 GETs of
// 256 KiB pieces a consume at 106-116 MB/s, and 9,100 of 1 MiB at
// 148-170 MB/s (1.47x), for 1.52 bytes fetched per byte consumed
// against 1.18 (a turn's piece is fetched again when its claim was
// revoked between turns; bench/kafkacatchup -store s3).
const DefaultTurnPiece = 1 << 20

// firstRead says whether a read that starts a run of r (Reader.readBlocks)
// fetches its blocks alone, and whether the piece after them is fetched
// ahead. A reader in turns fetches its blocks and nothing more: the
// first read of its run is the broker looking for a batch (its header,
// 4 or 16 KiB), seconds before it sends the partition. A piece of its
// share fetched for that read (256 KiB at 1,000 partitions) was
// evicted before then, its bytes fetched again, and while it stayed in
// the table the segment's piece was split around it; its buffer, of
// another size than a turn's, was garbage for the collector
// (bench/kafkacatchup). The blocks' buffer is borrowed for the read
// and kept for the next. Any other reader fetches its blocks alone
// only while the memory has room for two pieces of each reader
// (pieceSize's fits), and then the piece after them too: with no room
// to read ahead, the blocks would only be fetched again with the piece
// that holds them.
//
// A pass that starts with blocks starts as one that starts with a piece
// (read): the pieces it reaches from offset 0 are claimed (else a
// claim waited for the piece where the last pass had got to, and the
// pieces before it were evicted between turns and fetched again:
// bench/kafkacatchup at 40 partitions and 64 MiB fetched 1.74 bytes
// per byte consumed against 1.18).
func (p *Pool) firstRead(r *Reader, m readMode) (alone, ahead bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m == readStart {
		r.want = 0
	}
	if r.turn > 0 {
		return true, false
	}
	_, fits := p.pieceSize(r)
	return fits, fits
}

// pieceAt is the chunk or piece of r's object that holds pos: one in
// the table (in reports it), else a new one of the size reads get now
// (pieceSizeOf; turn says whether a turn piece may apply), or smaller
// where that would hold bytes a piece in the table holds.
// Pieces are a chunk halved, so two of them are nested or apart: one
// that holds pos is found by its size; one the new piece would hold is
// smaller than it. Without that, readers whose piece size changed (the
// number of readers crossed a power of two) would fetch bytes again.
// GUARDED_BY(mu).
func (p *Pool) pieceAt(r *Reader, pos int64, turn bool) (id chunkID, in bool) {
	if id, in := p.holder(r, pos); in {
		return id, true
	}
	w, _ := p.pieceSizeOf(r, turn)
	for {
		half, ok := r.m.halfPiece(w)
		if !ok || !p.holdsPieces(r, r.pieceID(w, pos), half) {
			return r.pieceID(w, pos), false
		}
		w = half
	}
}

// holder is the chunk or piece of r's object in the table that holds
// pos, if there is one. GUARDED_BY(mu).
func (p *Pool) holder(r *Reader, pos int64) (id chunkID, in bool) {
	for w, ok := r.m.ChunkSize, true; ok; w, ok = r.m.halfPiece(w) {
		if id := r.pieceID(w, pos); p.chunks[id] != nil {
			return id, true
		}
	}
	return chunkID{}, false
}

// holdsPieces says whether a piece of r's object of at most w bytes in
// the table lies within id. GUARDED_BY(mu).
func (p *Pool) holdsPieces(r *Reader, id chunkID, w int64) bool {
	for ok := true; ok; w, ok = r.m.halfPiece(w) {
		for off := id.start(); off < id.start()+id.size && off < r.m.Size; off += w {
			if p.chunks[r.pieceID(w, off)] != nil {
				return true
			}
		}
	}
	return false
}

// borrow takes n bytes of the budget for a buffer of a read's own (the
// blocks of a first read), only if there is room now: it never waits,
// and never while a read waits. The caller hands it back with repay.
func (p *Pool) borrow(n int64) ([]byte, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waiters.Len() > 0 {
		return nil, false
	}
	buf, ok := p.take(n, true)
	if ok && buf == nil {
		buf = newBuf(n)
	}
	return buf, ok
}

// repay gives back a buffer of n bytes from borrow.
func (p *Pool) repay(buf []byte, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.putFree(buf, n)
	p.wake()
}

// hold adds a holder to c, taking it off the evictable lists.
func (p *Pool) hold(c *chunk) {
	if c.refs == 0 && c.elem != nil {
		if c.read {
			p.cached.Remove(c.elem)
		} else {
			p.ahead.Remove(c.elem)
		}
		c.elem = nil
	}
	c.refs++
}

// release drops a holder of c; with none left, a ready chunk becomes
// evictable and a failed one goes.
func (p *Pool) release(c *chunk) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unref(c)
	p.wake()
}

// unref drops a holder of c; a ready chunk left with none becomes
// evictable (the caller wakes waiters). GUARDED_BY(mu).
func (p *Pool) unref(c *chunk) {
	c.refs--
	if c.refs == 0 && c.state == chunkReady {
		p.park(c)
	}
}

// park makes c, ready and held by no one, evictable. GUARDED_BY(mu).
func (p *Pool) park(c *chunk) {
	if c.read {
		c.elem = p.cached.PushFront(c)
	} else {
		c.elem = p.ahead.PushFront(c)
	}
}

// fetch waits in line for c's buffer, then fills it.
func (p *Pool) fetch(c *chunk, f fetcher) {
	p.mu.Lock()
	var buf []byte
	ok := false
	if p.waiters.Len() == 0 { // else: in line behind them
		buf, ok = p.take(c.n, true)
	}
	var w *waiter
	if !ok {
		w = &waiter{n: c.n, ready: make(chan struct{})}
		p.waiters.PushBack(w)
		p.stats.Waits.Add(1)
	}
	p.mu.Unlock()
	if w != nil {
		t0 := time.Now()
		select {
		case <-w.ready:
			buf = w.buf
		case <-p.ctx.Done():
			p.mu.Lock()
			select {
			case <-w.ready: // served meanwhile: give it back
				p.giveBack(w.buf, w.n)
			default:
				p.removeWaiter(w)
			}
			p.mu.Unlock()
			p.finish(c, nil, p.ctx.Err())
			p.wg.Done()
			return
		}
		p.stats.WaitNanos.Add(int64(time.Since(t0)))
	}
	p.fetchInto(c, buf, f)
}

// fetchInto fills buf (nil: allocate c.n bytes, already counted) with
// chunk c and makes it ready, or failed.
func (p *Pool) fetchInto(c *chunk, buf []byte, f fetcher) {
	defer p.wg.Done()
	p.mu.Lock()
	if c.refs == 0 && !c.ahead { // every read gave up while it waited
		p.giveBack(buf, c.n)
		p.mu.Unlock()
		p.finish(c, nil, context.Canceled)
		return
	}
	p.mu.Unlock()
	if buf == nil {
		buf = newBuf(c.n)
	}
	p.stats.Misses.Add(1)
	err := f(p.ctx, c.id, buf)
	if err != nil {
		p.stats.FetchErrors.Add(1)
		if c.ahead && p.ctx.Err() == nil {
			p.log.Debug("read-ahead failed", "key", c.id.key, "chunk", c.id.i, "err", err)
		}
	} else {
		p.stats.FetchedBytes.Add(c.n)
	}
	p.finish(c, buf, err)
}

// finish ends c's fetch: ready, or failed with err (its buffer, if any,
// freed, and c out of the table so the next read tries again).
func (p *Pool) finish(c *chunk, buf []byte, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.ahead {
		p.aheadBusy -= c.n
	}
	if err != nil {
		c.state, c.err = chunkFailed, err
		if buf != nil {
			p.putFree(buf, c.n)
		}
		delete(p.chunks, c.id)
	} else {
		c.state, c.buf = chunkReady, buf
		if c.refs == 0 {
			p.park(c)
		}
	}
	close(c.done)
	p.wake()
}

// take finds n bytes: a free buffer of n's capacity class (bufCap),
// room (then buf is nil: the caller allocates newBuf(n)), room made by
// letting free buffers of other classes go, or by evicting chunks no
// one holds (cache first; read-ahead only for a read). Free buffers go
// before any chunk: they hold no bytes anyone will read, and pieces,
// the last piece of each object above all, come in many lengths, so
// buffers kept for reuse would otherwise push out the chunks readers
// come back for. A free buffer of n's class is filled again even while
// the pool uses more than its room (SetRoom, which brings it down, let
// go of what it could): the pool does not grow by it, and a buffer let
// go and another allocated would be garbage for the collector. A pool
// that holds nothing allocates whatever its room, so a read always goes
// on. GUARDED_BY(mu).
func (p *Pool) take(n int64, read bool) (buf []byte, ok bool) {
	for {
		if b := p.popFree(n); b != nil {
			return b, true
		}
		if k := bufCap(n); p.used+k <= p.room || p.used == 0 {
			p.used += k
			return nil, true
		}
		if p.dropFree() {
			continue
		}
		if p.evict(read) {
			continue
		}
		if read && p.revokeIdle() {
			continue
		}
		return nil, false
	}
}

// readMode says how a read relates to its reader's earlier reads.
type readMode uint8

const (
	readRandom     readMode = iota // at no particular place: claims nothing
	readSequential                 // following the reader's last read
	readStart                      // starting a sequential pass (at offset 0)
)

// read holds the chunk or piece of r's object that holds pos for one
// read, and says where it starts. A sequential reader keeps a claim on
// the piece it has reached (r.want) until it reaches a later one, so the
// piece it is in the middle of is not evicted under it, and every read
// of it after the first costs no lookup. The kernel may send a reader's
// requests slightly out of order: a request behind the piece reached
// neither claims its piece nor lets the claim go. A reader at random
// offsets claims nothing; what it read stays in the cache while room
// allows.
func (p *Pool) read(ctx context.Context, r *Reader, pos int64, mode readMode) (Pin, int64, error) {
	p.mu.Lock()
	id, _ := p.pieceAt(r, pos, mode != readStart)
	start := id.start()
	switch {
	case mode == readStart:
		r.want = start
	case mode == readSequential && start > r.want:
		r.want = start
	}
	if cl := r.claim; cl != nil {
		if cl.c.id == id {
			cl.c.refs++
			cl.used = p.now()
			p.claims.MoveToBack(cl.elem) // the list stays in order of use
			p.stats.Hits.Add(1)
			p.mu.Unlock()
			return Pin{p: p, c: cl.c, b: cl.c.buf}, start, nil
		}
		if cl.c.id.start() != r.want {
			p.dropClaim(cl) // before any wait: a waiting reader holds nothing
			p.wake()
		}
	}
	p.mu.Unlock()
	h, err := p.get(ctx, id, r.pieceLen(id), r.fetch)
	if err != nil {
		return h, 0, err
	}
	p.mu.Lock()
	if mode != readRandom && start == r.want && r.claim == nil && !r.closed.Load() {
		h.c.refs++
		h.c.claims++
		cl := &claim{c: h.c, r: r, used: p.now()}
		cl.elem = p.claims.PushBack(cl)
		r.claim = cl
	}
	p.mu.Unlock()
	return h, start, nil
}

// dropClaim lets a reader's claim go. GUARDED_BY(mu).
func (p *Pool) dropClaim(cl *claim) {
	p.claims.Remove(cl.elem)
	cl.r.claim = nil
	cl.c.claims--
	p.unref(cl.c)
}

// revokeIdle revokes the claim unused for longest if it has been unused
// for claimIdle and no read holds its chunk, so that a waiting read can
// have the room; else it makes sure waiters are woken when one can be.
// GUARDED_BY(mu).
func (p *Pool) revokeIdle() bool {
	// The claims are in order of use: the first no read holds is the
	// one unused for longest, found without a look at every reader's.
	var oldest *claim
	for e := p.claims.Front(); e != nil && oldest == nil; e = e.Next() {
		if cl := e.Value.(*claim); cl.c.refs == cl.c.claims {
			oldest = cl
		}
	}
	if oldest == nil {
		return false
	}
	if wait := oldest.used.Add(p.claimIdle).Sub(p.now()); wait > 0 {
		if p.timer == nil {
			p.timer = time.AfterFunc(wait, func() {
				p.mu.Lock()
				defer p.mu.Unlock()
				p.timer = nil
				p.wake()
			})
		}
		return false
	}
	p.stats.Revoked.Add(1)
	p.dropClaim(oldest)
	return true
}

// leave stops counting r among the readers and lets its claim go, if it
// has one: when r closes, and when it has read to its object's end
// (Kafka keeps a segment open long after its consumers have read past
// it; its last piece is cache then, the first memory a read takes).
func (p *Pool) leave(r *Reader) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forget(r)
	if r.claim != nil {
		p.dropClaim(r.claim)
		p.wake()
	}
}

// evict drops the least recently used chunk no one holds, its buffer
// kept free. GUARDED_BY(mu).
func (p *Pool) evict(read bool) bool {
	l := &p.cached
	if l.Len() == 0 {
		if !read {
			return false
		}
		l = &p.ahead
	}
	e := l.Back()
	if e == nil {
		return false
	}
	c := e.Value.(*chunk)
	l.Remove(e)
	c.elem = nil
	if !c.read {
		p.stats.AheadWasted.Add(1)
	}
	delete(p.chunks, c.id)
	p.putFree(c.buf, c.n)
	c.buf = nil
	return true
}

// giveBack returns memory taken for n bytes: buf, or the room for it
// when buf is nil. GUARDED_BY(mu).
func (p *Pool) giveBack(buf []byte, n int64) {
	if buf == nil {
		p.used -= bufCap(n)
		return
	}
	p.putFree(buf, n)
}

// bufStep: a buffer of at least this many bytes has a capacity of a
// multiple of it (a smaller one, a power of two of at least 4 KiB).
const bufStep = 64 << 10

// bufCap is the capacity of a buffer for n bytes, what the pool counts
// for it: n rounded up to a multiple of bufStep (to a power of two
// below). Free buffers are kept by capacity, so a fetch reuses one of
// a chunk of another length of the same class: the last pieces of
// objects, and the chunks of objects of nearly the same size, come in as
// many lengths as there are objects, and with buffers kept by length a
// catch-up on 1,000 partitions allocated a quarter of its bytes fetched
// anew (bench/kafkacatchup), garbage for the collector. What a capacity
// holds beyond n is at most 64 KiB, or half of it below that.
func bufCap(n int64) int64 {
	if n >= bufStep {
		return (n + bufStep - 1) / bufStep * bufStep
	}
	c := int64(4 << 10)
	for c < n {
		c <<= 1
	}
	return c
}

// newBuf is a buffer of n bytes and bufCap(n) of capacity.
func newBuf(n int64) []byte { return make([]byte, n, bufCap(n)) }

// putFree keeps b, a buffer of n bytes, for reuse. GUARDED_BY(mu).
func (p *Pool) putFree(b []byte, n int64) {
	k := int64(cap(b))
	p.free[k] = append(p.free[k], b[:0])
	p.freeBytes += k
}

// popFree is a free buffer for n bytes, or nil. GUARDED_BY(mu).
func (p *Pool) popFree(n int64) []byte {
	b := p.popClass(bufCap(n))
	if b == nil {
		return nil
	}
	return b[:n]
}

// popClass is a free buffer of capacity k, or nil. GUARDED_BY(mu).
func (p *Pool) popClass(k int64) []byte {
	bs := p.free[k]
	if len(bs) == 0 {
		return nil
	}
	b := bs[len(bs)-1]
	bs[len(bs)-1] = nil
	if len(bs) == 1 {
		delete(p.free, k)
	} else {
		p.free[k] = bs[:len(bs)-1]
	}
	p.freeBytes -= k
	return b
}

// dropFree lets one free buffer go to the garbage collector, making room
// for a buffer of another capacity: one of the smallest capacity, the
// least garbage (a first read's blocks, borrowed for a moment, let a
// turn's megabyte go, to be allocated again for the next turn).
// GUARDED_BY(mu).
func (p *Pool) dropFree() bool {
	least := int64(-1)
	for k := range p.free {
		if least < 0 || k < least {
			least = k
		}
	}
	if least < 0 {
		return false
	}
	p.popClass(least)
	p.used -= least
	return true
}

// wake serves waiting reads, first come first served, while memory
// allows. GUARDED_BY(mu).
func (p *Pool) wake() {
	for e := p.waiters.Front(); e != nil; e = p.waiters.Front() {
		w := e.Value.(*waiter)
		buf, ok := p.take(w.n, true)
		if !ok {
			return
		}
		p.waiters.Remove(e)
		w.buf = buf
		close(w.ready)
	}
}

func (p *Pool) removeWaiter(w *waiter) {
	for e := p.waiters.Front(); e != nil; e = e.Next() {
		if e.Value.(*waiter) == w {
			p.waiters.Remove(e)
			return
		}
	}
}

// retryPolicyOf is the retry policy of a Reader that tries a chunk
// attempts times (2 when 0).
func retryPolicyOf(attempts int) retryPolicy {
	policy := defaultRetry
	policy.attempts = attempts
	if policy.attempts <= 0 {
		policy.attempts = 2
	}
	return policy
}
