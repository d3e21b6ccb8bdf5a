package tiering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/internal/tiered"
)

// copies are the store copies of files: from a file's record, its
// manifest (kept in the state dir), the objects holding its extents,
// and a reader of its bytes.
type copies struct{ t *Tierer }

// An Extent maps a run of a file's bytes onto an object: file bytes
// [Pos, Pos+Len) are object bytes [Off, Off+Len). A file whose record has
// extents is held by several objects (its head shipped by another broker,
// or all of it: a follower's segment), in order, covering it from 0 to
// its size. A record without extents is held by its own object (Key)
// alone.
type Extent struct {
	Pos  int64  `json:"pos"`
	Len  int64  `json:"len"`
	Key  string `json:"key"`
	Off  int64  `json:"off"`
	ETag string `json:"etag"` // of the object when the extent was made
}

// checkExtents says whether extents cover [0, size) in order.
func checkExtents(es []Extent, size int64) error {
	var pos int64
	for i, e := range es {
		if e.Pos != pos || e.Len <= 0 || e.Off < 0 || e.Key == "" {
			return fmt.Errorf("extent %d (%d+%d of %s at %d) does not follow position %d", i, e.Pos, e.Len, e.Key, e.Off, pos)
		}
		pos += e.Len
	}
	if pos != size {
		return fmt.Errorf("extents cover %d bytes of %d", pos, size)
	}
	return nil
}

// extentKeys are the distinct objects of extents, in order.
func extentKeys(es []Extent) []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range es {
		if !seen[e.Key] {
			seen[e.Key] = true
			out = append(out, e.Key)
		}
	}
	return out
}

// objectManifest is key's manifest, which must be of ETag etag (any,
// when empty): the local copy, written when the object was shipped here
// or when a file here was first mapped onto it. A copy that is missing
// (it went with the last local file that read from the object while
// another was being mapped onto it) is fetched from the store again.
func (cs *copies) objectManifest(key, etag string) (*chunkxfer.Manifest, error) {
	m, err := cs.localManifest(key)
	if os.IsNotExist(err) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		m, err = cs.fetchManifest(ctx, key)
		cancel()
	}
	if err != nil {
		return nil, err
	}
	if etag != "" && m.ETag != etag {
		return nil, fmt.Errorf("the manifest copy of %s is of etag %s, not %s", key, m.ETag, etag)
	}
	return m, nil
}

func (cs *copies) localManifest(key string) (*chunkxfer.Manifest, error) {
	return cs.t.manifests.get(key)
}

// fetchManifest is the local copy of key's manifest, or else the
// store's, checked against the object there now and kept as a local
// copy.
func (cs *copies) fetchManifest(ctx context.Context, key string) (*chunkxfer.Manifest, error) {
	return cs.fetchManifestWith(ctx, key, chunkxfer.LoadManifest)
}

// mappingManifest is fetchManifest for a mapping onto another broker's
// object, without the check of the object: the reference taken on it
// next checks its ETag against the manifest's (storeIndex.takeRef), and
// nothing reads it before that.
func (cs *copies) mappingManifest(ctx context.Context, key string) (*chunkxfer.Manifest, error) {
	return cs.fetchManifestWith(ctx, key, chunkxfer.ReadManifest)
}

func (cs *copies) fetchManifestWith(ctx context.Context, key string, load func(context.Context, store.Store, string) (*chunkxfer.Manifest, error)) (*chunkxfer.Manifest, error) {
	if m, err := cs.localManifest(key); err == nil {
		return m, nil
	}
	m, err := load(ctx, cs.t.cfg.Store, key)
	if err != nil {
		return nil, err
	}
	return m, cs.t.manifests.put(m)
}

// remoteSource is a file's bytes in the store: its own object, or its
// extents.
type remoteSource interface {
	io.ReaderAt
	Close() error
	// Slice hands out verified bytes without a copy (see
	// chunkxfer.Reader.Slice); ok is false when the range cannot be.
	Slice(ctx context.Context, off int64, n int) (b []byte, release func(), ok bool, err error)
}

// openSource opens the store copy of a file from its record, reading
// nothing until asked.
func (cs *copies) openSource(rec Record) (remoteSource, error) {
	opts := chunkxfer.ReaderOptions{ReadAhead: cs.readAheadChunks()}
	if len(rec.Extents) == 0 {
		m, err := cs.loadManifest(rec)
		if err != nil {
			return nil, err
		}
		return chunkxfer.NewReaderFor(cs.t.cfg.Store, m, cs.t.cfg.Pool, opts), nil
	}
	if err := checkExtents(rec.Extents, rec.Size); err != nil {
		return nil, fmt.Errorf("record of %s: %w", rec.Key, err)
	}
	readers := map[string]*chunkxfer.Reader{}
	r := &extentReader{size: rec.Size}
	for _, e := range rec.Extents {
		cr := readers[e.Key]
		if cr == nil {
			m, err := cs.objectManifest(e.Key, e.ETag)
			if err != nil {
				r.Close()
				return nil, err
			}
			if e.Off+e.Len > m.Size {
				r.Close()
				return nil, fmt.Errorf("extent %d+%d of %s is past its %d bytes", e.Off, e.Len, e.Key, m.Size)
			}
			cr = chunkxfer.NewReaderFor(cs.t.cfg.Store, m, cs.t.cfg.Pool, opts)
			readers[e.Key] = cr
			r.readers = append(r.readers, cr)
		}
		r.parts = append(r.parts, extentPart{Extent: e, r: cr})
	}
	return r, nil
}

type extentPart struct {
	Extent
	r *chunkxfer.Reader
}

// extentReader reads a file whose bytes are in several objects.
type extentReader struct {
	size    int64
	parts   []extentPart
	readers []*chunkxfer.Reader
}

func (r *extentReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("negative offset %d", off)
	}
	n := 0
	for len(p) > 0 && off < r.size {
		i := sort.Search(len(r.parts), func(i int) bool { return r.parts[i].Pos+r.parts[i].Len > off })
		e := r.parts[i]
		within := off - e.Pos
		m := int(min(int64(len(p)), e.Len-within))
		got, err := e.r.ReadAt(p[:m], e.Off+within)
		n += got
		if err != nil && !(errors.Is(err, io.EOF) && got == m) {
			return n, err
		}
		p, off = p[m:], off+int64(m)
	}
	if len(p) > 0 {
		return n, io.EOF
	}
	return n, nil
}

// Slice hands out a range that lies in one extent (and one chunk of its
// object) without a copy, as a segment's own object would.
func (r *extentReader) Slice(ctx context.Context, off int64, n int) ([]byte, func(), bool, error) {
	if off < 0 || off >= r.size || n <= 0 {
		return nil, nil, false, nil
	}
	i := sort.Search(len(r.parts), func(i int) bool { return r.parts[i].Pos+r.parts[i].Len > off })
	e := r.parts[i]
	within := off - e.Pos
	if within+int64(n) > e.Len && i != len(r.parts)-1 {
		return nil, nil, false, nil
	}
	return e.r.Slice(ctx, e.Off+within, int(min(int64(n), e.Len-within)))
}

func (r *extentReader) Close() error {
	for _, cr := range r.readers {
		cr.Close()
	}
	return nil
}

// checkCopies checks that every object holding a file is in the store
// as it was when the file was mapped onto it (same ETag and size).
func (cs *copies) checkCopies(rec Record) error {
	type want struct {
		key string
		m   *chunkxfer.Manifest
	}
	var ws []want
	if len(rec.Extents) == 0 {
		m, err := cs.loadManifest(rec)
		if err != nil {
			return fmt.Errorf("no usable manifest: %w", err)
		}
		ws = append(ws, want{rec.Key, m})
	} else {
		if err := checkExtents(rec.Extents, rec.Size); err != nil {
			return err
		}
		for _, e := range rec.Extents {
			m, err := cs.objectManifest(e.Key, e.ETag)
			if err != nil {
				return fmt.Errorf("no usable manifest: %w", err)
			}
			if len(ws) == 0 || ws[len(ws)-1].key != e.Key {
				ws = append(ws, want{e.Key, m})
			}
		}
	}
	for _, w := range ws {
		if w.m.NoObject() {
			continue // an empty file: its manifest is all there is
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		info, err := cs.t.cfg.Store.Head(ctx, w.key)
		cancel()
		if err != nil {
			return fmt.Errorf("remote copy %s: %w", w.key, err)
		}
		if info.ETag != w.m.ETag || info.Size != w.m.Size {
			return fmt.Errorf("remote copy %s is not the one recorded (etag %s, %d bytes; recorded %s, %d bytes): %w", w.key, info.ETag, info.Size, w.m.ETag, w.m.Size, store.ErrNotFound)
		}
	}
	return nil
}

// stateOf is the state and RDI of the file at path, for the tierer's
// own steps and status (the file system asks an open File).
func (cs *copies) stateOf(path string) (tiered.State, string, error) {
	rec, has, err := readRecord(path)
	if err != nil {
		return 0, "", err
	}
	if !has {
		var st syscall.Stat_t
		if syscall.Stat(path, &st) == nil && cs.t.claims.shippingIno(st.Ino) {
			return StateShipping, "", nil
		}
		return StateLocal, "", nil
	}
	return rec.State, rec.Key, nil
}
