package tiering

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/internal/tiered"
)

// openTiered opens the file at path read-write, and the tierer's view
// of it named rel (as the file system would); the caller closes both.
func openTiered(t *testing.T, tr *Tierer, path, rel string) (tiered.File, *os.File, uint64) {
	t.Helper()
	fd, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(fd.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	f, err := tr.Open(st.Ino, rel, int(fd.Fd()), 0)
	if err != nil {
		fd.Close()
		t.Fatal(err)
	}
	return f, fd, st.Ino
}

// readWhole reads a tiered file's bytes through it.
func readWhole(t *testing.T, f tiered.File, size int) []byte {
	t.Helper()
	b := make([]byte, size+100)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return b[:n]
}

func wantState(t *testing.T, f tiered.File, want tiered.State) {
	t.Helper()
	if st, err := f.State(); err != nil || st != want {
		t.Fatalf("state %v (%v), want %v", st, err, want)
	}
}

// An open file follows the tierer's changes of its state without being
// opened again, and reads its bytes from wherever they are.
func TestOpenFileFollowsItsState(t *testing.T) {
	root, bases, _ := logDir(t)
	tr := newTierer(t, root, store.NewMem(nil), 1<<40)
	ctx := context.Background()
	rel := "orders-0/" + kafkaName(bases["orders-0"][1], ".log")
	path := filepath.Join(root, rel)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, fd, ino := openTiered(t, tr, path, rel)
	defer fd.Close()
	wantState(t, f, StateLocal)
	if !bytes.Equal(readWhole(t, f, len(orig)), orig) {
		t.Fatal("local read differs")
	}
	if _, err := tr.ShipNow(ctx, rel, nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, f, StateShipped)
	if rdi, _ := f.RDI(); rdi == "" {
		t.Error("a shipped file has no RDI")
	}
	if _, err := tr.EvictNow(ctx, rel, nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, f, StateRemote)
	if !bytes.Equal(readWhole(t, f, len(orig)), orig) {
		t.Fatal("remote read differs")
	}
	b, release, ok, err := f.Slice(100, 4000)
	if !ok || err != nil || !bytes.Equal(b, orig[100:4100]) {
		t.Fatalf("slice: ok %v err %v, right bytes %v", ok, err, bytes.Equal(b, orig[100:4100]))
	}
	release()
	if d, err := f.RemoteCopy(); err != nil || d == nil {
		t.Fatalf("remote copy of an evicted file: %s %v", d, err)
	}

	// The state read stays until the tierer tells of a change: a record
	// removed behind its back is not seen, then is once told.
	rec, _, _ := readRecord(path)
	unix.Fremovexattr(int(fd.Fd()), recordXattr)
	wantState(t, f, StateRemote)
	tr.handles.changed(ino)
	wantState(t, f, StateLocal)
	writeRecordFd(int(fd.Fd()), path, rec)
	tr.handles.changed(ino)
	wantState(t, f, StateRemote)

	// With NoMove a change of a remote file is refused; an O_PATH
	// descriptor serves as well as any.
	pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pfd)
	nm, err := tr.Open(ino, rel, pfd, tiered.NoMove)
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, nm, StateRemote)
	if _, err := nm.WriteAt([]byte("x"), 0, func() (int, error) { t.Fatal("a remote file written locally"); return 0, nil }); !errors.Is(err, tiered.ErrRemote) {
		t.Fatalf("write with NoMove: %v", err)
	}
	if err := nm.Truncate(int64(len(orig)), func() error { t.Fatal("truncated locally"); return nil }); err != nil {
		t.Fatalf("a truncate to the size it has: %v", err)
	}
	nm.Close()

	// A write moves it: read back at once, local once the move ends.
	if n, err := f.WriteAt([]byte("X"), 0, func() (int, error) { t.Fatal("a remote file written locally"); return 0, nil }); n != 1 || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	wantState(t, f, tiered.StateMoving)
	if size, _, ok := f.Attr(); !ok || size != int64(len(orig)) {
		t.Errorf("a moving file's size: %d %v", size, ok)
	}
	want := append([]byte("X"), orig[1:]...)
	if !bytes.Equal(readWhole(t, f, len(orig)), want) {
		t.Fatal("read of a moving file differs")
	}
	if m := tr.moves.of(ino); m != nil {
		if err := m.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	wantState(t, f, StateLocal)
	if !bytes.Equal(readWhole(t, f, len(orig)), want) {
		t.Fatal("read after the move differs")
	}
	called := false
	if n, err := f.WriteAt([]byte("Y"), 1, func() (int, error) { called = true; return fd.WriteAt([]byte("Y"), 1) }); n != 1 || err != nil || !called {
		t.Fatalf("local write: %d %v, called %v", n, err, called)
	}
	if n := tr.handles.open(); n != 1 {
		t.Errorf("%d handles open", n)
	}
	f.Close()
	if n := tr.handles.open(); n != 0 {
		t.Errorf("%d handles open after close", n)
	}
}

// An open reads nothing of the file's record (a broker opens every
// segment at start-up): the first call that needs the state reads it,
// and a record that cannot be read is that call's error, naming the
// file, while the open itself succeeds.
func TestOpenReadsTheRecordAtFirstUse(t *testing.T) {
	root, bases, _ := logDir(t)
	tr := newTierer(t, root, store.NewMem(nil), 1<<40)
	ctx := context.Background()
	rel := "orders-0/" + kafkaName(bases["orders-0"][1], ".log")
	path := filepath.Join(root, rel)
	if _, err := tr.ShipNow(ctx, rel, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.EvictNow(ctx, rel, nil); err != nil {
		t.Fatal(err)
	}
	rec, has, err := readRecord(path)
	if err != nil || !has {
		t.Fatalf("no record after eviction: %v", err)
	}
	if err := unix.Setxattr(path, recordXattr, []byte("{not json"), 0); err != nil {
		t.Fatal(err)
	}
	f, fd, _ := openTiered(t, tr, path, rel)
	defer fd.Close()
	defer f.Close()
	if _, err := f.State(); err == nil || !strings.Contains(err.Error(), rel) {
		t.Fatalf("state of a file with a bad record: %v, want an error naming %s", err, rel)
	}
	if _, err := f.ReadAt(make([]byte, 10), 0); err == nil {
		t.Fatal("a read of a file with a bad record returned bytes")
	}

	// Put right before the first use of another open: that open sees it.
	g, gfd, _ := openTiered(t, tr, path, rel)
	defer gfd.Close()
	defer g.Close()
	if err := writeRecord(path, rec); err != nil {
		t.Fatal(err)
	}
	wantState(t, g, StateRemote)
}
