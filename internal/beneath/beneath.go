// Package beneath opens paths inside a directory and nowhere else.
package beneath

import "golang.org/x/sys/unix"

// Open opens p relative to the directory dfd, refusing any path that
// leaves it or goes through a symlink ("" is the directory itself).
func Open(dfd int, p string, flags uint64) (int, error) {
	if p == "" {
		p = "."
	}
	return unix.Openat2(dfd, p, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}
