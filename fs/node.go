package fs

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is one file, directory or symlink of the backing tree.
//
// Paths are resolved relative to Root.backingFd. Operations that must reach
// exactly this inode even while its name is being replaced (open, attribute
// changes without an open file) go through the file handle instead.
type node struct {
	gofs.Inode
	root *Root

	// handle is set when the node is created and never changes.
	handle fileHandle

	// Passthrough accounting (see localFile): handles of this node that
	// were offered to the kernel and are still open, and how many were
	// ever offered.
	offeredLive  atomic.Int32
	offeredTotal atomic.Uint64
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
)

func (n *node) isRoot() bool { return n == n.root.rootNode }

// rel is the node's path relative to the backing directory ("." for the
// root). An orphaned node (its last name unlinked) gets a path that does
// not exist, so path operations on it fail with ENOENT.
func (n *node) rel() string {
	if n.isRoot() {
		return "."
	}
	return n.Path(n.root.rootNode.EmbeddedInode())
}

// childRel is the relative path of the entry name in this directory.
func (n *node) childRel(name string) string {
	if n.isRoot() {
		return name
	}
	return n.rel() + "/" + name
}

// procPath reaches a relative path through /proc/self/fd of the backing
// descriptor, for the calls that have no *at form (xattrs).
func (n *node) procPath(rel string) string {
	return fmt.Sprintf("/proc/self/fd/%d/%s", n.root.backingFd, rel)
}

// hides reports whether name is an entry of this directory that the mount
// never shows.
func (n *node) hides(name string) bool {
	return n.isRoot() && name == StateDirName
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

// openPath returns an O_PATH descriptor of exactly this node's inode.
// The caller closes it.
func (n *node) openPath() (int, error) {
	if n.handle.ok {
		return n.handle.open(n.root.backingFd, unix.O_PATH|unix.O_NOFOLLOW)
	}
	return unix.Openat(n.root.backingFd, n.rel(), unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// sameInode reports whether st describes this node's inode.
func (n *node) sameInode(st *unix.Statx_t) bool {
	return n.root.stableAttr(st) == n.StableAttr()
}

// statSelf stats this node's inode: by path first (one syscall), through
// the handle when the path no longer leads to it.
func (n *node) statSelf(st *unix.Statx_t) error {
	if n.isRoot() {
		return statxAt(n.root.backingFd, "", st)
	}
	err := statxAt(n.root.backingFd, n.rel(), st)
	if err == nil && n.sameInode(st) {
		return nil
	}
	if !n.handle.ok {
		if err == nil {
			return syscall.ESTALE
		}
		return err
	}
	fd, herr := n.openPath()
	if herr != nil {
		return herr
	}
	defer unix.Close(fd)
	return statxAt(fd, "", st)
}

// lookupCreated builds the child node for an entry that exists at rel,
// identified through one O_PATH descriptor so that its attributes and its
// handle are certainly of the same inode.
func (n *node) lookupCreated(ctx context.Context, rel string, out *fuse.EntryOut) (*gofs.Inode, error) {
	fd, err := unix.Openat(n.root.backingFd, rel, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return n.childFromFd(ctx, fd, out)
}

// childFromFd builds the child node for the inode open at fd.
func (n *node) childFromFd(ctx context.Context, fd int, out *fuse.EntryOut) (*gofs.Inode, error) {
	var st unix.Statx_t
	if err := statxAt(fd, "", &st); err != nil {
		return nil, err
	}
	child := &node{root: n.root}
	if n.root.handles {
		child.handle, _ = nameToHandle(fd, "")
	}
	fillAttr(&out.Attr, &st)
	return n.NewInode(ctx, child, n.root.stableAttr(&st)), nil
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.hides(name) {
		return nil, syscall.ENOENT
	}
	ch, err := n.lookupCreated(ctx, n.childRel(name), out)
	return ch, toErrno(err)
}

func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if fga, ok := f.(gofs.FileGetattrer); ok {
		return fga.Getattr(ctx, out)
	}
	var st unix.Statx_t
	if err := n.statSelf(&st); err != nil {
		return toErrno(err)
	}
	fillAttr(&out.Attr, &st)
	return 0
}

func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if fsa, ok := f.(gofs.FileSetattrer); ok {
		return fsa.Setattr(ctx, in, out)
	}
	fd, err := n.openPath()
	if err != nil {
		return toErrno(err)
	}
	defer unix.Close(fd)
	if err := setattrFd(fd, in); err != nil {
		return toErrno(err)
	}
	var st unix.Statx_t
	if err := statxAt(fd, "", &st); err != nil {
		return toErrno(err)
	}
	fillAttr(&out.Attr, &st)
	return 0
}

// setattrFd applies a SETATTR to the inode open at the O_PATH descriptor fd.
// The size is changed before the times, so an explicit mtime is kept.
func setattrFd(fd int, in *fuse.SetAttrIn) error {
	self := fmt.Sprintf("/proc/self/fd/%d", fd)
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
		got, err := unix.Readlinkat(n.root.backingFd, n.rel(), buf)
		if err != nil {
			return nil, toErrno(err)
		}
		if got < size {
			return buf[:got], 0
		}
	}
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	sz, err := unix.Lgetxattr(n.procPath(n.rel()), attr, dest)
	return uint32(sz), toErrno(err)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return toErrno(unix.Lsetxattr(n.procPath(n.rel()), attr, data, int(flags)))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return toErrno(unix.Lremovexattr(n.procPath(n.rel()), attr))
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	sz, err := unix.Llistxattr(n.procPath(n.rel()), dest)
	return uint32(sz), toErrno(err)
}
