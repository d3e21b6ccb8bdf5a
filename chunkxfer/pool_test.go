package chunkxfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

// countingStore counts the bytes of GETs open at once, the most ever,
// and the GETs of each key.
type countingStore struct {
	store.Store
	mu       sync.Mutex
	open     int64
	peak     int64
	gets     map[string]int
	hold     time.Duration // each GET body stays open this long
	getCount atomic.Int64
}

func (c *countingStore) Get(ctx context.Context, key string, off, n int64, opt store.GetOptions) (io.ReadCloser, error) {
	rc, err := c.Store.Get(ctx, key, off, n, opt)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.open += n
	c.peak = max(c.peak, c.open)
	if c.gets == nil {
		c.gets = map[string]int{}
	}
	c.gets[key]++
	c.mu.Unlock()
	c.getCount.Add(1)
	time.Sleep(c.hold)
	return &countedBody{ReadCloser: rc, done: func() {
		c.mu.Lock()
		c.open -= n
		c.mu.Unlock()
	}}, nil
}

type countedBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *countedBody) Close() error {
	b.once.Do(b.done)
	return b.ReadCloser.Close()
}

// poolObjects uploads n objects of chunks chunks of cs bytes each (the
// last one shorter), each of other random bytes.
func poolObjects(t *testing.T, s store.Store, n, chunks int, cs int64) (keys []string, want map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	up := &Uploader{Store: s, JournalDir: dir, ChunkSize: cs}
	want = map[string][]byte{}
	for i := range n {
		key := fmt.Sprintf("p/%d", i)
		path := filepath.Join(dir, fmt.Sprint(i))
		want[key] = randomFile(t, path, int64(chunks)*cs-100, uint64(i+1))
		if _, err := up.Upload(context.Background(), path, key); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	return keys, want
}

// waitIdle waits until no fetch is in flight in p.
func waitIdle(t *testing.T, p *Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		u := p.Usage()
		if u.InFlight == 0 && u.Waiting == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fetches still in flight: %+v", u)
		}
		time.Sleep(time.Millisecond)
	}
}

// fakeClock makes pool's clock one that stands still until tick moves
// it on.
func fakeClock(pool *Pool) (tick func(time.Duration)) {
	var mu sync.Mutex
	clock := time.Unix(1_800_000_000, 0)
	pool.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	return func(d time.Duration) { mu.Lock(); defer mu.Unlock(); clock = clock.Add(d) }
}

