package fs

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/tierfs/tierfs/internal/tiered"
	"golang.org/x/sys/unix"
)

// node is one file, directory or symlink of the backing tree.
//
// A node normally holds an O_PATH descriptor of its backing inode for as
// long as the kernel knows the node (until FORGET), and every operation goes
// through it: a directory's entries are reached with *at calls on the
// directory's descriptor, and an open re-opens the descriptor itself. So an
// operation always reaches the inode the kernel asked about, whatever renames
// happen meanwhile, and an inode the kernel still knows cannot disappear
// from under it: an open racing a rename-over opens the old file, as it
// would natively. (virtiofsd works the same way; go-fuse's loopback
// re-resolves paths and fails that race.)
//
// Descriptors are bounded (fdPool): a node gets one only while there is
// room, and files opened through the mount come first: when they need the
// room, descriptors of idle nodes are closed. A node without one keeps
// only the inode's file handle and opens it when needed
// (open_by_handle_at). Such a node can find its inode gone when every
// name and every open of it disappeared; that is ESTALE, on which the
// kernel redoes the lookup once.
type node struct {
	gofs.Inode
	root *Root

	handle  fileHandle
	cleanup runtime.Cleanup // closes fd if the node is collected unforgotten
	unpinFn func()          // n.unpin, made once

	fdMu sync.Mutex
	// fd is the O_PATH descriptor, or -1 for a node that goes through its
	// handle. Set at creation; closed by OnForget, by the pool when files
	// need the room (a node with a handle only), or, for a node go-fuse
	// discarded in favour of an equal one, by a cleanup when it is
	// garbage collected. GUARDED_BY(fdMu)
	fd        int
	pins      int  // operations using fd now; GUARDED_BY(fdMu)
	forgotten bool // close fd when the last pin ends; GUARDED_BY(fdMu)

	// modes counts open handles by io mode (used with change management).
	modes ioModes
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

// newNode makes the node for the inode open at the O_PATH descriptor fd,
// and takes ownership of fd: it keeps it, or closes it when the pool has
// no room and the inode has a file handle.
func newNode(r *Root, fd int, h fileHandle) *node {
	if h.ok && !r.fds.room() {
		unix.Close(fd)
		return &node{root: r, fd: -1, handle: h}
	}
	n := &node{root: r, fd: fd, handle: h}
	n.unpinFn = n.unpin
	r.fds.add(fd, n)
	n.cleanup = runtime.AddCleanup(n, r.fds.closeFd, fd)
	return n
}

// OnForget closes the descriptor once the kernel has forgotten the node
// (once the operations using it end).
func (n *node) OnForget() {
	if !n.isRoot() {
		n.dropFd(false)
	}
}

// dropFd closes the node's descriptor and says whether it did. For a
// reclaim, only if no operation is using it and the node has a file
// handle to go on with; otherwise (a forget) now, or when the last
// operation using it ends.
func (n *node) dropFd(reclaim bool) bool {
	n.fdMu.Lock()
	defer n.fdMu.Unlock()
	if n.fd < 0 || n.isRoot() {
		return false
	}
	if reclaim && (n.pins > 0 || !n.handle.ok) {
		return false
	}
	if n.pins > 0 {
		n.forgotten = true
		return false
	}
	n.closeFdLocked()
	return true
}

func (n *node) closeFdLocked() {
	n.cleanup.Stop()
	n.root.fds.remove(n.fd)
	unix.Close(n.fd)
	n.fd = -1
}

// heldFd pins and returns the node's own descriptor, if it has one; the
// caller calls unpin when done.
func (n *node) heldFd() (int, bool) {
	n.fdMu.Lock()
	defer n.fdMu.Unlock()
	if n.fd < 0 {
		return -1, false
	}
	n.pins++
	return n.fd, true
}

func (n *node) unpin() {
	n.fdMu.Lock()
	defer n.fdMu.Unlock()
	n.pins--
	if n.pins == 0 && n.forgotten && n.fd >= 0 {
		n.closeFdLocked()
	}
}

// pin returns an O_PATH descriptor of this node's inode for the length of
// one operation; the caller calls unpin when done.
func (n *node) pin() (fd int, unpin func(), err error) {
	if fd, ok := n.heldFd(); ok {
		return fd, n.unpinFn, nil
	}
	fd, err = n.handle.open(n.root.backingFd, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return -1, nil, err
	}
	return fd, func() { unix.Close(fd) }, nil
}

// procFd is "/proc/self/fd/N": the path form of a descriptor's inode, for
// the calls that have no descriptor form.
func procFd(fd int) string {
	return "/proc/self/fd/" + strconv.Itoa(fd)
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
func (n *node) lookupAt(ctx context.Context, dfd int, name string, out *fuse.EntryOut) (*gofs.Inode, error) {
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return n.childFromPathFd(ctx, name, fd, out)
}

// childFromPathFd builds the child node for the entry name, which owns the
// O_PATH descriptor fd.
//
// go-fuse keeps the node it already has for an inode and silently drops the
// new one. Every READDIRPLUS looks up each entry again, so a new node for an
// inode that is already this directory's child gets no descriptor: it would
// only be dropped, and its descriptor would stay open until a garbage
// collection.
func (n *node) childFromPathFd(ctx context.Context, name string, fd int, out *fuse.EntryOut) (*gofs.Inode, error) {
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
	id := n.root.stableAttr(&st, h)
	n.root.moveAttr(id.Ino, &out.Attr)
	if known := n.GetChild(name); known != nil && h.ok && known.StableAttr() == id {
		unix.Close(fd)
		return n.NewInode(ctx, &node{root: n.root, fd: -1, handle: h}, id), nil
	}
	return n.NewInode(ctx, newNode(n.root, fd, h), id), nil
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.hides(name) {
		return nil, syscall.ENOENT
	}
	dfd, unpin, err := n.pin()
	if err != nil {
		return nil, toErrno(err)
	}
	defer unpin()
	ch, err := n.lookupAt(ctx, dfd, name, out)
	return ch, toErrno(err)
}

func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if fga, ok := f.(gofs.FileGetattrer); ok {
		errno := fga.Getattr(ctx, out)
		if lf, ok := f.(interface{ backingFd() int }); ok && errno == 0 {
			n.fixNlink(lf.backingFd(), &out.Attr)
		}
		n.moveAttr(&out.Attr)
		n.hideStateDirLink(&out.Attr)
		return errno
	}
	fd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	return toErrno(n.attrOf(fd, &out.Attr))
}

// attrOf fills a with the attributes of the inode open at fd as the
// mount shows them.
func (n *node) attrOf(fd int, a *fuse.Attr) error {
	var st unix.Statx_t
	if err := statxAt(fd, "", &st); err != nil {
		return err
	}
	fillAttr(a, &st)
	n.fixNlink(fd, a)
	n.moveAttr(a)
	n.hideStateDirLink(a)
	return nil
}

// hideStateDirLink leaves the hidden state directory out of the root's
// link count (its ".." is a link of the root), so the root counts the
// subdirectories a user sees, as ls and find expect. The mount makes the
// state directory before it serves, and holds its lock file open in it,
// so it is there to leave out.
func (n *node) hideStateDirLink(a *fuse.Attr) {
	if n.isRoot() && a.Nlink > 2 {
		a.Nlink--
	}
}

// setattrContext are the SETATTR fields that say how, not what: a
// request with nothing else is a chown to the owner the file has.
const setattrContext = fuse.FATTR_FH | fuse.FATTR_LOCKOWNER

func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	errno := n.setattrTracked(ctx, f, in, out)
	if errno != 0 || in.Valid&fuse.FATTR_KILL_SUIDGID == 0 {
		return errno
	}
	// A truncate (or chown) by a caller without CAP_FSETID: the kernel
	// leaves the set-ID bits to the mount (killpriv.go).
	fd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	killed, err := killSetID(ctx, fd)
	out.Attr.Mode &^= killed
	return toErrno(err)
}

