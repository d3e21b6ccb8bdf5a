package tiering

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/internal/tiered"
)

type mover interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Truncate(size int64) error
	Sync() error
	Attr() (size, mtimeNs int64)
}

// afterMove sends each op to a move while it runs and, once it is over,
// to the file, as fs does: the file ends the same whether the ops or the
// move's download end first (the race detector slows the ops).
type afterMove struct {
	m    *Move
	path string
}

func (a afterMove) ReadAt(p []byte, off int64) (int, error) {
	n, err := a.m.ReadAt(p, off)
	if !errors.Is(err, os.ErrClosed) {
		return n, err
	}
	f, err := os.Open(a.path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.ReadAt(p, off)
}

func (a afterMove) WriteAt(p []byte, off int64) (int, error) {
	n, err := a.m.WriteAt(p, off)
	if !errors.Is(err, os.ErrClosed) {
		return n, err
	}
	f, err := os.OpenFile(a.path, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.WriteAt(p, off)
}

func (a afterMove) Truncate(size int64) error {
	if err := a.m.Truncate(size); !errors.Is(err, os.ErrClosed) {
		return err
	}
	return os.Truncate(a.path, size)
}

func (a afterMove) Sync() error {
	if err := a.m.Sync(); !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}

func (a afterMove) Attr() (size, mtimeNs int64) {
	if err := a.m.Sync(); !errors.Is(err, os.ErrClosed) {
		return a.m.Attr() // while it runs, the move's own
	}
	var st syscall.Stat_t
	if err := syscall.Stat(a.path, &st); err != nil {
		return -1, 0
	}
	return st.Size, st.Mtim.Nano()
}

// evictedSegment ships and evicts a segment and returns its rel path,
// its inode and its bytes.
func evictedSegment(t *testing.T, tr *Tierer, root string, bases map[string][]int64) (string, uint64, []byte) {
	t.Helper()
	rel := "orders-0/" + kafkaName(bases["orders-0"][1], ".log")
	orig, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := tr.EvictNow(context.Background(), rel, nil); err != nil || st != StateRemote {
		t.Fatalf("evict: %s %v", st, err)
	}
	var st syscall.Stat_t
	syscall.Stat(filepath.Join(root, rel), &st)
	return rel, st.Ino, orig
}

// randomOps changes the moving file and the model alike, and checks
// reads and sizes against the model as it goes.
func randomOps(t *testing.T, r *rand.Rand, m mover, model *[]byte, n int) {
	t.Helper()
	for i := range n {
		switch op := r.IntN(10); {
		case op < 5: // write, sometimes past the end
			off := r.Int64N(int64(len(*model)) + 5000)
			b := make([]byte, 1+r.IntN(20000))
			for j := range b {
				b[j] = byte(r.Uint32())
			}
			if _, err := m.WriteAt(b, off); err != nil {
				t.Fatalf("op %d write: %v", i, err)
			}
			if end := off + int64(len(b)); end > int64(len(*model)) {
				*model = append(*model, make([]byte, end-int64(len(*model)))...)
			}
			copy((*model)[off:], b)
		case op < 7: // truncate, down or up
			size := r.Int64N(int64(len(*model)) + 3000)
			if err := m.Truncate(size); err != nil {
				t.Fatalf("op %d truncate: %v", i, err)
			}
			if size < int64(len(*model)) {
				*model = (*model)[:size]
			} else {
				*model = append(*model, make([]byte, size-int64(len(*model)))...)
			}
		default: // read
			off := r.Int64N(int64(len(*model)) + 100)
			b := make([]byte, 1+r.IntN(30000))
			k, err := m.ReadAt(b, off)
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("op %d read: %v", i, err)
			}
			want := []byte{}
			if off < int64(len(*model)) {
				want = (*model)[off:min(int64(len(*model)), off+int64(len(b)))]
			}
			if !bytes.Equal(b[:k], want) {
				t.Fatalf("op %d: read %d bytes at %d differ from the model (%d bytes)", i, k, off, len(want))
			}
		}
		if size, _ := m.Attr(); size != int64(len(*model)) {
			t.Fatalf("op %d: size %d, model %d", i, size, len(*model))
		}
	}
}

// TestMoveCatchUp: writes and truncates to an evicted file never wait
// for its download, reads see them at once, and once the file is in,
// it is exactly the model: local, its stale remote copy forgotten.
func TestMoveCatchUp(t *testing.T) {
	for seed := range uint64(4) {
		root, bases, _ := logDir(t)
		s := store.NewMem(nil)
		tr := newTierer(t, root, s, 1<<40)
		// Reads of whole chunks only: a first read of blocks costs one
		// GET more per chunk, and with every GET slow (below) the ops
		// would outlast the download this test needs them to beat.
		tr.up.BlockSize = -1
		rel, ino, orig := evictedSegment(t, tr, root, bases)
		// A slow store, most often slower than the ops below; and
		// held at first, so that the download cannot end before the
		// first write.
		gate := make(chan struct{})
		s.Inject(store.Fault{Op: store.OpGet, Latency: 50 * time.Millisecond, Gate: gate})
		m, err := tr.moves.startMoveOf(rel, ino, tiered.CauseWrite)
		if err != nil || m == nil {
			t.Fatalf("start move: %v", err)
		}
		if again, _ := tr.moves.startMoveOf(rel, ino, tiered.CauseWrite); again != m || tr.moves.of(ino) != m {
			t.Fatal("a second start made another move")
		}
		model := append([]byte(nil), orig...)
		// A write returns while the download waits.
		wrote := make(chan error, 1)
		go func() {
			_, err := m.WriteAt([]byte("first"), 3)
			wrote <- err
		}()
		select {
		case err := <-wrote:
			if err != nil {
				t.Fatalf("a write while the download waits: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a write waited for the download")
		}
		copy(model[3:], "first")
		close(gate)
		r := rand.New(rand.NewPCG(seed, 7))
		p := filepath.Join(root, rel)
		randomOps(t, r, afterMove{m, p}, &model, 150)
		if err := m.Wait(); err != nil {
			t.Fatal(err)
		}
		if tr.moves.of(ino) != nil {
			t.Fatal("still moving")
		}
		if _, err := m.WriteAt([]byte("x"), 0); !errors.Is(err, os.ErrClosed) {
			t.Fatalf("a write after the move: %v", err)
		}
		got, _ := os.ReadFile(p)
		if !bytes.Equal(got, model) {
			t.Fatalf("seed %d: after the move the file (%d bytes) is not the model (%d bytes)", seed, len(got), len(model))
		}
		if _, has, _ := readRecord(p); has {
			t.Error("a changed file kept its record")
		}
		if _, err := os.Stat(tr.moves.catchupPath(ino)); !os.IsNotExist(err) {
			t.Error("the catch-up log is left")
		}
		// The stale copy goes at the next passes, and the file ships
		// again as it is now (not the store's old bytes).
		mustPass(t, tr)
	}
}

// TestMoveTruncateToZeroNeedsNoDownload: a file cut to nothing, then
// written, comes back without a GET.
func TestMoveTruncateToZeroNeedsNoDownload(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1<<40)
	rel, ino, _ := evictedSegment(t, tr, root, bases)
	gets := s.Calls(store.OpGet)
	m, err := tr.moves.startMoveOf(rel, ino, tiered.CauseWrite)
	if err != nil {
		t.Fatal(err)
	}
	// The truncate may end the move at once: the write then goes to the
	// file, as fs sends it.
	a := afterMove{m, filepath.Join(root, rel)}
	if err := a.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt([]byte("new"), 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, rel)); string(b) != "new" {
		t.Fatalf("file %q", b)
	}
	if n := s.Calls(store.OpGet) - gets; n != 0 {
		t.Errorf("%d GETs for a file truncated to nothing", n)
	}
}

