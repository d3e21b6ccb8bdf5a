package idx

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// FileName is the name of a partition's index file in its state directory.
const FileName = "remote-log-segment-index"

// File is a partition's remote log segment index file, open for appends.
// One process appends (the backing directory's lock guarantees it); any
// number of goroutines look up concurrently with the appender.
type File struct {
	path string
	mu   sync.RWMutex
	f    *os.File
	x    *Index
	cut  int64
	// broken is set when a failed append could not be undone on disk;
	// reopening cuts the partial tail.
	broken error
}

// OpenFile opens or creates the index file at path. A torn tail left by an
// interrupted append is cut (and the cut synced) before it returns; Cut
// says how many bytes went.
func OpenFile(path string) (*File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
		}
	}()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	x, valid, err := ParseIndex(path, data)
	if err != nil {
		return nil, err
	}
	if valid < int64(len(data)) {
		if err := f.Truncate(valid); err != nil {
			return nil, fmt.Errorf("%s: cut torn tail: %w", path, err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return nil, fmt.Errorf("%s: sync: %w", path, err)
		}
	}
	if len(data) == 0 {
		// A new file: make its name durable.
		if err := syncDir(filepath.Dir(path)); err != nil {
			return nil, err
		}
	}
	ok = true
	return &File{path: path, f: f, x: x, cut: int64(len(data)) - valid}, nil
}

// Cut is the number of torn-tail bytes that OpenFile removed.
func (f *File) Cut() int64 { return f.cut }

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Append adds entries at the end and syncs them. Entries must follow the
// index's order; on any error nothing is added (a partial write is
// truncated away, or cut on the next open). Appends of more than MaxAppend
// bytes are written and synced in pieces, so after a crash a prefix of
// an append's entries may be there: callers resume from what the index
// holds.
func (f *File) Append(es ...Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.broken != nil {
		return f.broken
	}
	var chunks [][]byte
	var buf []byte
	owned := make([]Entry, 0, len(es))
	for _, e := range es {
		if e.Deleted() {
			return fmt.Errorf("%s: append: a tombstone", f.path)
		}
		if n := len(owned); n > 0 {
			if err := checkOrder(owned[n-1], e); err != nil {
				return fmt.Errorf("%s: append: %w", f.path, err)
			}
		}
		if len(buf)+e.Size() > MaxAppend {
			chunks, buf = append(chunks, buf), nil
		}
		var err error
		if buf, err = e.AppendTo(buf); err != nil {
			return fmt.Errorf("%s: append: %w", f.path, err)
		}
		e.RDI = append([]byte(nil), e.RDI...)
		owned = append(owned, e)
	}
	if len(owned) == 0 {
		return nil
	}
	if err := f.x.fits(f.x.slot(owned[0].FirstOffset), owned[0], owned[len(owned)-1]); err != nil {
		return fmt.Errorf("%s: append: %w", f.path, err)
	}
	chunks = append(chunks, buf)
	start := f.x.size
	at := start
	for _, c := range chunks {
		if err := f.write(c, at); err != nil {
			if terr := f.f.Truncate(start); terr != nil {
				f.broken = fmt.Errorf("%s: append failed and could not be undone (%v); reopen to recover: %w", f.path, terr, err)
			}
			return fmt.Errorf("%s: append: %w", f.path, err)
		}
		at += int64(len(c))
	}
	for _, e := range owned {
		// The run fits where it goes (checked above), so add cannot fail.
		if err := f.x.add(e); err != nil {
			panic(err)
		}
	}
	return nil
}

// write writes b at off and syncs it.
func (f *File) write(b []byte, off int64) error {
	if _, err := f.f.WriteAt(b, off); err != nil {
		return err
	}
	return unix.Fdatasync(int(f.f.Fd()))
}

// Tombstone turns every live entry that match selects into a tombstone
// (Entry.Deleted) and reports how many it turned. The file is rewritten
// whole beside itself, synced and renamed over, so a crash leaves either
// the old file or the new one; no entry moves.
func (f *File) Tombstone(match func(Entry) bool) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.broken != nil {
		return 0, f.broken
	}
	data := make([]byte, f.x.size)
	if _, err := f.f.ReadAt(data, 0); err != nil {
		return 0, fmt.Errorf("%s: %w", f.path, err)
	}
	n := 0
	for pos := 0; pos < len(data); {
		e, size, err := DecodeEntry(data[pos:])
		if err != nil {
			return 0, formatErr(f.path, int64(pos), "%v", err)
		}
		if !e.Deleted() && match(e) {
			t := Entry{FirstOffset: e.FirstOffset, LastOffset: e.LastOffset, FirstTimestamp: e.FirstTimestamp, LastTimestamp: e.LastTimestamp, DataLength: e.DataLength, RDI: make([]byte, len(e.RDI))}
			if len(t.RDI) == 0 {
				return 0, formatErr(f.path, int64(pos), "entry without RDI cannot be a tombstone")
			}
			if _, err := t.AppendTo(data[pos:pos]); err != nil {
				return 0, err
			}
			n++
		}
		pos += size
	}
	if n == 0 {
		return 0, nil
	}
	x, valid, err := ParseIndex(f.path, data)
	if err != nil || valid != int64(len(data)) {
		return 0, fmt.Errorf("%s: tombstones made an unreadable index (%v)", f.path, err)
	}
	tmp := f.path + ".tmp"
	nf, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	if _, err := nf.Write(data); err == nil {
		err = unix.Fdatasync(int(nf.Fd()))
	}
	if err == nil {
		err = os.Rename(tmp, f.path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(f.path))
	}
	if err != nil {
		nf.Close()
		os.Remove(tmp)
		return 0, fmt.Errorf("%s: rewrite: %w", f.path, err)
	}
	f.f.Close()
	f.f, f.x = nf, x
	return n, nil
}

// View runs fn with the index, read-locked against appends. The Index
// must not be kept past fn.
func (f *File) View(fn func(x *Index)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.x)
}

// Len is the number of entries.
func (f *File) Len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.x.Len()
}

// Entries yields a snapshot of the entries with their positions in the file.
func (f *File) Entries() iter.Seq2[int64, Entry] {
	f.mu.RLock()
	n := f.x.Len()
	ents, pos := f.x.ents[:n:n], f.x.pos[:n:n]
	f.mu.RUnlock()
	return func(yield func(int64, Entry) bool) {
		for i := range ents {
			if !yield(pos[i], ents[i]) {
				return
			}
		}
	}
}

// LookupOffset is Index.LookupOffset on the current entries.
func (f *File) LookupOffset(off int64) (e Entry, pos int64, ok bool) {
	f.View(func(x *Index) {
		var i int
		if i, ok = x.LookupOffset(off); ok {
			e, pos = x.ents[i], x.pos[i]
		}
	})
	return
}

// LookupTimestamp is Index.LookupTimestamp on the current entries.
func (f *File) LookupTimestamp(ts int64) (e Entry, pos int64, ok bool) {
	f.View(func(x *Index) {
		var i int
		if i, ok = x.LookupTimestamp(ts); ok {
			e, pos = x.ents[i], x.pos[i]
		}
	})
	return
}

// LookupPosition is Index.LookupPosition on the current entries.
func (f *File) LookupPosition(base, next, segPos int64) (e Entry, within int64, ok bool) {
	f.View(func(x *Index) {
		var i int
		if i, within, ok = x.LookupPosition(base, next, segPos); ok {
			e = x.ents[i]
		}
	})
	return
}

// Close closes the file.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil {
		return errors.New("index file already closed")
	}
	err := f.f.Close()
	f.f = nil
	return err
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
