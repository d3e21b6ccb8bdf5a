package fs

import (
	"context"
	"os"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var (
	_ = (gofs.NodeOpener)((*node)(nil))
	_ = (gofs.NodeCopyFileRanger)((*node)(nil))
)

// openFlags turns the flags of a FUSE OPEN or CREATE into flags for the
// backing open. O_APPEND is dropped: the kernel computes the offset of an
// appending write itself and sends it, and pwrite on an O_APPEND descriptor
// would ignore it. FMODE_EXEC is a kernel-internal bit. O_NOFOLLOW was
// applied by the kernel's own lookup, and the node is reopened through a
// /proc magic link, which O_NOFOLLOW would refuse with ELOOP.
func openFlags(flags uint32) int {
	return int(flags&^(syscall.O_APPEND|fuse.FMODE_EXEC|syscall.O_NOFOLLOW)) | unix.O_CLOEXEC
}

// openSelf opens this node's inode by re-opening its O_PATH descriptor
// through /proc (or its file handle), so it cannot land on a file that
// replaced the name.
func (n *node) openSelf(flags int) (int, error) {
	fd, err := n.reopen(flags)
	if err == unix.EMFILE || err == unix.ENFILE {
		// Out of descriptors: idle nodes give theirs back, once.
		if n.root.fds.reclaim(64) > 0 {
			fd, err = n.reopen(flags)
		}
	}
	return fd, err
}

func (n *node) reopen(flags int) (int, error) {
	if fd, ok := n.heldFd(); ok {
		defer n.unpin()
		return unix.Open(procFd(fd), flags|unix.O_CLOEXEC, 0)
	}
	return n.handle.open(n.root.backingFd, flags)
}

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	oflags := openFlags(flags)
	if n.root.changes != nil || n.root.tiering != nil {
		// Done after the original is retained, or through the catch-up
		// log of an evicted file: its backing file must keep its size.
		oflags &^= syscall.O_TRUNC
	}
	fd, err := n.openSelf(oflags)
	if err != nil {
		return nil, 0, toErrno(err)
	}
	rel := n.Path(n.Root())
	if flags&syscall.O_TRUNC != 0 && (n.root.changes != nil || n.root.tiering != nil) {
		cut := func() error {
			return n.truncate(fd, 0, func() error { return unix.Ftruncate(fd, 0) })
		}
		if n.root.changes != nil {
			// The original is retained before the open cuts it.
			err = n.truncateTracked(fd, rel, 0, cut)
		} else {
			err = cut()
		}
		if err != nil {
			unix.Close(fd)
			return nil, 0, toErrno(err)
		}
	}
	// An evicted file opened for writing stays evicted until it is
	// written or truncated: a broker opens every segment read-write at
	// start-up and changes none of the old ones.
	fh, fl, err := n.newHandle(ctx, fd, flags, rel)
	return fh, fl, toErrno(err)
}

func (n *node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	in, ok1 := fhIn.(*localFile)
	dst, ok2 := fhOut.(*localFile)
	if !ok1 || !ok2 {
		return 0, syscall.EXDEV
	}
	rOff, wOff := int64(offIn), int64(offOut)
	got, err := unix.CopyFileRange(int(in.f.Fd()), &rOff, int(dst.f.Fd()), &wOff, int(length), int(flags))
	return uint32(got), toErrno(err)
}

// localFile is an open file whose bytes are on the backing disk. All I/O is
// go-fuse's LoopbackFile on the backing descriptor; with passthrough on, the
// kernel does reads, writes and mmap on that descriptor itself and most of
// these methods are never called.
type localFile struct {
	*gofs.LoopbackFile
	f    *os.File
	node *node
	// unhold, when set, ends this handle's hold on its inode against
	// eviction (see wrapTiered).
	unhold func()
	// cm, when set, tracks this open for change management.
	cm *cmSession
	// cached says the handle is served by FUSE reads and writes on
	// purpose, and releaseMode ends its count (see ioModes).
	cached      bool
	releaseMode func()
}

var (
	_ = (gofs.FilePassthroughFder)((*localFile)(nil))
	_ = (gofs.FileReleaser)((*localFile)(nil))
	_ = (gofs.FileWriter)((*localFile)(nil))
	_ = (gofs.FileAllocater)((*localFile)(nil))
	_ = (gofs.FileFlusher)((*localFile)(nil))
	_ = (gofs.FileFsyncer)((*localFile)(nil))
)

func (lf *localFile) Release(ctx context.Context) syscall.Errno {
	lf.cm.noteWritten(int(lf.f.Fd()))
	if lf.releaseMode != nil {
		lf.releaseMode()
	}
	if lf.unhold != nil {
		lf.unhold()
	}
	defer lf.node.root.fds.fileClosed()
	return lf.LoopbackFile.Release(ctx)
}

func (lf *localFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if err := lf.cm.beforeWrite(int(lf.f.Fd()), off); err != nil {
		return 0, toErrno(err)
	}
	return lf.LoopbackFile.Write(ctx, data, off)
}

// Allocate: punching or zeroing a range changes bytes like a write.
func (lf *localFile) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	if mode&^unix.FALLOC_FL_KEEP_SIZE != 0 {
		if err := lf.cm.beforeWrite(int(lf.f.Fd()), int64(off)); err != nil {
			return toErrno(err)
		}
	}
	return lf.LoopbackFile.Allocate(ctx, off, size, mode)
}

// Flush (each close) and Fsync record what was written since the last
// event, so the event log follows the file even while it stays open.
func (lf *localFile) Flush(ctx context.Context) syscall.Errno {
	errno := lf.LoopbackFile.Flush(ctx)
	lf.cm.noteWritten(int(lf.f.Fd()))
	return errno
}

func (lf *localFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	errno := lf.LoopbackFile.Fsync(ctx, flags)
	lf.cm.noteWritten(int(lf.f.Fd()))
	return errno
}

func (lf *localFile) backingFd() int { return int(lf.f.Fd()) }

func newLocalFile(n *node, fd int) *localFile {
	n.root.fds.fileOpened()
	f := os.NewFile(uintptr(fd), "")
	return &localFile{LoopbackFile: gofs.NewLoopbackFileFromOS(f), f: f, node: n}
}

// PassthroughFd offers the backing descriptor to the kernel, when
// passthrough is on for this mount.
func (lf *localFile) PassthroughFd() (int, bool) {
	if !lf.node.root.passthrough.Load() || lf.cached {
		return 0, false
	}
	return lf.LoopbackFile.PassthroughFd()
}
