package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/tiered"
)

// Tiering is what fs needs from the tierer to serve files whose bytes may
// be in the store. fs never sees the store or the state format.
type Tiering interface {
	// Tiered says whether the file at rel (a path from the root) can be
	// shipped and evicted: such files are served by FUSE reads through
	// the gate instead of kernel passthrough, so their bytes can move
	// while they are open.
	Tiered(rel string) bool
	// RLock holds inode ino against eviction until unlock is called.
	RLock(ino uint64) (unlock func())
	// Hold keeps inode ino from being evicted while a handle that reads
	// the backing file directly is open; it waits for an eviction under
	// way, so a state read after it is final while the hold lasts.
	Hold(ino uint64) (release func())
	// State is the tiering state of the file open at path (a
	// /proc/self/fd link): local, shipped or remote, and its RDI.
	State(path string) (state, rdi string, err error)
	// OpenRemote reads the remote bytes of the remote file open at path.
	OpenRemote(path string) (RemoteReader, error)
	// Hydrations counts the remote files made local again: a file found
	// remote at one count may be local at a later one.
	Hydrations() uint64
	// Evictions counts the files recorded remote; it moves under the
	// file's gate, before its record: a file found local under its gate
	// at one count is local while the count stays the same.
	Evictions() uint64
	// StartMove makes the remote file rel (inode ino) moving: changed
	// through its catch-up log while its bytes come back (see Mover); nil
	// if it is not remote. The caller makes the change (cause) through
	// the Mover at once: nothing is downloaded before a change. Moving is
	// the move of ino under way, or nil.
	StartMove(rel string, ino uint64, cause tiered.Cause) (Mover, error)
	Moving(ino uint64) Mover
	// RemoteCopy describes where the bytes of the evicted file open at
	// path are in the store (JSON), for another mount of the same store
	// to take it over without them; nil for any other file.
	RemoteCopy(path string) ([]byte, error)
}

// Mover is an evicted file being changed while its bytes come back:
// reads and writes go through it, never waiting for the download. Once
// the file is local its methods return os.ErrClosed: use the file.
type Mover = interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Truncate(size int64) error
	Sync() error
	Attr() (size, mtimeNs int64)
}

// RemoteReader reads a file's bytes from the store, each checked. An
// alias, so the tierer can satisfy Tiering without importing fs.
type RemoteReader = interface {
	ReadAt(p []byte, off int64) (int, error)
	Close() error
}

// remoteSlicer is a RemoteReader that can hand out its verified bytes
// without a copy (chunkxfer.Reader does): they stay as they are until
// release, which the reply calls once the kernel has them.
type remoteSlicer interface {
	Slice(ctx context.Context, off int64, n int) (b []byte, release func(), ok bool, err error)
}

// heldResult replies with bytes held until the reply is written.
type heldResult struct {
	fuse.ReadResult
	release func()
}

func (r heldResult) Done() {
	r.ReadResult.Done()
	r.release()
}

// ErrRemote refuses a change to a file whose bytes are in the store.
var ErrRemote = errors.New("file is in the store (evicted); hydrate it before changing it")

// remoteError is a failure to read remote bytes: always EIO to the
// reader, whatever errno the network gave.
type remoteError struct{ err error }

func (e *remoteError) Error() string { return e.err.Error() }
func (e *remoteError) Unwrap() error { return e.err }

const (
	xattrState   = "user.tierfs.state"
	xattrRDI     = "user.tierfs.rdi"
	xattrRemote  = "user.tierfs.remote"
	hiddenXattrs = "trusted.tierfs"
)

