// Package posixtest is a conformance suite for file systems that must be
// indistinguishable from the disk below them. Each case runs a fixed script
// of system calls in a directory and writes down everything a program could
// observe (results, errnos, contents, sizes, modes) in a transcript. A test
// runs every case on a plain directory and on the file system under test and
// requires the transcripts to be equal.
//
// Inode numbers, device numbers and times that the script did not set are
// left out of transcripts: they legitimately differ.
package posixtest

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// Transcript is what a case observed, one line per observation.
type Transcript struct {
	lines []string
}

// Say records an observation.
func (tr *Transcript) Say(format string, args ...any) {
	tr.lines = append(tr.lines, fmt.Sprintf(format, args...))
}

// Err records the outcome of an operation as "op: ok" or "op: ERRNO".
func (tr *Transcript) Err(op string, err error) {
	tr.Say("%s: %s", op, errName(err))
}

// Lines returns the observations.
func (tr *Transcript) Lines() []string { return tr.lines }

// Diff returns a readable difference between two transcripts, or "" if they
// are equal.
func Diff(want, got *Transcript) string {
	var b strings.Builder
	n := max(len(want.lines), len(got.lines))
	for i := range n {
		var w, g string
		if i < len(want.lines) {
			w = want.lines[i]
		}
		if i < len(got.lines) {
			g = got.lines[i]
		}
		if w != g {
			fmt.Fprintf(&b, "line %d:\n  native: %s\n  mount:  %s\n", i, w, g)
		}
	}
	return b.String()
}

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unixErrName(errno)
	}
	return "error " + err.Error()
}

func unixErrName(e syscall.Errno) string {
	switch e {
	case syscall.ENOENT:
		return "ENOENT"
	case syscall.EEXIST:
		return "EEXIST"
	case syscall.ENOTEMPTY:
		return "ENOTEMPTY"
	case syscall.EISDIR:
		return "EISDIR"
	case syscall.ENOTDIR:
		return "ENOTDIR"
	case syscall.EAGAIN:
		return "EAGAIN"
	case syscall.EACCES:
		return "EACCES"
	case syscall.EPERM:
		return "EPERM"
	case syscall.EINVAL:
		return "EINVAL"
	case syscall.EBADF:
		return "EBADF"
	case syscall.ENODATA:
		return "ENODATA"
	case syscall.EXDEV:
		return "EXDEV"
	case syscall.ESTALE:
		return "ESTALE"
	case syscall.EIO:
		return "EIO"
	case syscall.ENOTSUP:
		return "ENOTSUP"
	}
	return fmt.Sprintf("errno %d (%v)", int(e), e)
}

// Sum is a short content digest for transcripts.
func Sum(b []byte) string {
	h := sha256.Sum256(b)
	return fmt.Sprintf("%d bytes sha256:%x", len(b), h[:8])
}

// Case is one script of the suite.
type Case struct {
	Name string
	Run  func(t *testing.T, dir string, tr *Transcript)
}

// Cases returns the whole suite.
func Cases() []Case {
	var all []Case
	all = append(all, openCases()...)
	all = append(all, ioCases()...)
	all = append(all, namespaceCases()...)
	all = append(all, concurrencyCases()...)
	return all
}

// helperEnv names the environment variable that turns a test binary into
// the lock helper (see RunHelperIfAsked).
const helperEnv = "POSIXTEST_LOCK_HELPER"

// RunHelperIfAsked must be called first in TestMain of any package that
// runs the suite: the lock case re-executes the test binary as a second
// process, because POSIX record locks only conflict between processes.
func RunHelperIfAsked() {
	if runStepIfAsked() {
		os.Exit(0)
	}
	path := os.Getenv(helperEnv)
	if path == "" {
		return
	}
	fmt.Print(tryLock(path))
	os.Exit(0)
}

// tryLock tries a non-blocking whole-file write lock on path, as Kafka's
// FileChannel.tryLock does, and says what happened.
func tryLock(path string) string {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return "open: " + errName(err)
	}
	defer f.Close()
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	return "setlk: " + errName(syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk))
}

// lockFromOtherProcess runs tryLock in a child process.
func lockFromOtherProcess(path string) string {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	out, err := cmd.Output()
	if err != nil {
		return "helper failed: " + err.Error()
	}
	return string(out)
}
