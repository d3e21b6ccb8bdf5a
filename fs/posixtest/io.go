package posixtest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// pattern returns n deterministic bytes.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*31+i/251)
	}
	return b
}

func ioCases() []Case {
	return []Case{
		{"pread-pwrite-lseek", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "f")
			fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
			must(t, err)
			defer unix.Close(fd)
			_, err = unix.Pwrite(fd, pattern(100000, 1), 0)
			tr.Err("pwrite 100000 at 0", err)
			_, err = unix.Pwrite(fd, []byte("middle"), 50000)
			tr.Err("pwrite at 50000", err)
			buf := make([]byte, 20)
			n, err := unix.Pread(fd, buf, 49995)
			tr.Err("pread", err)
			tr.Say("pread %d %q", n, buf[:n])
			n, err = unix.Pread(fd, buf, 99990)
			tr.Say("pread at end: %d %s", n, errName(err))
			n, err = unix.Pread(fd, buf, 200000)
			tr.Say("pread past end: %d %s", n, errName(err))
			off, err := unix.Seek(fd, 0, unix.SEEK_END)
			tr.Say("seek end: %d %s", off, errName(err))
			off, err = unix.Seek(fd, -10, unix.SEEK_CUR)
			tr.Say("seek cur-10: %d %s", off, errName(err))
			n, err = unix.Read(fd, buf)
			tr.Say("read after seek: %d %s %s", n, errName(err), Sum(buf[:n]))
			var st unix.Stat_t
			tr.Err("fstat", unix.Fstat(fd, &st))
			tr.Say("fstat size=%d mode=%o nlink=%d", st.Size, st.Mode, st.Nlink)
			sayFile(tr, "f", p)
		}},
		{"truncate-sparse", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "sparse")
			f, err := os.Create(p)
			must(t, err)
			defer f.Close()
			_, err = f.Write(pattern(5000, 3))
			must(t, err)
			tr.Err("ftruncate grow to 64 MiB", f.Truncate(64<<20))
			var st unix.Stat_t
			must(t, unix.Fstat(int(f.Fd()), &st))
			tr.Say("after grow: size=%d sparse=%v", st.Size, st.Blocks*512 < 1<<20)
			buf := make([]byte, 10)
			n, _ := f.ReadAt(buf, 32<<20)
			tr.Say("read in hole: %d %v", n, bytes.Equal(buf, make([]byte, 10)))
			off, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE)
			tr.Say("SEEK_HOLE: %d %s", off, errName(err))
			off, err = unix.Seek(int(f.Fd()), 8192, unix.SEEK_DATA)
			tr.Say("SEEK_DATA from 8192: %d %s", off, errName(err))
			tr.Err("ftruncate shrink to 100", f.Truncate(100))
			sayFile(tr, "after shrink", p)
			tr.Err("truncate by path to 3000", os.Truncate(p, 3000))
			sayFile(tr, "after path truncate", p)
			tr.Err("truncate dir", os.Truncate(dir, 0))
		}},
		{"fallocate", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "alloc")
			f, err := os.Create(p)
			must(t, err)
			defer f.Close()
			fd := int(f.Fd())
			tr.Err("fallocate 0..1MiB", unix.Fallocate(fd, 0, 0, 1<<20))
			sayFile(tr, "after fallocate", p)
			tr.Err("fallocate KEEP_SIZE to 2MiB", unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 1<<20, 1<<20))
			sayFile(tr, "after keep-size", p)
			_, err = f.WriteAt(pattern(1<<20, 9), 0)
			must(t, err)
			tr.Err("punch hole", unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 4096, 65536))
			sayFile(tr, "after punch", p)
		}},
		{"fsync", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "durable")
			f, err := os.Create(p)
			must(t, err)
			f.Write([]byte("data"))
			tr.Err("fsync file", f.Sync())
			tr.Err("fdatasync file", unix.Fdatasync(int(f.Fd())))
			f.Close()
			d, err := os.Open(dir)
			must(t, err)
			tr.Err("fsync dir", d.Sync())
			d.Close()
			tr.Err("syncfs", func() error {
				fd, err := unix.Open(dir, unix.O_RDONLY, 0)
				if err != nil {
					return err
				}
				defer unix.Close(fd)
				return unix.Syncfs(fd)
			}())
		}},
		{"mmap-shared", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "00000000000000000000.index")
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
			must(t, err)
			defer f.Close()
			// Kafka preallocates its index files and maps them read-write.
			tr.Err("ftruncate to 10 MiB", f.Truncate(10<<20))
			m, err := unix.Mmap(int(f.Fd()), 0, 10<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			tr.Err("mmap", err)
			if err != nil {
				return
			}
			for i := 0; i < 10<<20; i += 8 {
				m[i] = byte(i >> 3)
			}
			copy(m[5<<20:], "written through the map")
			tr.Err("msync", unix.Msync(m, unix.MS_SYNC))
			buf := make([]byte, 23)
			_, err = f.ReadAt(buf, 5<<20)
			tr.Say("read after msync: %q %s", buf, errName(err))
			_, err = f.WriteAt([]byte("PWRITE"), 100)
			tr.Say("map sees pwrite: %q %s", m[100:106], errName(err))
			tr.Err("munmap", unix.Munmap(m))
			tr.Err("shrink mapped file", f.Truncate(4096))
			sayFile(tr, "index", p)
		}},
		{"sendfile-splice-copy", func(t *testing.T, dir string, tr *Transcript) {
			src := filepath.Join(dir, "src")
			writeFile(t, src, pattern(300000, 5))
			f, err := os.Open(src)
			must(t, err)
			defer f.Close()
			var pipe [2]int
			must(t, unix.Pipe(pipe[:]))
			defer unix.Close(pipe[0])
			defer unix.Close(pipe[1])
			off := int64(1000)
			n, err := unix.Sendfile(pipe[1], int(f.Fd()), &off, 4096)
			tr.Say("sendfile to pipe: %d %s off=%d", n, errName(err), off)
			buf := make([]byte, 4096)
			got, _ := unix.Read(pipe[0], buf)
			tr.Say("pipe got %s", Sum(buf[:got]))
			soff := int64(250000)
			sn, err := unix.Splice(int(f.Fd()), &soff, pipe[1], nil, 4096, 0)
			tr.Say("splice to pipe: %d %s", sn, errName(err))
			got, _ = unix.Read(pipe[0], buf)
			tr.Say("pipe got %s", Sum(buf[:got]))
			// Socket, as the broker serves fetches: sendfile into a socket.
			sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			must(t, err)
			defer unix.Close(sp[0])
			defer unix.Close(sp[1])
			off = 0
			n, err = unix.Sendfile(sp[0], int(f.Fd()), &off, 8192)
			tr.Say("sendfile to socket: %d %s", n, errName(err))
			sbuf := make([]byte, 8192)
			total := 0
			for total < n {
				k, err := unix.Read(sp[1], sbuf[total:])
				if err != nil || k == 0 {
					break
				}
				total += k
			}
			tr.Say("socket got %s", Sum(sbuf[:total]))
			dst := filepath.Join(dir, "dst")
			d, err := os.Create(dst)
			must(t, err)
			defer d.Close()
			roff, woff := int64(0), int64(0)
			copied := 0
			for copied < 300000 {
				k, err := unix.CopyFileRange(int(f.Fd()), &roff, int(d.Fd()), &woff, 300000-copied, 0)
				if err != nil {
					tr.Err("copy_file_range", err)
					break
				}
				if k == 0 {
					break
				}
				copied += k
			}
			tr.Say("copy_file_range copied %d", copied)
			sayFile(tr, "dst", dst)
		}},
		{"fcntl-lock", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, ".lock")
			f, err := os.Create(p)
			must(t, err)
			lk := unix.Flock_t{Type: unix.F_WRLCK}
			tr.Err("F_SETLK write lock", unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk))
			tr.Say("other process: %s", lockFromOtherProcess(p))
			var q unix.Flock_t
			q.Type = unix.F_WRLCK
			tr.Err("F_GETLK own", unix.FcntlFlock(f.Fd(), unix.F_GETLK, &q))
			tr.Say("F_GETLK type=%d", q.Type)
			f.Close()
			tr.Say("other process after close: %s", lockFromOtherProcess(p))
		}},
		{"times", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "00000000000000001234.log")
			writeFile(t, p, []byte("x"))
			mt := time.Date(2020, 1, 2, 3, 4, 5, 678900000, time.UTC)
			tr.Err("utimensat", os.Chtimes(p, mt, mt))
			fi, err := os.Stat(p)
			must(t, err)
			tr.Say("mtime=%s", fi.ModTime().UTC().Format(time.RFC3339Nano))
			ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mt.Add(time.Hour).UnixNano())}
			tr.Err("utimensat omit atime", unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0))
			fi, _ = os.Stat(p)
			tr.Say("mtime=%s", fi.ModTime().UTC().Format(time.RFC3339Nano))
			// A rename keeps mtime; Kafka reads segment mtimes for retention.
			q := filepath.Join(dir, "renamed.log")
			must(t, os.Rename(p, q))
			fi, _ = os.Stat(q)
			tr.Say("mtime after rename=%s", fi.ModTime().UTC().Format(time.RFC3339Nano))
			f, err := os.OpenFile(q, os.O_RDWR, 0)
			must(t, err)
			tr.Err("futimens", unix.UtimesNanoAt(int(f.Fd()), "", []unix.Timespec{unix.NsecToTimespec(0), unix.NsecToTimespec(mt.UnixNano())}, unix.AT_EMPTY_PATH))
			f.Close()
			fi, _ = os.Stat(q)
			tr.Say("mtime after futimens=%s", fi.ModTime().UTC().Format(time.RFC3339Nano))
		}},
		{"xattr", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "x")
			writeFile(t, p, nil)
			tr.Err("setxattr", unix.Setxattr(p, "user.kafka", []byte("v1"), 0))
			tr.Err("setxattr CREATE existing", unix.Setxattr(p, "user.kafka", []byte("v2"), unix.XATTR_CREATE))
			buf := make([]byte, 64)
			n, err := unix.Getxattr(p, "user.kafka", buf)
			tr.Say("getxattr: %q %s", buf[:max(n, 0)], errName(err))
			n, err = unix.Getxattr(p, "user.kafka", nil)
			tr.Say("getxattr size: %d %s", n, errName(err))
			n, err = unix.Listxattr(p, buf)
			tr.Say("listxattr: %q %s", buf[:max(n, 0)], errName(err))
			_, err = unix.Getxattr(p, "user.missing", buf)
			tr.Err("getxattr missing", err)
			tr.Err("removexattr", unix.Removexattr(p, "user.kafka"))
			tr.Err("removexattr again", unix.Removexattr(p, "user.kafka"))
			tr.Err("setxattr on dir", unix.Setxattr(dir, "user.d", []byte("dir"), 0))
			n, err = unix.Getxattr(dir, "user.d", buf)
			tr.Say("getxattr dir: %q %s", buf[:max(n, 0)], errName(err))
		}},
		{"statfs", func(t *testing.T, dir string, tr *Transcript) {
			var s unix.Statfs_t
			tr.Err("statfs", unix.Statfs(dir, &s))
			tr.Say("bsize=%d namelen=%d has-blocks=%v", s.Bsize, s.Namelen, s.Blocks > 0)
		}},
	}
}
