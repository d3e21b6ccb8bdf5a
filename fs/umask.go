package fs

import (
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Where the backing file system has POSIX ACLs, a new file in a
// directory with a default ACL takes its permissions from that ACL and
// the mode asked for, and the creator's umask does not apply; elsewhere
// the umask does. The kernel cannot tell the two apart for a FUSE file
// system, so the mount asks it not to apply the umask (FUSE_DONT_MASK)
// and applies it here, where the parent's default ACL can be seen.
//
// go-fuse's request bridge passes the mode, not the umask, to Create,
// Mkdir and Mknod, so umaskCarrier (in front of it) carries the umask in
// the mode's bits above any mode bit, and creationMode takes it out.
const (
	umaskCarried = 1 << 19 // the mode carries a umask
	umaskShift   = 20      // the umask's 12 bits start here
)

// withUmask is mode carrying umask.
func withUmask(mode, umask uint32) uint32 {
	return mode&0o177777 | umaskCarried | (umask&0o7777)<<umaskShift
}

// creationMode is the mode to create an entry of dir (a descriptor of
// the backing directory, O_PATH allowed) with: mode less the umask it
// carries, unless dir has a default ACL, which the backing file system
// applies in the umask's place. A mode that carries no umask (the kernel
// applied it) is used as it is.
func creationMode(dir int, mode uint32) uint32 {
	if mode&umaskCarried == 0 {
		return mode
	}
	umask := mode >> umaskShift & 0o7777
	mode &= 0o177777
	if hasDefaultACL(dir) {
		return mode
	}
	return mode &^ umask
}

// hasDefaultACL says whether directory fd has a default ACL. An error
// counts as none: the umask then applies, and the new entry's mode is
// at most as wide as natively.
func hasDefaultACL(fd int) bool {
	_, err := unix.Getxattr(procFd(fd), "system.posix_acl_default", nil)
	return err == nil
}

// umaskCarrier passes the umask of Create, Mkdir and Mknod on in the
// mode (see withUmask), for a mount that negotiated FUSE_DONT_MASK.
type umaskCarrier struct {
	fuse.RawFileSystem
}

func (u *umaskCarrier) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	in.Mode = withUmask(in.Mode, in.Umask)
	return u.RawFileSystem.Create(cancel, in, name, out)
}

func (u *umaskCarrier) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	in.Mode = withUmask(in.Mode, in.Umask)
	return u.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (u *umaskCarrier) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	in.Mode = withUmask(in.Mode, in.Umask)
	return u.RawFileSystem.Mknod(cancel, in, name, out)
}
