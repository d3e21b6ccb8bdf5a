package tiering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/tiered"
)

// The state of a shipped segment lives on its own inode, in the
// trusted.tierfs extended attribute, so it follows the file through
// renames, disappears with it, and changes atomically. No xattr means
// local. fs hides trusted.tierfs.* from the mount.
const recordXattr = tiered.HiddenXattrPrefix

// Segment states (see tiered.State).
const (
	StateLocal    = tiered.StateLocal
	StateShipping = tiered.StateShipping // being uploaded; no record yet
	StateShipped  = tiered.StateShipped  // verified copy in the store, local bytes kept
	StateRemote   = tiered.StateRemote   // local bytes freed: reads go to the store
)

// Record is what the xattr holds.
type Record struct {
	Version  int          `json:"v"`
	State    tiered.State `json:"state"`
	Key      string       `json:"key"`      // the .log object
	ETag     string       `json:"etag"`     // of that object
	Size     int64        `json:"size"`     // of the file when shipped
	MtimeNs  int64        `json:"mtime_ns"` // restored after the hole punch
	Ino      uint64       `json:"ino"`
	Manifest string       `json:"manifest,omitempty"` // versions before 2026-12: the local manifest copy's file, relative to the state dir (now in the partition's manifest log, by Key)
	// Freed is set once a remote file's bytes were punched out and its
	// mtime restored; a remote record without it is an eviction that a
	// crash interrupted.
	Freed bool `json:"freed,omitempty"`
	// Extents, when set, say which objects hold the file's bytes (see
	// Extent); Key is then the name the file is catalogued under, and
	// its own object, if it has one, is one of them.
	Extents []Extent `json:"extents,omitempty"`
}

// readRecord reads the record of the file at path; ok is false for a
// local file.
func readRecord(path string) (Record, bool, error) {
	var buf [recordMax]byte // on the stack: the tierer reads records by the hundred thousand
	n, err := unix.Getxattr(path, recordXattr, buf[:])
	if errors.Is(err, unix.ERANGE) {
		return readLargeRecord(path, func(b []byte) (int, error) { return unix.Getxattr(path, recordXattr, b) })
	}
	return decodeRecord(path, buf[:], n, err)
}

// RecordState is the state the record of the file at path (on a
// backing directory) holds; ok is false for a file with no record (a
// local file).
func RecordState(path string) (st tiered.State, ok bool, err error) {
	r, ok, err := readRecord(path)
	return r.State, ok, err
}

// readRecordFd reads the record of an open file; name is for errors.
func readRecordFd(fd int, name string) (Record, bool, error) {
	var buf [recordMax]byte
	n, err := unix.Fgetxattr(fd, recordXattr, buf[:])
	if errors.Is(err, unix.ERANGE) {
		return readLargeRecord(name, func(b []byte) (int, error) { return unix.Fgetxattr(fd, recordXattr, b) })
	}
	return decodeRecord(name, buf[:], n, err)
}

// recordMax is the largest record read into a buffer on the stack; a
// larger one (a file of many extents) is read by readLargeRecord.
const recordMax = 4096

// readLargeRecord reads a record larger than recordMax with get: its
// size asked first, then read into a buffer of that size, again if it
// grew in between.
func readLargeRecord(path string, get func([]byte) (int, error)) (Record, bool, error) {
	for range 3 {
		size, err := get(nil)
		if err != nil {
			return decodeRecord(path, nil, 0, err)
		}
		buf := make([]byte, size)
		n, err := get(buf)
		if errors.Is(err, unix.ERANGE) || n > len(buf) {
			continue // it grew since (an empty buffer is told the size)
		}
		return decodeRecord(path, buf, n, err)
	}
	return Record{}, false, fmt.Errorf("read state of %s: %w", path, unix.ERANGE)
}

func decodeRecord(path string, buf []byte, n int, err error) (Record, bool, error) {
	if errors.Is(err, unix.ENODATA) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read state of %s: %w", path, err)
	}
	var r Record
	// The compiler cannot see that json.Unmarshal does not keep its
	// input, so what it is given escapes to the heap: a copy of the
	// bytes read, and the caller's buffer stays on the stack.
	if err := json.Unmarshal(bytes.Clone(buf[:n]), &r); err != nil {
		return Record{}, false, fmt.Errorf("state of %s: %w", path, err)
	}
	return r, true, nil
}

func writeRecord(path string, r Record) error {
	return setRecord(path, r, func(b []byte) error { return unix.Setxattr(path, recordXattr, b, 0) })
}

// writeRecordFd is writeRecord for an open file; name is for errors.
func writeRecordFd(fd int, name string, r Record) error {
	return setRecord(name, r, func(b []byte) error { return unix.Fsetxattr(fd, recordXattr, b, 0) })
}

func setRecord(name string, r Record, set func([]byte) error) error {
	r.Version = 1
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := set(b); err != nil {
		return fmt.Errorf("write state of %s: %w", name, err)
	}
	return nil
}
