package chunkxfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

// readRange reads [off, off+n) of rd in reads of 1 KiB and checks the
// bytes against want.
func readRange(t *testing.T, rd *Reader, off, n int64, want []byte) {
	t.Helper()
	buf := make([]byte, 1<<10)
	for pos := off; pos < min(off+n, rd.Size()); {
		k, err := rd.ReadAt(buf[:min(int64(len(buf)), off+n-pos)], pos)
		if err != nil && pos+int64(k) != rd.Size() {
			t.Fatalf("at %d: %d, %v", pos, k, err)
		}
		if !bytes.Equal(buf[:k], want[pos:pos+int64(k)]) {
			t.Fatalf("at %d: not the object's bytes", pos)
		}
		pos += int64(k)
	}
}

// blockObjects uploads n objects of size bytes in chunks of cs and
// blocks of bs, named prefix0, prefix1 …, each of other random bytes.
func blockObjects(t *testing.T, s store.Store, prefix string, n int, size, cs, bs int64, seed uint64) (keys []string, wants map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	up := &Uploader{Store: s, JournalDir: filepath.Join(dir, "j"), ChunkSize: cs, BlockSize: bs}
	wants = map[string][]byte{}
	for i := range n {
		path := filepath.Join(dir, fmt.Sprint(i))
		key := fmt.Sprintf("%s%d", prefix, i)
		wants[key] = randomFile(t, path, size, seed+uint64(i))
		if _, err := up.Upload(context.Background(), path, key); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	return keys, wants
}

// blockPool uploads n objects (blockObjects) to a new in-memory store and
// makes a pool of limit bytes for them, closed when the test ends.
func blockPool(t *testing.T, prefix string, n int, size, cs, bs int64, seed uint64, limit int64) (*store.Mem, []string, map[string][]byte, *Pool) {
	t.Helper()
	m := store.NewMem(nil)
	keys, wants := blockObjects(t, m, prefix, n, size, cs, bs, seed)
	pool, err := NewPool(limit, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return m, keys, wants, pool
}

// openReaders opens a Reader of each of keys in pool, closed when the
// test ends.
func openReaders(t *testing.T, s store.Store, keys []string, pool *Pool, opts ReaderOptions) []*Reader {
	t.Helper()
	rds := make([]*Reader, len(keys))
	for i, k := range keys {
		rd, err := NewReader(context.Background(), s, k, pool, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rd.Close() })
		rds[i] = rd
	}
	return rds
}

// readersInOrder opens a Reader of each of keys (openReaders) and reads
// its start in two reads in order, so that each counts among pool's
// readers.
func readersInOrder(t *testing.T, s store.Store, keys []string, wants map[string][]byte, pool *Pool, opts ReaderOptions) []*Reader {
	t.Helper()
	rds := openReaders(t, s, keys, pool, opts)
	for i, rd := range rds {
		readRange(t, rd, 0, 10, wants[keys[i]])
		readRange(t, rd, 10, 10, wants[keys[i]])
	}
	return rds
}

// readInTurns reads each of rds in turns of turn bytes, one reader after
// the other, until each has read its object, appending what it read to
// got; it calls afterRead after each read and afterRound after each
// round (either may be nil) with the bytes read so far, and returns
// them.
func readInTurns(t *testing.T, rds []*Reader, got [][]byte, turn int, afterRead, afterRound func(read int64)) int64 {
	t.Helper()
	var read int64
	for left := true; left; {
		left = false
		for i, rd := range rds {
			off := int64(len(got[i]))
			if off >= rd.Size() {
				continue
			}
			left = true
			buf := make([]byte, turn)
			n, err := rd.ReadAt(buf, off)
			if err != nil && n != len(buf) && int64(n)+off != rd.Size() {
				t.Fatalf("reader %d at %d: %d bytes, %v", i, off, n, err)
			}
			got[i] = append(got[i], buf[:n]...)
			read += int64(n)
			if afterRead != nil {
				afterRead(read)
			}
		}
		if afterRound != nil {
			afterRound(read)
		}
	}
	return read
}

// TestManyReadersInTurnFetchWhatTheyRead: twelve readers of objects of
// their own, reading in turn an eighth of a chunk each (as a consumer
// catching up reads a megabyte of each of its partitions in turn), with
// a budget of four chunks: far too little for a chunk per reader. Each
// reader's reads get pieces of a chunk sized to its share, so the bytes
// fetched are about the bytes read; with whole chunks each turn would
// fetch a chunk evicted before the reader's next turn, eight times what
// it read. Every byte read is the object's. A lone reader afterwards
// fetches whole chunks again.
func TestManyReadersInTurnFetchWhatTheyRead(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			cs := b.chunk
			bs := cs / 16 // pieces of 1/2 to 1/16 of a chunk
			const readers = 12
			keys, want := blockObjects(t, b.s, "turns/", readers, 2*cs+cs/3, cs, bs, 100)
			pool, _ := NewPool(4*cs, nil)
			defer pool.Close()
			pool.claimIdle = 20 * time.Millisecond // whole chunks would otherwise wait long for room
			rds := openReaders(t, b.s, keys, pool, ReaderOptions{ReadAhead: 4})
			got := make([][]byte, readers)
			turn := int(cs / 8)
			read := readInTurns(t, rds, got, turn, nil, nil)
			pool.mu.Lock()
			active := pool.active.Len()
			pool.mu.Unlock()
			if active != 0 {
				t.Fatalf("%d readers at their objects' ends, still open, count as reading", active)
			}
			for i, k := range keys {
				if !bytes.Equal(got[i], want[k]) {
					t.Fatalf("reader %d read %d bytes, not its object's %d", i, len(got[i]), len(want[k]))
				}
				rds[i].Close()
			}
			waitIdle(t, pool)
			st := pool.Stats()
			fetched := st.FetchedBytes.Load()
			t.Logf("%d readers in turn: %d bytes read, %d fetched (%.2f×), %d waits, %d claims revoked, %d read-ahead wasted",
				readers, read, fetched, float64(fetched)/float64(read), st.Waits.Load(), st.Revoked.Load(), st.AheadWasted.Load())
			if fetched > read+read/5 {
				t.Fatalf("%d bytes fetched for %d read: more than 1.2×", fetched, read)
			}
			if u := pool.Usage(); u.Windows != 0 || u.InUse != 0 || u.Used() > pool.Limit() {
				t.Fatalf("after the readers closed: %+v", u)
			}

			// Alone, a reader gets whole chunks: one GET a chunk.
			pool2, _ := NewPool(4*cs, nil)
			defer pool2.Close()
			lone, err := NewReader(ctx, b.s, keys[0], pool2, ReaderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer lone.Close()
			buf := make([]byte, turn)
			var all []byte
			for off := int64(0); off < lone.Size(); off += int64(turn) {
				n, _ := lone.ReadAt(buf, off)
				all = append(all, buf[:n]...)
			}
			if !bytes.Equal(all, want[keys[0]]) || lone.Fetches() != int64(lone.Manifest().Chunks()) {
				t.Fatalf("a lone reader: equal %v, %d GETs for %d chunks", bytes.Equal(all, want[keys[0]]), lone.Fetches(), lone.Manifest().Chunks())
			}
		})
	}
}

