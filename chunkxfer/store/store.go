// Package store is the object-store interface of chunkxfer and its
// implementations: Mem (in memory, with fault injection, for tests), Dir (a
// local directory as the remote) and S3 (aws-sdk-go-v2). Open picks one
// from a URL.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Sentinel errors every Store returns (wrapped) so callers can tell them
// apart without looking at a backend's own types.
var (
	ErrNotFound     = errors.New("not found")           // no such object, or no such upload
	ErrPrecondition = errors.New("precondition failed") // If-Match did not match: the object changed
)

// Store is an object store. Keys are slash-separated relative paths; see
// CheckKey. Bodies are io.ReadSeekers so a request can be retried (and, on
// S3 over plain HTTP, signed).
type Store interface {
	// Get returns n bytes of key from off (n < 0: to the end). A range
	// past the end is cut at the end. IfMatch, when set, must equal the
	// object's ETag.
	Get(ctx context.Context, key string, off, n int64, opt GetOptions) (io.ReadCloser, error)
	Head(ctx context.Context, key string) (ObjectInfo, error)
	Put(ctx context.Context, key string, body io.ReadSeeker, size int64) (ObjectInfo, error)
	// PutIf is Put on a condition, checked atomically with the write:
	// the object must have the ETag cond.IfMatch, or must not exist when
	// cond.IfNoneMatch; otherwise ErrPrecondition and nothing changes.
	// Several writers of one key (brokers sharing a partition's index)
	// use it to compare and swap.
	PutIf(ctx context.Context, key string, body io.ReadSeeker, size int64, cond PutCond) (ObjectInfo, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// List returns the objects under prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)

	CreateMultipart(ctx context.Context, key string) (uploadID string, err error)
	// UploadPart uploads part number num (1..10000) of an upload.
	UploadPart(ctx context.Context, key, uploadID string, num int32, body io.ReadSeeker, size int64) (Part, error)
	// ListParts returns the parts the store holds for an upload, by number.
	ListParts(ctx context.Context, key, uploadID string) ([]Part, error)
	// CompleteMultipart joins the parts, in order, into the object.
	CompleteMultipart(ctx context.Context, key, uploadID string, parts []Part) (ObjectInfo, error)
	// AbortMultipart discards an upload; an unknown upload is ErrNotFound.
	AbortMultipart(ctx context.Context, key, uploadID string) error
	// ListMultipart returns the uploads in progress under prefix.
	ListMultipart(ctx context.Context, prefix string) ([]Upload, error)
}

// GetOptions are conditions on a Get.
type GetOptions struct {
	IfMatch string // ETag the object must have, or ErrPrecondition
}

// PutCond is the condition of a PutIf: exactly one of its fields is set.
type PutCond struct {
	IfMatch     string // the ETag the object must have
	IfNoneMatch bool   // the object must not exist
}

func (c PutCond) check(key string) error {
	if (c.IfMatch == "") == !c.IfNoneMatch {
		return fmt.Errorf("put %s: a condition needs exactly one of IfMatch and IfNoneMatch", key)
	}
	return nil
}

// holds says whether the condition holds for an object that exists (or
// not) with an ETag.
func (c PutCond) holds(exists bool, etag string) bool {
	if c.IfNoneMatch {
		return !exists
	}
	return exists && etag == c.IfMatch
}

// ObjectInfo describes a stored object.
type ObjectInfo struct {
	Key     string
	Size    int64
	ETag    string // opaque; changes whenever the object is replaced
	ModTime time.Time
}

// Part is an uploaded part of a multipart upload.
type Part struct {
	Number int32
	ETag   string
	Size   int64
}

// Upload is a multipart upload in progress.
type Upload struct {
	Key       string
	UploadID  string
	Initiated time.Time
}

// MaxParts is S3's limit on the parts of one upload.
const MaxParts = 10000

// CheckKey refuses keys that could not be stored the same way everywhere:
// empty, absolute, with empty, "." or ".." components, a trailing slash,
// NUL or other control bytes, or longer than S3's 1024 bytes.
func CheckKey(key string) error {
	switch {
	case key == "":
		return errors.New("empty key")
	case len(key) > 1024:
		return fmt.Errorf("key of %d bytes exceeds 1024", len(key))
	case strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("key %q has a control character", key)
	}
	for _, c := range strings.Split(key, "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("key %q: empty, \".\" or \"..\" path component", key)
		}
	}
	return nil
}

// checkPrefix accepts "" or a prefix whose components, but for a
// possibly partial last one, are valid.
func checkPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if err := CheckKey(strings.TrimSuffix(prefix, "/") + "x"); err != nil {
		return fmt.Errorf("prefix %q: %w", prefix, err)
	}
	return nil
}

// ReadAll reads a whole Get body and closes it.
func ReadAll(rc io.ReadCloser, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}
