package fs

import (
	"context"
	"errors"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var (
	_ = (gofs.NodeMkdirer)((*node)(nil))
	_ = (gofs.NodeMknoder)((*node)(nil))
	_ = (gofs.NodeSymlinker)((*node)(nil))
	_ = (gofs.NodeLinker)((*node)(nil))
	_ = (gofs.NodeCreater)((*node)(nil))
	_ = (gofs.NodeUnlinker)((*node)(nil))
	_ = (gofs.NodeRmdirer)((*node)(nil))
	_ = (gofs.NodeRenamer)((*node)(nil))
	_ = (gofs.NodeOpendirHandler)((*node)(nil))
)

// chownToCaller gives a new entry to the process that created it. tierfs
// runs as root, so without this every file would belong to root. In a
// set-group-ID directory the group the backing filesystem chose is kept.
func (n *node) chownToCaller(ctx context.Context, dfd int, name string) {
	if !n.root.asRoot {
		return
	}
	caller, ok := fuse.FromContext(ctx)
	if !ok || (caller.Uid == 0 && caller.Gid == 0) {
		// tierfs is root too: the entry already has the right owner.
		return
	}
	gid := int(caller.Gid)
	var dir unix.Statx_t
	if statxAt(dfd, "", &dir) == nil && dir.Mode&unix.S_ISGID != 0 {
		gid = -1
	}
	_ = unix.Fchownat(dfd, name, int(caller.Uid), gid, unix.AT_SYMLINK_NOFOLLOW)
}

// created finishes an operation that made the entry name: ownership, then
// the node. When the node cannot be built the entry is removed again, so a
// failed request leaves nothing behind.
func (n *node) created(ctx context.Context, dfd int, name string, out *fuse.EntryOut, removeFlags int) (*gofs.Inode, syscall.Errno) {
	n.chownToCaller(ctx, dfd, name)
	ch, err := n.lookupAt(ctx, dfd, name, out)
	if err != nil {
		_ = unix.Unlinkat(dfd, name, removeFlags)
		return nil, toErrno(err)
	}
	return ch, 0
}

// makeEntry creates the entry name with mk (given this directory's
// descriptor) and returns its node; removeFlags undo it if that fails.
// kind and target are for change management.
func (n *node) makeEntry(ctx context.Context, name string, out *fuse.EntryOut, removeFlags int, kind, target string, mk func(dfd int) error) (*gofs.Inode, syscall.Errno) {
	if n.hides(name) {
		return nil, syscall.EEXIST
	}
	dfd, unpin, err := n.pin()
	if err != nil {
		return nil, toErrno(err)
	}
	defer unpin()
	ch, leave, err := n.changes()
	if err != nil {
		return nil, toErrno(err)
	}
	defer leave()
	if err := mk(dfd); err != nil {
		return nil, toErrno(err)
	}
	ino, errno := n.created(ctx, dfd, name, out, removeFlags)
	if errno == 0 && ch != nil {
		ch.Created(n.childRel(name), kind, target)
	}
	return ino, errno
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeEntry(ctx, name, out, unix.AT_REMOVEDIR, "dir", "", func(dfd int) error { return unix.Mkdirat(dfd, name, creationMode(dfd, mode)) })
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeEntry(ctx, name, out, 0, "other", "", func(dfd int) error { return unix.Mknodat(dfd, name, creationMode(dfd, mode), int(rdev)) })
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeEntry(ctx, name, out, 0, "symlink", target, func(dfd int) error { return unix.Symlinkat(target, dfd, name) })
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.hides(name) {
		return nil, syscall.EEXIST
	}
	src, ok := target.(*node)
	if !ok || src.root != n.root {
		return nil, syscall.EXDEV
	}
	// AT_EMPTY_PATH links the inode itself, even one whose last name is
	// gone but that is still open (it needs CAP_DAC_READ_SEARCH, which
	// root has).
	dfd, unpin, err := n.pin()
	if err != nil {
		return nil, toErrno(err)
	}
	defer unpin()
	sfd, unpinSrc, err := src.pin()
	if err != nil {
		return nil, toErrno(err)
	}
	defer unpinSrc()
	changes, leave, err := n.changes()
	if err != nil {
		return nil, toErrno(err)
	}
	defer leave()
	if err := unix.Linkat(sfd, "", dfd, name, unix.AT_EMPTY_PATH); err != nil {
		return nil, toErrno(err)
	}
	if changes != nil {
		// A new name with the bytes of an existing file: to a replica,
		// a new file (its content follows from the later write events).
		changes.Created(n.childRel(name), "file", "")
	}
	ch, err := n.lookupAt(ctx, dfd, name, out)
	return ch, toErrno(err)
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.hides(name) {
		return nil, nil, 0, syscall.EEXIST
	}
	dfd, unpin, err := n.pin()
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	defer unpin()
	rel := n.childRel(name)
	changes, leave, err := n.changes()
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	defer leave()
	fd, created, err := createAt(changes, dfd, name, rel, flags, creationMode(dfd, mode))
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	if created {
		n.chownToCaller(ctx, dfd, name)
		if changes != nil {
			changes.Created(rel, "file", "")
		}
	}
	// The node's descriptor comes from the open file, not from the name,
	// which another process could already have replaced.
	pfd, err := unix.Open(procFd(fd), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, nil, 0, toErrno(err)
	}
	ch, err := n.childFromPathFd(ctx, name, pfd, out)
	if err != nil {
		unix.Close(fd)
		return nil, nil, 0, toErrno(err)
	}
	// The child is linked into the tree only after Create returns, so
	// its own Path would name an orphan: rel is from the parent's.
	fh, fl, err := ch.Operations().(*node).newHandle(ctx, fd, flags, rel)
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	return ch, fh, fl, 0
}

// createAt opens the entry name of dfd for a CREATE and says whether it
// made it. With change management an existing file's truncation (O_TRUNC)
// retains its original first, so the open cannot make and cut in one call.
func createAt(ch Changes, dfd int, name, rel string, flags, mode uint32) (int, bool, error) {
	if ch == nil {
		fd, err := unix.Openat(dfd, name, openFlags(flags)|unix.O_CREAT, mode)
		return fd, true, err
	}
	oflags := openFlags(flags) &^ unix.O_TRUNC
	fd, err := unix.Openat(dfd, name, oflags|unix.O_CREAT|unix.O_EXCL, mode)
	if err == nil || !errors.Is(err, unix.EEXIST) || flags&unix.O_EXCL != 0 {
		return fd, err == nil, err
	}
	// It exists (the kernel's lookup raced a creation): open it.
	if fd, err = unix.Openat(dfd, name, oflags, 0); err != nil {
		return -1, false, err
	}
	if flags&unix.O_TRUNC != 0 {
		if err := truncateWith(ch, fd, rel, 0, func() error { return unix.Ftruncate(fd, 0) }); err != nil {
			unix.Close(fd)
			return -1, false, err
		}
	}
	return fd, false, nil
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.hides(name) {
		return syscall.EPERM
	}
	dfd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	ch, leave, err := n.changes()
	if err != nil {
		return toErrno(err)
	}
	defer leave()
	if ch != nil {
		return toErrno(ch.Unlink(dfd, name, n.childRel(name)))
	}
	return toErrno(unix.Unlinkat(dfd, name, 0))
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.hides(name) {
		return syscall.EPERM
	}
	dfd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	ch, leave, err := n.changes()
	if err != nil {
		return toErrno(err)
	}
	defer leave()
	if ch != nil {
		return toErrno(ch.Rmdir(dfd, name, n.childRel(name)))
	}
	return toErrno(unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR))
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	dst, ok := newParent.(*node)
	if !ok || dst.root != n.root {
		return syscall.EXDEV
	}
	if n.hides(name) || dst.hides(newName) {
		return syscall.EPERM
	}
	dfd, unpin, err := n.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpin()
	tfd, unpinDst, err := dst.pin()
	if err != nil {
		return toErrno(err)
	}
	defer unpinDst()
	ch, leave, err := n.changes()
	if err != nil {
		return toErrno(err)
	}
	defer leave()
	if ch != nil {
		return toErrno(ch.Rename(dfd, name, n.childRel(name), tfd, newName, dst.childRel(newName), flags))
	}
	return toErrno(unix.Renameat2(dfd, name, tfd, newName, uint(flags)))
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fd, err := n.openSelf(unix.O_RDONLY | unix.O_DIRECTORY)
	if err != nil {
		return nil, 0, toErrno(err)
	}
	ds, errno := gofs.NewLoopbackDirStreamFd(fd)
	if errno != 0 {
		unix.Close(fd)
		return nil, 0, errno
	}
	d := &dirHandle{n: n, inner: ds}
	if n.isRoot() {
		d.hidden = StateDirName
	}
	return d, dirCacheFlags, 0
}