// TestPiecesAreChecked: a piece of a chunk is checked against its
// blocks' CRC32Cs. A block that comes back corrupt is an error naming
// it, never its bytes; once the store is sound the same read returns the
// object's bytes.
func TestPiecesAreChecked(t *testing.T) {
	ctx := context.Background()
	const cs, bs = 64 << 10, 4 << 10
	m, keys, wants, pool := blockPool(t, "k", 16, 2*cs, cs, bs, 200, 2*cs)
	want := wants[keys[0]]
	// Fifteen other readers reading in turns: the reader's share is a
	// sixteenth of the budget, so its reads get pieces of 4 KiB.
	readersInOrder(t, m, keys[1:], wants, pool, ReaderOptions{})
	rd, _ := NewReader(ctx, m, keys[0], pool, ReaderOptions{Attempts: 2})
	defer rd.Close()
	readRange(t, rd, 0, 100, want)
	readRange(t, rd, 100, 100, want)
	waitIdle(t, pool)
	m.Inject(store.Fault{Op: store.OpGet, KeyPrefix: keys[0], FlipAt: 10, Times: 1000})
	off := int64(cs + 5*bs + 1) // sequential to nothing: a random read, in no piece yet
	// More than maxBlockRead blocks: read from pieces, not blocks of a
	// first read.
	n, err := rd.ReadAt(make([]byte, 3*bs), off)
	if !errors.Is(err, ErrChecksum) || n != 0 || !strings.Contains(err.Error(), "block 21 of k0") {
		t.Fatalf("corrupt piece: %d bytes, %v", n, err)
	}
	m.ClearFaults()
	waitIdle(t, pool)
	// In order from there, in turns: pieces, each checked, and the
	// object's bytes.
	for pos := off; pos < rd.Size(); pos += 2 * bs {
		readRange(t, rd, pos, 2*bs, want)
	}
	if rd.Fetches() < 4 {
		t.Fatalf("%d piece GETs for %d bytes in pieces of %d", rd.Fetches(), rd.Size()-off, bs)
	}
}

