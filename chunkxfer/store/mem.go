package store

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// Mem is an in-memory Store with fault injection. The zero value is not
// usable; call NewMem.
type Mem struct {
	now func() time.Time

	mu      sync.Mutex
	objects map[string]memObject // GUARDED_BY(mu)
	uploads map[string]*memUpload
	faults  []*Fault
	nextID  int
	calls   [NumOps]int
}

type memObject struct {
	data []byte
	etag string
	mod  time.Time
}

type memUpload struct {
	key     string
	started time.Time
	parts   map[int32]memObject
}

// Fault is an injected failure. It applies to calls of Op (OpAny: any;
// OpPut also matches PutIf, which the memory store counts as a put)
// on keys with KeyPrefix, for Times calls (0: every call) after skipping
// Skip matching calls.
type Fault struct {
	Op        Op
	KeyPrefix string
	Skip      int
	Times     int

	Err     error         // the call fails with Err (before doing anything)
	Latency time.Duration // the call waits first (honouring ctx)
	// Gate, if not nil, holds the call until it is closed (honouring
	// ctx), after Latency: a test decides when the call goes on.
	Gate <-chan struct{}
	// Body faults, for get bodies and for put and upload-part request
	// bodies (which then fail after the bytes, as a dropped connection).
	DieAfter int64 // the body fails with ErrConnReset after this many bytes (>0)
	Truncate int64 // a get body ends cleanly (io.EOF) after this many bytes (>0): a short read
	FlipAt   int64 // a get body has the byte at this position of the body flipped (>0 means pos-1)

	matched int
	used    int
}

// ErrConnReset is the error of a body cut by a DieAfter fault.
var ErrConnReset = errors.New("connection reset by fault injection")

// NewMem returns an empty in-memory store; now is its clock (nil: time.Now).
func NewMem(now func() time.Time) *Mem {
	if now == nil {
		now = time.Now
	}
	return &Mem{now: now, objects: map[string]memObject{}, uploads: map[string]*memUpload{}}
}

// Inject adds a fault.
func (m *Mem) Inject(f Fault) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults = append(m.faults, &f)
}

// ClearFaults removes every fault.
func (m *Mem) ClearFaults() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults = nil
}

// Calls is how many times op was called.
func (m *Mem) Calls(op Op) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[op]
}

