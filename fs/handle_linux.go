package fs

import (
	"golang.org/x/sys/unix"
)

// fileHandle is a backing filesystem's handle for one inode
// (name_to_handle_at): it names the inode, including the generation number
// that tells a reused inode number apart.
type fileHandle struct {
	h  unix.FileHandle
	ok bool
}

// nameToHandle returns the handle of path relative to dirfd; an empty path
// names dirfd itself.
func nameToHandle(dirfd int, path string) (fileHandle, error) {
	flags := 0
	if path == "" {
		flags = unix.AT_EMPTY_PATH
	}
	h, _, err := unix.NameToHandleAt(dirfd, path, flags)
	if err != nil {
		return fileHandle{}, err
	}
	return fileHandle{h: h, ok: true}, nil
}

// open opens the inode behind the handle; mountFd is a descriptor (not
// O_PATH) on the same filesystem. An inode that no longer exists is ESTALE:
// ext4 reports a handle of an inode being freed as ENOMEM or ENOENT, and
// both mean that this handle no longer names a file.
func (fh fileHandle) open(mountFd int, flags int) (int, error) {
	fd, err := unix.OpenByHandleAt(mountFd, fh.h, flags|unix.O_CLOEXEC)
	if err == unix.ENOMEM || err == unix.ENOENT {
		err = unix.ESTALE
	}
	return fd, err
}