// TestPiecesNeverOverlap: a reader whose pieces grow (the other readers
// left) fetches around the smaller pieces already in memory, never the
// same bytes twice: with read-ahead on and room to spare, the bytes
// fetched for its pass are its object's, plus the block of its first
// read.
func TestPiecesNeverOverlap(t *testing.T) {
	ctx := context.Background()
	const cs, bs = 64 << 10, 4 << 10
	m, keys, wants, pool := blockPool(t, "o", 16, 4*cs-100, cs, bs, 300, 16*cs)
	want := wants[keys[0]]
	others := readersInOrder(t, m, keys[1:], wants, pool, ReaderOptions{})
	waitIdle(t, pool)
	base := pool.Stats().FetchedBytes.Load()
	rd, _ := NewReader(ctx, m, keys[0], pool, ReaderOptions{ReadAhead: 2})
	defer rd.Close()
	for pos := int64(0); pos < cs/2; pos += cs / 8 {
		readRange(t, rd, pos, cs/8, want) // sixteen readers, one reading: pieces of 16 KiB
	}
	if u := pool.Usage(); u.Readers != 16 {
		t.Fatalf("%d readers, want 16", u.Readers)
	}
	for _, o := range others {
		o.Close()
	}
	readRange(t, rd, cs/2, rd.Size()-cs/2, want) // alone: whole chunks, fetched around the pieces
	waitIdle(t, pool)
	st := pool.Stats()
	if fetched, wantBytes := st.FetchedBytes.Load()-base, rd.Size()+bs*rd.BlockFetches(); fetched != wantBytes || st.AheadWasted.Load() != 0 {
		t.Fatalf("fetched %d bytes for an object of %d and %d block reads of %d (%d read-ahead wasted)",
			fetched, rd.Size(), rd.BlockFetches(), bs, st.AheadWasted.Load())
	}
	if rd.Fetches() < 4 || rd.Fetches() > 12 {
		t.Fatalf("%d GETs: neither pieces nor chunks", rd.Fetches())
	}
}

// TestReadersReadingAtOnceGetWholeChunks: sixteen readers in order on
// room for eight chunks get pieces while few of them are reading at a
// time (readers in turns), and whole chunks while half of them or more
// are (each reads the chunk it holds to its end).
func TestReadersReadingAtOnceGetWholeChunks(t *testing.T) {
	const cs, bs = 64 << 10, 4 << 10
	m, keys, wants, pool := blockPool(t, "f", 1, 8*cs, cs, bs, 9, 8*cs)
	var rds []*Reader
	for range 16 {
		rd, _ := NewReader(context.Background(), m, keys[0], pool, ReaderOptions{})
		defer rd.Close()
		readRange(t, rd, 0, 100, wants[keys[0]])
		rds = append(rds, rd)
	}
	size := func() int64 {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		w, _ := pool.pieceSize(rds[0])
		return w
	}
	if u := pool.Usage(); u.Readers != 16 {
		t.Fatalf("%d readers, want 16", u.Readers)
	}
	if w := size(); w != cs/8 {
		t.Fatalf("no reader reading: pieces of %d, want %d (8 chunks / (4 × 16 readers))", w, cs/8)
	}
	pool.reading.Add(7) // seven reads in progress
	if w := size(); w != cs/8 {
		t.Fatalf("seven of sixteen reading: pieces of %d, want %d", w, cs/8)
	}
	pool.reading.Add(1)
	if w := size(); w != cs {
		t.Fatalf("eight of sixteen reading: pieces of %d, want whole chunks", w)
	}
	pool.reading.Add(-8)
}

