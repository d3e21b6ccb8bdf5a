package fs

import (
	"context"
	"os"
	"sync/atomic"
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
// would ignore it. FMODE_EXEC is a kernel-internal bit.
func openFlags(flags uint32) int {
	return int(flags&^(syscall.O_APPEND|fuse.FMODE_EXEC)) | unix.O_CLOEXEC
}

// openSelf opens exactly this node's inode. Through a file handle the open
// cannot land on a file that replaced the name in the meantime; if the inode
// is gone, ESTALE makes the kernel redo the lookup and open what the name
// now holds, as a native open would.
func (n *node) openSelf(flags int) (int, error) {
	if n.handle.ok {
		return n.handle.open(n.root.backingFd, flags)
	}
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := unix.Openat2(n.root.backingFd, n.rel(), &how)
	if err != nil {
		if err == unix.ENOENT && !n.isRoot() {
			return -1, unix.ESTALE
		}
		return -1, err
	}
	var st unix.Statx_t
	if err := statxAt(fd, "", &st); err != nil || !n.sameInode(&st) {
		unix.Close(fd)
		return -1, unix.ESTALE
	}
	return fd, nil
}

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fd, err := n.openSelf(openFlags(flags))
	if err != nil {
		return nil, 0, toErrno(err)
	}
	return newLocalFile(n, fd), 0, 0
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

	// Passthrough accounting: go-fuse silently stops offering backing
	// files for the whole mount after one registration fails. It asks a
	// handle for its descriptor only when no other handle of the node is
	// registered, so a handle that was never asked while no sibling was
	// registered, and no sibling was registered during its life, means
	// passthrough was lost.
	offered     atomic.Bool
	liveAtOpen  int32
	totalAtOpen uint64
}

var (
	_ = (gofs.FilePassthroughFder)((*localFile)(nil))
	_ = (gofs.FileReleaser)((*localFile)(nil))
)

func newLocalFile(n *node, fd int) *localFile {
	f := os.NewFile(uintptr(fd), "")
	return &localFile{
		LoopbackFile: gofs.NewLoopbackFileFromOS(f),
		f:            f,
		node:         n,
		liveAtOpen:   n.offeredLive.Load(),
		totalAtOpen:  n.offeredTotal.Load(),
	}
}

// PassthroughFd offers the backing descriptor to the kernel, when
// passthrough is on for this mount.
func (lf *localFile) PassthroughFd() (int, bool) {
	if !lf.node.root.passthrough {
		return 0, false
	}
	fd, ok := lf.LoopbackFile.PassthroughFd()
	if ok && !lf.offered.Swap(true) {
		lf.node.offeredLive.Add(1)
		lf.node.offeredTotal.Add(1)
	}
	return fd, ok
}

func (lf *localFile) Release(ctx context.Context) syscall.Errno {
	if lf.offered.Load() {
		lf.node.offeredLive.Add(-1)
	} else if lf.node.root.passthrough && lf.liveAtOpen == 0 && lf.totalAtOpen == lf.node.offeredTotal.Load() {
		lf.node.root.notePassthroughLost()
	}
	return lf.LoopbackFile.Release(ctx)
}

// notePassthroughLost logs, once, that the kernel no longer gets backing
// files for this mount.
func (r *Root) notePassthroughLost() {
	if !r.passthroughLost.Swap(true) {
		r.log.Warn("kernel passthrough stopped for this mount: a backing file registration failed; local files are now served through FUSE reads and writes (slower, still correct)")
	}
}

// PassthroughLost reports whether passthrough was on at mount and has since
// been turned off by a failed registration.
func (r *Root) PassthroughLost() bool { return r.passthroughLost.Load() }
