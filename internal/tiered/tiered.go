// Package tiered holds the values that cross the seam between the file
// system (fs) and the tierer (tiering): fs imports no tierfs package, and
// tiering does not import fs, so what both must name lives here.
package tiered

import (
	"errors"
	"fmt"
)

// Cause says why an evicted file's bytes came back to local disk.
type Cause uint8

// The causes. A move (an evicted file changed through the mount, its
// bytes coming back in the background) starts only on a change that
// alters bytes or size: a write, or a truncate to another size. Opening
// for writing, fsync, flush, and a truncate to the size the file has are
// not changes.
const (
	CauseWrite    Cause = iota // a write to the evicted file
	CauseTruncate              // a truncate to another size (or an open with O_TRUNC)
	CauseHydrate               // tierfs hydrate (the control command)
	NumCauses                  // how many causes there are
)

// String is the cause's name in logs, metrics and status.
func (c Cause) String() string {
	switch c {
	case CauseWrite:
		return "write"
	case CauseTruncate:
		return "truncate"
	case CauseHydrate:
		return "hydrate"
	}
	return "unknown"
}

// State is where a tiered file's bytes are. Records keep it by name
// (String), as does the user.tierfs.state attribute the mount shows.
type State uint8

// The states of a tiered file.
const (
	StateLocal    State = iota // only on local disk (no record)
	StateShipping              // being uploaded; the local bytes are the file's
	StateShipped               // a verified copy is in the store; the local bytes are kept
	StateRemote                // the local bytes are freed: reads go to the store
	StateMoving                // was remote, changed since: its bytes are coming back (see Mover)
	numStates
)

var stateNames = [numStates]string{"local", "shipping", "shipped", "remote", "moving"}

// String is the state's name in records, attributes, logs and status.
func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return "unknown"
}

// InStore says the file's bytes are read from the store: it is remote.
// A moving file is read through its move.
func (s State) InStore() bool { return s == StateRemote }

// LocalBytes says the file's bytes are its backing file's: it is
// neither remote nor moving back.
func (s State) LocalBytes() bool { return s != StateRemote && s != StateMoving }

// MarshalText writes the state's name.
func (s State) MarshalText() ([]byte, error) {
	if s >= numStates {
		return nil, fmt.Errorf("tiering state %d has no name", s)
	}
	return []byte(s.String()), nil
}

// UnmarshalText reads a state's name; an unknown name is an error that
// names it.
func (s *State) UnmarshalText(b []byte) error {
	st, ok := ParseState(string(b))
	if !ok {
		return fmt.Errorf("unknown tiering state %q", b)
	}
	*s = st
	return nil
}

// ParseState is the state named name.
func ParseState(name string) (State, bool) {
	for i, n := range stateNames {
		if n == name {
			return State(i), true
		}
	}
	return 0, false
}

// The extended attributes of tiering. The user.tierfs.* ones are made up
// by the mount for each file (its state, its RDI, and the description of
// its store copy for a hand-over); HiddenXattrPrefix is tierfs's own
// record on the backing file, which the mount never shows.
const (
	XattrState        = "user.tierfs.state"
	XattrRDI          = "user.tierfs.rdi"
	XattrRemote       = "user.tierfs.remote"
	HiddenXattrPrefix = "trusted.tierfs"
)

// Reader reads a file's bytes from the store, each checked before it is
// returned. It is the one name for a reader that must be closed.
type Reader interface {
	ReadAt(p []byte, off int64) (int, error)
	Close() error
}

// File is one open of a tiered file, as the file system sees it: the
// tierer reads the file's record once, when it opens it, and again only
// after it changed the file's state itself. Reads and writes go through
// it whatever the state; the file decides where its bytes are.
//
// Offsets and sizes are the file's, as the broker sees them.
type File interface {
	// State is the file's state now. A file that is moving says so.
	State() (State, error)
	// RDI is the key of the file's copy in the store ("" when it has
	// none).
	RDI() (string, error)
	// ReadAt reads bytes from wherever they are: the backing file (under
	// the gate, so no eviction frees them meanwhile), the store, or the
	// file's move. Fewer than len(p) only at the end, with io.EOF.
	ReadAt(p []byte, off int64) (int, error)
	// Slice is ReadAt without a copy: the bytes stay valid until release
	// is called. ok is false when the range cannot be handed out whole
	// (it spans chunks, or the bytes are local): use ReadAt.
	Slice(off int64, n int) (b []byte, release func(), ok bool, err error)
	// WriteAt writes p at off. A local file is written by local (the
	// caller's write of the backing file), run under the gate; a remote
	// one starts moving (cause write) and is written through its move,
	// unless it was opened with NoMove: then ErrRemote. An empty write
	// to a remote file changes nothing and starts nothing.
	WriteAt(p []byte, off int64, local func() (int, error)) (int, error)
	// Truncate sets the size the same way: local runs under the gate for
	// a local file; a remote one moves, unless size is the size it has
	// (then nothing happens, and local is not called).
	Truncate(size int64, local func() error) error
	// Locked runs fn with the file's state while no eviction can change
	// it (fallocate and lseek on the backing file need that).
	Locked(fn func(State) error) error
	// Sync makes a move's changes durable (nothing for a file that is
	// not moving; the caller syncs the backing file).
	Sync() error
	// Attr is the size and mtime the file shows, when they are not the
	// backing file's (a moving file); ok is false otherwise.
	Attr() (size, mtimeNs int64, ok bool)
	// RemoteCopy describes where an evicted file's bytes are in the
	// store (JSON), for another mount of the same store to take the file
	// over without them; nil for any other file.
	RemoteCopy() ([]byte, error)
	// Close lets go of the file's store reader and stops its updates.
	Close() error
}

// OpenFlags say how the file system uses a File.
type OpenFlags uint8

// NoMove: a change to a remote file is refused (ErrRemote) rather than
// moving it back: change management is on, and could not retain the
// original from a catch-up log.
const NoMove OpenFlags = 1 << iota

// ErrRemote refuses a change to a file whose bytes are in the store.
var ErrRemote = errors.New("file is in the store (evicted); hydrate it before changing it")

// StoreError is a failure to read a file's bytes from the store. The
// reader gets EIO whatever errno the network gave: a refused connection
// is no errno of the file's.
type StoreError struct{ Err error }

func (e *StoreError) Error() string { return e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }
