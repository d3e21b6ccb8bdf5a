package fs

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is one file, directory or symlink of the backing tree.
//
// Each node holds an O_PATH descriptor of its backing inode for as long as
// the kernel knows the node (until FORGET). Every operation goes through it:
// a directory's entries are reached with *at calls on the directory's
// descriptor, and an open re-opens the descriptor itself. So an operation
// always reaches the inode the kernel asked about, whatever renames happen
// meanwhile, and an inode the kernel still knows cannot disappear from under
// it: an open racing a rename-over opens the old file, as it would natively.
// (This is what virtiofsd does; go-fuse's loopback re-resolves paths.)
type node struct {
	gofs.Inode
	root *Root

	// fd is the O_PATH descriptor; set at creation, closed by OnForget
	// (or, for a node that go-fuse discarded in favour of an equal one,
	// by a cleanup when it is garbage collected).
	fd      int
	cleanup runtime.Cleanup
	closed  atomic.Bool
}

var (
	_ = (gofs.NodeLookuper)((*node)(nil))
	_ = (gofs.NodeGetattrer)((*node)(nil))
	_ = (gofs.NodeSetattrer)((*node)(nil))
	_ = (gofs.NodeStatfser)((*node)(nil))
	_ = (gofs.NodeReadlinker)((*node)(nil))
	_ = (gofs.NodeGetxattrer)((*node)(nil))
	_ = (gofs.NodeSetxattrer)((*node)(nil))
	_ = (gofs.NodeRemovexattrer)((*node)(nil))
	_ = (gofs.NodeListxattrer)((*node)(nil))
	_ = (gofs.NodeOnForgetter)((*node)(nil))
)

func (n *node) isRoot() bool { return n == n.root.rootNode }

// newNode wraps a fresh O_PATH descriptor.
func newNode(r *Root, fd int) *node {
	n := &node{root: r, fd: fd}
	n.cleanup = runtime.AddCleanup(n, closeFd, fd)
	return n
}

func closeFd(fd int) { unix.Close(fd) }

// OnForget closes the descriptor once the kernel has forgotten the node.
func (n *node) OnForget() {
	if n.isRoot() || n.closed.Swap(true) {
		return
	}
	n.cleanup.Stop()
	unix.Close(n.fd)
}

// self is "/proc/self/fd/N" for this node's descriptor: the path form of
// the inode, for the calls that have no descriptor form.
func (n *node) self() string {
	return "/proc/self/fd/" + strconv.Itoa(n.fd)
}

// hides reports whether name is an entry of this directory that the mount
// never shows.
func (n *node) hides(name string) bool {
	return n.isRoot() && name == StateDirName
}

func (n *node) isSymlink() bool {
	return n.StableAttr().Mode == syscall.S_IFLNK
}

const statxMask = unix.STATX_BASIC_STATS | unix.STATX_BTIME

func statxAt(dirfd int, path string, st *unix.Statx_t) error {
	flags := unix.AT_SYMLINK_NOFOLLOW
	if path == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	return unix.Statx(dirfd, path, flags, statxMask, st)
}

// fillAttr copies a statx result into a FUSE attribute.
func fillAttr(out *fuse.Attr, st *unix.Statx_t) {
	out.Ino = st.Ino
	out.Size = st.Size
	out.Blocks = st.Blocks
	out.Blksize = st.Blksize
	out.Mode = uint32(st.Mode)
	out.Nlink = st.Nlink
	out.Owner = fuse.Owner{Uid: st.Uid, Gid: st.Gid}
	out.Rdev = uint32(unix.Mkdev(st.Rdev_major, st.Rdev_minor))
	out.Atime, out.Atimensec = uint64(st.Atime.Sec), st.Atime.Nsec
	out.Mtime, out.Mtimensec = uint64(st.Mtime.Sec), st.Mtime.Nsec
	out.Ctime, out.Ctimensec = uint64(st.Ctime.Sec), st.Ctime.Nsec
}

