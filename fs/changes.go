package fs

import (
	"context"
	"strings"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Changes is change management as the file system needs it: it performs
// the changes that lose data (so it can retain the original first) and is
// told of the others. cm.Manager implements it; fs does not import cm.
//
// Every call is made between Enter and its leave, so a change and its
// event are seen together by anyone reading the tree under cm's lock.
type Changes interface {
	Enter() (leave func(), err error)
	Excluded(rel string) bool
	Unlink(dfd int, name, rel string) error
	Rmdir(dfd int, name, rel string) error
	Rename(odfd int, oname, orel string, ndfd int, nname, nrel string, flags uint32) error
	// Created is told of a new entry: kind is "file", "dir" or
	// "symlink" (with its target).
	Created(rel, kind, target string)
	// Truncate retains the file at path (a /proc/self/fd link) before it
	// is cut to size; Overwrite before its existing bytes are first
	// overwritten.
	Truncate(path, rel string, size int64) error
	Overwrite(path, rel string) error
	// Written is told that a file open for writing changed: it was
	// oldSize bytes at the last event and is newSize now.
	Written(rel string, oldSize, newSize int64, overwrote bool)
	// Holds says whether path (an inode's name as the kernel gives it)
	// is inside the cmroot: the file was deleted and is retained.
	Holds(path string) bool
}

// childRel is the path from the root of the entry name in this directory.
func (n *node) childRel(name string) string {
	if n.isRoot() {
		return name
	}
	return n.Path(n.Root()) + "/" + name
}

// changes returns the change manager, entered, when there is one; leave
// must be called when the change (and its report) is done.
func (n *node) changes() (Changes, func(), error) {
	ch := n.root.changes
	if ch == nil {
		return nil, func() {}, nil
	}
	leave, err := ch.Enter()
	if err != nil {
		return nil, nil, err
	}
	return ch, leave, nil
}

// fdSizeMtime is the size and mtime (ns) of the inode open at fd.
func fdSizeMtime(fd int) (int64, int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, err
	}
	return st.Size, st.Mtim.Nano(), nil
}

// cmSession is what change management tracks of one open for writing:
// whether its writes reached the file's original bytes (which are then
// retained first) and the size and mtime at its last event.
type cmSession struct {
	ch       Changes
	node     *node
	rel      string // at open; used when the node is no longer linked
	origSize int64  // bytes that existed at open: writes below this overwrite

	mu        sync.Mutex
	overwrote bool  // GUARDED_BY(mu)
	lastSize  int64 // GUARDED_BY(mu)
	lastMtime int64 // GUARDED_BY(mu)
}

// newSession starts tracking an open for writing of the file at fd; nil
// when there is no change management, the file is excluded, or the open
// is read-only.
func (n *node) newSession(fd int, flags uint32, rel string) *cmSession {
	ch := n.root.changes
	if ch == nil || flags&syscall.O_ACCMODE == syscall.O_RDONLY || ch.Excluded(rel) {
		return nil
	}
	size, mtime, err := fdSizeMtime(fd)
	if err != nil {
		return nil
	}
	return &cmSession{ch: ch, node: n, rel: rel, origSize: size, lastSize: size, lastMtime: mtime}
}

// path is the file's path now (it may have been renamed while open).
func (s *cmSession) path() string {
	p := s.node.Path(s.node.Root())
	if p == "" || strings.Contains(p, ".go-fuse.") {
		return s.rel
	}
	return p
}

// needsWrites says whether the session must see the writes (so kernel
// passthrough is off): only then can it retain what they overwrite.
func (s *cmSession) needsWrites() bool { return s != nil && s.origSize > 0 }

