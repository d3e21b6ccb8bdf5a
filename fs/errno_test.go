package fs

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

func TestToErrno(t *testing.T) {
	cases := []struct {
		in   error
		want syscall.Errno
	}{
		{nil, 0},
		{syscall.ENOENT, syscall.ENOENT},
		{fmt.Errorf("wrapped: %w", syscall.EXDEV), syscall.EXDEV},
		{&os.PathError{Op: "open", Path: "x", Err: syscall.EACCES}, syscall.EACCES},
		{os.ErrNotExist, syscall.ENOENT},
		{os.ErrExist, syscall.EEXIST},
		{syscall.ENOSYS, syscall.EIO},
		{fmt.Errorf("something else"), syscall.EIO},
	}
	for _, c := range cases {
		if got := toErrno(c.in); got != c.want {
			t.Errorf("toErrno(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
