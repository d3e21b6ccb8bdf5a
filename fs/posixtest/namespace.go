package posixtest

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// SayTree records every entry below dir with its type, size, mode, link
// count and content digest, in name order.
func SayTree(tr *Transcript, dir string) {
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			lines = append(lines, p+": "+errName(err))
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			lines = append(lines, rel+": "+errName(err))
			return nil
		}
		desc := rel
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			desc += "/ mode=" + octal(st.Mode)
		case unix.S_IFLNK:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case unix.S_IFREG:
			data, err := os.ReadFile(p)
			if err != nil {
				desc += " read: " + errName(err)
			} else {
				desc += " mode=" + octal(st.Mode) + " nlink=" + itoa(int64(st.Nlink)) + " " + Sum(data)
			}
		default:
			desc += " mode=" + octal(st.Mode)
		}
		lines = append(lines, desc)
		return nil
	})
	if err != nil {
		lines = append(lines, "walk: "+errName(err))
	}
	sort.Strings(lines)
	tr.Say("tree: %s", strings.Join(lines, " | "))
}

func octal(m uint32) string { return strconv.FormatUint(uint64(m), 8) }
func itoa(v int64) string   { return strconv.FormatInt(v, 10) }

func namespaceCases() []Case {
	return []Case{
		{"mkdir-rmdir-readdir", func(t *testing.T, dir string, tr *Transcript) {
			d := filepath.Join(dir, "topic-0")
			tr.Err("mkdir", os.Mkdir(d, 0o755))
			tr.Err("mkdir existing", os.Mkdir(d, 0o755))
			for _, name := range []string{"00000000000000000000.log", "00000000000000000000.index", "leader-epoch-checkpoint", "partition.metadata"} {
				writeFile(t, filepath.Join(d, name), []byte(name))
			}
			tr.Err("rmdir non-empty", unix.Rmdir(d))
			ents, err := os.ReadDir(d)
			tr.Err("readdir", err)
			for _, e := range ents {
				tr.Say("entry %s dir=%v", e.Name(), e.IsDir())
			}
			names, err := readdirNames(d)
			tr.Say("raw readdir (with . and ..): %v %s", names, errName(err))
			tr.Err("rmdir file", unix.Rmdir(filepath.Join(d, "partition.metadata")))
			tr.Err("unlink dir", unix.Unlink(d))
			tr.Err("rm -r", os.RemoveAll(d))
			tr.Err("rmdir missing", unix.Rmdir(d))
			many := filepath.Join(dir, "many")
			must(t, os.Mkdir(many, 0o755))
			for i := range 1500 {
				writeFile(t, filepath.Join(many, "f"+itoa(int64(i))), nil)
			}
			ents, err = os.ReadDir(many)
			tr.Say("1500 entries listed: %d %s", len(ents), errName(err))
			SayTree(tr, dir)
		}},
		{"rename-over", func(t *testing.T, dir string, tr *Transcript) {
			a, b := filepath.Join(dir, "recovery-point-offset-checkpoint.tmp"), filepath.Join(dir, "recovery-point-offset-checkpoint")
			writeFile(t, b, []byte("0\n1\nold 0 5\n"))
			writeFile(t, a, []byte("0\n1\nnew 0 9\n"))
			// unix.Rename, not os.Rename: Go's refuses to rename over a
			// directory before asking the kernel.
			tr.Err("rename file over file", unix.Rename(a, b))
			sayFile(tr, "target", b)
			_, err := os.Stat(a)
			tr.Err("source gone", err)
			d1, d2 := filepath.Join(dir, "t-0"), filepath.Join(dir, "t-0.abc-delete")
			must(t, os.Mkdir(d1, 0o755))
			writeFile(t, filepath.Join(d1, "seg"), []byte("seg"))
			must(t, os.Mkdir(d2, 0o755))
			tr.Err("rename dir over empty dir", unix.Rename(d1, d2))
			sayFile(tr, "moved child", filepath.Join(d2, "seg"))
			must(t, os.Mkdir(d1, 0o755))
			tr.Err("rename dir over non-empty dir", unix.Rename(d1, d2))
			tr.Err("rename file over dir", unix.Rename(b, d2))
			tr.Err("rename dir over file", unix.Rename(d1, b))
			tr.Err("rename into own subdir", unix.Rename(d2, filepath.Join(d2, "x")))
			x, y := filepath.Join(dir, "x"), filepath.Join(dir, "y")
			writeFile(t, x, []byte("X"))
			writeFile(t, y, []byte("Y"))
			tr.Err("RENAME_NOREPLACE existing", unix.Renameat2(unix.AT_FDCWD, x, unix.AT_FDCWD, y, unix.RENAME_NOREPLACE))
			tr.Err("RENAME_EXCHANGE", unix.Renameat2(unix.AT_FDCWD, x, unix.AT_FDCWD, y, unix.RENAME_EXCHANGE))
			sayFile(tr, "x", x)
			sayFile(tr, "y", y)
			tr.Err("rename missing", os.Rename(filepath.Join(dir, "missing"), x))
			SayTree(tr, dir)
		}},
		{"open-unlinked", func(t *testing.T, dir string, tr *Transcript) {
			d := filepath.Join(dir, "part-0")
			must(t, os.Mkdir(d, 0o755))
			p := filepath.Join(d, "00000000000000000000.log.deleted")
			f, err := os.Create(p)
			must(t, err)
			f.Write(pattern(10000, 2))
			m, err := unix.Mmap(int(f.Fd()), 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			must(t, err)
			tr.Err("unlink open and mapped file", os.Remove(p))
			_, err = f.WriteAt([]byte("after"), 0)
			tr.Err("write after unlink", err)
			buf := make([]byte, 5)
			_, err = f.ReadAt(buf, 0)
			tr.Say("read after unlink: %q %s", buf, errName(err))
			tr.Say("map after unlink: %q", m[:5])
			var st unix.Stat_t
			tr.Err("fstat after unlink", unix.Fstat(int(f.Fd()), &st))
			tr.Say("nlink=%d size=%d", st.Nlink, st.Size)
			tr.Err("ftruncate after unlink", f.Truncate(100))
			// No leftovers (such as .fuse_hidden files) may keep the
			// directory from being removed.
			names, _ := readdirNames(d)
			tr.Say("dir after unlink: %v", names)
			tr.Err("rmdir while file still open", unix.Rmdir(d))
			unix.Munmap(m)
			f.Close()
			q := filepath.Join(dir, "open-renamed")
			g, err := os.Create(q)
			must(t, err)
			g.WriteString("before rename")
			tr.Err("rename open file", os.Rename(q, q+".swap"))
			g.WriteString(", after")
			tr.Err("fsync renamed open file", g.Sync())
			g.Close()
			sayFile(tr, "renamed", q+".swap")
			SayTree(tr, dir)
		}},
		{"links", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "file")
			writeFile(t, p, []byte("content"))
			tr.Err("link", os.Link(p, filepath.Join(dir, "hard")))
			tr.Err("link existing", os.Link(p, filepath.Join(dir, "hard")))
			sayFile(tr, "file", p)
			tr.Err("symlink", os.Symlink("file", filepath.Join(dir, "sym")))
			tr.Err("symlink dangling", os.Symlink("nowhere/at/all", filepath.Join(dir, "dangling")))
			target, err := os.Readlink(filepath.Join(dir, "sym"))
			tr.Say("readlink: %q %s", target, errName(err))
			data, err := os.ReadFile(filepath.Join(dir, "sym"))
			tr.Say("read through symlink: %q %s", data, errName(err))
			_, err = os.ReadFile(filepath.Join(dir, "dangling"))
			tr.Err("read dangling", err)
			tr.Err("unlink original", os.Remove(p))
			sayFile(tr, "hard", filepath.Join(dir, "hard"))
			tr.Err("mkfifo", unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
			var st unix.Stat_t
			tr.Err("lstat fifo", unix.Lstat(filepath.Join(dir, "fifo"), &st))
			tr.Say("fifo type=%o", st.Mode&unix.S_IFMT)
			tr.Err("unlink symlink", os.Remove(filepath.Join(dir, "sym")))
			SayTree(tr, dir)
		}},
	}
}

// readdirNames lists a directory with getdents, including . and .., sorted.
func readdirNames(dir string) ([]string, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var names []string
	buf := make([]byte, 1<<16)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return names, err
		}
		if n == 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	names = append(names, ".", "..") // ParseDirent drops them; both file systems have them
	sort.Strings(names)
	return names, nil
}