// TestReadersInLongRoundsFetchWhatTheyRead: readers in turns whose
// round takes far longer than activeSpan (a consumer catching up on a
// thousand partitions comes back to each after 15 s) still count as
// readers, so their pieces are sized to their share of the memory.
// With 2 s of counting, a tenth of them counted, each turn fetched a
// piece four times what it read, evicted before the reader came back.
func TestReadersInLongRoundsFetchWhatTheyRead(t *testing.T) {
	for _, b := range backends(t) {
		if b.chunk > 64<<10 {
			continue // 24 objects of S3's 5 MiB parts: the same code, slowly
		}
		// With 2 chunks, two blocks per reader do not fit in half of
		// it.
		for _, budget := range []int64{4, 2} {
			t.Run(fmt.Sprintf("%s/%d-chunks", b.name, budget), func(t *testing.T) {
				cs := b.chunk
				bs := cs / 16
				const readers = 24
				keys, want := blockObjects(t, b.s, "rounds/", readers, 2*cs+cs/3, cs, bs, 400)
				pool, _ := NewPool(budget*cs, nil)
				defer pool.Close()
				pool.turnPiece = cs / 8 // a turn, as 1 MiB is of 8 MiB chunks
				tick := fakeClock(pool)
				rds := openReaders(t, b.s, keys, pool, ReaderOptions{ReadAhead: 4})
				got := make([][]byte, readers)
				var read2, fetched2 int64 // after two rounds
				rounds := 0
				read := readInTurns(t, rds, got, int(cs/8), func(int64) {
					waitIdle(t, pool) // its read-ahead, if any, lands before the clock moves
					tick(time.Second) // a round of 24 s
				}, func(read int64) {
					if rounds++; rounds == 2 {
						read2, fetched2 = read, pool.stats.FetchedBytes.Load()
					}
				})
				for i, k := range keys {
					if !bytes.Equal(got[i], want[k]) {
						t.Fatalf("reader %d read %d bytes, not its object's %d", i, len(got[i]), len(want[k]))
					}
				}
				st := pool.Stats()
				fetched := st.FetchedBytes.Load()
				t.Logf("%d readers in rounds of %d s: %d bytes read, %d fetched (%.2f×; %.2f× in the first two rounds), %d claims revoked, %d read-ahead wasted",
					readers, readers, read, fetched, float64(fetched)/float64(read), float64(fetched2)/float64(read2), st.Revoked.Load(), st.AheadWasted.Load())
				// A reader counts once it has come back after a pause: the
				// first round (and the part of the second before each has)
				// is sized for the readers seen so far.
				if r, f := read-read2, fetched-fetched2; f > r+r/5 {
					t.Fatalf("after two rounds: %d bytes fetched for %d read: more than 1.2×", f, r)
				}
			})
		}
	}
}

