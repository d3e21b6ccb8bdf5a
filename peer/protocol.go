// Package peer copies a tree of files from one machine to another over
// TCP: a Server shares a directory, a Client pulls a path of it into a
// local directory.
//
// The protocol is a conversation of JSON lines, with raw bytes after a
// read's header. Files go in chunks; every chunk carries its CRC32C and
// the version (size, mtime and ctime) of its file before and after it
// was sent, so the client writes only verified bytes of one version. A
// file that changes while it is sent is sent again: the chunks the client
// already has are checked by CRC on the server and not resent. The same
// check resumes a pull after a broken connection or a crash of the
// client, from what is already on its disk. Without TLS the server sends
// with sendfile(2), and checksums the chunk through a mapping, so no
// byte is copied through user space; with TLS each chunk goes through a
// buffer.
package peer

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"path"
	"strings"
)

// DefaultChunkSize is the unit of transfer, verification and resume.
const DefaultChunkSize = 8 << 20

// maxLine bounds a protocol line (a list entry holds one path).
const maxLine = 64 << 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// request is what the client sends.
type request struct {
	Op   string `json:"op"`   // "list" or "read"
	Path string `json:"path"` // relative to the server's root
	// read
	Off     int64   `json:"off,omitempty"`
	Len     int64   `json:"len,omitempty"`
	Version string  `json:"version,omitempty"` // the version being copied
	Have    *uint32 `json:"have,omitempty"`    // CRC32C of the chunk the client already holds
}

// Kinds of entries.
const (
	KindFile    = "file"
	KindDir     = "dir"
	KindSymlink = "symlink"
)

// Entry is one file, directory or symlink of a listed tree.
type Entry struct {
	Path    string `json:"path"` // relative to the server's root
	Kind    string `json:"kind"`
	Mode    uint32 `json:"mode"` // permission bits
	Size    int64  `json:"size,omitempty"`
	MtimeNs int64  `json:"mtime_ns"`
	Version string `json:"version,omitempty"` // files
	Target  string `json:"target,omitempty"`  // symlinks
	// State is the tierfs state of a file served from a tierfs mount
	// ("remote": its bytes are in the store).
	State string `json:"state,omitempty"`
	// Remote is where an evicted file's bytes are in the server's store
	// (user.tierfs.remote), so that a client on a mount of the same
	// store can take the file over without its bytes.
	Remote json.RawMessage `json:"remote,omitempty"`
	// End and Error close a listing.
	End   bool   `json:"end,omitempty"`
	Error string `json:"error,omitempty"`
}

// header answers a read; trailer follows its bytes.
type header struct {
	Len     int64  `json:"len"`               // bytes that follow
	CRC     uint32 `json:"crc"`               // of those bytes
	Same    bool   `json:"same,omitempty"`    // the client's chunk is right: nothing follows
	Version string `json:"version"`           // of the file before the chunk was read
	Changed bool   `json:"changed,omitempty"` // the file is not at the version asked for; Size is its size now
	Size    int64  `json:"size,omitempty"`
	MtimeNs int64  `json:"mtime_ns,omitempty"`
	Error   string `json:"error,omitempty"`
}

type trailer struct {
	Version string `json:"version"` // of the file after the chunk was sent
}

// checkPath refuses any path that is not a clean relative path: the
// server resolves it beneath its root besides.
func checkPath(p string) error {
	switch {
	case p == "" || p == ".":
		return nil
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is absolute", p)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("path %q holds a NUL", p)
	case path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../"):
		return fmt.Errorf("path %q is not clean and relative", p)
	}
	return nil
}

func writeJSON(w *bufio.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

var errLineTooLong = errors.New("protocol line too long")

// readJSON reads one line of at most maxLine bytes into v.
func readJSON(r *bufio.Reader, v any) error {
	var line []byte
	for {
		part, isPrefix, err := r.ReadLine()
		if err != nil {
			if err == io.EOF && len(line) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		line = append(line, part...)
		if len(line) > maxLine {
			return errLineTooLong
		}
		if !isPrefix {
			break
		}
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("bad protocol line: %w", err)
	}
	return nil
}