// tieredFile is an open file that may be evicted: every read and write
// holds the gate, reads of remote bytes go to the store.
type tieredFile struct {
	*localFile
	t   Tiering
	ino uint64

	// evictedAt is set once a read found the file remote: the tierer's
	// Hydrations then, plus one. Until that count changes nothing can
	// have brought the file back, so reads skip the gate and the state
	// lookup.
	evictedAt atomic.Uint64
	// localAt is set once a read or write found the file local under its
	// gate: the tierer's Evictions then, plus one. Until that count
	// changes no eviction can have made it remote, so reads and writes
	// under the gate skip the state lookup (a getxattr and a decode).
	localAt atomic.Uint64

	mu     sync.Mutex
	remote RemoteReader // opened on the first remote read; GUARDED_BY(mu)
}

var (
	_ = (gofs.FileReader)((*tieredFile)(nil))
	_ = (gofs.FileWriter)((*tieredFile)(nil))
	_ = (gofs.FileSetattrer)((*tieredFile)(nil))
	_ = (gofs.FileAllocater)((*tieredFile)(nil))
	_ = (gofs.FileReleaser)((*tieredFile)(nil))
	_ = (gofs.FilePassthroughFder)((*tieredFile)(nil))
	_ = (gofs.FileLseeker)((*tieredFile)(nil))
)

// PassthroughFd: never; the kernel would read punched holes.
func (tf *tieredFile) PassthroughFd() (int, bool) { return 0, false }

func (tf *tieredFile) state() (string, error) {
	st, _, err := tf.t.State(procFd(int(tf.f.Fd())))
	return st, err
}

// isLocal says whether the file is local now; call it under the gate. A
// file found local stays known local until the tierer's Evictions moves.
func (tf *tieredFile) isLocal() (bool, error) {
	gen := tf.t.Evictions()
	if tf.localAt.Load() == gen+1 {
		return true, nil
	}
	st, err := tf.state()
	if err != nil {
		return false, err
	}
	if st == "remote" {
		return false, nil
	}
	tf.localAt.Store(gen + 1)
	return true, nil
}

func (tf *tieredFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if mv := tf.t.Moving(tf.ino); mv != nil {
		n, err := mv.ReadAt(dest, off)
		if !errors.Is(err, os.ErrClosed) {
			if err != nil && !errors.Is(err, io.EOF) {
				tf.node.root.log.Error("read of a moving file failed", "ino", tf.ino, "offset", off, "err", err)
				return nil, toErrno(&remoteError{err})
			}
			return fuse.ReadResultData(dest[:n]), 0
		}
	}
	if at := tf.evictedAt.Load(); at != 0 && at == tf.t.Hydrations()+1 {
		return tf.readRemote(dest, off)
	}
	gen := tf.t.Hydrations()
	unlock := tf.t.RLock(tf.ino)
	defer unlock()
	local, err := tf.isLocal()
	if err != nil {
		return nil, toErrno(err)
	}
	if local {
		// Copied under the gate: a spliced reply would read the file
		// after the gate is released.
		n, err := unix.Pread(int(tf.f.Fd()), dest, off)
		if err != nil {
			return nil, toErrno(err)
		}
		return fuse.ReadResultData(dest[:n]), 0
	}
	tf.evictedAt.Store(gen + 1)
	return tf.readRemote(dest, off)
}

// Lseek answers SEEK_DATA and SEEK_HOLE for a remote file as for the
// file it stands for: all data, no hole before its end. The backing
// file is all holes, and cp, tar and rsync would copy zeros from it.
func (tf *tieredFile) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return tf.localFile.Lseek(ctx, off, whence)
	}
	unlock := tf.t.RLock(tf.ino)
	defer unlock()
	local, err := tf.isLocal()
	if err != nil {
		return 0, toErrno(err)
	}
	if local {
		return tf.localFile.Lseek(ctx, off, whence)
	}
	var fst unix.Stat_t
	if err := unix.Fstat(int(tf.f.Fd()), &fst); err != nil {
		return 0, toErrno(err)
	}
	if int64(off) >= fst.Size {
		return 0, syscall.ENXIO
	}
	if whence == unix.SEEK_DATA {
		return off, 0
	}
	return uint64(fst.Size), 0
}