// TestManyReadersFirstReadAndReadAhead: with far more readers in turns
// than the memory holds two blocks of, a reader's first read fetches its
// pieces alone (not blocks, then the piece that holds them again), and
// nothing ahead: read-ahead would be evicted before its next turn.
func TestManyReadersFirstReadAndReadAhead(t *testing.T) {
	ctx := context.Background()
	const cs, bs = 64 << 10, 4 << 10
	m, keys, wants, pool := blockPool(t, "many/", 41, 2*cs, cs, bs, 500, 2*cs)
	// Forty readers that have read in order: a share of 128 KiB / 160,
	// less than a block.
	readersInOrder(t, m, keys[1:], wants, pool, ReaderOptions{ReadAhead: 4})
	waitIdle(t, pool)
	rd, _ := NewReader(ctx, m, keys[0], pool, ReaderOptions{ReadAhead: 4})
	defer rd.Close()
	blocks0, fetched0 := pool.stats.BlockFetches.Load(), pool.stats.FetchedBytes.Load()
	readRange(t, rd, 0, 2*bs, wants[keys[0]])
	readRange(t, rd, 2*bs, bs, wants[keys[0]])
	waitIdle(t, pool)
	if b := pool.stats.BlockFetches.Load() - blocks0; b != 0 {
		t.Fatalf("%d first-read block fetches while reads get pieces", b)
	}
	if f := pool.stats.FetchedBytes.Load() - fetched0; f != 3*bs {
		t.Fatalf("%d bytes fetched for 3 blocks read, want %d: blocks twice, or read ahead", f, 3*bs)
	}
	if u := pool.Usage(); u.ReadAhead != 0 {
		t.Fatalf("read ahead with no room for it: %+v", u)
	}
}

// TestReadersInTurnsGetTurnSizedPieces: readers in turns whose share of
// the memory is less than a block still get pieces of at least the
// pool's turnPiece (DefaultTurnPiece: a consumer's turn), so a turn of
// four blocks is one or two GETs rather than four or five; every byte
// read is the object's. Measured from the second round: a reader is in
// turns once it has paused.
func TestReadersInTurnsGetTurnSizedPieces(t *testing.T) {
	for _, b := range backends(t) {
		if b.chunk > 64<<10 {
			continue // 24 objects of S3's 5 MiB parts: the same code, slowly
		}
		t.Run(b.name, func(t *testing.T) {
			cs := b.chunk
			bs := cs / 16
			const readers = 24
			keys, want := blockObjects(t, b.s, "turnpieces/", readers, 2*cs+cs/3, cs, bs, 500)
			gets := map[int64]int64{}
			for _, floor := range []int64{0, cs / 4} {
				pool, _ := NewPool(2*cs, nil) // far less than a block a reader
				defer pool.Close()
				pool.turnPiece = floor
				tick := fakeClock(pool)
				rds := openReaders(t, b.s, keys, pool, ReaderOptions{ReadAhead: 4})
				got := make([][]byte, readers)
				var first int64
				rounds := 0
				read := readInTurns(t, rds, got, int(cs/4), func(int64) {
					waitIdle(t, pool)
					tick(time.Second) // a round of 24 s
				}, func(int64) {
					if rounds++; rounds == 1 {
						first = pool.stats.Misses.Load()
					}
				})
				for i, k := range keys {
					if !bytes.Equal(got[i], want[k]) {
						t.Fatalf("least piece %d: reader %d read %d bytes, not its object's %d", floor, i, len(got[i]), len(want[k]))
					}
				}
				gets[floor] = pool.stats.Misses.Load() - first
				t.Logf("least piece %d: %d bytes read, %d fetched, %d GETs after the first round", floor, read, pool.stats.FetchedBytes.Load(), gets[floor])
			}
			if gets[cs/4]*2 > gets[0] {
				t.Fatalf("GETs after the first round: %d with pieces of at least a turn, %d without: want at most half", gets[cs/4], gets[0])
			}
		})
	}
}

// TestTurnPiecesOnlyWhileFewRead: a reader in turns gets pieces of at
// least turnPiece only while such a piece for every read in progress
// fits in a quarter of the room. Hundreds of readers reading at once
// whose reads wait for memory also look as if they paused between
// turns; a turn's piece each would be far more than the memory holds.
func TestTurnPiecesOnlyWhileFewRead(t *testing.T) {
	const cs, bs = 64 << 10, 4 << 10
	_, _, _, pool, rds := crowdedPool(t, 1, 8*cs, cs, bs, 11)
	size := func(r *Reader, turn time.Duration, reading int64) int64 {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		r.turn = turn
		pool.reading.Add(reading)
		defer pool.reading.Add(-reading)
		w, _ := pool.pieceSize(r)
		return w
	}
	for _, c := range []struct {
		turn    time.Duration
		reading int64
		want    int64
		why     string
	}{
		{0, 1, bs, "not in turns: a block (8 chunks / (4 × 64 readers) is less)"},
		{time.Second, 1, cs / 4, "in turns, one read in progress: a turn's piece"},
		{time.Second, 8, cs / 4, "in turns, 8 reads in progress (8 × 4 turn pieces is the room)"},
		{time.Second, 9, bs, "in turns, 9 reads in progress: no room for a turn's piece each"},
		{time.Second, 31, bs, "in turns, 31 of 64 reading"},
		{time.Second, 32, cs, "half of the readers reading: whole chunks"},
	} {
		if w := size(rds[0], c.turn, c.reading); w != c.want {
			t.Errorf("%s: pieces of %d, want %d", c.why, w, c.want)
		}
	}
}

