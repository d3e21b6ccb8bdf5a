// Package keylog keeps small values by key in one append-only file: a
// put or a delete is one line appended and synced, the newest line of a
// key wins, and the file is compacted (rewritten with only the live
// lines) once most of it is dead. It replaces a directory of one small
// file per key, where every value takes a file system block and every
// write a create, an fsync and a rename.
//
// The format (docs/formats.md, "Keyed logs"): each line is framed as
// internal/crcline frames it (the CRC32C of its JSON, as 8 lowercase hex
// digits, a space, the JSON and a newline).
// The JSON is {"k":key,"v":value} for a put and {"k":key} for a delete;
// {"b":[put, ...]} is several puts appended and synced as one (PutAll).
// A last line that is cut short or does not match its CRC is a torn
// append (a crash before its sync returned) and is cut off when the file
// is opened; a bad line before the last is an error naming the file and
// its offset.
package keylog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/tierfs/tierfs/internal/crcline"
	"github.com/tierfs/tierfs/internal/fsutil"
)

// MaxLine is the longest line a log holds (value, key and framing).
const MaxLine = 1 << 20

// compactAt is how many bytes of dead lines a log holds at least before
// it is compacted (and more than of live ones).
const compactAt = 8 << 10

// FormatError is a bad line: the file and the byte offset it starts at.
type FormatError struct {
	Path   string
	Offset int64
	Why    string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s: offset %d: %s", e.Path, e.Offset, e.Why)
}

// span is where a live key's value is: the line at off, n bytes long,
// and in a batch line (which holds other keys too) the key's put at
// [lo, hi) of the line, so that reading it decodes that put alone (0, 0:
// the line is the key's). cost is what the key's value counts of the
// file's live bytes: the whole line for a line of one key, a share of it
// for a batch line.
type span struct {
	off, n, cost int64
	lo, hi       int32
}

// inBatch says whether the span is a put of a batch line.
func (sp span) inBatch() bool { return sp.hi > 0 }

// Log is one keyed log file. Its methods are safe for concurrent use.
type Log struct {
	path string

	mu     sync.Mutex
	at     map[string]span // each live key's line; GUARDED_BY(mu)
	size   int64           // of the file; GUARDED_BY(mu)
	live   int64           // bytes of live lines; GUARDED_BY(mu)
	broken error           // a failed append that could not be undone; GUARDED_BY(mu)
}

type line struct {
	K string          `json:"k,omitempty"`
	V json.RawMessage `json:"v,omitempty"`
	B []line          `json:"b,omitempty"` // a batch of puts (nothing else is set)
}

// puts is what a line does, in order: itself, or its batch.
func (ln line) puts() []line {
	if ln.B != nil {
		return ln.B
	}
	return []line{ln}
}

// Entry is one key and value of PutAll.
type Entry struct {
	Key string
	Val []byte
}

// Open reads the log at path (none yet is an empty log) and cuts off a
// torn last line, returning how many bytes it cut.
func Open(path string) (*Log, int64, error) {
	return openWith(path, nil)
}

