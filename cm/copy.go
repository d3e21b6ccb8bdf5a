package cm

import (
	"errors"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// copySparse copies size bytes from in to out, data extent by data
// extent, so holes (Kafka's preallocated indexes, evicted files) stay holes.
// copy_file_range lets the kernel copy without a trip through user space,
// and share the blocks where the file system can (xfs, btrfs).
func copySparse(in, out int, size int64) error {
	if err := unix.IoctlFileClone(out, in); err == nil {
		return nil
	}
	var off int64
	for off < size {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		hole = min(hole, size)
		roff, woff := data, data
		for roff < hole {
			n, err := unix.CopyFileRange(in, &roff, out, &woff, int(min(hole-roff, 1<<30)), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return errors.New("file shrank while it was copied")
			}
		}
		off = hole
	}
	return unix.Ftruncate(out, size)
}

// finishCopy gives the copy its original's mode, owner and times, and
// makes it durable.
func finishCopy(out *os.File, st *unix.Stat_t) error {
	if err := copyAttrs(out, st); err != nil {
		return err
	}
	return out.Sync()
}

// copyAttrs gives the copy its original's mode, owner and times.
func copyAttrs(out *os.File, st *unix.Stat_t) error {
	fd := int(out.Fd())
	if err := unix.Fchmod(fd, st.Mode&0o7777); err != nil {
		return err
	}
	_ = unix.Fchown(fd, int(st.Uid), int(st.Gid))
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
}

// copyAt copies the file name of dfd to the new file dst.
func copyAt(dfd int, name, dst string) error {
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	in, err := os.Open("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := copySparse(int(in.Fd()), int(out.Fd()), st.Size); err != nil {
		os.Remove(dst)
		return err
	}
	return copyAttrs(out, &st)
}