// TestAPassStartGetsNoTurnPiece: a reader in turns that starts a pass at
// offset 0 (a broker looking for a batch at a segment's start, seconds
// before it sends the partition) fetches no turn's piece there (it
// fetches its block alone, Pool.firstRead): the turn's piece was
// evicted before the partition was sent, and fetched again. Its reads in order after that get turn
// pieces.
func TestAPassStartGetsNoTurnPiece(t *testing.T) {
	const cs, bs = 64 << 10, 4 << 10
	m, keys, wants, pool, _ := crowdedPool(t, 2, 2*cs, cs, bs, 13)
	rd := readerInTurns(t, m, keys[1], pool, ReaderOptions{})
	fetched := func(read func()) int64 {
		waitIdle(t, pool)
		before := pool.stats.FetchedBytes.Load()
		read()
		waitIdle(t, pool)
		return pool.stats.FetchedBytes.Load() - before
	}
	if n := fetched(func() { readRange(t, rd, 0, 100, wants[keys[1]]) }); n != bs {
		t.Fatalf("a pass's start fetched %d bytes, want a block (%d)", n, bs)
	}
	// In order past the turn piece that would hold the block (the
	// pieces around a piece in the table are made smaller).
	if n := fetched(func() { readRange(t, rd, cs/4, bs, wants[keys[1]]) }); n != cs/4 {
		t.Fatalf("a read in order after it fetched %d bytes, want a turn's piece (%d)", n, cs/4)
	}
}

// TestAPassStartInTurnsFetchesItsBlocksAlone: with a share of the
// memory between a block and a turn's piece, a reader in turns that
// starts a pass fetches the blocks it reads and nothing ahead (the
// broker's look at a batch header, seconds before it sends the
// partition), where it fetched a share-sized piece; a reader not in
// turns still fetches its blocks and the piece after them.
func TestAPassStartInTurnsFetchesItsBlocksAlone(t *testing.T) {
	const cs, bs = 64 << 10, 4 << 10
	m, keys, wants, pool := blockPool(t, "turns/", 3, 2*cs, cs, bs, 17, 8*cs)
	pool.turnPiece = cs / 2
	// Eight readers in order: a share of 16 KiB, four blocks, half a
	// turn's piece.
	for _, rd := range openReaders(t, m, slices.Repeat([]string{keys[0]}, 8), pool, ReaderOptions{}) {
		readRange(t, rd, 0, 100, wants[keys[0]])
	}
	fetched := func(read func()) (n, ahead int64) {
		waitIdle(t, pool)
		before, wasted := pool.stats.FetchedBytes.Load(), pool.Usage().ReadAhead
		read()
		waitIdle(t, pool)
		return pool.stats.FetchedBytes.Load() - before, pool.Usage().ReadAhead - wasted
	}
	inTurns := readerInTurns(t, m, keys[1], pool, ReaderOptions{ReadAhead: 1})
	if n, ahead := fetched(func() { readRange(t, inTurns, 0, 100, wants[keys[1]]) }); n != bs || ahead != 0 {
		t.Fatalf("a pass's start in turns fetched %d bytes (%d ahead), want its block (%d) alone", n, ahead, bs)
	}
	fresh, _ := NewReader(context.Background(), m, keys[2], pool, ReaderOptions{ReadAhead: 1})
	defer fresh.Close()
	if n, ahead := fetched(func() { readRange(t, fresh, 0, 100, wants[keys[2]]) }); n <= bs || ahead == 0 {
		t.Fatalf("a first pass's start fetched %d bytes (%d ahead), want its block and a piece ahead", n, ahead)
	}
}

