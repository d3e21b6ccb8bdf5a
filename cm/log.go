package cm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/tierfs/tierfs/internal/crcline"
	"github.com/tierfs/tierfs/internal/fsutil"
)

// Event types.
const (
	EvCreate   = "create"   // Path was created (Kind says what it is)
	EvDelete   = "delete"   // Path was removed; a file's original is retained
	EvRename   = "rename"   // Path moved to To; a file it replaced is retained
	EvTruncate = "truncate" // Path was cut to Size; the original is retained
	EvModify   = "modify"   // Path's bytes were about to be overwritten; the original is retained
	EvWrite    = "write"    // Path was written (appended or, after a modify, overwritten) up to Size
	// EvFiled completes the event Ref: its original, retained as Pending,
	// has checksum Sum and is kept as Name. Readers see it merged into
	// that event (see readResolved).
	EvFiled = "filed"
)

// Kinds of entries.
const (
	KindFile    = "file"
	KindDir     = "dir"
	KindSymlink = "symlink"
)

// Event is one change, as kept in the event log.
type Event struct {
	ID     uint64 `json:"id"`
	TimeNs int64  `json:"t"`
	Type   string `json:"type"`
	Kind   string `json:"kind,omitempty"`
	Path   string `json:"path"`
	To     string `json:"to,omitempty"`
	// Size is the retained original's size (delete, rename-over,
	// truncate, modify) or the file's size after the change (write).
	Size int64 `json:"size,omitempty"`
	// NewSize is the size a truncate cut to; OldSize the size before a
	// write.
	NewSize int64 `json:"new_size,omitempty"`
	OldSize int64 `json:"old_size,omitempty"`
	// Sum is the SHA-256 (hex) of the retained original, and Name its
	// file in cmroot (relative to it); both empty when nothing was
	// retained.
	Sum  string `json:"sum,omitempty"`
	Name string `json:"name,omitempty"`
	// Pending is where an original waits in the cmroot (tmp/...) until
	// the filer has named it by checksum; Ref is the event a filed
	// record completes.
	Pending string `json:"pending,omitempty"`
	Ref     uint64 `json:"ref,omitempty"`
	// Target is a symlink's target.
	Target string `json:"target,omitempty"`
	// Flags are renameat2 flags (RENAME_EXCHANGE is replayed as a swap).
	Flags uint32 `json:"flags,omitempty"`
	// Overwrote marks a write after a modify in the same open: the
	// bytes before it are the modify's original, not a prefix.
	Overwrote bool `json:"overwrote,omitempty"`
	// Over is the kind of the entry a rename replaced (its original is
	// Sum/Name/Size when a file); FromUntracked says the rename's source
	// was an excluded path, so To appeared from nowhere cm knows.
	Over          string `json:"over,omitempty"`
	FromUntracked bool   `json:"from_untracked,omitempty"`
	// ZeroTail marks a truncate that cut only zeros, a hole or zero
	// bytes (Kafka trimming a preallocated index): the original is the
	// file's first NewSize bytes followed by zeros up to OldSize, so
	// nothing was copied.
	ZeroTail bool `json:"zero_tail,omitempty"`
	// Recovered marks an original found in cmroot after a crash, whose
	// event had not been written.
	Recovered bool `json:"recovered,omitempty"`
}

// Retains says whether the event kept an original in cmroot.
func (e Event) Retains() bool { return e.Name != "" || e.Pending != "" }

// The event log is a directory of segment files named by the id of their
// first event. Each line is "<crc32c of the JSON, 8 hex> <JSON>\n"
// (internal/crcline), so a line torn by a crash is told from a good one. It is append-only: old
// segments are removed whole by the retention cleaner.
type eventLog struct {
	dir string

	mu      sync.Mutex
	f       *os.File // the newest segment, open for appending; GUARDED_BY(mu)
	size    int64    // of f; GUARDED_BY(mu)
	next    uint64   // the id the next event gets; GUARDED_BY(mu)
	dirty   bool     // written since the last sync; GUARDED_BY(mu)
	buf     []byte   // the line being written; GUARDED_BY(mu)
	segSize int64
}

// A segment rolls at 16 MiB (~60k events), so retention frees space in
// steps much smaller than a day of Kafka's churn.
const defaultSegmentBytes = 16 << 20

// maxLine bounds one log line; events are a few hundred bytes, paths at
// most 4 KiB.
const maxLine = 64 << 10

func segName(first uint64) string { return fmt.Sprintf("%020d.log", first) }