// openWith is Open, calling fn for each put and delete as parse does.
func openWith(path string, fn func(key string, val []byte)) (*Log, int64, error) {
	l := &Log{path: path, at: map[string]span{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return l, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	valid, err := l.parse(b, fn)
	if err != nil {
		return nil, 0, err
	}
	cut := int64(len(b)) - valid
	if cut > 0 {
		if err := cutTo(path, valid); err != nil {
			return nil, 0, err
		}
	}
	l.size = valid
	return l, cut, nil
}

// OpenEach is Open followed by Each, without reading the file a second
// time: fn gets every live key and its value, in the file's order (as
// Each gives them), from the bytes Open read and checked, each line
// decoded once. A tierer's first pass opens every partition's logs, and
// Open then Each decoded each live line twice.
func OpenEach(path string, fn func(key string, val []byte) error) (*Log, int64, error) {
	vals := map[string][]byte{} // each key's newest value
	l, cut, err := openWith(path, func(key string, val []byte) {
		if val == nil {
			delete(vals, key)
		} else {
			vals[key] = val
		}
	})
	if err != nil {
		return nil, 0, err
	}
	for _, x := range l.inOrder() {
		if err := fn(x.k, vals[x.k]); err != nil {
			return nil, 0, err
		}
	}
	return l, cut, nil
}

// Parse reads the lines of a log's bytes (path names it in errors) and
// calls fn for each, in order, with the value (nil for a delete). It
// returns the length of the whole lines; a torn last line is not an
// error.
func Parse(path string, b []byte, fn func(key string, val []byte)) (valid int64, err error) {
	l := &Log{path: path, at: map[string]span{}}
	return l.parse(b, fn)
}

func (l *Log) parse(b []byte, fn func(key string, val []byte)) (int64, error) {
	var off int64
	for off < int64(len(b)) {
		rest := b[off:]
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			return off, nil // torn: no newline yet
		}
		ln, puts, err := decodePuts(rest[:nl])
		if err != nil {
			if off+int64(nl)+1 == int64(len(b)) {
				return off, nil // torn: the last line
			}
			return 0, &FormatError{Path: l.path, Offset: off, Why: err.Error()}
		}
		n := int64(nl) + 1
		l.apply(ln, puts, off, n)
		if fn != nil {
			for _, p := range ln.puts() {
				fn(p.K, p.V)
			}
		}
		off += n
	}
	return off, nil
}

// apply takes the line at off, n bytes long, into the live keys; puts
// are where a batch line's puts are in it (decodePuts).
func (l *Log) apply(ln line, puts [][2]int32, off, n int64) {
	ps := ln.puts()
	for i, p := range ps {
		if old, ok := l.at[p.K]; ok {
			l.live -= old.cost
			delete(l.at, p.K)
		}
		if p.V != nil {
			sp := span{off: off, n: n, cost: n / int64(len(ps))}
			if puts != nil {
				sp.lo, sp.hi = puts[i][0], puts[i][1]
			}
			l.at[p.K] = sp
			l.live += sp.cost
		}
	}
}

// decodePuts is decode, and for a batch line where each of its puts is
// in b: [lo, hi) from the line's start.
func decodePuts(b []byte) (line, [][2]int32, error) {
	ln, err := decode(b)
	if err != nil || ln.B == nil {
		return ln, nil, err
	}
	var raw struct {
		B []json.RawMessage `json:"b"`
	}
	body := b[crcline.Prefix:]
	if err := json.Unmarshal(body, &raw); err != nil || len(raw.B) != len(ln.B) {
		return ln, nil, fmt.Errorf("bad batch: %v", err)
	}
	// Each put's bytes are the first match after the one before: only
	// a comma and spaces come between them.
	puts := make([][2]int32, len(raw.B))
	at := 0
	for i, r := range raw.B {
		j := bytes.Index(body[at:], r)
		if j < 0 {
			return ln, nil, fmt.Errorf("batch put %d not found in its line", i)
		}
		lo := crcline.Prefix + at + j
		puts[i] = [2]int32{int32(lo), int32(lo + len(r))}
		at += j + len(r)
	}
	return ln, puts, nil
}

// decode checks one line (without its newline).
func decode(b []byte) (line, error) {
	var ln line
	if len(b) > MaxLine {
		return ln, fmt.Errorf("line of %d bytes, more than %d", len(b), MaxLine)
	}
	body, err := crcline.Body(b)
	if err != nil {
		return ln, err
	}
	if err := json.Unmarshal(body, &ln); err != nil {
		return ln, fmt.Errorf("bad JSON: %v", err)
	}
	if ln.B != nil {
		if ln.K != "" || ln.V != nil || len(ln.B) == 0 {
			return ln, errors.New("a batch with a key, a value or no puts")
		}
		for i, p := range ln.B {
			if p.K == "" || p.V == nil || p.B != nil || bytes.Equal(p.V, []byte("null")) {
				return ln, fmt.Errorf("batch put %d: no key, no value, a null value or a batch", i)
			}
		}
		return ln, nil
	}
	if ln.K == "" {
		return ln, errors.New("no key")
	}
	if bytes.Equal(ln.V, []byte("null")) {
		return ln, errors.New("a null value")
	}
	return ln, nil
}

func encode(key string, val []byte) ([]byte, error) {
	return encodeLine(line{K: key, V: val}, key)
}

// encodeLine frames ln; what names it in an error.
func encodeLine(ln line, what string) ([]byte, error) {
	j, err := json.Marshal(ln)
	if err != nil {
		return nil, err
	}
	return frame(j, what)
}

// encodeBatch frames the batch line of ps, and says where each put is in
// it ([lo, hi) from the line's start, as decodePuts finds them): the
// JSON json.Marshal makes of line{B: ps}, put by put.
func encodeBatch(ps []line, what string) ([]byte, [][2]int32, error) {
	j := []byte(`{"b":[`)
	puts := make([][2]int32, len(ps))
	for i, p := range ps {
		if i > 0 {
			j = append(j, ',')
		}
		pj, err := json.Marshal(p)
		if err != nil {
			return nil, nil, err
		}
		lo := crcline.Prefix + len(j)
		j = append(j, pj...)
		puts[i] = [2]int32{int32(lo), int32(crcline.Prefix + len(j))}
	}
	b, err := frame(append(j, "]}"...), what)
	return b, puts, err
}

// frame is the line of body j, checksum and newline included; what names
// it in an error.
func frame(j []byte, what string) ([]byte, error) {
	out := crcline.Append(make([]byte, 0, len(j)+crcline.Prefix+1), j)
	if len(out)-1 > MaxLine {
		return nil, fmt.Errorf("keylog: a line of %d bytes for %s, more than %d", len(out), what, MaxLine)
	}
	return out, nil
}

// Path is the log's file.
func (l *Log) Path() string { return l.path }

// Len is how many keys are live.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.at)
}