// TestAPassStartedWithBlocksClaimsItsPieces: a reader in turns that
// starts a second pass with its blocks alone claims the pieces that pass
// reaches from offset 0, as a pass started with a piece does, not only
// from where its last pass got to: unclaimed, they were evicted between
// turns and fetched again.
func TestAPassStartedWithBlocksClaimsItsPieces(t *testing.T) {
	const cs, bs = 64 << 10, 4 << 10
	m, keys, wants, pool, _ := crowdedPool(t, 2, 16*cs, cs, bs, 23)
	rd := readerInTurns(t, m, keys[1], pool, ReaderOptions{})
	for off := int64(0); off < 14*cs; off += 8 << 10 { // a first pass, its start evicted since
		readRange(t, rd, off, 8<<10, wants[keys[1]])
	}
	blocks := rd.BlockFetches()
	readRange(t, rd, 0, 100, wants[keys[1]]) // a second pass: its blocks alone
	if rd.BlockFetches() != blocks+1 {
		t.Fatalf("the second pass's start fetched no blocks alone")
	}
	readRange(t, rd, bs, 100, wants[keys[1]])
	pool.mu.Lock()
	defer pool.mu.Unlock()
	if rd.claim == nil || rd.claim.c.id.start() != 0 {
		t.Fatalf("the second pass's first piece is not claimed (claim %+v, want %d)", rd.claim, rd.want)
	}
}

// TestASmallObjectInTurnsIsOnePiece: a reader in turns reads an object
// of up to two turns' pieces in one GET (a broker sends a small segment
// whole), and a larger one in turn-sized pieces.
func TestASmallObjectInTurnsIsOnePiece(t *testing.T) {
	const cs, bs = 64 << 10, 4 << 10
	for _, c := range []struct {
		size   int64
		pieces int64
	}{{3 * cs / 8, 1}, {cs / 2, 1}, {cs, 4}} {
		m, keys, wants, pool, _ := crowdedPool(t, 2, c.size, cs, bs, 19)
		rd := readerInTurns(t, m, keys[1], pool, ReaderOptions{})
		readRange(t, rd, 0, 100, wants[keys[1]]) // its blocks alone
		waitIdle(t, pool)
		before := pool.stats.FetchedBytes.Load()
		for off := int64(bs); off < c.size; off += 8 << 10 {
			readRange(t, rd, off, min(8<<10, c.size-off), wants[keys[1]])
		}
		waitIdle(t, pool)
		if got, fetched := rd.Fetches(), pool.stats.FetchedBytes.Load()-before; got != c.pieces || fetched != c.size {
			t.Errorf("an object of %d bytes read in turns: %d pieces, %d bytes fetched; want %d, %d", c.size, got, fetched, c.pieces, c.size)
		}
	}
}

// readerInTurns opens key with a Reader that reads in turns (it paused a
// second between its reads in order); it closes when the test ends.
func readerInTurns(t *testing.T, m *store.Mem, key string, pool *Pool, opts ReaderOptions) *Reader {
	t.Helper()
	rd, err := NewReader(context.Background(), m, key, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	pool.mu.Lock()
	rd.turn = time.Second
	pool.mu.Unlock()
	return rd
}

// crowdedPool uploads n objects of size bytes (blockObjects) and makes a
// pool of 8 chunks with a turnPiece of a quarter chunk, whose 64 readers
// of the first object have each read its first 100 bytes: a share of the
// memory far below a block each. The pool closes when the test ends.
func crowdedPool(t *testing.T, n int, size, cs, bs int64, seed uint64) (*store.Mem, []string, map[string][]byte, *Pool, []*Reader) {
	t.Helper()
	m, keys, wants, pool := blockPool(t, "crowd/", n, size, cs, bs, seed, 8*cs)
	pool.turnPiece = cs / 4
	rds := openReaders(t, m, slices.Repeat([]string{keys[0]}, 64), pool, ReaderOptions{})
	for _, rd := range rds {
		readRange(t, rd, 0, 100, wants[keys[0]])
	}
	return m, keys, wants, pool, rds
}