// setattrTracked is a SETATTR, a truncate through change management when
// it has one.
func (n *node) setattrTracked(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if in.Valid&^setattrContext == 0 {
		// chown(-1, -1): no owner changes, but ctime does, as on the
		// backing file system.
		return n.touchCtime(out)
	}
	sz, ok := in.GetSize()
	if !ok || n.root.changes == nil {
		return n.setattr(ctx, f, in, out)
	}
	fd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	if err := n.refuseRemoteTruncate(fd, int64(sz)); err != nil {
		return toErrno(err) // with cm, an evicted file is not changed
	}
	var errno syscall.Errno
	err = n.truncateTracked(fd, n.Path(n.Root()), int64(sz), func() error {
		if errno = n.setattr(ctx, f, in, out); errno != 0 {
			return errno
		}
		return nil
	})
	return toErrno(err)
}

func (n *node) setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if fsa, ok := f.(gofs.FileSetattrer); ok {
		return fsa.Setattr(ctx, in, out)
	}
	fd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	if sz, ok := in.GetSize(); ok {
		ran := false
		err := n.truncate(fd, int64(sz), func() error { ran = true; return setattrFd(fd, in) })
		if err != nil {
			return toErrno(err)
		}
		if !ran {
			// Remote: the size went through its move, or was the size
			// it has; the rest applies to the backing file.
			rest := *in
			rest.Valid &^= fuse.FATTR_SIZE
			if err := setattrFd(fd, &rest); err != nil {
				return toErrno(err)
			}
		}
		return toErrno(n.attrOf(fd, &out.Attr))
	}
	if err := setattrFd(fd, in); err != nil {
		return toErrno(err)
	}
	return toErrno(n.attrOf(fd, &out.Attr))
}

