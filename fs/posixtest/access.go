package posixtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The users the access cases act as (they need no entry in /etc/passwd).
// UserA's groups are GroupA and GroupShared; UserB's only GroupB.
const (
	UserA       = 10001
	UserB       = 10002
	GroupA      = 10001
	GroupB      = 10002
	GroupShared = 10003
)

// AccessCase checks permissions: Setup makes files as root (owners and
// modes included), then each step runs as its user in a process of its
// own and writes down what it observed; at the end root writes down
// every file's mode, owner and content.
type AccessCase struct {
	Name  string
	Setup func(dir string) error
	Steps []Step
}

// Step is one thing a user does.
type Step struct {
	As   int // UserA or UserB
	Do   func(dir string, tr *Transcript)
	What string
}

// accessEnv names the variable that turns a test binary into the step
// runner: "<case>/<step index>/<dir>".
const accessEnv = "POSIXTEST_ACCESS_STEP"

// runStepIfAsked runs the step accessEnv names and prints its
// transcript, one line each.
func runStepIfAsked() bool {
	v := os.Getenv(accessEnv)
	if v == "" {
		return false
	}
	name, rest, _ := strings.Cut(v, "/")
	idx, dir, _ := strings.Cut(rest, "/")
	i, _ := strconv.Atoi(idx)
	for _, c := range AccessCases() {
		if c.Name == name {
			tr := &Transcript{}
			c.Steps[i].Do("/"+dir, tr)
			for _, l := range tr.lines {
				fmt.Println(l)
			}
			return true
		}
	}
	fmt.Println("no access case", name)
	return true
}

// runner is a copy of the test binary that every user may run (the go
// build directory is root's alone).
var runner = struct {
	once sync.Once
	dir  string
	path string
	err  error
}{}

func runnerPath() (string, error) {
	runner.once.Do(func() {
		dir, err := os.MkdirTemp("", "posixtest-runner-")
		if err != nil {
			runner.err = err
			return
		}
		runner.dir = dir
		os.Chmod(dir, 0o755)
		b, err := os.ReadFile(os.Args[0])
		if err != nil {
			runner.err = err
			return
		}
		runner.path = filepath.Join(dir, "runner")
		runner.err = os.WriteFile(runner.path, b, 0o755)
	})
	return runner.path, runner.err
}

// RemoveRunner removes the copy of the test binary that RunAccess made,
// if it made one (15 MB in $TMPDIR otherwise left behind by every test
// run): a TestMain calls it once its tests ran.
func RemoveRunner() {
	if runner.dir != "" {
		os.RemoveAll(runner.dir)
	}
}

// RunAccess runs c in dir (which its users must be able to reach) and
// returns what was observed. It needs root.
func RunAccess(t *testing.T, c AccessCase, dir string) *Transcript {
	t.Helper()
	tr := &Transcript{}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.Setup(dir); err != nil {
		t.Fatalf("setup of %s: %v", c.Name, err)
	}
	bin, err := runnerPath()
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range c.Steps {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s/%d%s", accessEnv, c.Name, i, dir))
		cred := &syscall.Credential{Uid: uint32(s.As), Gid: GroupB}
		if s.As == UserA {
			cred.Gid, cred.Groups = GroupA, []uint32{GroupA, GroupShared}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Dir = "/"
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("step %d (%s) of %s: %v", i, s.What, c.Name, err)
		}
		who := "A"
		if s.As == UserB {
			who = "B"
		}
		for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			tr.Say("%s as %s: %s", s.What, who, l)
		}
	}
	tree(dir, tr)
	return tr
}

// tree writes down every entry under dir: mode, owner, group, and a
// regular file's content.
func tree(dir string, tr *Transcript) {
	var names []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && p != dir {
			names = append(names, p)
		}
		return nil
	})
	sort.Strings(names)
	for _, p := range names {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			tr.Err("lstat "+p[len(dir):], err)
			continue
		}
		line := fmt.Sprintf("%s mode %o uid %d gid %d", p[len(dir)+1:], st.Mode, st.Uid, st.Gid)
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			b, _ := os.ReadFile(p)
			line += " " + Sum(b)
		}
		tr.Say("%s", line)
	}
}

// file makes a file with content, owner and mode (set after the owner:
// a chown clears set-id bits). Modes are raw (0o4000 is set-user-ID):
// os.FileMode has bits of its own for those.
func file(p, content string, uid, gid int, mode uint32) error {
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		return err
	}
	if err := os.Chown(p, uid, gid); err != nil {
		return err
	}
	return unix.Chmod(p, mode)
}

func mkdir(p string, uid, gid int, mode uint32) error {
	if err := os.Mkdir(p, 0o700); err != nil {
		return err
	}
	if err := os.Chown(p, uid, gid); err != nil {
		return err
	}
	return unix.Chmod(p, mode)
}

func readStep(name string) func(dir string, tr *Transcript) {
	return func(dir string, tr *Transcript) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		tr.Err("read "+name, err)
		if err == nil {
			tr.Say("content %q", b)
		}
	}
}

func openStep(name string, flags int) func(dir string, tr *Transcript) {
	return func(dir string, tr *Transcript) {
		f, err := os.OpenFile(filepath.Join(dir, name), flags, 0)
		tr.Err(fmt.Sprintf("open %s flags %#x", name, flags), err)
		if err == nil {
			f.Close()
		}
	}
}

func writeStep(name, data string) func(dir string, tr *Transcript) {
	return func(dir string, tr *Transcript) {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY, 0)
		tr.Err("open "+name+" for writing", err)
		if err == nil {
			_, err = f.WriteAt([]byte(data), 0)
			tr.Err("write", err)
			f.Close()
		}
	}
}

func truncStep(name string, size int64) func(dir string, tr *Transcript) {
	return func(dir string, tr *Transcript) {
		tr.Err(fmt.Sprintf("truncate %s to %d", name, size), os.Truncate(filepath.Join(dir, name), size))
	}
}

func statStep(name string) func(dir string, tr *Transcript) {
	return func(dir string, tr *Transcript) {
		var st unix.Stat_t
		err := unix.Lstat(filepath.Join(dir, name), &st)
		tr.Err("stat "+name, err)
		if err == nil {
			tr.Say("mode %o uid %d gid %d", st.Mode, st.Uid, st.Gid)
		}
	}
}

func listStep(name string) func(dir string, tr *Transcript) {
	return func(dir string, tr *Transcript) {
		ents, err := os.ReadDir(filepath.Join(dir, name))
		tr.Err("list "+name, err)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if err == nil {
			tr.Say("entries %v", names)
		}
	}
}

func execStep(name string) func(dir string, tr *Transcript) {
	return func(dir string, tr *Transcript) {
		out, err := exec.Command(filepath.Join(dir, name)).Output()
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		tr.Err("exec "+name, err)
		if err == nil {
			tr.Say("printed %q", out)
		}
	}
}

// AccessCases returns the access-control suite.
func AccessCases() []AccessCase {
	return []AccessCase{
		{Name: "read", Setup: func(d string) error {
			return file(filepath.Join(d, "f"), "for A and its group\n", UserA, GroupA, 0o640)
		}, Steps: []Step{{UserA, readStep("f"), "read"}, {UserB, readStep("f"), "read"}}},

		{Name: "write", Setup: func(d string) error {
			return file(filepath.Join(d, "f"), "original\n", UserA, GroupA, 0o644)
		}, Steps: []Step{{UserB, writeStep("f", "B was here"), "write"}, {UserA, writeStep("f", "A was here"), "write"}}},

		{Name: "exec", Setup: func(d string) error {
			if err := file(filepath.Join(d, "script"), "#!/bin/sh\necho ran\n", UserA, GroupA, 0o754); err != nil {
				return err
			}
			return file(filepath.Join(d, "data"), "#!/bin/sh\necho ran\n", UserA, GroupA, 0o644)
		}, Steps: []Step{{UserA, execStep("script"), "exec"}, {UserB, execStep("script"), "exec"}, {UserA, execStep("data"), "exec"}}},

		{Name: "list-and-traverse", Setup: func(d string) error {
			for _, x := range []struct {
				name string
				mode uint32
			}{{"d0750", 0o750}, {"d0711", 0o711}, {"d0700", 0o700}, {"d0000", 0}} {
				if err := mkdir(filepath.Join(d, x.name), UserA, GroupA, 0o755); err != nil {
					return err
				}
				if err := file(filepath.Join(d, x.name, "f"), "inside\n", UserA, GroupA, 0o644); err != nil {
					return err
				}
				if err := unix.Chmod(filepath.Join(d, x.name), x.mode); err != nil {
					return err
				}
			}
			return nil
		}, Steps: []Step{
			{UserA, listStep("d0750"), "list"}, {UserB, listStep("d0750"), "list"},
			{UserB, listStep("d0711"), "list"}, {UserB, statStep("d0711/f"), "traverse"}, {UserB, readStep("d0711/f"), "traverse"},
			{UserB, statStep("d0700/f"), "traverse"}, {UserA, listStep("d0000"), "list"}, {UserA, statStep("d0000/f"), "traverse"},
		}},

		{Name: "other-users-0600", Setup: func(d string) error {
			return file(filepath.Join(d, "f"), "A's alone\n", UserA, GroupA, 0o600)
		}, Steps: []Step{{UserB, openStep("f", os.O_RDONLY), "open"}, {UserB, openStep("f", os.O_RDWR), "open"}, {UserA, openStep("f", os.O_RDWR), "open"}}},

		{Name: "otrunc-without-write", Setup: func(d string) error {
			return file(filepath.Join(d, "f"), "must survive\n", UserA, GroupA, 0o644)
		}, Steps: []Step{{UserB, openStep("f", os.O_WRONLY|os.O_TRUNC), "truncate"}, {UserB, func(dir string, tr *Transcript) {
			tr.Err("truncate(2)", os.Truncate(filepath.Join(dir, "f"), 0))
		}, "truncate"}}},

		{Name: "sticky-directory", Setup: func(d string) error {
			if err := mkdir(filepath.Join(d, "tmp"), 0, 0, 0o1777); err != nil {
				return err
			}
			if err := file(filepath.Join(d, "tmp", "a"), "A's\n", UserA, GroupA, 0o666); err != nil {
				return err
			}
			return file(filepath.Join(d, "tmp", "b"), "B's\n", UserB, GroupB, 0o666)
		}, Steps: []Step{
			{UserB, func(dir string, tr *Transcript) { tr.Err("unlink tmp/a", os.Remove(filepath.Join(dir, "tmp", "a"))) }, "sticky"},
			{UserB, func(dir string, tr *Transcript) {
				tr.Err("rename tmp/a", os.Rename(filepath.Join(dir, "tmp", "a"), filepath.Join(dir, "tmp", "a2")))
			}, "sticky"},
			{UserB, func(dir string, tr *Transcript) {
				tr.Err("rename tmp/b over tmp/a", os.Rename(filepath.Join(dir, "tmp", "b"), filepath.Join(dir, "tmp", "a")))
			}, "sticky"},
			{UserB, func(dir string, tr *Transcript) {
				tr.Err("rename tmp/b", os.Rename(filepath.Join(dir, "tmp", "b"), filepath.Join(dir, "tmp", "b2")))
			}, "sticky"},
			{UserA, func(dir string, tr *Transcript) { tr.Err("unlink tmp/a", os.Remove(filepath.Join(dir, "tmp", "a"))) }, "sticky"},
		}},

		{Name: "chmod-chown", Setup: func(d string) error {
			return file(filepath.Join(d, "f"), "x\n", UserA, GroupA, 0o666)
		}, Steps: []Step{
			{UserB, func(dir string, tr *Transcript) { tr.Err("chmod 0777", unix.Chmod(filepath.Join(dir, "f"), 0o777)) }, "chmod"},
			{UserB, func(dir string, tr *Transcript) { tr.Err("chown to B", os.Chown(filepath.Join(dir, "f"), UserB, -1)) }, "chown"},
			{UserA, func(dir string, tr *Transcript) { tr.Err("chown to B", os.Chown(filepath.Join(dir, "f"), UserB, -1)) }, "chown"},
			{UserA, func(dir string, tr *Transcript) {
				tr.Err("chgrp to B's group", os.Chown(filepath.Join(dir, "f"), -1, GroupB))
			}, "chgrp"},
			{UserA, func(dir string, tr *Transcript) {
				tr.Err("chgrp to a group of A's", os.Chown(filepath.Join(dir, "f"), -1, GroupShared))
			}, "chgrp"},
			{UserA, func(dir string, tr *Transcript) { tr.Err("chmod 02640", unix.Chmod(filepath.Join(dir, "f"), 0o2640)) }, "chmod"},
			{UserA, statStep("f"), "chmod"},
		}},

		{Name: "setgid-directory", Setup: func(d string) error {
			return mkdir(filepath.Join(d, "shared"), UserA, GroupShared, 0o2775)
		}, Steps: []Step{
			{UserA, func(dir string, tr *Transcript) {
				tr.Err("create shared/f", os.WriteFile(filepath.Join(dir, "shared", "f"), []byte("x"), 0o644))
				tr.Err("mkdir shared/sub", os.Mkdir(filepath.Join(dir, "shared", "sub"), 0o755))
			}, "inherit"},
			{UserA, statStep("shared/f"), "inherit"}, {UserA, statStep("shared/sub"), "inherit"},
			{UserB, func(dir string, tr *Transcript) {
				tr.Err("create shared/g", os.WriteFile(filepath.Join(dir, "shared", "g"), []byte("x"), 0o644))
			}, "inherit"},
		}},

		{Name: "setid-cleared-on-write", Setup: func(d string) error {
			if err := file(filepath.Join(d, "by-other"), "#!/bin/sh\n", UserA, GroupA, 0o6777); err != nil {
				return err
			}
			return file(filepath.Join(d, "by-owner"), "#!/bin/sh\n", UserA, GroupA, 0o6777)
		}, Steps: []Step{
			{UserB, writeStep("by-other", "#"), "write"}, {UserB, statStep("by-other"), "write"},
			{UserA, writeStep("by-owner", "#"), "write"}, {UserA, statStep("by-owner"), "write"},
		}},

		// A truncate, and an open with O_TRUNC, clear them too (the
		// mount tells the kernel it clears them itself on a truncate:
		// FUSE_HANDLE_KILLPRIV_V2). "no-group-x" has set-group-ID without
		// group execute, truncated by a user outside its group: Linux
		// clears that bit too. (A write by such a user keeps it through
		// the mount: the kernel's FUSE code clears the set-group-ID bit
		// on a write only with group execute; README, Semantics.)
		{Name: "setid-cleared-on-truncate", Setup: func(d string) error {
			for _, name := range []string{"by-other", "by-owner", "trunc-open", "unchanged-size"} {
				if err := file(filepath.Join(d, name), "#!/bin/sh\n", UserA, GroupA, 0o6777); err != nil {
					return err
				}
			}
			return file(filepath.Join(d, "no-group-x"), "#!/bin/sh\n", UserA, GroupA, 0o6767)
		}, Steps: []Step{
			{UserB, truncStep("by-other", 1), "truncate"}, {UserB, statStep("by-other"), "truncate"},
			{UserA, truncStep("by-owner", 1), "truncate"}, {UserA, statStep("by-owner"), "truncate"},
			{UserB, func(dir string, tr *Transcript) {
				f, err := os.OpenFile(filepath.Join(dir, "trunc-open"), os.O_WRONLY|os.O_TRUNC, 0)
				tr.Err("open trunc-open with O_TRUNC", err)
				if err == nil {
					f.Close()
				}
			}, "truncate"},
			{UserB, statStep("trunc-open"), "truncate"},
			{UserB, truncStep("unchanged-size", 10), "truncate"}, {UserB, statStep("unchanged-size"), "truncate"},
			{UserB, truncStep("no-group-x", 1), "truncate"}, {UserB, statStep("no-group-x"), "truncate"},
		}},

		{Name: "utimes", Setup: func(d string) error {
			if err := file(filepath.Join(d, "writable"), "x\n", UserA, GroupA, 0o666); err != nil {
				return err
			}
			return file(filepath.Join(d, "readonly"), "x\n", UserA, GroupA, 0o644)
		}, Steps: []Step{
			{UserB, func(dir string, tr *Transcript) {
				tr.Err("touch writable (now)", unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, "writable"), nil, 0))
			}, "utimes"},
			{UserB, func(dir string, tr *Transcript) {
				ts := []unix.Timespec{{Sec: 1e9}, {Sec: 1e9}}
				tr.Err("set the times of writable", unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, "writable"), ts, 0))
			}, "utimes"},
			{UserB, func(dir string, tr *Transcript) {
				tr.Err("touch readonly (now)", unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, "readonly"), nil, 0))
			}, "utimes"},
			{UserA, func(dir string, tr *Transcript) {
				ts := []unix.Timespec{{Sec: 1e9}, {Sec: 1e9}}
				tr.Err("set the times of readonly", unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, "readonly"), ts, 0))
				var st unix.Stat_t
				unix.Stat(filepath.Join(dir, "readonly"), &st)
				tr.Say("mtime %d", st.Mtim.Sec)
			}, "utimes"},
		}},

		{Name: "user-xattrs", Setup: func(d string) error {
			if err := file(filepath.Join(d, "readonly"), "x\n", UserA, GroupA, 0o644); err != nil {
				return err
			}
			if err := unix.Setxattr(filepath.Join(d, "readonly"), "user.tag", []byte("A's"), 0); err != nil {
				return err
			}
			return file(filepath.Join(d, "writable"), "x\n", UserA, GroupA, 0o666)
		}, Steps: []Step{
			{UserB, func(dir string, tr *Transcript) {
				tr.Err("set user.x on readonly", unix.Setxattr(filepath.Join(dir, "readonly"), "user.x", []byte("B"), 0))
				buf := make([]byte, 64)
				n, err := unix.Getxattr(filepath.Join(dir, "readonly"), "user.tag", buf)
				tr.Err("get user.tag of readonly", err)
				if err == nil {
					tr.Say("value %q", buf[:n])
				}
				tr.Err("remove user.tag of readonly", unix.Removexattr(filepath.Join(dir, "readonly"), "user.tag"))
				tr.Err("set user.x on writable", unix.Setxattr(filepath.Join(dir, "writable"), "user.x", []byte("B"), 0))
			}, "xattr"},
			{UserA, func(dir string, tr *Transcript) {
				tr.Err("set user.y on readonly", unix.Setxattr(filepath.Join(dir, "readonly"), "user.y", []byte("A"), 0))
				tr.Err("set trusted.x on readonly", unix.Setxattr(filepath.Join(dir, "readonly"), "trusted.x", []byte("A"), 0))
			}, "xattr"},
		}},
	}
}