func (tf *tieredFile) readRemote(dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if obs := tf.node.root.ops; obs != nil {
		t0 := time.Now()
		res, errno := tf.readRemoteBytes(dest, off)
		obs.ObserveOp("read_remote", time.Since(t0), fuse.Status(errno))
		return res, errno
	}
	return tf.readRemoteBytes(dest, off)
}

func (tf *tieredFile) readRemoteBytes(dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	r, err := tf.remoteReader()
	if err != nil {
		tf.node.root.log.Error("cannot open remote file", "ino", tf.ino, "err", err)
		return nil, toErrno(&remoteError{err})
	}
	if sl, ok := r.(remoteSlicer); ok {
		// Most reads lie in one chunk: reply straight from it.
		if b, release, ok, err := sl.Slice(context.Background(), off, len(dest)); ok {
			if err != nil {
				tf.node.root.log.Error("remote read failed", "ino", tf.ino, "offset", off, "len", len(dest), "err", err)
				return nil, toErrno(&remoteError{err})
			}
			return heldResult{fuse.ReadResultData(b), release}, 0
		}
	}
	n, err := r.ReadAt(dest, off)
	if err != nil && n < len(dest) && !errors.Is(err, io.EOF) {
		tf.node.root.log.Error("remote read failed", "ino", tf.ino, "offset", off, "len", len(dest), "err", err)
		return nil, toErrno(&remoteError{err})
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (tf *tieredFile) remoteReader() (RemoteReader, error) {
	tf.mu.Lock()
	defer tf.mu.Unlock()
	if tf.remote == nil {
		r, err := tf.t.OpenRemote(procFd(int(tf.f.Fd())))
		if err != nil {
			return nil, err
		}
		tf.remote = r
	}
	return tf.remote, nil
}

// refuseRemote runs fn under the gate unless the file is remote.
func (tf *tieredFile) refuseRemote(fn func() syscall.Errno) syscall.Errno {
	unlock := tf.t.RLock(tf.ino)
	defer unlock()
	local, err := tf.isLocal()
	if err != nil {
		return toErrno(err)
	}
	if !local {
		tf.node.root.log.Warn("refused a change to an evicted file", "ino", tf.ino)
		return toErrno(ErrRemote)
	}
	return fn()
}

// Write writes the file; a remote file starts moving, and the write goes
// to its catch-up log.
func (tf *tieredFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	for range 3 {
		if mv := tf.t.Moving(tf.ino); mv != nil {
			n, err := mv.WriteAt(data, off)
			if errors.Is(err, os.ErrClosed) {
				continue // local now
			}
			return uint32(n), toErrno(err)
		}
		var n uint32
		errno := tf.refuseRemote(func() syscall.Errno {
			var e syscall.Errno
			n, e = tf.localFile.Write(ctx, data, off)
			return e
		})
		if errno != toErrno(ErrRemote) {
			return n, errno
		}
		if len(data) == 0 {
			return 0, 0 // changes nothing: no move
		}
		if _, err := tf.node.remoteMove(int(tf.f.Fd()), tiered.CauseWrite); err != nil {
			return 0, toErrno(err)
		}
	}
	return 0, toErrno(ErrRemote)
}

// Setattr: a truncate of an evicted file to another size goes through
// its move; one to the size it has changes no byte and starts nothing.
// The rest (mode, owner, times) applies to the backing file either way.
func (tf *tieredFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	sz, ok := in.GetSize()
	if !ok {
		errno := tf.localFile.Setattr(ctx, in, out)
		tf.node.moveAttr(&out.Attr)
		return errno
	}
	done, err := tf.node.truncateRemote(int(tf.f.Fd()), int64(sz))
	if err != nil {
		return toErrno(err)
	}
	if done {
		rest := *in
		rest.Valid &^= fuse.FATTR_SIZE
		errno := tf.localFile.Setattr(ctx, &rest, out)
		tf.node.moveAttr(&out.Attr)
		return errno
	}
	return tf.refuseRemote(func() syscall.Errno { return tf.localFile.Setattr(ctx, in, out) })
}

func (tf *tieredFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if mv := tf.t.Moving(tf.ino); mv != nil {
		if err := mv.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
			return toErrno(err)
		}
	}
	return tf.localFile.Fsync(ctx, flags)
}

func (tf *tieredFile) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return tf.refuseRemote(func() syscall.Errno { return tf.localFile.Allocate(ctx, off, size, mode) })
}

