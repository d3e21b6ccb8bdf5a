package tiering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/tiered"
)

// openFile is one open of a tiered file by the file system (a
// tiered.File). It reads the file's record once, and again only after
// the tierer told it of a change (handles.changed): its epoch moved.
// Reads go down from here only: to the backing file under the gate, to
// the file's move, or to its store copy.
type openFile struct {
	t     *Tierer
	ino   uint64
	rel   string // the file's name from the root when it was opened
	fd    int    // the file system's descriptor of the backing file; not ours to close
	flags tiered.OpenFlags
	epoch atomic.Uint64 // changes told (see handles.changed)

	snap atomic.Pointer[fileState] // what was read at an epoch

	mu      sync.Mutex
	src     remoteSource   // the store copy, opened at the first read of it; GUARDED_BY(mu)
	retired []remoteSource // copies of an earlier record (the file was shipped again); GUARDED_BY(mu)
	srcKey  string         // the record key src was opened for; GUARDED_BY(mu)
	closed  bool           // GUARDED_BY(mu)
}

// fileState is the state an openFile read at one epoch.
type fileState struct {
	epoch uint64
	st    tiered.State
	rec   Record // when the file has a record
	mv    *Move  // when st is StateMoving
}

var _ tiered.File = (*openFile)(nil)

// Open gives the file system its view of the tiered file at fd (a
// descriptor of the backing file, O_PATH or not, which stays the caller's),
// inode ino, named rel from the root. The record is read at the first
// call that needs it, and again after each change the file is told of: a
// broker opens every segment at start-up and uses few of them, and the
// record of an evicted file is a read from disk of its own (an xattr
// block) once the page cache has been dropped. A record that cannot be
// read is the error of that call, not of the open.
func (t *Tierer) Open(ino uint64, rel string, fd int, flags tiered.OpenFlags) (tiered.File, error) {
	f := &openFile{t: t, ino: ino, rel: rel, fd: fd, flags: flags}
	t.handles.add(f)
	return f, nil
}

// Attr is the size and mtime of inode ino while it moves (its backing
// file has neither yet); ok is false for any other inode.
func (t *Tierer) Attr(ino uint64) (size, mtimeNs int64, ok bool) {
	if m := t.moves.of(ino); m != nil {
		size, mtimeNs = m.Attr()
		return size, mtimeNs, true
	}
	return 0, 0, false
}

// current is the file's state: the one read at this epoch, or read now.
func (f *openFile) current() (*fileState, error) {
	e := f.epoch.Load()
	if s := f.snap.Load(); s != nil && s.epoch == e {
		return s, nil
	}
	s := &fileState{epoch: e, st: tiered.StateLocal}
	rec, has, err := readRecordFd(f.fd, f.name())
	if errors.Is(err, unix.EBADF) { // an O_PATH descriptor: by its path
		rec, has, err = readRecord(fdPath(f.fd))
	}
	if err != nil {
		return nil, err
	}
	switch {
	case has:
		s.st, s.rec = rec.State, rec
		if rec.State == StateRemote {
			if s.mv = f.t.moves.of(f.ino); s.mv != nil {
				s.st = tiered.StateMoving
			}
		}
	case f.t.claims.shippingIno(f.ino):
		s.st = tiered.StateShipping
	}
	f.snap.Store(s)
	return s, nil
}

// stale makes the next current read the state again (a move said it
// ended before the tierer told the file).
func (f *openFile) stale() {
	f.epoch.Add(1)
	runtime.Gosched()
}

func (f *openFile) State() (tiered.State, error) {
	s, err := f.current()
	if err != nil {
		return 0, err
	}
	return s.st, nil
}

func (f *openFile) RDI() (string, error) {
	s, err := f.current()
	if err != nil {
		return "", err
	}
	return s.rec.Key, nil
}

// maxRetries bounds the loops that follow a state change under way (a
// move ending, an eviction): each turn sees a newer state.
const maxRetries = 1000

// local runs fn under the gate if the file's bytes are local, and says
// whether it did.
func (f *openFile) local(fn func()) (ran bool, err error) {
	unlock := f.t.cfg.Gate.RLock(f.ino)
	defer unlock()
	s, err := f.current()
	if err != nil || !s.st.LocalBytes() {
		return false, err
	}
	fn()
	return true, nil
}

func (f *openFile) ReadAt(p []byte, off int64) (int, error) {
	for range maxRetries {
		s, err := f.current()
		if err != nil {
			return 0, err
		}
		switch {
		case s.mv != nil:
			n, err := s.mv.ReadAt(p, off)
			if errors.Is(err, os.ErrClosed) {
				f.stale() // local now
				continue
			}
			return n, storeError(err)
		case s.st.InStore():
			n, err := f.readStore(s, p, off)
			return n, storeError(err)
		}
		var n int
		var rerr error
		ran, err := f.local(func() { n, rerr = unix.Pread(f.fd, p, off) })
		if err != nil {
			return 0, err
		}
		if ran {
			if rerr == nil && n < len(p) {
				rerr = io.EOF
			}
			return n, rerr
		}
	}
	return 0, fmt.Errorf("%s: its state kept changing", f.name())
}

// source is the store copy of the file as recorded in s, opened once.
func (f *openFile) source(s *fileState) (remoteSource, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, os.ErrClosed
	}
	if f.src != nil && f.srcKey == s.rec.Key {
		return f.src, nil
	}
	if err := f.t.waitReady(); err != nil {
		return nil, err
	}
	src, err := f.t.copies.openSource(s.rec)
	if err != nil {
		return nil, err
	}
	if f.src != nil {
		// A read may still be in it: it is closed with the file.
		f.retired = append(f.retired, f.src)
	}
	f.src, f.srcKey = src, s.rec.Key
	return src, nil
}

