package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/tiered"
)

// Tiering is what fs needs from the tierer to serve files whose bytes may
// be in the store. fs never sees the store or the state format: it opens
// a tiered.File for each open of a tiered file and hands it every read
// and change; the file knows where its bytes are.
type Tiering interface {
	// Tiered says whether the file at rel (a path from the root) can be
	// shipped and evicted: such files are served by FUSE reads through
	// their tiered.File instead of kernel passthrough, so their bytes can
	// move while they are open.
	Tiered(rel string) bool
	// Hold keeps inode ino from being evicted while a handle that reads
	// the backing file directly is open; it waits for an eviction under
	// way, so a state read after it is final while the hold lasts.
	Hold(ino uint64) (release func())
	// Open is the tiered file at fd (the backing file, O_PATH or not;
	// it stays fs's), inode ino, named rel from the root now.
	Open(ino uint64, rel string, fd int, flags tiered.OpenFlags) (tiered.File, error)
	// Attr is the size and mtime of inode ino while it moves back from
	// the store (its backing file has neither yet); ok is false for any
	// other inode.
	Attr(ino uint64) (size, mtimeNs int64, ok bool)
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
var ErrRemote = tiered.ErrRemote

// tieredFile is an open file that may be evicted: its reads and changes
// go to its tiered.File, which reads the backing file under the gate or
// the store, and moves the file back when it is changed.
type tieredFile struct {
	*localFile
	tf  tiered.File
	ino uint64
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
func (h *tieredFile) PassthroughFd() (int, bool) { return 0, false }

func (h *tieredFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if obs := h.node.root.ops; obs != nil {
		// Reads served from the store are observed apart, as
		// "read_remote" (the file's state is known: no lookup).
		if st, err := h.tf.State(); err == nil && st.InStore() {
			t0 := time.Now()
			res, errno := h.read(dest, off)
			obs.ObserveOp("read_remote", time.Since(t0), fuse.Status(errno))
			return res, errno
		}
	}
	return h.read(dest, off)
}

func (h *tieredFile) read(dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	// Most reads of a remote file lie in one chunk: reply straight from it.
	if b, release, ok, err := h.tf.Slice(off, len(dest)); ok {
		if err != nil {
			h.node.root.log.Error("read of a tiered file failed", "ino", h.ino, "offset", off, "len", len(dest), "err", err)
			return nil, toErrno(err)
		}
		return heldResult{fuse.ReadResultData(b), release}, 0
	}
	// Copied: a spliced reply would read the backing file after the
	// gate is released.
	n, err := h.tf.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		h.node.root.log.Error("read of a tiered file failed", "ino", h.ino, "offset", off, "len", len(dest), "err", err)
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// Lseek answers SEEK_DATA and SEEK_HOLE for a remote file as for the
// file it stands for: all data, no hole before its end. The backing
// file is all holes, and cp, tar and rsync would copy zeros from it.
func (h *tieredFile) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return h.localFile.Lseek(ctx, off, whence)
	}
	var res uint64
	var errno syscall.Errno
	err := h.tf.Locked(func(st tiered.State) error {
		if st.LocalBytes() {
			res, errno = h.localFile.Lseek(ctx, off, whence)
			return nil
		}
		var fst unix.Stat_t
		if err := unix.Fstat(int(h.f.Fd()), &fst); err != nil {
			return err
		}
		switch {
		case int64(off) >= fst.Size:
			errno = syscall.ENXIO
		case whence == unix.SEEK_DATA:
			res = off
		default:
			res = uint64(fst.Size)
		}
		return nil
	})
	if err != nil {
		return 0, toErrno(err)
	}
	return res, errno
}

// refused logs a change refused because the file is in the store.
func (h *tieredFile) refused(err error) {
	if errors.Is(err, ErrRemote) {
		h.node.root.log.Warn("refused a change to an evicted file", "ino", h.ino, "err", err)
	}
}

// Write writes the file; a remote file starts moving, and the write goes
// to its catch-up log.
func (h *tieredFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := h.tf.WriteAt(data, off, func() (int, error) {
		n, errno := h.localFile.Write(ctx, data, off)
		if errno != 0 {
			return int(n), errno
		}
		return int(n), nil
	})
	h.refused(err)
	return uint32(n), toErrno(err)
}

// Setattr: a truncate of an evicted file to another size goes through
// its move; one to the size it has changes no byte and starts nothing.
// The rest (mode, owner, times) applies to the backing file either way.
func (h *tieredFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	sz, ok := in.GetSize()
	if !ok {
		errno := h.localFile.Setattr(ctx, in, out)
		h.node.moveAttr(&out.Attr)
		return errno
	}
	ran := false
	err := h.tf.Truncate(int64(sz), func() error {
		ran = true
		if errno := h.localFile.Setattr(ctx, in, out); errno != 0 {
			return errno
		}
		return nil
	})
	if err != nil {
		h.refused(err)
		return toErrno(err)
	}
	if !ran {
		rest := *in
		rest.Valid &^= fuse.FATTR_SIZE
		if errno := h.localFile.Setattr(ctx, &rest, out); errno != 0 {
			return errno
		}
	}
	h.node.moveAttr(&out.Attr)
	return 0
}

func (h *tieredFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if err := h.tf.Sync(); err != nil {
		return toErrno(err)
	}
	return h.localFile.Fsync(ctx, flags)
}

func (h *tieredFile) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	err := h.tf.Locked(func(st tiered.State) error {
		if !st.LocalBytes() {
			return ErrRemote
		}
		if errno := h.localFile.Allocate(ctx, off, size, mode); errno != 0 {
			return errno
		}
		return nil
	})
	h.refused(err)
	return toErrno(err)
}

func (h *tieredFile) Release(ctx context.Context) syscall.Errno {
	h.tf.Close()
	return h.localFile.Release(ctx)
}

// openTiered is the tiered view of the file this node has open at fd
// (O_PATH or not), named rel from the root ("": not known, which spares
// a walk up the tree for an attribute read or a truncate; the tierer
// asks the descriptor when it needs the name); nil without tiering. The
// caller closes it.
func (n *node) openTiered(fd int, rel string) (tiered.File, error) {
	t := n.root.tiering
	if t == nil {
		return nil, nil
	}
	var flags tiered.OpenFlags
	if n.root.changes != nil {
		// With change management a remote file is not changed: its
		// original could not be retained from a catch-up log.
		flags |= tiered.NoMove
	}
	return t.Open(n.StableAttr().Ino, rel, fd, flags)
}

// wrapTiered gives a file its tiered handle if it is tiered (by its path
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
func (n *node) wrapTiered(lf *localFile, rel string) (gofs.FileHandle, uint32, error) {
	t := n.root.tiering
	if t == nil || n.IsRoot() {
		return lf, 0, nil
	}
	ino := n.StableAttr().Ino
	if t.Tiered(rel) {
		tf, err := n.openTiered(int(lf.f.Fd()), rel)
		if err != nil {
			return nil, 0, err
		}
		return &tieredFile{localFile: lf, tf: tf, ino: ino}, fuse.FOPEN_KEEP_CACHE, nil
	}
	release := t.Hold(ino)
	// A file with a tiering state is tiered whatever its name now (Kafka
	// renames segments to .deleted before removing them). Read after the
	// hold: an eviction that ran shows here, and none can run after.
	if tf, err := n.openTiered(int(lf.f.Fd()), rel); err == nil {
		if st, err := tf.State(); err == nil && st != tiered.StateLocal {
			release()
			return &tieredFile{localFile: lf, tf: tf, ino: ino}, fuse.FOPEN_KEEP_CACHE, nil
		}
		tf.Close()
	}
	lf.unhold = release
	return lf, 0, nil
}

// tieringXattr answers user.tierfs.state, user.tierfs.rdi and
// user.tierfs.remote; handled reports whether attr was one of them.
func (n *node) tieringXattr(fd int, attr string, dest []byte) (uint32, syscall.Errno, bool) {
	if n.root.tiering == nil || (attr != tiered.XattrState && attr != tiered.XattrRDI && attr != tiered.XattrRemote) {
		return 0, 0, false
	}
	tf, err := n.openTiered(fd, "")
	if err != nil {
		return 0, toErrno(err), true
	}
	defer tf.Close()
	var val []byte
	switch attr {
	case tiered.XattrRemote:
		val, err = tf.RemoteCopy()
	case tiered.XattrRDI:
		var rdi string
		rdi, err = tf.RDI()
		val = []byte(rdi)
	default:
		var st tiered.State
		st, err = tf.State()
		val = []byte(st.String())
	}
	if err != nil {
		return 0, toErrno(err), true
	}
	if len(val) == 0 {
		return 0, syscall.ENODATA, true
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
func hiddenXattr(attr string) bool { return strings.HasPrefix(attr, tiered.HiddenXattrPrefix) }

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

// truncate sets the size of the file open at fd (O_PATH or not) through
// its tiered view, running local (the truncate of the backing file) under
// the gate if its bytes are local. A remote file moves, or, truncated to
// the size it has, is left as it is (local is not run).
func (n *node) truncate(fd int, size int64, local func() error) error {
	tf, err := n.openTiered(fd, "")
	if err != nil {
		return err
	}
	if tf == nil {
		return local()
	}
	defer tf.Close()
	return tf.Truncate(size, local)
}

// moveAttr gives a moving file's size and mtime (its backing file has
// neither yet).
func (n *node) moveAttr(a *fuse.Attr) { n.root.moveAttr(n.StableAttr().Ino, a) }

func (r *Root) moveAttr(ino uint64, a *fuse.Attr) {
	t := r.tiering
	if t == nil {
		return
	}
	size, mt, ok := t.Attr(ino)
	if !ok {
		return
	}
	a.Size = uint64(size)
	a.Blocks = (a.Size + 511) / 512
	a.Mtime, a.Mtimensec = uint64(mt/1e9), uint32(mt%1e9)
}

// refuseRemoteTruncate refuses (with change management on) a truncate of
// an evicted file to another size: its original could not be retained
// from a catch-up log. One to the size it has changes nothing, and a
// file moving already takes it through its move.
func (n *node) refuseRemoteTruncate(fd int, size int64) error {
	tf, err := n.openTiered(fd, "")
	if err != nil || tf == nil {
		return err
	}
	defer tf.Close()
	return tf.Locked(func(st tiered.State) error {
		if !st.InStore() {
			return nil
		}
		var fst unix.Stat_t
		if err := unix.Fstat(fd, &fst); err != nil {
			return err
		}
		if fst.Size == size {
			return nil
		}
		return fmt.Errorf("change: %w", ErrRemote)
	})
}