// beforeWrite retains the original before the first write into [off,
// off+n) that reaches bytes the file had at open.
func (s *cmSession) beforeWrite(fd int, off int64) error {
	if s == nil || off >= s.origSize {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overwrote {
		return nil
	}
	leave, err := s.ch.Enter()
	if err != nil {
		return err
	}
	defer leave()
	if err := s.ch.Overwrite(procFd(fd), s.path()); err != nil {
		return err
	}
	s.overwrote = true
	return nil
}

// noteWritten records a write event when the file changed since the last.
func (s *cmSession) noteWritten(fd int) {
	if s == nil {
		return
	}
	size, mtime, err := fdSizeMtime(fd)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if size == s.lastSize && mtime == s.lastMtime {
		return
	}
	leave, err := s.ch.Enter()
	if err != nil {
		return
	}
	defer leave()
	s.ch.Written(s.path(), s.lastSize, size, s.overwrote)
	s.lastSize, s.lastMtime = size, mtime
}

// newHandle makes the handle of a file this node opened at fd (path rel,
// FUSE open flags): tiered or local, tracked by change management, in the
// inode's io mode.
func (n *node) newHandle(ctx context.Context, fd int, flags uint32, rel string) (gofs.FileHandle, uint32, error) {
	lf := newLocalFile(n, fd)
	lf.cm = n.newSession(fd, flags, rel)
	fh, fl, err := n.wrapTiered(lf, rel)
	if err != nil {
		lf.Release(ctx)
		return nil, 0, err
	}
	if fh == gofs.FileHandle(lf) && n.root.changes != nil {
		if err := n.chooseMode(lf); err != nil {
			lf.Release(ctx)
			return nil, 0, err
		}
	}
	return fh, fl, nil
}

// truncateTracked sets the size of the file open at fd (path rel) with
// cut: when it shrinks the original is retained first, when it grows the
// growth is recorded.
func (n *node) truncateTracked(fd int, rel string, size int64, cut func() error) error {
	ch, leave, err := n.changes()
	if err != nil {
		return err
	}
	defer leave()
	return truncateWith(ch, fd, rel, size, cut)
}

// truncateWith is truncateTracked for a caller that has entered ch
// already (entering twice could deadlock behind a waiting dump).
func truncateWith(ch Changes, fd int, rel string, size int64, cut func() error) error {
	if ch == nil || ch.Excluded(rel) {
		return cut()
	}
	old, _, err := fdSizeMtime(fd)
	if err != nil {
		return err
	}
	if size < old {
		if err := ch.Truncate(procFd(fd), rel, size); err != nil {
			return err
		}
	}
	if err := cut(); err != nil {
		return err
	}
	if size > old {
		ch.Written(rel, old, size, false)
	}
	return nil
}

// The kernel serves all opens of an inode at one time in one io mode:
// passthrough, or cached (FUSE reads and writes); an open that would mix
// them fails (ETXTBSY). Change management needs to see the writes of an
// open that may overwrite existing bytes, so such an open is cached, and
// then so must be every other open of the inode while it lasts. ioModes
// counts an inode's opens of each mode.
type ioModes struct {
	mu          sync.Mutex
	passthrough int // GUARDED_BY(mu)
	cached      int // GUARDED_BY(mu)
}

// openMode picks the mode of a new open of this inode: cached when asked
// and no passthrough open exists, or when a cached open exists. release
// ends the open's count.
func (n *node) openMode(wantCached bool) (cached bool, release func()) {
	m := &n.modes
	m.mu.Lock()
	defer m.mu.Unlock()
	cached = m.cached > 0 || (wantCached && m.passthrough == 0)
	if cached {
		m.cached++
	} else {
		m.passthrough++
	}
	var once sync.Once
	return cached, func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if cached {
				m.cached--
			} else {
				m.passthrough--
			}
		})
	}
}

// chooseMode settles whether the local handle lf is served by
// passthrough or cached (see ioModes). A session that may overwrite but
// must share the inode with passthrough opens cannot see its writes: the
// original is retained now instead.
func (n *node) chooseMode(lf *localFile) error {
	want := lf.cm.needsWrites()
	cached, release := n.openMode(want)
	lf.releaseMode, lf.cached = release, cached
	if cached && n.root.passthrough.Load() {
		n.root.expectedCached.Add(1)
	}
	if want && !cached {
		if err := lf.cm.beforeWrite(int(lf.f.Fd()), 0); err != nil {
			release()
			return err
		}
	}
	return nil
}

// fixNlink hides the cmroot's links to a file that was deleted while
// open: natively its link count is 0, and programs check that.
func (n *node) fixNlink(fd int, out *fuse.Attr) {
	if n.root.changes == nil || out.Nlink == 0 {
		return
	}
	if _, parent := n.Parent(); parent != nil {
		return
	}
	buf := make([]byte, unix.PathMax)
	k, err := unix.Readlink(procFd(fd), buf)
	if err == nil && n.root.changes.Holds(string(buf[:k])) {
		out.Nlink = 0
	}
}
