package fs

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"strconv"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The mount tells the kernel that it clears set-ID bits itself
// (FUSE_HANDLE_KILLPRIV_V2). Without it the kernel cannot keep the fact
// that a file has no security.capability attribute (S_NOSEC needs
// SB_NOSEC, which FUSE sets only then), and asks the mount for that
// attribute before every write to any file, a GETXATTR round trip per
// write(2) even with kernel passthrough: 20,000 appends of 4 KiB took
// 0.83-0.98 s through the mount against 0.08 s on the backing directory,
// and 0.09-0.11 s with the capability (README, "How local files are
// served"). With it the kernel asks once per file until its attributes
// are next refreshed.
//
// What the mount then owes the kernel: on a truncate by a caller
// without CAP_FSETID (a SETATTR of the size with FATTR_KILL_SUIDGID, and
// so an open with O_TRUNC, which the kernel does as such a SETATTR) the
// kernel no longer clears the bits, and tierfs truncates the backing
// file as root, which keeps them: killSetID clears them. Writes need
// nothing: the kernel still clears the bits of a set-ID file itself
// before a write (a set-ID file never has S_NOSEC), through passthrough
// or not, and the backing file system drops security.capability on
// tierfs's own write or truncate. A chown by tierfs clears them on the
// backing file (Linux does so for root too). fs/posixtest's
// setid-cleared-on-write and setid-cleared-on-truncate check each
// against the backing directory as unprivileged users.

// killSetID clears the set-user-ID bit of the regular file at the O_PATH
// descriptor fd, and its set-group-ID bit where Linux clears it on a
// truncate by the caller of ctx (the file has group execute, or the
// caller is not in its group), as the backing file system would for an
// unprivileged caller. It returns the bits it cleared.
func killSetID(ctx context.Context, fd int) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, nil
	}
	mode := st.Mode & 0o7777
	kill := mode & unix.S_ISUID
	if mode&unix.S_ISGID != 0 && (mode&unix.S_IXGRP != 0 || !callerInGroup(ctx, st.Gid)) {
		kill |= unix.S_ISGID
	}
	if kill == 0 {
		return 0, nil
	}
	return kill, unix.Fchmodat(unix.AT_FDCWD, procFd(fd), mode&^kill, 0)
}

// callerInGroup says whether the caller of ctx is in group gid: its
// group, or one of its supplementary groups (from /proc). A caller whose
// groups cannot be read counts as not in it: the bit is cleared, the
// safe side.
func callerInGroup(ctx context.Context, gid uint32) bool {
	caller, ok := fuse.FromContext(ctx)
	if !ok {
		return false
	}
	if caller.Gid == gid {
		return true
	}
	if caller.Pid == 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(caller.Pid), 10) + "/status")
	if err != nil {
		return false
	}
	return statusHasGroup(b, gid)
}

// statusHasGroup says whether a /proc/PID/status lists gid among its
// supplementary groups (its "Groups:" line).
func statusHasGroup(status []byte, gid uint32) bool {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("Groups:"))
		if !ok {
			continue
		}
		for _, f := range bytes.Fields(rest) {
			if g, err := strconv.ParseUint(string(f), 10, 32); err == nil && uint32(g) == gid {
				return true
			}
		}
		return false
	}
	return false
}
