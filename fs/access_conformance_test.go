package fs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/fs/posixtest"
	"github.com/tierfs/tierfs/internal/testenv"
)

// reachable makes dir, and the directories above it inside the temporary
// directory, searchable by everyone (t.TempDir makes them 0700), so
// other users reach it.
func reachable(t *testing.T, dir string) {
	t.Helper()
	for d := dir; strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAccessConformance runs the access-control cases (each step as one
// of two unprivileged users, in a process of its own) on a plain
// directory and on the mount, with and without passthrough and with
// change management, and requires the same observations: the mount lets
// exactly what the backing files let.
func TestAccessConformance(t *testing.T) {
	requireMount(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to act as other users")
	}
	for _, variant := range []struct {
		name        string
		passthrough bool
		cm          bool
	}{{"passthrough", true, false}, {"fuse-io", false, false}, {"cm", true, true}} {
		t.Run(variant.name, func(t *testing.T) {
			if variant.cm {
				t.Setenv(serveCMEnv, "1")
			}
			top := t.TempDir()
			backing, mnt, native := filepath.Join(top, "backing"), filepath.Join(top, "mnt"), filepath.Join(top, "native")
			for _, d := range []string{backing, mnt, native} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			reachable(t, top)
			srv := startServer(t, backing, mnt, variant.passthrough)
			for _, c := range posixtest.AccessCases() {
				t.Run(c.Name, func(t *testing.T) {
					want := posixtest.RunAccess(t, c, filepath.Join(native, c.Name))
					got := posixtest.RunAccess(t, c, filepath.Join(srv.Mountpoint, c.Name))
					if d := posixtest.Diff(want, got); d != "" {
						t.Errorf("mount differs from native:\n%s", d)
					}
					if variant.name == "passthrough" {
						t.Logf("native and mount:\n  %s", strings.Join(want.Lines(), "\n  "))
					}
				})
			}
		})
	}
}

// TestTierfsXattrsHidden: tierfs's own state (trusted.tierfs*) is
// invisible and unwritable through the mount, to root and to everyone.
func TestTierfsXattrsHidden(t *testing.T) {
	backing := filepath.Join(t.TempDir(), "backing")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(backing, "f")
	if err := os.WriteFile(p, []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "trusted.tierfs", []byte(`{"state":"shipped"}`), 0); err != nil {
		testenv.Missing(t, "no trusted xattrs here: %v", err)
	}
	srv := mountTest(t, backing, true)
	f := filepath.Join(srv.Mountpoint, "f")
	buf := make([]byte, 4096)
	n, err := unix.Listxattr(f, buf)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(buf[:n]), "tierfs") {
		t.Errorf("listxattr through the mount shows %q", buf[:n])
	}
	if _, err := unix.Getxattr(f, "trusted.tierfs", buf); err != unix.ENODATA {
		t.Errorf("getxattr trusted.tierfs through the mount: %v, want ENODATA", err)
	}
	for _, name := range []string{"trusted.tierfs", "trusted.tierfs.other"} {
		if err := unix.Setxattr(f, name, []byte("forged"), 0); err == nil {
			t.Errorf("setxattr %s through the mount succeeded", name)
		}
		if err := unix.Removexattr(f, name); err == nil {
			t.Errorf("removexattr %s through the mount succeeded", name)
		}
	}
	if n, err := unix.Getxattr(p, "trusted.tierfs", buf); err != nil || string(buf[:n]) != `{"state":"shipped"}` {
		t.Errorf("the backing file's record is %q (%v) after the attempts", buf[:n], err)
	}
}
