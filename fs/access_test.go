package fs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/internal/testenv"
)

// asNobody runs a command as uid and gid 65534 and says how it went:
// "ok" or the first line of its error output.
func asNobody(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil {
		return "ok"
	}
	line, _, _ := strings.Cut(string(out), "\n")
	// The message names the path; keep what it says of it.
	if i := strings.LastIndex(line, ": "); i >= 0 {
		line = line[i+2:]
	}
	return line
}

// TestModesAsTheBackingFile: every mode, 0000 included, shows through
// the mount as in the backing directory, and another user is allowed
// and refused exactly as on the backing directory (the kernel checks
// access against the mode the mount reports). The root's link count is
// what the user sees: the hidden state directory is not counted.
func TestModesAsTheBackingFile(t *testing.T) {
	requireMount(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to act as another user")
	}
	for _, passthrough := range []bool{false, true} {
		t.Run(fmt.Sprintf("passthrough=%v", passthrough), func(t *testing.T) {
			top := t.TempDir()
			reachable(t, top) // else nobody could not reach the mount at all
			backing := filepath.Join(top, "backing")
			if err := os.Mkdir(backing, 0o755); err != nil {
				t.Fatal(err)
			}
			files := map[string]os.FileMode{"f0000": 0, "f0600": 0o600, "f0640": 0o640, "f0644": 0o644, "f0004": 0o004, "f0400": 0o400}
			for name, mode := range files {
				p := filepath.Join(backing, name)
				if err := os.WriteFile(p, []byte("secret\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, mode); err != nil {
					t.Fatal(err)
				}
			}
			dirs := map[string]os.FileMode{"d0000": 0, "d0700": 0o700, "d0711": 0o711, "d0755": 0o755}
			for name, mode := range dirs {
				p := filepath.Join(backing, name)
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(p, "inside"), []byte("x\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, mode); err != nil {
					t.Fatal(err)
				}
			}
			mnt := filepath.Join(top, "mnt")
			if err := os.Mkdir(mnt, 0o755); err != nil {
				t.Fatal(err)
			}
			srv := startServer(t, backing, mnt, passthrough)
			// The server made its state directory in the backing root.
			if _, err := os.Stat(filepath.Join(backing, StateDirName)); err != nil {
				t.Fatal(err)
			}
			// Not a test that passes because nobody is refused everything.
			if got := asNobody(t, "cat", filepath.Join(srv.Mountpoint, "f0644")); got != "ok" {
				t.Fatalf("nobody cannot read a 0644 file through the mount: %s", got)
			}
			for name := range files {
				b, m := stat(t, filepath.Join(backing, name)), stat(t, filepath.Join(srv.Mountpoint, name))
				if b.Mode != m.Mode || b.Uid != m.Uid || b.Gid != m.Gid {
					t.Errorf("%s: mode %o uid %d gid %d through the mount, %o %d %d in the backing directory", name, m.Mode, m.Uid, m.Gid, b.Mode, b.Uid, b.Gid)
				}
				native := asNobody(t, "cat", filepath.Join(backing, name))
				mounted := asNobody(t, "cat", filepath.Join(srv.Mountpoint, name))
				if native != mounted {
					t.Errorf("cat %s as nobody: %q through the mount, %q in the backing directory", name, mounted, native)
				}
				nativeW := asNobody(t, "sh", "-c", "echo x >> "+filepath.Join(backing, name))
				mountedW := asNobody(t, "sh", "-c", "echo x >> "+filepath.Join(srv.Mountpoint, name))
				if nativeW != mountedW {
					t.Errorf("append to %s as nobody: %q through the mount, %q in the backing directory", name, mountedW, nativeW)
				}
			}
			for name := range dirs {
				b, m := stat(t, filepath.Join(backing, name)), stat(t, filepath.Join(srv.Mountpoint, name))
				if b.Mode != m.Mode {
					t.Errorf("%s: mode %o through the mount, %o in the backing directory", name, m.Mode, b.Mode)
				}
				for _, c := range [][]string{{"ls", "DIR"}, {"cat", "DIR/inside"}} {
					run := func(root string) string {
						args := append([]string(nil), c[1:]...)
						for i := range args {
							args[i] = strings.Replace(args[i], "DIR", filepath.Join(root, name), 1)
						}
						return asNobody(t, c[0], args...)
					}
					if native, mounted := run(backing), run(srv.Mountpoint); native != mounted {
						t.Errorf("%s %s as nobody: %q through the mount, %q in the backing directory", c[0], name, mounted, native)
					}
				}
			}
			// The root: its subdirectories as listed (the state directory
			// is hidden), so its link count is the backing one's less one.
			b, m := stat(t, backing), stat(t, srv.Mountpoint)
			if m.Nlink != b.Nlink-1 {
				t.Errorf("the root's link count is %d through the mount, %d in the backing directory (which has the hidden state directory)", m.Nlink, b.Nlink)
			}
		})
	}
}

func stat(t *testing.T, p string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestLargeReadsAreSpliced: reads of a local file served by FUSE (no
// passthrough) in 1 MiB requests are spliced from the backing file, and
// go-fuse's messages reach the mount's logger: it says nothing here,
// where before each read logged that its reply did not fit a pipe and
// was copied instead.
func TestLargeReadsAreSpliced(t *testing.T) {
	backing := filepath.Join(t.TempDir(), "backing")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 16<<20)
	for i := range want {
		want[i] = byte(i*31 + i>>12)
	}
	if err := os.WriteFile(filepath.Join(backing, "big"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := mountTest(t, backing, false)
	f, err := os.Open(filepath.Join(srv.Mountpoint, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for off := 0; off < len(want); off += len(buf) {
		n, err := f.ReadAt(buf, int64(off))
		if err != nil || n != len(buf) || string(buf) != string(want[off:off+n]) {
			t.Fatalf("read at %d: %d bytes, %v, equal %v", off, n, err, string(buf[:n]) == string(want[off:off+n]))
		}
	}
	if log := srv.Log(); strings.Contains(log, "trySplice") || strings.Contains(log, "max pipe size") {
		t.Errorf("reads fell back from splice:\n%s", log)
	}
}

// TestChownUnchangedUpdatesCtime: chown(path, -1, -1) changes no owner
// but updates ctime, on ext4 and through the mount alike.
func TestChownUnchangedUpdatesCtime(t *testing.T) {
	for _, passthrough := range []bool{false, true} {
		t.Run(fmt.Sprintf("passthrough=%v", passthrough), func(t *testing.T) {
			backing := filepath.Join(t.TempDir(), "backing")
			if err := os.Mkdir(backing, 0o755); err != nil {
				t.Fatal(err)
			}
			srv := mountTest(t, backing, passthrough)
			for _, root := range []string{backing, srv.Mountpoint} {
				p := filepath.Join(root, "f-"+filepath.Base(root))
				if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				before := stat(t, p)
				time.Sleep(20 * time.Millisecond)
				if err := os.Chown(p, -1, -1); err != nil {
					t.Fatal(err)
				}
				after := stat(t, p)
				if after.Ctim == before.Ctim {
					t.Errorf("chown(-1, -1) of %s left ctime at %v", p, before.Ctim)
				}
			}
		})
	}
}
