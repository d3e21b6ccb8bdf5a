package tiering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
)

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
func (t *Tierer) objectManifest(key, etag string) (*chunkxfer.Manifest, error) {
	m, err := t.localManifest(key)
	if os.IsNotExist(err) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		m, err = t.fetchManifest(ctx, key)
		cancel()
	}
	if err != nil {
		return nil, err
	}
	if etag != "" && m.ETag != etag {
		return nil, fmt.Errorf("manifest %s is not of %s (etag %s)", manifestRel(key), key, etag)
	}
	return m, nil
}

func (t *Tierer) localManifest(key string) (*chunkxfer.Manifest, error) {
	b, err := os.ReadFile(filepath.Join(t.cfg.StateDir, manifestRel(key)))
	if err != nil {
		return nil, err
	}
	m, err := chunkxfer.ParseManifest(b)
	if err != nil {
		return nil, err
	}
	if m.Key != key {
		return nil, fmt.Errorf("manifest %s is not of %s", manifestRel(key), key)
	}
	return m, nil
}

// fetchManifest is the local copy of key's manifest, or else the
// store's, checked against the object there now and kept as a local
// copy.
func (t *Tierer) fetchManifest(ctx context.Context, key string) (*chunkxfer.Manifest, error) {
	if m, err := t.localManifest(key); err == nil {
		return m, nil
	}
	m, err := chunkxfer.LoadManifest(ctx, t.cfg.Store, key)
	if err != nil {
		return nil, err
	}
	return m, writeManifestCopy(filepath.Join(t.cfg.StateDir, manifestRel(key)), m)
}

// remoteSource is a file's bytes in the store: its own object, or its
// extents.
type remoteSource interface {
	io.ReaderAt
	Close() error
}

// openSource opens the store copy of a file from its record, reading
// nothing until asked.
func (t *Tierer) openSource(rec Record) (remoteSource, error) {
	opts := chunkxfer.ReaderOptions{ReadAhead: t.readAheadChunks()}
	if len(rec.Extents) == 0 {
		m, err := t.loadManifest(rec)
		if err != nil {
			return nil, err
		}
		return chunkxfer.NewReaderFor(t.cfg.Store, m, t.cfg.Pool, opts), nil
	}
	if err := checkExtents(rec.Extents, rec.Size); err != nil {
		return nil, fmt.Errorf("record of %s: %w", rec.Key, err)
	}
	readers := map[string]*chunkxfer.Reader{}
	r := &extentReader{size: rec.Size}
	for _, e := range rec.Extents {
		cr := readers[e.Key]
		if cr == nil {
			m, err := t.objectManifest(e.Key, e.ETag)
			if err != nil {
				r.Close()
				return nil, err
			}
			if e.Off+e.Len > m.Size {
				r.Close()
				return nil, fmt.Errorf("extent %d+%d of %s is past its %d bytes", e.Off, e.Len, e.Key, m.Size)
			}
			cr = chunkxfer.NewReaderFor(t.cfg.Store, m, t.cfg.Pool, opts)
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

func (r *extentReader) Close() error {
	for _, cr := range r.readers {
		cr.Close()
	}
	return nil
}

// checkCopies checks that every object holding a file is in the store
// as it was when the file was mapped onto it (same ETag and size).
func (t *Tierer) checkCopies(rec Record) error {
	type want struct {
		key, etag string
		size      int64
	}
	var ws []want
	if len(rec.Extents) == 0 {
		m, err := t.loadManifest(rec)
		if err != nil {
			return fmt.Errorf("no usable manifest: %w", err)
		}
		ws = append(ws, want{rec.Key, m.ETag, m.Size})
	} else {
		if err := checkExtents(rec.Extents, rec.Size); err != nil {
			return err
		}
		for _, e := range rec.Extents {
			m, err := t.objectManifest(e.Key, e.ETag)
			if err != nil {
				return fmt.Errorf("no usable manifest: %w", err)
			}
			if len(ws) == 0 || ws[len(ws)-1].key != e.Key {
				ws = append(ws, want{e.Key, m.ETag, m.Size})
			}
		}
	}
	for _, w := range ws {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		info, err := t.cfg.Store.Head(ctx, w.key)
		cancel()
		if err != nil {
			return fmt.Errorf("remote copy %s: %w", w.key, err)
		}
		if info.ETag != w.etag || info.Size != w.size {
			return fmt.Errorf("remote copy %s is not the one recorded (etag %s, %d bytes; recorded %s, %d bytes): %w", w.key, info.ETag, info.Size, w.etag, w.size, store.ErrNotFound)
		}
	}
	return nil
}