func (tf *tieredFile) Release(ctx context.Context) syscall.Errno {
	tf.mu.Lock()
	if tf.remote != nil {
		tf.remote.Close()
		tf.remote = nil
	}
	tf.mu.Unlock()
	return tf.localFile.Release(ctx)
}

// wrapTiered gives a file its gated handle if it is tiered (by its path
// rel from the root, or by having a tiering state), and the open flags to
// reply with. A tiered file keeps its page cache across opens
// (FOPEN_KEEP_CACHE): every change to it comes through the mount, which
// keeps the cache right, and eviction does not change its bytes; repeated
// reads are then served by the kernel, as passthrough would.
//
// Any other handle reads the backing file directly (passthrough), so it
// holds its inode against eviction until it is released: a file can be
// renamed into a segment's name while open, and Kafka keeps using the
// handle it opened before.
func (n *node) wrapTiered(lf *localFile, rel string) (gofs.FileHandle, uint32) {
	t := n.root.tiering
	if t == nil || n.IsRoot() {
		return lf, 0
	}
	tf := &tieredFile{localFile: lf, t: t, ino: n.StableAttr().Ino}
	if t.Tiered(rel) {
		return tf, fuse.FOPEN_KEEP_CACHE
	}
	release := t.Hold(tf.ino)
	// A file with a tiering state is tiered whatever its name now (Kafka
	// renames segments to .deleted before removing them). Read after the
	// hold: an eviction that ran shows here, and none can run after.
	if st, err := tf.state(); err == nil && st != "local" {
		release()
		return tf, fuse.FOPEN_KEEP_CACHE
	}
	lf.unhold = release
	return lf, 0
}

// tieringXattr answers user.tierfs.state and user.tierfs.rdi; handled
// reports whether attr was one of them.
func (n *node) tieringXattr(fd int, attr string, dest []byte) (uint32, syscall.Errno, bool) {
	if n.root.tiering == nil || (attr != xattrState && attr != xattrRDI && attr != xattrRemote) {
		return 0, 0, false
	}
	if attr == xattrRemote {
		if n.root.tiering.Moving(n.StableAttr().Ino) != nil {
			return 0, syscall.ENODATA, true
		}
		b, err := n.root.tiering.RemoteCopy(procFd(fd))
		if err != nil {
			return 0, toErrno(err), true
		}
		if b == nil {
			return 0, syscall.ENODATA, true
		}
		if len(dest) == 0 {
			return uint32(len(b)), 0, true
		}
		if len(dest) < len(b) {
			return 0, syscall.ERANGE, true
		}
		return uint32(copy(dest, b)), 0, true
	}
	st, rdi, err := n.root.tiering.State(procFd(fd))
	if err != nil {
		return 0, toErrno(err), true
	}
	if st == "remote" && n.root.tiering.Moving(n.StableAttr().Ino) != nil {
		st = "moving" // coming back: changed through its catch-up log
	}
	val := st
	if attr == xattrRDI {
		if rdi == "" {
			return 0, syscall.ENODATA, true
		}
		val = rdi
	}
	if len(dest) == 0 {
		return uint32(len(val)), 0, true
	}
	if len(dest) < len(val) {
		return 0, syscall.ERANGE, true
	}
	return uint32(copy(dest, val)), 0, true
}

// hiddenXattr is tierfs's own state on backing files: not for the mount.
func hiddenXattr(attr string) bool { return strings.HasPrefix(attr, hiddenXattrs) }

// filterXattrList drops hidden names from a listxattr result.
func filterXattrList(b []byte) []byte {
	out := b[:0]
	for _, name := range strings.SplitAfter(string(b), "\x00") {
		if name != "" && !hiddenXattr(strings.TrimSuffix(name, "\x00")) {
			out = append(out, name...)
		}
	}
	return out
}

// remoteMove is the move of the file open at fd: under way, or started
// now for cause if the file is remote; nil for a local file. The caller
// makes its change through it at once. With change management a remote
// file is not changed (ErrRemote): its original could not be retained
// from a catch-up log.
func (n *node) remoteMove(fd int, cause tiered.Cause) (Mover, error) {
	t := n.root.tiering
	if t == nil {
		return nil, nil
	}
	ino := n.StableAttr().Ino
	if mv := t.Moving(ino); mv != nil {
		return mv, nil
	}
	st, _, err := t.State(procFd(fd))
	if err != nil || st != "remote" {
		return nil, err
	}
	if n.root.changes != nil {
		return nil, fmt.Errorf("change: %w", ErrRemote)
	}
	mv, err := t.StartMove(n.Path(n.Root()), ino, cause)
	if err != nil {
		n.root.log.Error("cannot start moving an evicted file back", "path", n.Path(n.Root()), "cause", cause.String(), "err", err)
		return nil, err
	}
	return mv, nil
}

// truncateRemote truncates the file open at fd to size if it is remote
// or moving, and says whether it did: through its move, or not at all
// when size is the size the file has (that changes no byte, so it is no
// reason to bring the file back). The caller applies the rest of the
// request without the size; on false, it truncates the local file.
func (n *node) truncateRemote(fd int, size int64) (bool, error) {
	t := n.root.tiering
	if t == nil {
		return false, nil
	}
	mv := t.Moving(n.StableAttr().Ino)
	if mv == nil {
		now, remote, err := n.evictedSize(fd)
		if err != nil || !remote {
			return false, err
		}
		if now == size {
			return true, nil
		}
		if mv, err = n.remoteMove(fd, tiered.CauseTruncate); err != nil || mv == nil {
			return false, err
		}
	}
	if err := mv.Truncate(size); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return false, nil // local now
		}
		return false, err
	}
	return true, nil
}

// moveAttr gives a moving file's size and mtime (its backing file has
// neither yet).
func (n *node) moveAttr(a *fuse.Attr) { n.root.moveAttr(n.StableAttr().Ino, a) }

func (r *Root) moveAttr(ino uint64, a *fuse.Attr) {
	t := r.tiering
	if t == nil {
		return
	}
	mv := t.Moving(ino)
	if mv == nil {
		return
	}
	size, mt := mv.Attr()
	a.Size = uint64(size)
	a.Blocks = (a.Size + 511) / 512
	a.Mtime, a.Mtimensec = uint64(mt/1e9), uint32(mt%1e9)
}

// refuseRemoteTruncate refuses (with change management on) a truncate of
// an evicted file to another size: its original could not be retained
// from a catch-up log. One to the size it has changes nothing.
func (n *node) refuseRemoteTruncate(fd int, size int64) error {
	t := n.root.tiering
	if t == nil {
		return nil
	}
	if t.Moving(n.StableAttr().Ino) == nil {
		now, remote, err := n.evictedSize(fd)
		if err != nil || !remote || now == size {
			return err
		}
	}
	_, err := n.remoteMove(fd, tiered.CauseTruncate)
	return err
}

// evictedSize says whether the file open at fd is evicted (and not
// moving), and its size: the backing file of an evicted file keeps it.
func (n *node) evictedSize(fd int) (size int64, remote bool, err error) {
	st, _, err := n.root.tiering.State(procFd(fd))
	if err != nil || st != "remote" {
		return 0, false, err
	}
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return 0, false, err
	}
	return fst.Size, true, nil
}