// setattrFd applies a SETATTR to the inode open at the O_PATH descriptor fd.
// The size is changed before the times, so an explicit mtime is kept.
func setattrFd(fd int, in *fuse.SetAttrIn) error {
	self := procFd(fd)
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
	fd, unpin, err := n.pin()
	if err != nil {
		return nil, toErrno(err)
	}
	defer unpin()
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		got, err := unix.Readlinkat(fd, "", buf)
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
	fd, unpin, err := n.pin()
	if err != nil {
		return 0, toErrno(err)
	}
	defer unpin()
	if sz, errno, ok := n.tieringXattr(fd, attr, dest); ok {
		return sz, errno
	}
	if hiddenXattr(attr) {
		return 0, syscall.ENODATA
	}
	sz, err := unix.Getxattr(procFd(fd), attr, dest)
	return uint32(sz), toErrno(err)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.isSymlink() || hiddenXattr(attr) || (n.root.tiering != nil && (attr == tiered.XattrState || attr == tiered.XattrRDI)) {
		return syscall.EPERM
	}
	fd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	return toErrno(unix.Setxattr(procFd(fd), attr, data, int(flags)))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.isSymlink() {
		return syscall.ENODATA
	}
	if hiddenXattr(attr) {
		return syscall.EPERM
	}
	fd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	return toErrno(unix.Removexattr(procFd(fd), attr))
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	if n.isSymlink() {
		return 0, 0
	}
	fd, unpin, err := n.pin()
	if err != nil {
		return 0, toErrno(err)
	}
	defer unpin()
	// Listed in full and filtered, so a size query matches the list.
	buf := make([]byte, 64<<10)
	sz, err := unix.Listxattr(procFd(fd), buf)
	if err != nil {
		return 0, toErrno(err)
	}
	list := filterXattrList(buf[:sz])
	if len(dest) == 0 {
		return uint32(len(list)), 0
	}
	if len(dest) < len(list) {
		return 0, syscall.ERANGE
	}
	return uint32(copy(dest, list)), 0
}

// touchCtime updates the inode's ctime as a chown to the same owner
// does, and replies with its attributes.
func (n *node) touchCtime(out *fuse.AttrOut) syscall.Errno {
	fd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	if err := unix.Fchownat(fd, "", -1, -1, unix.AT_EMPTY_PATH); err != nil {
		return toErrno(err)
	}
	return toErrno(n.attrOf(fd, &out.Attr))
}