// dirCacheFlags let the kernel keep a directory's listing and serve the
// next opendir and readdir of it from memory. It drops the listing when
// the directory changes through the mount, and when the directory's
// mtime differs at the next listing: a change made behind the mount's
// back shows once the kernel refreshes the directory's attributes (at
// most AttrTimeout, as for names). A broker lists each partition
// directory about seven times at start-up; each was a READDIRPLUS of
// every entry.
const dirCacheFlags = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE

// dirHandle is an open directory of the mount: the backing directory's
// stream, less the name the mount never shows (the root's state
// directory), and the lookups of the entries a READDIRPLUS returns.
type dirHandle struct {
	n      *node
	inner  gofs.DirStream
	hidden string // "" for none (no entry is named "")
}

var (
	_ = (gofs.FileReaddirenter)((*dirHandle)(nil))
	_ = (gofs.FileLookuper)((*dirHandle)(nil))
	_ = (gofs.FileSeekdirer)((*dirHandle)(nil))
	_ = (gofs.FileFsyncdirer)((*dirHandle)(nil))
	_ = (gofs.FileReleasedirer)((*dirHandle)(nil))
)

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	r := d.inner.(gofs.FileReaddirenter)
	for {
		de, errno := r.Readdirent(ctx)
		if errno != 0 || de == nil || de.Name != d.hidden {
			return de, errno
		}
	}
}

// errKnownEntry answers a READDIRPLUS entry without attributes.
const errKnownEntry = syscall.EEXIST

// Lookup looks up an entry of a READDIRPLUS reply. A name whose node the
// kernel holds already is sent without attributes (an error here leaves
// the entry's node id 0, which the kernel takes as "no attributes": it
// keeps the name and attributes it has, revalidated as any are when they
// time out). At start-up a broker lists each partition directory several
// times, each listing after a create or rename of its own in the
// directory (which drops the kernel's kept listing), and every entry was
// looked up on the backing disk again each time. A new name is looked up
// as LOOKUP does.
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if d.n.GetChild(name) != nil {
		return nil, errKnownEntry
	}
	return d.n.Lookup(ctx, name, out)
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.inner.(gofs.FileSeekdirer).Seekdir(ctx, off)
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.inner.(gofs.FileFsyncdirer).Fsyncdir(ctx, flags)
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.inner.(gofs.FileReleasedirer).Releasedir(ctx, flags)
}