// TestMoveRecoversAfterCrash: a move whose download failed (as if tierfs
// died) is resumed by the next tierer over the same dirs: what its
// catch-up log holds is applied, a torn tail is cut.
func TestMoveRecoversAfterCrash(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	tr1 := newTierer(t, root, s, 1<<40) // closed below, as if tierfs died
	rel, ino, orig := evictedSegment(t, tr1, root, bases)
	s.Inject(store.Fault{Op: store.OpGet, Err: errors.New("injected outage")})
	m, err := tr1.moves.startMoveOf(rel, ino, tiered.CauseWrite)
	if err != nil {
		t.Fatal(err)
	}
	model := append([]byte(nil), orig...)
	// Only writes: reads would need the store that is down.
	for i := range 40 {
		off := int64(i * 977 % len(orig))
		b := bytes.Repeat([]byte{byte(i + 1)}, 3000)
		if _, err := m.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		if end := off + 3000; end > int64(len(model)) {
			model = append(model, make([]byte, end-int64(len(model)))...)
		}
		copy(model[off:], b)
	}
	m.Truncate(int64(len(model) - 100))
	model = model[:len(model)-100]
	m.Sync()
	tr1.Close() // as if tierfs died: the move stops retrying
	if err := m.Wait(); err == nil {
		t.Fatal("the move succeeded with the store down")
	}
	// A torn record at the end, as a crash mid-append leaves.
	lf, _ := os.OpenFile(tr1.moves.catchupPath(ino), os.O_WRONLY|os.O_APPEND, 0)
	lf.Write([]byte{1, 2, 3, 4, recWrite, 0, 0})
	lf.Close()
	s.ClearFaults()

	tr2 := newTierer(t, root, s, 1<<40)
	mustPass(t, tr2) // resumes the move
	if mv := tr2.moves.of(ino); mv != nil {
		if err := mv.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(tr2.moves.catchupPath(ino)); !os.IsNotExist(err) {
		t.Fatalf("the catch-up log was not applied: %v", err)
	}
	if lost, _ := filepath.Glob(filepath.Join(root, ".tierfs", "catchup", "lost", "*")); len(lost) > 0 {
		t.Fatalf("logs kept aside: %v", lost)
	}
	got, _ := os.ReadFile(filepath.Join(root, rel))
	if !bytes.Equal(got, model) {
		t.Fatalf("after recovery the file (%d bytes) is not the model (%d bytes)", len(got), len(model))
	}
}

// TestMoveWithoutChangeDownloadsNothing: a move that is only started
// (the file system is about to write, and the write never comes or
// changes nothing), synced, read, or truncated to the size the file has
// downloads nothing and counts no move; the first real change starts the
// download, and is counted by its cause.
func TestMoveWithoutChangeDownloadsNothing(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1<<40)
	rel, ino, orig := evictedSegment(t, tr, root, bases)
	gets := s.Calls(store.OpGet)
	m, err := tr.moves.startMoveOf(rel, ino, tiered.CauseTruncate)
	if err != nil || m == nil {
		t.Fatalf("start move: %v", err)
	}
	if err := m.Truncate(int64(len(orig))); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WriteAt(nil, 10); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a download would have begun by now
	if n := s.Calls(store.OpGet) - gets; n != 0 {
		t.Fatalf("%d GETs for a move with no change", n)
	}
	for c := range tiered.NumCauses {
		if n := tr.Counters().Moves[c].Load(); n != 0 {
			t.Fatalf("%d moves counted (%s) for a move with no change", n, c)
		}
	}
	if st, _, _ := tr.copies.stateOf(filepath.Join(root, rel)); st != StateRemote {
		t.Fatalf("state %s, want remote", st)
	}
	// The first real change starts it.
	if err := m.Truncate(100); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, rel)); !bytes.Equal(b, orig[:100]) {
		t.Fatalf("file is %d bytes, not the first 100 of the original", len(b))
	}
	c := tr.Counters()
	if c.Moves[tiered.CauseTruncate].Load() != 1 || c.HydratedSegments[tiered.CauseTruncate].Load() != 1 || c.HydratedBytes[tiered.CauseTruncate].Load() != int64(len(orig)) {
		t.Errorf("counted moves %d, hydrated %d (%d bytes) by truncate; want 1, 1 (%d bytes)",
			c.Moves[tiered.CauseTruncate].Load(), c.HydratedSegments[tiered.CauseTruncate].Load(), c.HydratedBytes[tiered.CauseTruncate].Load(), len(orig))
	}
}