// lookupAt builds the child node for the entry name of the directory open
// at dirfd. Attributes, identity and the node's descriptor all come from one
// O_PATH open, so they are certainly of the same inode.
func (n *node) lookupAt(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, error) {
	fd, err := unix.Openat(n.fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return n.childFromPathFd(ctx, fd, out)
}

// childFromPathFd builds a child node that owns the O_PATH descriptor fd.
func (n *node) childFromPathFd(ctx context.Context, fd int, out *fuse.EntryOut) (*gofs.Inode, error) {
	var st unix.Statx_t
	if err := statxAt(fd, "", &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	var h fileHandle
	if n.root.handles {
		h, _ = nameToHandle(fd, "")
	}
	fillAttr(&out.Attr, &st)
	return n.NewInode(ctx, newNode(n.root, fd), n.root.stableAttr(&st, h)), nil
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.hides(name) {
		return nil, syscall.ENOENT
	}
	ch, err := n.lookupAt(ctx, name, out)
	return ch, toErrno(err)
}

func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if fga, ok := f.(gofs.FileGetattrer); ok {
		return fga.Getattr(ctx, out)
	}
	var st unix.Statx_t
	if err := statxAt(n.fd, "", &st); err != nil {
		return toErrno(err)
	}
	fillAttr(&out.Attr, &st)
	return 0
}

func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if fsa, ok := f.(gofs.FileSetattrer); ok {
		return fsa.Setattr(ctx, in, out)
	}
	if err := setattrFd(n.fd, in); err != nil {
		return toErrno(err)
	}
	var st unix.Statx_t
	if err := statxAt(n.fd, "", &st); err != nil {
		return toErrno(err)
	}
	fillAttr(&out.Attr, &st)
	return 0
}

// setattrFd applies a SETATTR to the inode open at the O_PATH descriptor fd.
// The size is changed before the times, so an explicit mtime is kept.
func setattrFd(fd int, in *fuse.SetAttrIn) error {
	self := "/proc/self/fd/" + strconv.Itoa(fd)
	if m, ok := in.GetMode(); ok {
		if err := unix.Fchmodat(unix.AT_FDCWD, self, m, 0); err != nil {
			return err
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		suid, sgid := -1, -1
		if uok {
			suid = int(uid)
		}
		if gok {
			sgid = int(gid)
		}
		if err := unix.Fchownat(fd, "", suid, sgid, unix.AT_EMPTY_PATH); err != nil {
			return err
		}
	}
	if sz, ok := in.GetSize(); ok {
		if err := unix.Truncate(self, int64(sz)); err != nil {
			return err
		}
	}
	mtime, mok := in.GetMTime()
	atime, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if aok {
			ts[0] = unix.NsecToTimespec(atime.UnixNano())
		}
		if mok {
			ts[1] = unix.NsecToTimespec(mtime.UnixNano())
		}
		if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
			return err
		}
	}
	return nil
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var s unix.Statfs_t
	if err := unix.Fstatfs(n.root.backingFd, &s); err != nil {
		return toErrno(err)
	}
	out.Blocks, out.Bfree, out.Bavail = s.Blocks, s.Bfree, s.Bavail
	out.Files, out.Ffree = s.Files, s.Ffree
	out.Bsize, out.Frsize = uint32(s.Bsize), uint32(s.Frsize)
	out.NameLen = uint32(s.Namelen)
	return 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		got, err := unix.Readlinkat(n.fd, "", buf)
		if err != nil {
			return nil, toErrno(err)
		}
		if got < size {
			return buf[:got], 0
		}
	}
}

// Extended attributes have no O_PATH-descriptor calls. Through the magic
// link of the descriptor they reach the inode itself; symlinks (which can
// only carry trusted and security attributes) have no xattr support here.

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if n.isSymlink() {
		return 0, syscall.ENODATA
	}
	sz, err := unix.Getxattr(n.self(), attr, dest)
	return uint32(sz), toErrno(err)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.isSymlink() {
		return syscall.EPERM
	}
	return toErrno(unix.Setxattr(n.self(), attr, data, int(flags)))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.isSymlink() {
		return syscall.ENODATA
	}
	return toErrno(unix.Removexattr(n.self(), attr))
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	if n.isSymlink() {
		return 0, 0
	}
	sz, err := unix.Listxattr(n.self(), dest)
	return uint32(sz), toErrno(err)
}
