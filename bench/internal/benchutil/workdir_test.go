package benchutil

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// undoChild is set in the environment of the child TestUndoOnInterrupt
// starts: the directory it leaves its mark in when it undoes.
const undoChild = "BENCHUTIL_UNDO_CHILD"

// TestUndoOnInterrupt: a benchmark interrupted with SIGTERM (or ^C)
// undoes what it pushed, newest first, and exits 1; it is run as a
// child process, which the signal ends.
func TestUndoOnInterrupt(t *testing.T) {
	if dir := os.Getenv(undoChild); dir != "" {
		u := NewUndo("child")
		u.Push(func() { os.WriteFile(filepath.Join(dir, "first"), nil, 0o644) })
		u.Push(func() {
			// The newest step runs first: the older one's mark is not there yet.
			if _, err := os.Stat(filepath.Join(dir, "first")); err == nil {
				os.WriteFile(filepath.Join(dir, "out-of-order"), nil, 0o644)
			}
			os.WriteFile(filepath.Join(dir, "second"), nil, 0o644)
		})
		os.Stdout.WriteString("ready\n")
		time.Sleep(time.Minute)
		os.Exit(3) // not interrupted
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestUndoOnInterrupt$")
	cmd.Env = append(os.Environ(), undoChild+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		cmd.Process.Kill()
		t.Fatalf("child: %q, %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("child after SIGTERM: %v, want exit status 1", err)
	}
	for _, f := range []string{"first", "second"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("step %s not undone: %v", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "out-of-order")); err == nil {
		t.Errorf("the older step ran before the newer one")
	}
}