// TestMoveCrashBeforeFirstChangeKeepsFileRemote: a catch-up log with no
// change in it (tierfs died between starting a move and logging its
// first write) is dropped at the next start: nothing was acknowledged,
// the file stays remote, and nothing is downloaded.
func TestMoveCrashBeforeFirstChangeKeepsFileRemote(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	tr1 := newTierer(t, root, s, 1<<40) // closed below, as if tierfs died
	rel, ino, orig := evictedSegment(t, tr1, root, bases)
	p := filepath.Join(root, rel)
	var evicted syscall.Stat_t
	syscall.Stat(p, &evicted)
	if _, err := tr1.moves.startMoveOf(rel, ino, tiered.CauseWrite); err != nil {
		t.Fatal(err)
	}
	tr1.Close() // as if tierfs died
	if _, err := os.Stat(tr1.moves.catchupPath(ino)); err != nil {
		t.Fatalf("no catch-up log: %v", err)
	}
	tr2 := newTierer(t, root, s, 1<<40)
	mustPass(t, tr2)
	if tr2.moves.of(ino) != nil {
		t.Fatal("a move with no change was resumed")
	}
	if _, err := os.Stat(tr2.moves.catchupPath(ino)); !os.IsNotExist(err) {
		t.Fatalf("the empty catch-up log is left: %v", err)
	}
	if st, _, _ := tr2.copies.stateOf(p); st != StateRemote {
		t.Fatalf("state %s, want remote", st)
	}
	c := tr2.Counters()
	for cause := range tiered.NumCauses {
		if c.Moves[cause].Load() != 0 || c.HydratedBytes[cause].Load() != 0 {
			t.Errorf("recovery counted %d moves, %d bytes hydrated (%s)", c.Moves[cause].Load(), c.HydratedBytes[cause].Load(), cause)
		}
	}
	var st syscall.Stat_t
	syscall.Stat(p, &st)
	if st.Blocks != evicted.Blocks || st.Size != int64(len(orig)) {
		t.Errorf("the file has %d blocks and %d bytes; as evicted: %d and %d", st.Blocks, st.Size, evicted.Blocks, len(orig))
	}
}