// Keys are the live keys, sorted.
func (l *Log) Keys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.at))
	for k := range l.at {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Get is key's value, read from the file.
func (l *Log) Get(key string) ([]byte, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sp, ok := l.at[key]
	if !ok {
		return nil, false, nil
	}
	b, err := l.readLocked(sp)
	if err != nil {
		return nil, false, err
	}
	v, err := l.valueAt(b, key, sp, true)
	if err != nil {
		return nil, false, err
	}
	return v, true, nil
}

// readLocked reads the line at sp, without its newline.
func (l *Log) readLocked(sp span) ([]byte, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, sp.n)
	if _, err := f.ReadAt(b, sp.off); err != nil {
		return nil, fmt.Errorf("%s: offset %d: %w", l.path, sp.off, err)
	}
	return b[:len(b)-1], nil
}

// valueAt is key's value in b, the line at sp (without its newline).
// check says whether the line's checksum is to be checked (a caller
// reading several keys of one batch line checks it once); a batch
// line's other puts are not decoded.
func (l *Log) valueAt(b []byte, key string, sp span, check bool) ([]byte, error) {
	bad := func(why string) error { return &FormatError{Path: l.path, Offset: sp.off, Why: why} }
	if !sp.inBatch() {
		ln, err := decode(b)
		if err != nil {
			return nil, bad(err.Error())
		}
		if ln.K != key {
			return nil, bad("the line does not hold " + key)
		}
		return ln.V, nil
	}
	if check {
		if _, err := crcline.Body(b); err != nil {
			return nil, bad(err.Error())
		}
	}
	var p line
	if int(sp.hi) > len(b) || sp.lo >= sp.hi {
		return nil, bad("a batch put past the end of its line")
	}
	if err := json.Unmarshal(b[sp.lo:sp.hi], &p); err != nil || p.K != key || p.V == nil {
		return nil, bad("the batch put of " + key + " is not where it was")
	}
	return p.V, nil
}

// Each calls fn with every live key and value, in the file's order.
func (l *Log) Each(fn func(key string, val []byte) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	spans := l.inOrder()
	if len(spans) == 0 {
		return nil
	}
	b, err := os.ReadFile(l.path)
	if err != nil {
		return err
	}
	checked := int64(-1) // the line whose checksum was checked last
	for _, x := range spans {
		if x.s.off+x.s.n > int64(len(b)) {
			return &FormatError{Path: l.path, Offset: x.s.off, Why: "past the end of the file"}
		}
		v, err := l.valueAt(b[x.s.off:x.s.off+x.s.n-1], x.k, x.s, x.s.off != checked)
		if err != nil {
			return err
		}
		checked = x.s.off
		if err := fn(x.k, v); err != nil {
			return err
		}
	}
	return nil
}

// keySpan is a live key and where its line is.
type keySpan struct {
	k string
	s span
}

// inOrder is the live keys in the file's order (a batch line's by key).
// GUARDED_BY(mu), or l not shared yet.
func (l *Log) inOrder() []keySpan {
	spans := make([]keySpan, 0, len(l.at))
	for k, s := range l.at {
		spans = append(spans, keySpan{k, s})
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].s.off != spans[j].s.off {
			return spans[i].s.off < spans[j].s.off
		}
		return spans[i].k < spans[j].k // one batch line's keys
	})
	return spans
}

// Put appends key's value (JSON) and syncs it.
func (l *Log) Put(key string, val []byte) error {
	if len(val) == 0 || !json.Valid(val) || bytes.Equal(val, []byte("null")) {
		return fmt.Errorf("%s: value of %s is not a JSON value", l.path, key)
	}
	return l.write(key, val)
}

// Delete appends key's removal, if it is live. A log left with no key
// is removed.
func (l *Log) Delete(key string) error {
	l.mu.Lock()
	_, ok := l.at[key]
	l.mu.Unlock()
	if !ok {
		return nil
	}
	return l.write(key, nil)
}

