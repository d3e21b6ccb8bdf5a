package fs

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The umask a mode carries comes off it, but not in a directory with a
// default ACL, and a mode that carries none is left as it is. No mount.
func TestCreationMode(t *testing.T) {
	top := t.TempDir()
	inherits := filepath.Join(top, "inherits")
	if err := unix.Mkdir(inherits, 0o755); err != nil {
		t.Fatal(err)
	}
	def := aclXattr(aclEntry{aclUserObj, 7, aclNoID}, aclEntry{aclGroupObj, 5, aclNoID}, aclEntry{aclOther, 5, aclNoID})
	setACL(t, inherits, "system.posix_acl_default", def)
	open := func(p string) int {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	plain, acl := open(top), open(inherits)
	for _, c := range []struct {
		dir        int
		mode, want uint32
	}{
		{plain, withUmask(unix.S_IFREG|0o666, 0o022), unix.S_IFREG | 0o644},
		{plain, withUmask(0o777, 0o077), 0o700},
		{plain, withUmask(0o4777, 0), 0o4777},
		{plain, 0o666, 0o666}, // the kernel applied the umask
		{acl, withUmask(unix.S_IFREG|0o666, 0o022), unix.S_IFREG | 0o666},
		{acl, withUmask(0o777, 0o077), 0o777},
	} {
		if got := creationMode(c.dir, c.mode); got != c.want {
			t.Errorf("creationMode(%o): %o, want %o", c.mode, got, c.want)
		}
	}
}
