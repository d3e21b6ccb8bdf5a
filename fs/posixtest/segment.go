package posixtest

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// SegmentName is the file the segment cases find in their directory:
// a rolled Kafka segment the caller made there, the same bytes in each
// directory compared. On a tiering file system it may be local, shipped
// or evicted: every case must see the same file either way.
const SegmentName = "00000000000000000000.log"

// SegmentCases are scripts on an existing segment (see SegmentName):
// reads, maps, seeks, the changes a broker makes (append, truncate,
// rename, delete) and the ones a user might (overwrite, O_TRUNC, copy).
func SegmentCases() []Case {
	seg := func(dir string) string { return filepath.Join(dir, SegmentName) }
	size := func(t *testing.T, p string) int64 {
		st, err := os.Stat(p)
		must(t, err)
		return st.Size()
	}
	return []Case{
		{"seg-read", func(t *testing.T, dir string, tr *Transcript) {
			p := seg(dir)
			n := size(t, p)
			sayFile(tr, "segment", p)
			f, err := os.Open(p)
			must(t, err)
			defer f.Close()
			for _, off := range []int64{0, 1, n / 2, n - 10, n - 1, n, n + 4096} {
				buf := make([]byte, 4096)
				got, err := f.ReadAt(buf, off)
				tr.Say("pread 4096 at %d: %d %s %s", off, got, errName(noEOF(err)), Sum(buf[:got]))
			}
			var all bytes.Buffer
			buf := make([]byte, 1<<20)
			for {
				got, err := f.Read(buf)
				all.Write(buf[:got])
				if err != nil || got == 0 {
					tr.Say("sequential 1 MiB reads: %s %s", errName(noEOF(err)), Sum(all.Bytes()))
					break
				}
			}
			fd := int(f.Fd())
			for _, q := range []struct {
				whence int
				off    int64
			}{{unix.SEEK_DATA, 0}, {unix.SEEK_HOLE, 0}, {unix.SEEK_DATA, n / 2}, {unix.SEEK_DATA, n}} {
				off, err := unix.Seek(fd, q.off, q.whence)
				tr.Say("lseek whence=%d from %d: %d %s", q.whence, q.off, off, errName(err))
			}
			names := make([]byte, 4096)
			got, err := unix.Listxattr(p, names)
			tr.Say("listxattr: %d %s", got, errName(err))
		}},
		{"seg-mmap", func(t *testing.T, dir string, tr *Transcript) {
			p := seg(dir)
			f, err := os.Open(p)
			must(t, err)
			defer f.Close()
			n := size(t, p)
			m, err := unix.Mmap(int(f.Fd()), 0, int(n), unix.PROT_READ, unix.MAP_SHARED)
			tr.Err("mmap", err)
			if err == nil {
				tr.Say("mapped: %s", Sum(m))
				unix.Munmap(m)
			}
		}},
		{"seg-overwrite", func(t *testing.T, dir string, tr *Transcript) {
			p := seg(dir)
			n := size(t, p)
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			must(t, err)
			_, err = f.WriteAt([]byte("overwritten"), n/2)
			tr.Err("pwrite in the middle", err)
			buf := make([]byte, 40)
			got, err := f.ReadAt(buf, n/2-10)
			tr.Say("pread around it: %d %s %q", got, errName(noEOF(err)), buf[:got])
			tr.Err("fsync", f.Sync())
			var st unix.Stat_t
			tr.Err("fstat", unix.Fstat(int(f.Fd()), &st))
			tr.Say("fstat size=%d", st.Size)
			tr.Err("close", f.Close())
			sayFile(tr, "after", p)
		}},
		{"seg-append", func(t *testing.T, dir string, tr *Transcript) {
			p := seg(dir)
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			must(t, err)
			_, err = f.Write(pattern(5000, 7))
			tr.Err("append 5000", err)
			tr.Err("close", f.Close())
			sayFile(tr, "after", p)
		}},
		{"seg-truncate", func(t *testing.T, dir string, tr *Transcript) {
			p := seg(dir)
			n := size(t, p)
			tr.Err("truncate to the size it has", os.Truncate(p, n))
			sayFile(tr, "same size", p)
			tr.Err("truncate to a third", os.Truncate(p, n/3))
			sayFile(tr, "a third", p)
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			must(t, err)
			tr.Err("ftruncate to grow", f.Truncate(n/3+9000))
			tr.Err("close", f.Close())
			sayFile(tr, "grown", p)
		}},
		{"seg-open-trunc", func(t *testing.T, dir string, tr *Transcript) {
			p := seg(dir)
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
			tr.Err("open O_TRUNC", err)
			if err == nil {
				_, err = f.Write([]byte("new"))
				tr.Err("write", err)
				tr.Err("close", f.Close())
			}
			sayFile(tr, "after", p)
		}},
		{"seg-rename-unlink", func(t *testing.T, dir string, tr *Transcript) {
			p := seg(dir)
			gone := p + ".deleted"
			tr.Err("rename to .deleted", os.Rename(p, gone))
			sayFile(tr, "renamed", gone)
			f, err := os.Open(gone)
			must(t, err)
			defer f.Close()
			tr.Err("unlink while open", os.Remove(gone))
			b, err := io.ReadAll(f)
			tr.Say("read through the open handle: %s %s", errName(err), Sum(b))
			_, err = os.Stat(gone)
			tr.Err("stat after unlink", err)
		}},
		{"seg-copy", func(t *testing.T, dir string, tr *Transcript) {
			p := seg(dir)
			src, err := os.Open(p)
			must(t, err)
			defer src.Close()
			dst, err := os.Create(filepath.Join(dir, "copy"))
			must(t, err)
			n, err := io.Copy(dst, src)
			tr.Say("copy: %d %s", n, errName(err))
			tr.Err("close copy", dst.Close())
			sayFile(tr, "copy", filepath.Join(dir, "copy"))
		}},
	}
}

// noEOF drops io.EOF, which os.File returns where a system call says 0.
func noEOF(err error) error {
	if err == io.EOF {
		return nil
	}
	return err
}
