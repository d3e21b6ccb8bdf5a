package cm

import (
	"errors"
	"os"

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
	err := dataExtents(in, 0, size, func(data, end int64) error {
		roff, woff := data, data
		for roff < end {
			n, err := unix.CopyFileRange(in, &roff, out, &woff, int(min(end-roff, 1<<30)), 0)
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
				// Across file systems that cannot: through a buffer.
				return copyRange(in, out, roff, end-roff)
			}
			if err != nil {
				return err
			}
			if n == 0 {
				return errors.New("file shrank while it was copied")
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return unix.Ftruncate(out, size)
}

// dataExtents calls fn with each data extent [data, end) of the file open
// at fd between off and size, in order, skipping holes (SEEK_DATA and
// SEEK_HOLE; where the file system cannot tell, all is one extent). It
// moves the descriptor's offset.
func dataExtents(fd int, off, size int64, fn func(data, end int64) error) error {
	for off < size {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		if data >= size {
			return nil
		}
		end, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		end = min(end, size)
		if err := fn(data, end); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// copyRange copies n bytes at off from in to out with pread and pwrite.
func copyRange(in, out int, off, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		k, err := unix.Pread(in, buf[:min(n, int64(len(buf)))], off)
		if err != nil {
			return err
		}
		if k == 0 {
			return errors.New("file shrank while it was copied")
		}
		if _, err := unix.Pwrite(out, buf[:k], off); err != nil {
			return err
		}
		off += int64(k)
		n -= int64(k)
	}
	return nil
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

// copyAt copies the file name of dfd to the new file dst (from the store
// when it was evicted).
func (m *Manager) copyAt(dfd int, name, dst string) error {
	return atPath(dfd, name, func(path string) error {
		if _, err := m.copyContent(path, dst); err != nil {
			os.Remove(dst)
			return err
		}
		return nil
	})
}
