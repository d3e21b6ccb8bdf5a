package fs

import (
	"golang.org/x/sys/unix"
)

// fileHandle is a backing filesystem's handle for one inode
// (name_to_handle_at). It names the inode, not a path, so it stays valid
// across renames, and it holds no kernel resource, so a node that go-fuse
// drops without telling us leaks nothing.
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

// open opens the inode behind the handle. mountFd is any descriptor on the
// same filesystem. An inode that no longer exists gives ESTALE.
func (fh fileHandle) open(mountFd int, flags int) (int, error) {
	return unix.OpenByHandleAt(mountFd, fh.h, flags|unix.O_CLOEXEC)
}
