package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/fs/posixtest"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// TestCommandsRefusedForOtherUsers: the commands that change what a
// mount does or what its files hold (ship, evict, hydrate, role, cm
// restore, repl load) are refused to a user other than root, with a
// message that says so, and change nothing; read-only commands (status)
// work for anyone.
func TestCommandsRefusedForOtherUsers(t *testing.T) {
	requireRoot(t)
	dir, backing, mnt := mountDirs(t)
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 4, Batches: 20, Records: 8, ValueSize: 500, Unflushed: 1, Age: time.Hour}.Write(backing)
	if err != nil {
		t.Fatal(err)
	}
	startMount(t, nil, "--backing", backing, "--remote", "file://"+filepath.Join(dir, "remote"), "--cm", "--ship-after", "1000h", "--tier-interval", "200ms", mnt)
	seg := filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][0]))
	if out, code := tierfs(t, nil, "evict", seg); code != 0 {
		t.Fatalf("evict as root: %s", out)
	}
	seg1 := filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][1]))
	// The binary and the mount, reachable by nobody.
	for _, d := range []string{filepath.Dir(tierfsBin), dir, filepath.Dir(dir)} {
		os.Chmod(d, 0o755)
	}
	dump, target := filepath.Join(t.TempDir(), "dump"), t.TempDir()
	if out, code := tierfs(t, nil, "repl", "dump", "--bootstrap", mnt, dump); code != 0 {
		t.Fatalf("repl dump as root: %s", out)
	}
	for _, d := range []string{dump, filepath.Dir(dump), target, filepath.Dir(target)} {
		os.Chmod(d, 0o777)
	}
	asNobody := func(args ...string) (string, int) {
		cmd := exec.Command(tierfsBin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	for _, args := range [][]string{
		{"ship", seg1},
		{"evict", seg1},
		{"hydrate", seg},
		{"role", mnt, "follower"},
		{"cm", "restore", filepath.Join(mnt, "orders-0")},
		{"repl", "load", dump, target},
	} {
		out, code := asNobody(args...)
		if code == 0 {
			t.Errorf("tierfs %s as nobody succeeded:\n%s", strings.Join(args, " "), out)
			continue
		}
		if !strings.Contains(out, "root") && !strings.Contains(out, "may not") && !strings.Contains(out, "ermission denied") {
			t.Errorf("tierfs %s as nobody (exit %d) does not say why:\n%s", strings.Join(args, " "), code, out)
		}
		t.Logf("tierfs %s as nobody: exit %d: %s", strings.Join(args, " "), code, strings.TrimSpace(out))
	}
	if st := state(seg); st != "remote" {
		t.Errorf("the evicted segment is %s after nobody's commands", st)
	}
	if st := state(seg1); st != "local" {
		t.Errorf("segment 1 is %s after nobody's commands", st)
	}
	if out, code := tierfs(t, nil, "role", mnt); code != 0 || strings.TrimSpace(out) != "auto" {
		t.Errorf("role after nobody's command: %s", out)
	}
	if out, code := asNobody("status", mnt); code != 0 || !strings.Contains(out, "orders-0") {
		t.Errorf("status as nobody: exit %d:\n%s", code, out)
	}
}

// TestAccessThroughEveryMount: the access-control cases (fs/posixtest,
// each step as an unprivileged user) observe on the tierfs binary's
// mounts what they observe on a plain directory: --backing with a
// remote, in place (the mount over its own backing directory) with a
// remote, with --cm, and without passthrough.
func TestAccessThroughEveryMount(t *testing.T) {
	requireRoot(t)
	for _, v := range []struct {
		name    string
		inPlace bool
		flags   []string
	}{
		{"remote", false, []string{"--remote", "REMOTE", "--ship-after", "1000h"}},
		{"in-place remote", true, []string{"--remote", "REMOTE", "--ship-after", "1000h"}},
		{"cm", false, []string{"--cm"}},
		{"no passthrough", false, []string{"--passthrough=false"}},
	} {
		t.Run(v.name, func(t *testing.T) {
			dir, backing, mnt := mountDirs(t)
			native := filepath.Join(dir, "native")
			if err := os.Mkdir(native, 0o755); err != nil {
				t.Fatal(err)
			}
			for d := dir; d != "/" && strings.HasPrefix(d, os.TempDir()); d = filepath.Dir(d) {
				os.Chmod(d, 0o755)
			}
			if v.inPlace {
				mnt = backing
			}
			args := []string{"--backing", backing}
			if v.inPlace {
				args = nil
			}
			for _, f := range v.flags {
				args = append(args, strings.Replace(f, "REMOTE", "file://"+filepath.Join(dir, "remote"), 1))
			}
			startMount(t, nil, append(args, mnt)...)
			for _, c := range posixtest.AccessCases() {
				want := posixtest.RunAccess(t, c, filepath.Join(native, c.Name))
				got := posixtest.RunAccess(t, c, filepath.Join(mnt, c.Name))
				if d := posixtest.Diff(want, got); d != "" {
					t.Errorf("%s: the mount differs from a plain directory:\n%s", c.Name, d)
				}
			}
		})
	}
}