// fault records a call and returns the fault that applies to it, if any.
func (m *Mem) fault(ctx context.Context, op Op, key string) (*Fault, error) {
	m.mu.Lock()
	m.calls[op]++
	var hit *Fault
	for _, f := range m.faults {
		if (f.Op != OpAny && f.Op != op) || !strings.HasPrefix(key, f.KeyPrefix) {
			continue
		}
		f.matched++
		if f.matched <= f.Skip || (f.Times > 0 && f.used >= f.Times) {
			continue
		}
		f.used++
		hit = f
		break
	}
	m.mu.Unlock()
	if hit == nil {
		return nil, ctx.Err()
	}
	if hit.Latency > 0 {
		select {
		case <-time.After(hit.Latency):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if hit.Gate != nil {
		select {
		case <-hit.Gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if hit.Err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, key, hit.Err)
	}
	return hit, nil
}

func memETag(data []byte) string {
	sum := md5.Sum(data)
	return `"` + hex.EncodeToString(sum[:]) + `"`
}

func (m *Mem) Get(ctx context.Context, key string, off, n int64, opt GetOptions) (io.ReadCloser, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	f, err := m.fault(ctx, OpGet, key)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	o, ok := m.objects[key]
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	if opt.IfMatch != "" && opt.IfMatch != o.etag {
		return nil, fmt.Errorf("get %s: etag %s, want %s: %w", key, o.etag, opt.IfMatch, ErrPrecondition)
	}
	if off < 0 || off > int64(len(o.data)) {
		return nil, fmt.Errorf("get %s: offset %d outside %d bytes", key, off, len(o.data))
	}
	end := int64(len(o.data))
	if n >= 0 && off+n < end {
		end = off + n
	}
	body := o.data[off:end]
	if f != nil {
		if f.FlipAt > 0 && f.FlipAt-1 < int64(len(body)) {
			body = slices.Clone(body)
			body[f.FlipAt-1] ^= 0x40
		}
		if f.Truncate > 0 && f.Truncate < int64(len(body)) {
			body = body[:f.Truncate]
		}
		var r io.Reader = bytes.NewReader(body)
		if f.DieAfter > 0 {
			r = &dyingReader{r: r, left: f.DieAfter}
		}
		return io.NopCloser(r), nil
	}
	return io.NopCloser(bytes.NewReader(body)), nil
}

func (m *Mem) Head(ctx context.Context, key string) (ObjectInfo, error) {
	if err := CheckKey(key); err != nil {
		return ObjectInfo{}, err
	}
	if _, err := m.fault(ctx, OpHead, key); err != nil {
		return ObjectInfo{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	if !ok {
		return ObjectInfo{}, fmt.Errorf("head %s: %w", key, ErrNotFound)
	}
	return ObjectInfo{Key: key, Size: int64(len(o.data)), ETag: o.etag, ModTime: o.mod}, nil
}

// readBody reads size bytes of a request body, applying a body fault.
func readBody(f *Fault, body io.ReadSeeker, size int64) ([]byte, error) {
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	var r io.Reader = body
	if f != nil && f.DieAfter > 0 {
		r = &dyingReader{r: r, left: f.DieAfter}
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, fmt.Errorf("body of %d bytes: %w", size, err)
	}
	return data, nil
}

func (m *Mem) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) (ObjectInfo, error) {
	return m.put(ctx, key, body, size, nil)
}

func (m *Mem) PutIf(ctx context.Context, key string, body io.ReadSeeker, size int64, cond PutCond) (ObjectInfo, error) {
	if err := cond.check(key); err != nil {
		return ObjectInfo{}, err
	}
	return m.put(ctx, key, body, size, &cond)
}

// put stores the object, on cond when it is set (checked under the lock
// that the write takes).
func (m *Mem) put(ctx context.Context, key string, body io.ReadSeeker, size int64, cond *PutCond) (ObjectInfo, error) {
	if err := CheckKey(key); err != nil {
		return ObjectInfo{}, err
	}
	f, err := m.fault(ctx, OpPut, key)
	if err != nil {
		return ObjectInfo{}, err
	}
	data, err := readBody(f, body, size)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	o := memObject{data: data, etag: memETag(data), mod: m.now()}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, exists := m.objects[key]; cond != nil && !cond.holds(exists, old.etag) {
		return ObjectInfo{}, fmt.Errorf("put %s: %w", key, ErrPrecondition)
	}
	m.objects[key] = o
	return ObjectInfo{Key: key, Size: size, ETag: o.etag, ModTime: o.mod}, nil
}

func (m *Mem) Delete(ctx context.Context, key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if _, err := m.fault(ctx, OpDelete, key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objects, key)
	return nil
}

func (m *Mem) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	if _, err := m.fault(ctx, OpList, prefix); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ObjectInfo
	for k, o := range m.objects {
		if strings.HasPrefix(k, prefix) {
			out = append(out, ObjectInfo{Key: k, Size: int64(len(o.data)), ETag: o.etag, ModTime: o.mod})
		}
	}
	slices.SortFunc(out, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (m *Mem) CreateMultipart(ctx context.Context, key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	if _, err := m.fault(ctx, OpCreateMultipart, key); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextID++
	id := fmt.Sprintf("mem-upload-%d", m.nextID)
	m.uploads[id] = &memUpload{key: key, started: m.now(), parts: map[int32]memObject{}}
	return id, nil
}

func (m *Mem) upload(key, id string) (*memUpload, error) {
	u, ok := m.uploads[id]
	if !ok || u.key != key {
		return nil, fmt.Errorf("upload %s of %s: %w", id, key, ErrNotFound)
	}
	return u, nil
}

func (m *Mem) UploadPart(ctx context.Context, key, id string, num int32, body io.ReadSeeker, size int64) (Part, error) {
	if err := CheckKey(key); err != nil {
		return Part{}, err
	}
	if num < 1 || num > MaxParts {
		return Part{}, fmt.Errorf("part number %d outside 1..%d", num, MaxParts)
	}
	f, err := m.fault(ctx, OpUploadPart, key)
	if err != nil {
		return Part{}, err
	}
	data, err := readBody(f, body, size)
	if err != nil {
		return Part{}, fmt.Errorf("upload part %d of %s: %w", num, key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	u, err := m.upload(key, id)
	if err != nil {
		return Part{}, err
	}
	p := memObject{data: data, etag: memETag(data), mod: m.now()}
	u.parts[num] = p
	return Part{Number: num, ETag: p.etag, Size: size}, nil
}

func (m *Mem) ListParts(ctx context.Context, key, id string) ([]Part, error) {
	if _, err := m.fault(ctx, OpListParts, key); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	u, err := m.upload(key, id)
	if err != nil {
		return nil, err
	}
	var out []Part
	for n, p := range u.parts {
		out = append(out, Part{Number: n, ETag: p.etag, Size: int64(len(p.data))})
	}
	slices.SortFunc(out, func(a, b Part) int { return int(a.Number - b.Number) })
	return out, nil
}

func (m *Mem) CompleteMultipart(ctx context.Context, key, id string, parts []Part) (ObjectInfo, error) {
	if _, err := m.fault(ctx, OpCompleteMultipart, key); err != nil {
		return ObjectInfo{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	u, err := m.upload(key, id)
	if err != nil {
		return ObjectInfo{}, err
	}
	if len(parts) == 0 {
		return ObjectInfo{}, fmt.Errorf("complete %s: no parts", key)
	}
	var data []byte
	for i, p := range parts {
		got, ok := u.parts[p.Number]
		if !ok || got.etag != p.ETag || (i > 0 && p.Number <= parts[i-1].Number) {
			return ObjectInfo{}, fmt.Errorf("complete %s: part %d missing, out of order or with another etag", key, p.Number)
		}
		data = append(data, got.data...)
	}
	delete(m.uploads, id)
	o := memObject{data: data, etag: fmt.Sprintf(`"%s-%d"`, strings.Trim(memETag(data), `"`), len(parts)), mod: m.now()}
	m.objects[key] = o
	return ObjectInfo{Key: key, Size: int64(len(data)), ETag: o.etag, ModTime: o.mod}, nil
}

func (m *Mem) AbortMultipart(ctx context.Context, key, id string) error {
	if _, err := m.fault(ctx, OpAbortMultipart, key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.upload(key, id); err != nil {
		return err
	}
	delete(m.uploads, id)
	return nil
}

func (m *Mem) ListMultipart(ctx context.Context, prefix string) ([]Upload, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	if _, err := m.fault(ctx, OpListMultipart, prefix); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Upload
	for id, u := range m.uploads {
		if strings.HasPrefix(u.key, prefix) {
			out = append(out, Upload{Key: u.key, UploadID: id, Initiated: u.started})
		}
	}
	slices.SortFunc(out, func(a, b Upload) int { return strings.Compare(a.Key+a.UploadID, b.Key+b.UploadID) })
	return out, nil
}

// dyingReader fails with ErrConnReset after left bytes.
type dyingReader struct {
	r    io.Reader
	left int64
}

func (d *dyingReader) Read(p []byte) (int, error) {
	if d.left <= 0 {
		return 0, ErrConnReset
	}
	if int64(len(p)) > d.left {
		p = p[:d.left]
	}
	n, err := d.r.Read(p)
	d.left -= int64(n)
	return n, err
}
