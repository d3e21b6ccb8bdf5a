package fs

import (
	"errors"
	"os"
	"syscall"

	"github.com/tierfs/tierfs/internal/tiered"
)

// toErrno is the one place where Go errors become FUSE status codes.
//
// Unknown errors become EIO, never ENOSYS: ENOSYS makes the kernel stop
// sending that operation for the rest of the mount, which would turn a
// passing failure into a permanent loss of function.
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var se *tiered.StoreError
	if errors.As(err, &se) {
		return syscall.EIO // a network's errno is no errno of the file's
	}
	if errors.Is(err, ErrRemote) {
		return syscall.EROFS
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if errno == syscall.ENOSYS {
			return syscall.EIO
		}
		return errno
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, os.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, os.ErrPermission):
		return syscall.EACCES
	case errors.Is(err, os.ErrClosed):
		return syscall.EBADF
	}
	return syscall.EIO
}
