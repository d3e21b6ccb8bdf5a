package store

import (
	"context"
	"io"
	"sync/atomic"
)

// Op is a kind of request to a store: what S3 bills by, one per call
// of a Store method (Counted does not see the S3 client's retries of a
// request). The memory store counts its calls and matches its faults
// by Op too.
type Op int

const (
	// OpAny is no request: in a Fault of the memory store, any op.
	OpAny Op = iota
	OpGet
	OpHead
	OpPut
	OpPutIf
	OpDelete
	OpList
	OpCreateMultipart
	OpUploadPart
	OpListParts
	OpCompleteMultipart
	OpAbortMultipart
	OpListMultipart
	NumOps
)

var opNames = [NumOps]string{"any", "get", "head", "put", "put_if", "delete", "list", "create_multipart", "upload_part", "list_parts", "complete_multipart", "abort_multipart", "list_multipart"}

// String is the op's name in metrics: get, head, put, put_if, ...
func (o Op) String() string {
	if o < 0 || o >= NumOps {
		return "unknown"
	}
	return opNames[o]
}

// Requests counts a store's requests by op, and those that failed
// (any error, a missing key and a failed condition included).
type Requests struct {
	n, failed [NumOps]atomic.Int64
}

// Count returns how many requests of op were made, and how many failed.
func (r *Requests) Count(op Op) (n, failed int64) {
	return r.n[op].Load(), r.failed[op].Load()
}

// Total is the number of requests of every op.
func (r *Requests) Total() int64 {
	var t int64
	for op := range NumOps {
		t += r.n[op].Load()
	}
	return t
}

func (r *Requests) add(op Op, err error) {
	r.n[op].Add(1)
	if err != nil {
		r.failed[op].Add(1)
	}
}

// Counted returns s with every request it serves counted in r. A store
// with deferred puts (Dir) stays one: its Deferred view is counted in r
// too.
func Counted(s Store, r *Requests) Store {
	c := &counted{s: s, r: r}
	if d, ok := s.(interface{ Deferred() Store }); ok {
		return &countedDeferrer{counted: c, d: d}
	}
	return c
}

type countedDeferrer struct {
	*counted
	d interface{ Deferred() Store }
}

func (c *countedDeferrer) Deferred() Store { return &counted{s: c.d.Deferred(), r: c.r} }

type counted struct {
	s Store
	r *Requests
}

func (c *counted) Get(ctx context.Context, key string, off, n int64, opt GetOptions) (io.ReadCloser, error) {
	rc, err := c.s.Get(ctx, key, off, n, opt)
	c.r.add(OpGet, err)
	return rc, err
}

func (c *counted) Head(ctx context.Context, key string) (ObjectInfo, error) {
	i, err := c.s.Head(ctx, key)
	c.r.add(OpHead, err)
	return i, err
}

func (c *counted) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) (ObjectInfo, error) {
	i, err := c.s.Put(ctx, key, body, size)
	c.r.add(OpPut, err)
	return i, err
}

func (c *counted) PutIf(ctx context.Context, key string, body io.ReadSeeker, size int64, cond PutCond) (ObjectInfo, error) {
	i, err := c.s.PutIf(ctx, key, body, size, cond)
	c.r.add(OpPutIf, err)
	return i, err
}

func (c *counted) Delete(ctx context.Context, key string) error {
	err := c.s.Delete(ctx, key)
	c.r.add(OpDelete, err)
	return err
}

func (c *counted) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	l, err := c.s.List(ctx, prefix)
	c.r.add(OpList, err)
	return l, err
}

func (c *counted) CreateMultipart(ctx context.Context, key string) (string, error) {
	id, err := c.s.CreateMultipart(ctx, key)
	c.r.add(OpCreateMultipart, err)
	return id, err
}

func (c *counted) UploadPart(ctx context.Context, key, uploadID string, num int32, body io.ReadSeeker, size int64) (Part, error) {
	p, err := c.s.UploadPart(ctx, key, uploadID, num, body, size)
	c.r.add(OpUploadPart, err)
	return p, err
}

func (c *counted) ListParts(ctx context.Context, key, uploadID string) ([]Part, error) {
	l, err := c.s.ListParts(ctx, key, uploadID)
	c.r.add(OpListParts, err)
	return l, err
}

func (c *counted) CompleteMultipart(ctx context.Context, key, uploadID string, parts []Part) (ObjectInfo, error) {
	i, err := c.s.CompleteMultipart(ctx, key, uploadID, parts)
	c.r.add(OpCompleteMultipart, err)
	return i, err
}

func (c *counted) AbortMultipart(ctx context.Context, key, uploadID string) error {
	err := c.s.AbortMultipart(ctx, key, uploadID)
	c.r.add(OpAbortMultipart, err)
	return err
}

func (c *counted) ListMultipart(ctx context.Context, prefix string) ([]Upload, error) {
	l, err := c.s.ListMultipart(ctx, prefix)
	c.r.add(OpListMultipart, err)
	return l, err
}