func (f *openFile) readStore(s *fileState, p []byte, off int64) (int, error) {
	src, err := f.source(s)
	if err != nil {
		return 0, err
	}
	return src.ReadAt(p, off)
}

func (f *openFile) Slice(off int64, n int) ([]byte, func(), bool, error) {
	s, err := f.current()
	if err != nil {
		return nil, nil, true, err
	}
	if !s.st.InStore() {
		return nil, nil, false, nil
	}
	src, err := f.source(s)
	if err != nil {
		return nil, nil, true, storeError(err)
	}
	b, release, ok, err := src.Slice(context.Background(), off, n)
	return b, release, ok, storeError(err)
}

// storeError marks a failure to read the store copy (see
// tiered.StoreError); io.EOF stays itself.
func storeError(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	return &tiered.StoreError{Err: err}
}

// moveFor is the file's move, started now for cause if the file is
// remote; nil if it is local.
func (f *openFile) moveFor(s *fileState, cause tiered.Cause) (*Move, error) {
	if s.mv != nil {
		return s.mv, nil
	}
	if f.flags&tiered.NoMove != 0 {
		return nil, fmt.Errorf("change: %w", tiered.ErrRemote)
	}
	rel := f.currentRel()
	if rel == "" {
		return nil, fmt.Errorf("%s has no name in the log dir: %w", fdPath(f.fd), tiered.ErrRemote)
	}
	m, err := f.t.moves.startMoveOf(rel, f.ino, cause)
	if err != nil {
		f.t.cfg.Log.Error("cannot start moving an evicted file back", "path", rel, "cause", cause.String(), "err", err)
	}
	return m, err
}

// name names the file in errors: by the name it was opened by, else
// by its name now.
func (f *openFile) name() string {
	if f.rel != "" {
		return f.rel
	}
	if rel := f.currentRel(); rel != "" {
		return rel
	}
	return fdPath(f.fd)
}

// currentRel is the file's name from the root now (it may have been
// renamed since it was opened), or the name it was opened by ("" when
// neither is known).
func (f *openFile) currentRel() string {
	buf := make([]byte, 4096)
	n, err := unix.Readlink(fdPath(f.fd), buf)
	if err != nil {
		return f.rel
	}
	root, err := filepath.EvalSymlinks(f.t.cfg.Root)
	if err != nil {
		return f.rel
	}
	if rel, ok := strings.CutPrefix(string(buf[:n]), root+"/"); ok && !strings.HasSuffix(rel, " (deleted)") {
		return rel
	}
	return f.rel
}

func (f *openFile) WriteAt(p []byte, off int64, local func() (int, error)) (int, error) {
	for range maxRetries {
		s, err := f.current()
		if err != nil {
			return 0, err
		}
		if s.st.LocalBytes() {
			var n int
			var werr error
			ran, err := f.local(func() { n, werr = local() })
			if err != nil {
				return 0, err
			}
			if ran {
				if werr == nil && n > 0 {
					f.t.scans.touch(f.ino)
				}
				return n, werr
			}
			continue
		}
		if len(p) == 0 && s.mv == nil {
			return 0, nil // changes nothing: no move
		}
		m, err := f.moveFor(s, tiered.CauseWrite)
		if err != nil {
			return 0, err
		}
		if m == nil {
			f.stale()
			continue
		}
		n, err := m.WriteAt(p, off)
		if errors.Is(err, os.ErrClosed) {
			f.stale()
			continue
		}
		return n, err
	}
	return 0, fmt.Errorf("%s: its state kept changing", f.name())
}

func (f *openFile) Truncate(size int64, local func() error) error {
	for range maxRetries {
		s, err := f.current()
		if err != nil {
			return err
		}
		if s.st.LocalBytes() {
			var terr error
			ran, err := f.local(func() { terr = local() })
			if err != nil {
				return err
			}
			if ran {
				if terr == nil {
					f.t.scans.touch(f.ino)
				}
				return terr
			}
			continue
		}
		if s.mv == nil && size == s.rec.Size {
			return nil // the size it has: no byte changes, nothing moves
		}
		m, err := f.moveFor(s, tiered.CauseTruncate)
		if err != nil {
			return err
		}
		if m == nil {
			f.stale()
			continue
		}
		if err := m.Truncate(size); errors.Is(err, os.ErrClosed) {
			f.stale()
			continue
		} else {
			return err
		}
	}
	return fmt.Errorf("%s: its state kept changing", f.name())
}

func (f *openFile) Locked(fn func(tiered.State) error) error {
	unlock := f.t.cfg.Gate.RLock(f.ino)
	defer unlock()
	s, err := f.current()
	if err != nil {
		return err
	}
	return fn(s.st)
}

func (f *openFile) Sync() error {
	s, err := f.current()
	if err != nil || s.mv == nil {
		return err
	}
	if err := s.mv.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}

func (f *openFile) Attr() (size, mtimeNs int64, ok bool) {
	s, err := f.current()
	if err != nil || s.mv == nil {
		return 0, 0, false
	}
	size, mtimeNs = s.mv.Attr()
	return size, mtimeNs, true
}

func (f *openFile) RemoteCopy() ([]byte, error) {
	s, err := f.current()
	if err != nil || s.st != StateRemote {
		return nil, err
	}
	if err := f.t.waitReady(); err != nil {
		return nil, err
	}
	return f.t.copies.remoteCopy(s.rec)
}

func (f *openFile) Close() error {
	f.t.handles.remove(f)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.src != nil {
		f.src.Close()
		f.src = nil
	}
	for _, r := range f.retired {
		r.Close()
	}
	f.retired = nil
	return nil
}

// fdPath is the path form of a descriptor, for the calls that take no
// descriptor (an O_PATH one serves no getxattr).
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }
