package benchutil

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Undo is what a benchmark undoes on its way out, newest first, also
// when a step fails or the benchmark is interrupted (SIGINT, SIGTERM):
// brokers, mounts, servers and the file system they run on. Fail and
// Check exit without running deferred calls, so all clean-up goes
// through it.
type Undo struct {
	name  string     // the benchmark, for messages
	runMu sync.Mutex // held while Run undoes: an interrupt meanwhile exits after it
	mu    sync.Mutex
	fns   []func() // GUARDED_BY(mu)
}

// NewUndo starts an empty Undo for the benchmark name. An interrupt
// undoes what was pushed and exits 1: a benchmark killed half-way
// (pkill, ^C) leaves no mount, broker or server behind.
func NewUndo(name string) *Undo {
	u := &Undo{name: name}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "%s: %v: undoing what it set up\n", name, s)
		u.Run()
		os.Exit(1)
	}()
	return u
}

// Push adds a step to undo.
func (u *Undo) Push(f func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.fns = append(u.fns, f)
}

// Run undoes everything pushed so far, newest first; each step once,
// whoever calls it (the benchmark, or an interrupt meanwhile).
func (u *Undo) Run() {
	u.runMu.Lock()
	defer u.runMu.Unlock()
	u.mu.Lock()
	fns := u.fns
	u.fns = nil
	u.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// Fail undoes everything and exits 1 with err.
func (u *Undo) Fail(err error) {
	u.Run()
	fmt.Fprintf(os.Stderr, "%s: %v\n", u.name, err)
	os.Exit(1)
}

// Check fails when err is set.
func (u *Undo) Check(err error) {
	if err != nil {
		u.Fail(err)
	}
}

// WorkDir makes the benchmark's directory in parent ("" for $TMPDIR):
// on a fresh file system of type fsType and size bytes (see FreshFS), or
// a plain directory when fsType is "". It says where, for the report,
// and pushes its removal to u.
func WorkDir(u *Undo, parent, fsType string, size int64) (dir, where string) {
	top, err := os.MkdirTemp(parent, u.name+"-")
	u.Check(err)
	u.Push(func() { os.RemoveAll(top) })
	if fsType == "" {
		return top, "a directory in " + parent
	}
	dir, done, err := FreshFS(top, fsType, size)
	if err != nil {
		u.Fail(fmt.Errorf("-fs %s: %w (-fs \"\" measures in a plain directory instead)", fsType, err))
	}
	u.Push(done)
	return dir, "a fresh " + fsType + " file system (mkfs defaults, on a loop device)"
}

// FreeAddr is a loopback address with a port nothing listens on now.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
