package benchutil

import (
	"fmt"
	"net"
	"os"
)

// Undo is what a benchmark undoes on its way out, newest first, also
// when a step fails: brokers, mounts, servers and the file system they
// run on. Fail and Check exit without running deferred calls, so all
// clean-up goes through it.
type Undo struct {
	name string // the benchmark, for messages
	fns  []func()
}

// NewUndo starts an empty Undo for the benchmark name.
func NewUndo(name string) *Undo { return &Undo{name: name} }

// Push adds a step to undo.
func (u *Undo) Push(f func()) { u.fns = append(u.fns, f) }

// Run undoes everything pushed so far, newest first.
func (u *Undo) Run() {
	for i := len(u.fns) - 1; i >= 0; i-- {
		u.fns[i]()
	}
	u.fns = nil
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
