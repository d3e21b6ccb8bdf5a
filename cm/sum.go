package cm

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The checksum of a file version is the SHA-256 of its bytes, in hex: the
// value sha256sum prints, so anyone can check a retained or restored file
// with standard tools. (SHA-256 runs at about 2 GB/s per core with the
// SHA extensions of current x86 CPUs; BLAKE3 would be faster but needs a
// dependency and a tool nobody has installed.)
//
// It is computed once per version and cached on the inode, in the
// trusted.tierfs.sum attribute, with the size and mtime it belongs to. A
// version whose mtime is within settleTime of now is not cached: a write
// in the same timestamp tick would not change the mtime.
const (
	sumXattr   = "trusted.tierfs.sum"
	settleTime = 2 * time.Second
)

// SumLen is the length of a checksum in hex.
const SumLen = sha256.Size * 2

// ValidSum says whether s has the form of a checksum.
func ValidSum(s string) bool {
	if len(s) != SumLen {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// cachedSum returns the cached checksum of the file open at fd, if it is
// for its current size and mtime.
func cachedSum(fd int) (string, bool) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return "", false
	}
	return cachedSumOf(fd, &st)
}

// cachedSumOf is cachedSum for a file whose stat is st.
func cachedSumOf(fd int, st *unix.Stat_t) (string, bool) {
	buf := make([]byte, 256)
	n, err := unix.Fgetxattr(fd, sumXattr, buf)
	if err != nil {
		return "", false
	}
	f := strings.Split(string(buf[:n]), " ")
	if len(f) != 3 || !ValidSum(f[0]) {
		return "", false
	}
	if f[1] != strconv.FormatInt(st.Size, 10) || f[2] != strconv.FormatInt(st.Mtim.Nano(), 10) {
		return "", false
	}
	return f[0], true
}

// cacheSum records sum as the checksum of the file at fd, if its version
// is settled. Failure to cache (a file system without trusted xattrs) only
// costs a later recomputation.
func cacheSum(fd int, sum string, now time.Time) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || now.Sub(time.Unix(0, st.Mtim.Nano())) < settleTime {
		return
	}
	_ = writeSum(fd, sum, &st)
}

// writeSum records sum as the checksum of the version of the file at fd
// that st describes.
func writeSum(fd int, sum string, st *unix.Stat_t) error {
	v := fmt.Sprintf("%s %d %d", sum, st.Size, st.Mtim.Nano())
	return unix.Fsetxattr(fd, sumXattr, []byte(v), 0)
}

// hashReader is the SHA-256 of the first n bytes of r (all when n < 0).
func hashReader(r io.Reader, n int64, buf []byte) (string, error) {
	h := sha256.New()
	if n >= 0 {
		r = io.LimitReader(r, n)
	}
	if buf == nil {
		buf = make([]byte, 256<<10)
	}
	got, err := io.CopyBuffer(h, r, buf)
	if err != nil {
		return "", err
	}
	if n >= 0 && got != n {
		return "", fmt.Errorf("file is %d bytes, shorter than %d", got, n)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Remote reads files whose bytes are in the store (evicted by the
// tierer); nil when there is no store.
type Remote interface {
	// OpenIfRemote opens the store copy of the file at path when its
	// local bytes were freed; ok is false for a file whose bytes are
	// local.
	OpenIfRemote(path string) (r io.ReaderAt, closer io.Closer, ok bool, err error)
}

// contentAt returns a reader of the whole content of the file at path
// (open at fd), from the store when it was evicted.
func contentAt(remote Remote, path string, fd int, size int64) (io.Reader, func(), error) {
	if remote != nil {
		r, c, ok, err := remote.OpenIfRemote(path)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			return io.NewSectionReader(r, 0, size), func() { c.Close() }, nil
		}
	}
	r := &sparseReader{fd: fd, size: size}
	if size <= sparseMin {
		r.data = size // all of it in a read or two: holes are not worth two seeks
	}
	return r, func() {}, nil
}

// sparseMin is the size up to which sparseReader does not look for holes.
const sparseMin = 256 << 10

// sparseReader reads the first size bytes of a file open at fd (which
// its caller owns: it seeks it) with pread, except its holes: those it
// gives as zeros without reading them, which would fill the page cache
// with pages of zeros. A retained Kafka index is mostly hole.
type sparseReader struct {
	fd         int
	off, size  int64
	data, hole int64 // [off, data) is data and [off, hole) hole, as last found
}

func (r *sparseReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.size-r.off)]
	if r.off >= r.data && r.off >= r.hole {
		r.classify()
	}
	if r.off < r.hole {
		n := int(min(int64(len(p)), r.hole-r.off))
		clear(p[:n])
		r.off += int64(n)
		return n, nil
	}
	n, err := unix.Pread(r.fd, p[:min(int64(len(p)), r.data-r.off)], r.off)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, io.ErrUnexpectedEOF // the file is shorter than size now
	}
	r.off += int64(n)
	return n, nil
}

// classify finds whether the bytes at off are data or hole, and how far
// that goes. Where the file system cannot say, everything is data.
func (r *sparseReader) classify() {
	data, err := unix.Seek(r.fd, r.off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO): // a hole up to the end, or past it
		var st unix.Stat_t
		if unix.Fstat(r.fd, &st) == nil && st.Size >= r.size {
			r.hole = r.size
		} else {
			r.data = r.size // the file shrank: pread says so
		}
		return
	case err != nil:
		r.data = r.size
		return
	case data > r.off:
		r.hole = min(data, r.size)
		return
	}
	end, err := unix.Seek(r.fd, r.off, unix.SEEK_HOLE)
	if err != nil || end <= r.off {
		end = r.size
	}
	r.data = min(end, r.size)
}

// openRegular opens the file at path (relative to the directory dfd, or
// unix.AT_FDCWD) for reading, without following a symlink, and stats it;
// it must be a regular file. A raw descriptor: the runtime's poller has
// nothing to do with a regular file, and os.File would ask it (and set
// and clear O_NONBLOCK) on every open.
func openRegular(dfd int, path string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := unix.Openat(dfd, path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, st, &os.PathError{Op: "open", Path: path, Err: err}
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, st, fmt.Errorf("%s: not a regular file", path)
	}
	return fd, st, nil
}

// sumOpen returns the checksum of the file at path, open at fd with stat
// st: from the cache, or by reading it (through the store when it was
// evicted); computed says it was read.
func (m *Manager) sumOpen(fd int, path string, st *unix.Stat_t) (sum string, computed bool, err error) {
	if s, ok := cachedSumOf(fd, st); ok {
		return s, false, nil
	}
	r, done, err := contentAt(m.cfg.Remote, path, fd, st.Size)
	if err != nil {
		return "", false, err
	}
	defer done()
	s, err := m.hash(r, st.Size)
	if err != nil {
		return "", false, fmt.Errorf("checksum of %s: %w", path, err)
	}
	return s, true, nil
}

// sumFile returns the checksum of the file at path, from the cache or by
// reading it (through the store when it was evicted), and caches it.
func (m *Manager) sumFile(path string) (string, int64, error) {
	fd, st, err := openRegular(unix.AT_FDCWD, path)
	if err != nil {
		return "", 0, err
	}
	defer unix.Close(fd)
	s, computed, err := m.sumOpen(fd, path, &st)
	if err != nil {
		return "", 0, err
	}
	if computed {
		cacheSum(fd, s, m.cfg.Now())
	}
	return s, st.Size, nil
}

// hash is hashReader with a reused 256 KiB buffer: most retained files,
// checkpoints and indexes, are small, and a fresh large buffer per file
// cost more than hashing them.
func (m *Manager) hash(r io.Reader, n int64) (string, error) {
	b, _ := m.bufs.Get().(*[]byte)
	if b == nil {
		s := make([]byte, 256<<10)
		b = &s
	}
	defer m.bufs.Put(b)
	return hashReader(r, n, *b)
}

// CacheSum computes and caches the checksum of the local file at path. The
// tierer calls it before freeing a file's local bytes, so a later capture
// of the evicted file needs no download.
func (m *Manager) CacheSum(path string) error {
	fd, st, err := openRegular(unix.AT_FDCWD, path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	s, computed, err := m.sumOpen(fd, path, &st)
	if err != nil || !computed {
		return err
	}
	// Cached whatever the mtime's age: the file is about to be evicted,
	// and an evicted file is never written.
	return writeSum(fd, s, &st)
}