// PutAll appends the values of es (JSON) as one line, synced once: after
// a crash either all of them are in the log or none is. Where they do
// not fit one line, each line that holds some of them is such an append.
func (l *Log) PutAll(es []Entry) error {
	for _, e := range es {
		if e.Key == "" || len(e.Val) == 0 || !json.Valid(e.Val) || bytes.Equal(e.Val, []byte("null")) {
			return fmt.Errorf("%s: value of %q is not a JSON value", l.path, e.Key)
		}
	}
	for len(es) > 0 {
		ln, n := line{}, 0
		for size := 0; n < len(es); n++ {
			// A batch line stays well under MaxLine (framing and JSON
			// escapes aside), or holds one put.
			if size += len(es[n].Key) + len(es[n].Val) + 16; n > 0 && size > MaxLine/2 {
				break
			}
			ln.B = append(ln.B, line{K: es[n].Key, V: es[n].Val})
		}
		var b []byte
		var puts [][2]int32
		var err error
		if n == 1 {
			ln = ln.B[0]
			b, err = encodeLine(ln, ln.K)
		} else {
			b, puts, err = encodeBatch(ln.B, es[0].Key)
		}
		if err != nil {
			return err
		}
		if err := l.writeLine(ln, puts, b); err != nil {
			return err
		}
		es = es[n:]
	}
	return nil
}

func (l *Log) write(key string, val []byte) error {
	ln := line{K: key, V: val}
	b, err := encode(key, val)
	if err != nil {
		return err
	}
	return l.writeLine(ln, nil, b)
}

// writeLine appends ln, encoded as b, and syncs it; puts are where a
// batch line's puts are in b (encodeBatch).
func (l *Log) writeLine(ln line, puts [][2]int32, b []byte) error {
	key, val := ln.K, ln.V
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.broken != nil {
		return l.broken
	}
	if ln.B == nil && val == nil && len(l.at) == 1 {
		if _, ok := l.at[key]; ok {
			// The last key goes: so does the file.
			if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			if err := fsutil.SyncDir(filepath.Dir(l.path)); err != nil {
				return err
			}
			l.at, l.size, l.live = map[string]span{}, 0, 0
			return nil
		}
	}
	created := l.size == 0
	if created {
		if err := os.MkdirAll(filepath.Dir(l.path), 0o755); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(b, l.size); err != nil {
		return l.undo(f, err)
	}
	if err := f.Sync(); err != nil {
		return l.undo(f, err)
	}
	if created {
		if err := fsutil.SyncDir(filepath.Dir(l.path)); err != nil {
			return err
		}
	}
	n := int64(len(b))
	l.apply(ln, puts, l.size, n)
	l.size += n
	if dead := l.size - l.live; dead >= compactAt && dead > l.live {
		return l.compactLocked()
	}
	return nil
}

// undo cuts a failed append off; if that fails too, the log takes no
// more writes (a line after a torn one would make the file unreadable).
func (l *Log) undo(f *os.File, err error) error {
	if terr := f.Truncate(l.size); terr != nil {
		l.broken = fmt.Errorf("%s: an append failed (%v) and could not be cut off: %w", l.path, err, terr)
		return l.broken
	}
	return fmt.Errorf("%s: append: %w", l.path, err)
}

// compactLocked rewrites the file with only the live lines, beside it,
// and renames it over (fsutil.WriteFileAtomic).
func (l *Log) compactLocked() error {
	old, err := os.ReadFile(l.path)
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(l.at))
	for k := range l.at {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := l.at[keys[i]], l.at[keys[j]]
		if a.off != b.off {
			return a.off < b.off
		}
		return keys[i] < keys[j]
	})
	out := make([]byte, 0, l.live)
	at := make(map[string]span, len(keys))
	for _, k := range keys {
		sp := l.at[k]
		if sp.off+sp.n > int64(len(old)) {
			return &FormatError{Path: l.path, Offset: sp.off, Why: "past the end of the file"}
		}
		b := old[sp.off : sp.off+sp.n]
		if sp.inBatch() {
			// A key of a batch line is written again as a line of
			// its own.
			v, err := l.valueAt(b[:len(b)-1], k, sp, true)
			if err != nil {
				return err
			}
			if b, err = encode(k, v); err != nil {
				return err
			}
		}
		n := int64(len(b))
		at[k] = span{off: int64(len(out)), n: n, cost: n}
		out = append(out, b...)
	}
	if err := fsutil.WriteFileAtomic(l.path, out, 0o644); err != nil {
		return err
	}
	l.at, l.size, l.live = at, int64(len(out)), int64(len(out))
	return nil
}

// cutTo cuts the file at path to size bytes, durably.
func cutTo(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}