// watchUsage looks at pool's usage every 50 µs until stop is called;
// stop returns the last usage bad said yes to, or "" if none.
func watchUsage(pool *Pool, bad func(Usage) bool) (stop func() string) {
	done := make(chan struct{})
	ended := make(chan struct{})
	var over atomic.Value
	go func() {
		defer close(ended)
		for {
			select {
			case <-done:
				return
			default:
			}
			if u := pool.Usage(); bad(u) {
				over.Store(fmt.Sprintf("%+v", u))
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	return func() string {
		close(done)
		<-ended
		v, _ := over.Load().(string)
		return v
	}
}

// readAtOnce has readers goroutines each read an object whole through a
// Reader of its own, all at once: reader r reads key(r), in ReadAts of
// size bytes (0: as io.ReadAll does). Every byte is checked against
// want; it returns how many readers read their object exactly.
func readAtOnce(t *testing.T, s store.Store, pool *Pool, readers int, key func(r int) string, opts ReaderOptions, size int, want map[string][]byte) int64 {
	t.Helper()
	var wg sync.WaitGroup
	var exact atomic.Int64
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := key(r)
			rd, err := NewReader(context.Background(), s, k, pool, opts)
			if err != nil {
				t.Error(err)
				return
			}
			defer rd.Close()
			var got []byte
			if size == 0 {
				got, err = io.ReadAll(io.NewSectionReader(rd, 0, rd.Size()))
			} else {
				b := make([]byte, size)
				for off := int64(0); off < rd.Size() && err == nil; {
					var n int
					n, err = rd.ReadAt(b, off)
					got = append(got, b[:n]...)
					off += int64(n)
				}
				if errors.Is(err, io.EOF) {
					err = nil
				}
			}
			if err != nil || !bytes.Equal(got, want[k]) {
				t.Errorf("reader %d of %s: %d bytes, %v; not the object's: %v", r, k, len(got), err, !bytes.Equal(got, want[k]))
				return
			}
			exact.Add(1)
		}()
	}
	wg.Wait()
	return exact.Load()
}

// TestPoolBoundsEveryChunkByte: 40 readers of 20 objects with read-ahead
// and a budget of four chunks. The bytes fetched at once (counted by the
// store) and every kind of chunk memory together stay within the budget,
// and every byte read is the object's.
func TestPoolBoundsEveryChunkByte(t *testing.T) {
	const cs = 64 << 10
	cst := &countingStore{Store: store.NewMem(nil), hold: time.Millisecond}
	keys, want := poolObjects(t, cst.Store, 20, 8, cs)
	pool, err := NewPool(4*cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// The budget holds at every moment we look.
	stop := watchUsage(pool, func(u Usage) bool { return u.Used() > u.Limit || u.InFlight < 0 })
	readAtOnce(t, cst, pool, 40, func(r int) string { return keys[r%len(keys)] }, ReaderOptions{ReadAhead: 4}, 0, want)
	if v := stop(); v != "" {
		t.Fatalf("chunk memory over the budget: %s", v)
	}
	if cst.peak > pool.Limit() {
		t.Fatalf("%d bytes fetched at once, budget %d", cst.peak, pool.Limit())
	}
	waitIdle(t, pool)
	u := pool.Usage()
	if u.InUse != 0 || u.Used() > u.Limit {
		t.Fatalf("after every read ended: %+v (nothing may stay in use)", u)
	}
	t.Logf("peak fetched at once %d of %d; %d GETs for %d chunks; waits %d; read-ahead skipped %d, wasted %d",
		cst.peak, pool.Limit(), cst.getCount.Load(), 20*8, pool.Stats().Waits.Load(), pool.Stats().AheadSkipped.Load(), pool.Stats().AheadWasted.Load())
}

// TestPoolNeverHandsOutAnotherChunksBytes reuses buffers as hard as it
// can: 64 readers, random ranges of 12 objects, a budget of three
// chunks, slices held for a while before they are checked and released.
// A buffer filled again while a reader holds it would show as wrong
// bytes here, and as a data race under -race.
func TestPoolNeverHandsOutAnotherChunksBytes(t *testing.T) {
	const cs = 16 << 10
	s := store.NewMem(nil)
	keys, want := poolObjects(t, s, 12, 5, cs)
	pool, _ := NewPool(3*cs, nil)
	defer pool.Close()
	pool.claimIdle = time.Millisecond // revoke claims at once: more reuse
	readers := map[string]*Reader{}
	for _, k := range keys {
		rd, err := NewReader(context.Background(), s, k, pool, ReaderOptions{ReadAhead: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer rd.Close()
		readers[k] = rd
	}
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 60 {
				key := keys[r.IntN(len(keys))]
				rd, w := readers[key], want[key]
				off := r.Int64N(int64(len(w)))
				n := 1 + r.IntN(cs)
				if b, release, ok, err := rd.Slice(context.Background(), off, n); ok {
					if err != nil {
						t.Errorf("slice of %s at %d: %v", key, off, err)
						return
					}
					if r.IntN(3) == 0 {
						time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
					}
					end := min(off+int64(n), int64(len(w)))
					if !bytes.Equal(b, w[off:end]) {
						t.Errorf("slice of %s at %d+%d: not the object's bytes", key, off, n)
					}
					release()
					continue
				}
				got := make([]byte, n)
				k, err := rd.ReadAt(got, off)
				if err != nil && !errors.Is(err, io.EOF) {
					t.Errorf("read of %s at %d: %v", key, off, err)
					return
				}
				if !bytes.Equal(got[:k], w[off:off+int64(k)]) {
					t.Errorf("read of %s at %d+%d: not the object's bytes", key, off, n)
				}
			}
		}()
	}
	wg.Wait()
	waitIdle(t, pool)
	if u := pool.Usage(); u.InUse != 0 || u.Used() > u.Limit {
		t.Fatalf("after every read: %+v", u)
	}
}

// TestPoolSharesChunksBetweenReaders: 8 handles of one object read it at
// once, each through its own Reader: one GET per chunk.
func TestPoolSharesChunksBetweenReaders(t *testing.T) {
	const cs = 64 << 10
	cst := &countingStore{Store: store.NewMem(nil), hold: 2 * time.Millisecond}
	keys, want := poolObjects(t, cst.Store, 1, 16, cs)
	pool, _ := NewPool(64*cs, nil)
	defer pool.Close()
	readAtOnce(t, cst, pool, 8, func(int) string { return keys[0] }, ReaderOptions{ReadAhead: 2}, 32<<10, want)
	waitIdle(t, pool)
	if n := cst.gets[keys[0]]; n != 16 {
		t.Fatalf("8 readers of 16 chunks made %d GETs, want 16", n)
	}
}

// TestPoolServesEveryReader: 200 readers of 20 objects and room for two
// chunks. Every reader finishes; reads waited in line, and read-ahead
// gave way to them. Each GET takes a millisecond, as a store's do: with
// the memory store's instant ones, reads of shared chunks sometimes all
// found them fetched and none waited (in about 1 run of 40).
func TestPoolServesEveryReader(t *testing.T) {
	const cs = 16 << 10
	s := &countingStore{Store: store.NewMem(nil), hold: time.Millisecond}
	keys, want := poolObjects(t, s.Store, 20, 4, cs)
	pool, _ := NewPool(2*cs, nil)
	defer pool.Close()
	if done := readAtOnce(t, s, pool, 200, func(r int) string { return keys[r%len(keys)] }, ReaderOptions{ReadAhead: 4}, 0, want); done != 200 {
		t.Fatalf("%d of 200 readers finished", done)
	}
	st := pool.Stats()
	if st.Waits.Load() == 0 {
		t.Fatal("no read waited for memory: the test did not press the budget")
	}
	t.Logf("waits %d (%.1f ms in all), read-ahead skipped %d", st.Waits.Load(), float64(st.WaitNanos.Load())/1e6, st.AheadSkipped.Load())
}

// TestPoolRefusesAChunkLargerThanTheBudget: an error that says so, not a
// wait for ever.
func TestPoolRefusesAChunkLargerThanTheBudget(t *testing.T) {
	const cs = 64 << 10
	s := store.NewMem(nil)
	keys, _ := poolObjects(t, s, 1, 2, cs)
	pool, _ := NewPool(cs/2, nil)
	defer pool.Close()
	rd, err := NewReader(context.Background(), s, keys[0], pool, ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = rd.ReadAt(make([]byte, 10), 0)
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("read of a chunk larger than the budget: %v", err)
	}
}

// TestPoolReadGivingUpWhileWaiting: a read whose context ends while it
// waits for memory returns, and takes nothing once memory frees.
func TestPoolReadGivingUpWhileWaiting(t *testing.T) {
	const cs = 64 << 10
	s := store.NewMem(nil)
	keys, want := poolObjects(t, s, 2, 2, cs)
	pool, _ := NewPool(cs, nil)
	defer pool.Close()
	a, _ := NewReader(context.Background(), s, keys[0], pool, ReaderOptions{})
	b, _ := NewReader(context.Background(), s, keys[1], pool, ReaderOptions{})
	sl, release, _, err := a.Slice(context.Background(), 0, 100) // holds the only room
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.ReadAtContext(ctx, make([]byte, 10), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read waiting for memory: %v", err)
	}
	if !bytes.Equal(sl, want[keys[0]][:100]) {
		t.Fatal("held slice changed")
	}
	release()
	waitIdle(t, pool)
	got := make([]byte, 10)
	if _, err := b.ReadAt(got, 0); err != nil || !bytes.Equal(got, want[keys[1]][:10]) {
		t.Fatalf("read after the room was freed: %v", err)
	}
	if u := pool.Usage(); u.Used() > u.Limit || u.InUse != 0 {
		t.Fatalf("%+v", u)
	}
}

// TestPoolFetchErrorIsNotKept: a failed fetch fails its readers, and the
// next read tries again.
func TestPoolFetchErrorIsNotKept(t *testing.T) {
	const cs = 64 << 10
	m := store.NewMem(nil)
	keys, want := poolObjects(t, m, 1, 2, cs)
	pool, _ := NewPool(4*cs, nil)
	defer pool.Close()
	rd, _ := NewReader(context.Background(), m, keys[0], pool, ReaderOptions{Attempts: 1})
	m.Inject(store.Fault{Op: store.OpGet, Err: errors.New("injected")})
	if _, err := rd.ReadAt(make([]byte, 10), 0); err == nil {
		t.Fatal("read through a failing GET succeeded")
	}
	m.ClearFaults()
	got := make([]byte, 10)
	if _, err := rd.ReadAt(got, 0); err != nil || !bytes.Equal(got, want[keys[0]][:10]) {
		t.Fatalf("read after the fault: %v", err)
	}
	if u := pool.Usage(); u.Used() > u.Limit {
		t.Fatalf("%+v", u)
	}
}

// TestPoolSequentialReadersFetchEachChunkOnce: 8 sequential readers of
// distinct objects, room for 4 chunks, small reads. Each reader keeps
// the chunk it is in the middle of (its claim), so no chunk is evicted
// under a reader and fetched again: one GET per chunk, though half the
// readers wait at any time.
func TestPoolSequentialReadersFetchEachChunkOnce(t *testing.T) {
	const cs = 64 << 10
	cst := &countingStore{Store: store.NewMem(nil), hold: time.Millisecond}
	keys, want := poolObjects(t, cst.Store, 8, 6, cs)
	pool, _ := NewPool(4*cs, nil)
	defer pool.Close()
	readAtOnce(t, cst, pool, len(keys), func(r int) string { return keys[r] }, ReaderOptions{}, 4<<10, want)
	n := 0
	for _, k := range keys {
		n += cst.gets[k] // chunk GETs (not the manifests')
	}
	if n != 8*6 {
		t.Fatalf("8 readers of 6 chunks each made %d GETs, want 48", n)
	}
	if pool.Stats().Waits.Load() == 0 {
		t.Fatal("no read waited: the test did not press the budget")
	}
	if u := pool.Usage(); u.Windows != 0 || u.InUse != 0 {
		t.Fatalf("closed readers still hold chunks: %+v", u)
	}
}

// TestPoolRevokesAnIdleReadersClaim: a reader that stopped in the middle
// of a chunk holds it only until another read needs the room and the
// claim has been unused for claimIdle.
func TestPoolRevokesAnIdleReadersClaim(t *testing.T) {
	const cs = 64 << 10
	s := store.NewMem(nil)
	keys, want := poolObjects(t, s, 2, 2, cs)
	pool, _ := NewPool(cs, nil)
	defer pool.Close()
	pool.claimIdle = 50 * time.Millisecond
	idle, _ := NewReader(context.Background(), s, keys[0], pool, ReaderOptions{})
	defer idle.Close()
	if _, err := idle.ReadAt(make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
	if u := pool.Usage(); u.Windows != cs {
		t.Fatalf("the reader's claim: %+v", u)
	}
	other, _ := NewReader(context.Background(), s, keys[1], pool, ReaderOptions{})
	defer other.Close()
	got := make([]byte, 100)
	t0 := time.Now()
	if _, err := other.ReadAt(got, 0); err != nil || !bytes.Equal(got, want[keys[1]][:100]) {
		t.Fatalf("read past an idle claim: %v", err)
	}
	if time.Since(t0) < 40*time.Millisecond || pool.Stats().Revoked.Load() != 1 {
		t.Fatalf("the claim was taken after %v, %d revoked", time.Since(t0), pool.Stats().Revoked.Load())
	}
	// The idle reader reads on: its chunk comes back.
	if _, err := idle.ReadAt(got, 200); err != nil || !bytes.Equal(got, want[keys[0]][200:300]) {
		t.Fatalf("the idle reader after its claim was revoked: %v", err)
	}
}

// TestPoolRevokesTheClaimUnusedForLongest: of two idle readers' claims,
// a read that needs the room takes the one whose reader read last the
// longest ago, though its claim was made first: the claims are kept in
// order of use, and the first one no read holds is revoked.
func TestPoolRevokesTheClaimUnusedForLongest(t *testing.T) {
	const cs = 64 << 10
	s := store.NewMem(nil)
	keys, want := poolObjects(t, s, 3, 2, cs)
	pool, _ := NewPool(2*cs, nil)
	defer pool.Close()
	pool.claimIdle = 50 * time.Millisecond
	tick := fakeClock(pool)
	rds := make([]*Reader, 3)
	for i, k := range keys {
		rds[i], _ = NewReader(context.Background(), s, k, pool, ReaderOptions{})
		defer rds[i].Close()
	}
	got := make([]byte, 100)
	read := func(i int, off int64) {
		t.Helper()
		if _, err := rds[i].ReadAt(got, off); err != nil || !bytes.Equal(got, want[keys[i]][off:off+100]) {
			t.Fatalf("reader %d at %d: %v", i, off, err)
		}
		tick(10 * time.Millisecond)
	}
	read(0, 0)   // the first claim
	read(1, 0)   // the second: the budget is full
	read(0, 200) // the first reader reads on in its chunk
	tick(time.Second)
	read(2, 0) // needs the room of one claim
	if n := pool.Stats().Revoked.Load(); n != 1 {
		t.Fatalf("%d claims revoked, want 1", n)
	}
	pool.mu.Lock()
	kept, revoked := rds[0].claim != nil, rds[1].claim == nil
	pool.mu.Unlock()
	if !kept || !revoked {
		t.Fatalf("the first reader's claim kept: %v, the second's revoked: %v; want the second's, unused for longest", kept, revoked)
	}
}

// TestPoolLetsFreeBuffersGoBeforeChunks: buffers kept for reuse whose
// lengths no fetch wants (pieces and objects' last chunks come in many
// lengths) go before any chunk a reader may come back for: a read that
// needs room keeps the cache and lets them go.
func TestPoolLetsFreeBuffersGoBeforeChunks(t *testing.T) {
	const cs = 16 << 10
	s := store.NewMem(nil)
	keys, want := poolObjects(t, s, 2, 2, cs)
	pool, _ := NewPool(4*cs, nil)
	defer pool.Close()
	a, _ := NewReader(context.Background(), s, keys[0], pool, ReaderOptions{})
	defer a.Close()
	got := make([]byte, 100)
	if _, err := a.ReadAt(got, cs/2); err != nil || !bytes.Equal(got, want[keys[0]][cs/2:cs/2+100]) {
		t.Fatalf("first read: %v", err)
	}
	// Most of the rest of the budget in free buffers of three other
	// capacities (bufCap: a chunk of cs-1 bytes would share the chunks').
	lens := []int64{2*cs - 1, cs / 2, cs / 4}
	var bufs [][]byte
	for _, n := range lens {
		b, ok := pool.borrow(n)
		if !ok {
			t.Fatalf("no room for a buffer of %d: %+v", n, pool.Usage())
		}
		bufs = append(bufs, b)
	}
	for i, b := range bufs {
		pool.repay(b, lens[i])
	}
	if u := pool.Usage(); u.Cache != cs || u.Free != 2*cs+cs/2+cs/4 {
		t.Fatalf("before the read: %+v", u)
	}
	b, _ := NewReader(context.Background(), s, keys[1], pool, ReaderOptions{})
	defer b.Close()
	if _, err := b.ReadAt(got, cs/2); err != nil || !bytes.Equal(got, want[keys[1]][cs/2:cs/2+100]) {
		t.Fatalf("second read: %v", err)
	}
	if !pool.covers(a, cs/2) {
		t.Fatalf("the cached chunk went while free buffers stayed: %+v", pool.Usage())
	}
	if u := pool.Usage(); u.Used() > pool.Limit() {
		t.Fatalf("over the budget: %+v", u)
	}
}

// TestPoolKeepsToItsRoom: room taken from the pool (SetRoom) lets its
// cache and free buffers go at once, its held chunks as they are let go,
// and bounds what it fetches from then on; room given back is used, and
// a pool that holds nothing still serves a read larger than its room.
func TestPoolKeepsToItsRoom(t *testing.T) {
	const cs = 16 << 10
	s := store.NewMem(nil)
	keys, want := poolObjects(t, s, 2, 8, cs)
	pool, _ := NewPool(8*cs, nil)
	defer pool.Close()
	pool.minRoom = cs / 2
	read := func(key string) {
		t.Helper()
		r, err := NewReader(context.Background(), s, key, pool, ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		got, err := io.ReadAll(io.NewSectionReader(r, 0, r.Size()))
		if err != nil || !bytes.Equal(got, want[key]) {
			t.Fatalf("%s: %d bytes, %v", key, len(got), err)
		}
	}
	read(keys[0])
	if u := pool.Usage(); u.Used() != 8*cs {
		t.Fatalf("after one object read whole: %+v, want all of it cached (its last chunk's buffer is a whole chunk's, bufCap)", u)
	}
	pool.SetRoom(3 * cs)
	if u := pool.Usage(); u.Used() > 3*cs || u.Room != 3*cs {
		t.Fatalf("with a room of 3 chunks: %+v", u)
	}
	// Reads go on within the room.
	stop := watchUsage(pool, func(u Usage) bool { return u.Used() > 3*cs })
	readAtOnce(t, s, pool, 6, func(r int) string { return keys[r%2] }, ReaderOptions{ReadAhead: 2}, 0, want)
	if v := stop(); v != "" {
		t.Fatalf("over the room: %s", v)
	}
	// Less room than the least one: the least one.
	pool.SetRoom(-1)
	if u := pool.Usage(); u.Room != cs/2 || u.Used() > cs/2 {
		t.Fatalf("with no room: %+v, want the least room, %d", u, cs/2)
	}
	read(keys[1]) // a chunk more than the room: the pool holds nothing else
	pool.SetRoom(1 << 40)
	if u := pool.Usage(); u.Room != 8*cs {
		t.Fatalf("room given back: %+v, want the limit", u)
	}
	read(keys[0])
	read(keys[1])
	if u := pool.Usage(); u.Used() < 7*cs {
		t.Fatalf("room given back is not used: %+v", u)
	}
}

// TestPoolServesWaitingReadsWhenRoomGrows: a read that waits because a
// held chunk fills the room goes on as soon as room is given back.
func TestPoolServesWaitingReadsWhenRoomGrows(t *testing.T) {
	const cs = 16 << 10
	s := store.NewMem(nil)
	keys, want := poolObjects(t, s, 2, 2, cs)
	pool, _ := NewPool(4*cs, nil)
	defer pool.Close()
	pool.minRoom = cs
	pool.SetRoom(cs)
	a, _ := NewReader(context.Background(), s, keys[0], pool, ReaderOptions{})
	defer a.Close()
	got := make([]byte, 10)
	h, _, err := pool.read(context.Background(), a, 0, readRandom)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		b, _ := NewReader(context.Background(), s, keys[1], pool, ReaderOptions{})
		defer b.Close()
		_, err := b.ReadAt(got, 5)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("read served beyond the room: %v, %+v", err, pool.Usage())
	case <-time.After(50 * time.Millisecond):
	}
	pool.SetRoom(2 * cs)
	select {
	case err := <-done:
		if err != nil || !bytes.Equal(got, want[keys[1]][5:15]) {
			t.Fatalf("the waiting read: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the waiting read still waits with room for it: %+v", pool.Usage())
	}
	h.Release()
}

// TestPoolReusesBuffersOfTheirClass: a free buffer serves a fetch of any
// length of its capacity class (bufCap), not only of its own length; a
// length of another class gets one of its own.
func TestPoolReusesBuffersOfTheirClass(t *testing.T) {
	for n, want := range map[int64]int64{1: 4 << 10, 5000: 8 << 10, 64 << 10: 64 << 10, 64<<10 + 1: 128 << 10, 256 << 10: 256 << 10, 2_050_000: 2_097_152, 2_100_000: 2_162_688} {
		if got := bufCap(n); got != want {
			t.Errorf("bufCap(%d) = %d, want %d", n, got, want)
		}
	}
	pool, _ := NewPool(1<<20, nil)
	defer pool.Close()
	pool.mu.Lock()
	defer pool.mu.Unlock()
	b, ok := pool.take(200_000, true)
	if !ok || b != nil {
		t.Fatalf("take from an empty pool: %v, %d bytes (want room to allocate)", ok, len(b))
	}
	b = newBuf(200_000)
	pool.putFree(b, 200_000)
	if pool.used != bufCap(200_000) || pool.freeBytes != bufCap(200_000) {
		t.Fatalf("used %d, free %d; want the capacity, %d", pool.used, pool.freeBytes, bufCap(200_000))
	}
	got, ok := pool.take(199_000, true)
	if !ok || len(got) != 199_000 || &got[0] != &b[0] {
		t.Fatalf("a take of 199,000 bytes did not reuse the free buffer of 200,000 (%v, %d bytes)", ok, len(got))
	}
	pool.putFree(got, 199_000)
	other, ok := pool.take(300_000, true)
	if !ok || other != nil || pool.used != bufCap(200_000)+bufCap(300_000) {
		t.Fatalf("a take of another class: %v, %d bytes, used %d", ok, len(other), pool.used)
	}
}

// TestPoolLetsTheSmallestFreeBufferGo: a pool with no room and free
// buffers of other capacities than a take's lets the smallest go, the
// least garbage: a first read's blocks, borrowed for a moment, do not
// let a turn's megabyte go (to be allocated again for the next turn).
func TestPoolLetsTheSmallestFreeBufferGo(t *testing.T) {
	const big, small = 1 << 20, 16 << 10
	pool, _ := NewPool(4<<20, nil)
	defer pool.Close()
	pool.mu.Lock()
	defer pool.mu.Unlock()
	bigBuf := newBuf(big)
	pool.putFree(bigBuf, big)
	for round := range 20 {
		pool.putFree(newBuf(small), small)
		pool.used = pool.room // the rest held by chunks in use
		b, ok := pool.take(8<<10, true)
		if !ok || b != nil {
			t.Fatalf("round %d: a take of 8 KiB: %v, %d bytes (want room made to allocate)", round, ok, len(b))
		}
		if got := pool.free[big]; len(got) != 1 || &got[0][:1][0] != &bigBuf[0] {
			t.Fatalf("round %d: the free megabyte went for 8 KiB (free: %v)", round, slices.Collect(maps.Keys(pool.free)))
		}
	}
}
