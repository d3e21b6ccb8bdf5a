package posixtest

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	must(t, os.WriteFile(path, data, 0o644))
}

// sayFile records a file's size, mode and content digest.
func sayFile(tr *Transcript, label, path string) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		tr.Err(label+" lstat", err)
		return
	}
	data, err := os.ReadFile(path)
	if err != nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		tr.Err(label+" read", err)
		return
	}
	tr.Say("%s: mode=%o nlink=%d size=%d %s", label, st.Mode, st.Nlink, st.Size, Sum(data))
}

func openCases() []Case {
	return []Case{
		{"open-flags", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "f")
			fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o640)
			tr.Err("open O_RDWR|O_CREAT", err)
			if err == nil {
				_, err = unix.Write(fd, []byte("0123456789"))
				tr.Err("write", err)
				unix.Close(fd)
			}
			_, err = unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o640)
			tr.Err("open O_CREAT|O_EXCL existing", err)
			fd, err = unix.Open(filepath.Join(dir, "g"), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
			tr.Err("open O_CREAT|O_EXCL new", err)
			if err == nil {
				unix.Close(fd)
			}
			sayFile(tr, "g", filepath.Join(dir, "g"))
			fd, err = unix.Open(p, unix.O_RDONLY, 0)
			tr.Err("open O_RDONLY", err)
			if err == nil {
				_, err = unix.Write(fd, []byte("x"))
				tr.Err("write on O_RDONLY", err)
				unix.Close(fd)
			}
			fd, err = unix.Open(p, unix.O_WRONLY|unix.O_TRUNC, 0)
			tr.Err("open O_WRONLY|O_TRUNC", err)
			if err == nil {
				unix.Close(fd)
			}
			sayFile(tr, "f after O_TRUNC", p)
			fd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			tr.Err("open dir O_RDONLY", err)
			if err == nil {
				unix.Close(fd)
			}
			_, err = unix.Open(dir, unix.O_WRONLY, 0)
			tr.Err("open dir O_WRONLY", err)
			_, err = unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			tr.Err("open file O_DIRECTORY", err)
			// tar and rsync open with O_NOFOLLOW; a regular file opens.
			fd, err = unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOATIME, 0)
			tr.Err("open O_NOFOLLOW|O_NOATIME", err)
			if err == nil {
				unix.Close(fd)
			}
			if err := unix.Symlink("f", filepath.Join(dir, "lnk")); err == nil {
				_, err = unix.Open(filepath.Join(dir, "lnk"), unix.O_RDONLY|unix.O_NOFOLLOW, 0)
				tr.Err("open symlink O_NOFOLLOW", err)
			}
			_, err = unix.Open(filepath.Join(dir, "missing"), unix.O_RDONLY, 0)
			tr.Err("open missing", err)
			tr.Err("access f R_OK|W_OK", unix.Access(p, unix.R_OK|unix.W_OK))
			tr.Err("access missing", unix.Access(filepath.Join(dir, "missing"), unix.F_OK))
		}},
		{"umask-and-mode", func(t *testing.T, dir string, tr *Transcript) {
			old := unix.Umask(0o027)
			defer unix.Umask(old)
			fd, err := unix.Open(filepath.Join(dir, "m"), unix.O_CREAT|unix.O_WRONLY, 0o666)
			tr.Err("create with umask 027", err)
			if err == nil {
				unix.Close(fd)
			}
			tr.Err("mkdir with umask 027", unix.Mkdir(filepath.Join(dir, "d"), 0o777))
			sayFile(tr, "m", filepath.Join(dir, "m"))
			var st unix.Stat_t
			must(t, unix.Stat(filepath.Join(dir, "d"), &st))
			tr.Say("d mode=%o", st.Mode)
			tr.Err("chmod 0604", unix.Chmod(filepath.Join(dir, "m"), 0o604))
			sayFile(tr, "m after chmod", filepath.Join(dir, "m"))
		}},
		{"append", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "log")
			writeFile(t, p, []byte("head\n"))
			a, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			must(t, err)
			b, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			must(t, err)
			for i := range 50 {
				_, err := a.WriteString("a-line\n")
				if err != nil {
					tr.Err("append a", err)
				}
				if i%3 == 0 {
					_, err = b.WriteString("b\n")
					if err != nil {
						tr.Err("append b", err)
					}
				}
			}
			// pwrite at 0 on an O_APPEND descriptor still appends on Linux.
			_, err = unix.Pwrite(int(a.Fd()), []byte("tail\n"), 0)
			tr.Err("pwrite at 0 on O_APPEND", err)
			a.Close()
			b.Close()
			sayFile(tr, "log", p)
		}},
		{"o-direct", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "direct")
			fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT, 0o644)
			tr.Err("open O_DIRECT", err)
			if err != nil {
				return
			}
			defer unix.Close(fd)
			buf := alignedBuf(8192)
			for i := range buf {
				buf[i] = byte(i * 7)
			}
			n, err := unix.Pwrite(fd, buf, 4096)
			tr.Err("pwrite O_DIRECT", err)
			tr.Say("wrote %d", n)
			got := alignedBuf(4096)
			n, err = unix.Pread(fd, got, 8192)
			tr.Err("pread O_DIRECT", err)
			tr.Say("read %d %s", n, Sum(got[:max(n, 0)]))
			sayFile(tr, "direct", p)
		}},
	}
}

// alignedBuf returns a buffer aligned to 4096 bytes, as O_DIRECT needs.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 4096 - int(uintptrOf(b)%4096)
	if off == 4096 {
		off = 0
	}
	return b[off : off+n]
}