// segments lists the log's segment files in id order, with their first ids.
func segments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, e := range ents {
		base, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(base, 10, 64)
		if err != nil {
			continue
		}
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// openLog opens (creating) the log in dir. A torn last line, left by a
// crash in the middle of an append, is cut off; a bad line anywhere else
// is an error naming the file and offset.
func openLog(dir string) (*eventLog, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	l := &eventLog{dir: dir, next: 1, segSize: defaultSegmentBytes}
	ids, err := segments(dir)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return l, l.roll(1)
	}
	last := filepath.Join(dir, segName(ids[len(ids)-1]))
	good, lastID, err := scanSegment(last, ids[len(ids)-1], true, nil)
	if err != nil {
		return nil, err
	}
	if err := os.Truncate(last, good); err != nil {
		return nil, err
	}
	l.next = ids[len(ids)-1]
	if lastID > 0 {
		l.next = lastID + 1
	}
	f, err := os.OpenFile(last, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	l.f, l.size = f, good
	return l, nil
}

// scanSegment reads the segment at path, whose first event should have id
// first, handing each event to fn (when set). It returns the length of the
// good prefix and the last id. With tolerateTail a bad last line is
// dropped (a torn append); otherwise it is an error.
func scanSegment(path string, first uint64, tolerateTail bool, fn func(Event) error) (int64, uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	var off int64
	var last uint64
	for {
		line, err := readLogLine(r)
		if err == io.EOF && len(line) == 0 {
			return off, last, nil
		}
		ev, perr := parseLine(line, err)
		if perr == nil && ev.ID != first && last == 0 {
			perr = fmt.Errorf("first event has id %d, the segment's name says %d", ev.ID, first)
		}
		if perr == nil && last != 0 && ev.ID != last+1 {
			perr = fmt.Errorf("event id %d follows %d", ev.ID, last)
		}
		if perr != nil {
			if tolerateTail && isLastLine(r) {
				return off, last, nil
			}
			return 0, 0, fmt.Errorf("event log %s at offset %d: %w", path, off, perr)
		}
		if fn != nil {
			if err := fn(ev); err != nil {
				return 0, 0, err
			}
		}
		off += int64(len(line))
		last = ev.ID
	}
}

// readLogLine reads one line, at most maxLine bytes; a longer one comes
// back cut, with an error.
func readLogLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxLine {
			return line, errors.New("line too long")
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, err
	}
}

func isLastLine(r *bufio.Reader) bool {
	_, err := r.Peek(1)
	return err == io.EOF
}

func parseLine(line []byte, readErr error) (Event, error) {
	var ev Event
	if readErr != nil && readErr != io.EOF {
		return ev, readErr
	}
	if len(line) == 0 || line[len(line)-1] != '\n' {
		return ev, errors.New("unterminated line")
	}
	body, err := crcline.Body(line[:len(line)-1])
	if err != nil {
		return ev, err
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, err
	}
	if ev.ID == 0 || ev.Type == "" {
		return ev, errors.New("event without id or type")
	}
	return ev, nil
}

// roll starts a new segment whose first event is first. Call with mu held
// (or before the log is shared).
func (l *eventLog) roll(first uint64) error {
	if l.f != nil {
		if err := l.f.Sync(); err != nil {
			return err
		}
		l.f.Close()
	}
	f, err := os.OpenFile(filepath.Join(l.dir, segName(first)), os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	l.f, l.size = f, 0
	return fsutil.SyncDir(l.dir)
}

// append gives ev the next id and writes it. The write reaches the
// kernel before append returns, so it survives a crash of tierfs; sync
// makes it survive a crash of the machine.
func (l *eventLog) append(ev *Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size >= l.segSize {
		if err := l.roll(l.next); err != nil {
			return fmt.Errorf("event log: %w", err)
		}
	}
	ev.ID = l.next
	// "<crc> " is filled in once the body is there.
	line := append(l.buf[:0], "00000000 "...)
	line = appendEvent(line, ev)
	crcline.Seal(line)
	line = append(line, '\n')
	l.buf = line
	if _, err := l.f.Write(line); err != nil {
		// A partial line would be cut at the next start; stop at it now
		// too, so the next append does not follow garbage.
		l.f.Truncate(l.size)
		return fmt.Errorf("event log: %w", err)
	}
	l.size += int64(len(line))
	l.next++
	l.dirty = true
	return nil
}

// lastID is the id of the newest event (0 if none).
func (l *eventLog) lastID() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next - 1
}

func (l *eventLog) sync() error {
	l.mu.Lock()
	if !l.dirty {
		l.mu.Unlock()
		return nil
	}
	l.dirty = false
	f := l.f
	l.mu.Unlock()
	// Outside the lock: appends (every change through the mount) do not
	// wait for the disk. A segment rolled meanwhile was synced as it
	// was closed.
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
		l.mu.Lock()
		l.dirty = true
		l.mu.Unlock()
		return err
	}
	return nil
}

func (l *eventLog) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Sync()
	l.f.Close()
	l.f = nil
	return err
}

// readEvents hands every event with from <= id <= to to fn, in order.
func readEvents(dir string, from, to uint64, fn func(Event) error) error {
	ids, err := segments(dir)
	if err != nil {
		return err
	}
	for i, first := range ids {
		if i+1 < len(ids) && ids[i+1] <= from {
			continue
		}
		if first > to {
			break
		}
		stop := errors.New("stop")
		_, _, err := scanSegment(filepath.Join(dir, segName(first)), first, i == len(ids)-1, func(ev Event) error {
			if ev.ID > to {
				return stop
			}
			if ev.ID >= from {
				return fn(ev)
			}
			return nil
		})
		if err == stop {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// firstID is the id of the oldest event still in the log (0 if none).
func firstID(dir string) (uint64, error) {
	ids, err := segments(dir)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	return ids[0], nil
}
