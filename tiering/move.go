package tiering

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/fsutil"
	"github.com/tierfs/tierfs/internal/tiered"
)

// A Move is an evicted file coming back to local disk because it is
// being changed through the mount: written, or truncated to another
// size. It is *moving*. Opening the file for writing, fsync, flush and a
// truncate to the size it has change nothing and start no move (a Kafka
// broker opens every segment read-write at start-up, and flushes and
// closes them all at a clean shutdown). Its bytes are downloaded in the
// background, starting once the first change is in the log; meanwhile
// every write and truncate is appended to the file's catch-up log
// (catchup/<inode>.log in the state dir, on disk, unbounded) and returns
// at once, never waiting for the download. Reads see the original bytes
// (from the store) under what the log changed. Once the download is in,
// the log is applied in order, under the gate, and the file is local:
// its remote copy is stale, and goes as any changed file's does.
//
// The guarantee after a crash: the catch-up log is written before a
// write returns, so a kill -9 of tierfs loses no acknowledged write; a
// machine crash loses what was not fsynced, as for any file (fsync of a
// moving file syncs its log). At the next start the half-downloaded
// bytes are discarded, the download starts again, and the log is
// replayed on top.
type Move struct {
	t    *Tierer
	rel  string
	fd   *os.File // the backing file, open for writing
	rec  Record
	logf *os.File

	mu      sync.Mutex
	logEnd  int64    // GUARDED_BY(mu)
	ext     []extent // written ranges, sorted, not overlapping; GUARDED_BY(mu)
	size    int64    // the file's size now; GUARDED_BY(mu)
	cut     int64    // original bytes at and past cut are gone (truncated); GUARDED_BY(mu)
	mtimeNs int64    // GUARDED_BY(mu)
	done    bool     // the file is local: use it; GUARDED_BY(mu)

	remote   tiered.Reader // the store's copy, for original bytes
	cause    tiered.Cause  // what started it
	begun    sync.Once     // the download starts at the first change
	finished chan struct{}
	err      error // of the move, once finished
}

// extent is bytes [off, end) of the file, held at pos in the log.
type extent struct{ off, end, pos int64 }

// Catch-up log records: crc32c (4) | op (1) | off (8) | len (4) | data.
// The crc covers op to the end of data. The first record (op 0) holds
// the move's header as JSON.
const (
	recHeader   = 0
	recWrite    = 1
	recTruncate = 2
	recHdrLen   = 17
)

type moveHeader struct {
	Rel   string       `json:"rel"`
	Ino   uint64       `json:"ino"`
	Key   string       `json:"key"`
	Size  int64        `json:"size"`
	Cause tiered.Cause `json:"cause,omitempty"` // absent in logs of older versions: a write
}

func (ms *moves) catchupPath(ino uint64) string {
	return filepath.Join(ms.t.cfg.StateDir, "catchup", strconv.FormatUint(ino, 10)+".log")
}

// startMoveOf makes the evicted file rel (from the root) moving, or
// returns its move under way. A file that is not remote has no move:
// nil, nil. The caller is about to make the change cause names through
// the move; nothing is downloaded until a change is in its log.
func (ms *moves) startMoveOf(rel string, ino uint64, cause tiered.Cause) (*Move, error) {
	if err := ms.t.waitReady(); err != nil {
		return nil, err
	}
	ms.t.moves.start.Lock()
	defer ms.t.moves.start.Unlock()
	if m := ms.t.moves.of(ino); m != nil {
		return m, nil
	}
	return ms.startMove(rel, ino, nil, cause)
}

// startMove begins a move; old, when set, is the catch-up log of a move
// a crash interrupted, replayed into the new one (whose download then
// starts at once: its log holds changes).
func (ms *moves) startMove(rel string, ino uint64, old *os.File, cause tiered.Cause) (*Move, error) {
	path := filepath.Join(ms.t.cfg.Root, rel)
	if !ms.t.claims.take(inodeClaim(ino)) {
		return nil, fmt.Errorf("%s: %w", rel, ErrBusy)
	}
	release := func() { ms.t.claims.release(inodeClaim(ino)) }
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		release()
		return nil, err
	}
	fail := func(err error) (*Move, error) {
		f.Close()
		release()
		return nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fail(err)
	}
	rec, has, err := readRecordFd(int(f.Fd()), path)
	if err != nil {
		return fail(err)
	}
	if !has || rec.State != StateRemote {
		return fail(nil) // local: nothing to move
	}
	if st.Ino != ino || rec.Ino != ino || st.Size != rec.Size {
		return fail(fmt.Errorf("%s is another file now (inode %d, %d bytes; recorded %d, %d bytes)", path, st.Ino, st.Size, rec.Ino, rec.Size))
	}
	src, err := ms.t.copies.openSource(rec)
	if err != nil {
		return fail(err)
	}
	m := &Move{t: ms.t, rel: rel, fd: f, rec: rec, size: rec.Size, cut: rec.Size, mtimeNs: rec.MtimeNs, cause: cause, finished: make(chan struct{})}
	m.remote = src
	if err := os.MkdirAll(filepath.Dir(ms.catchupPath(ino)), 0o700); err != nil {
		return fail(err)
	}
	if old != nil {
		m.logf = old
		if err := m.replayInto(); err != nil {
			return fail(err)
		}
	} else {
		lf, err := os.OpenFile(ms.catchupPath(ino), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return fail(err)
		}
		m.logf = lf
		h, _ := json.Marshal(moveHeader{Rel: rel, Ino: ino, Key: rec.Key, Size: rec.Size, Cause: cause})
		if err := m.append(recHeader, 0, h); err != nil {
			lf.Close()
			os.Remove(lf.Name())
			return fail(err)
		}
		if err := lf.Sync(); err != nil {
			return fail(err)
		}
		if err := fsutil.SyncDir(filepath.Dir(lf.Name())); err != nil {
			return fail(err)
		}
	}
	ms.t.moves.add(ino, m)
	ms.t.changed(ino)
	if old != nil {
		m.begin("recovered", true)
	}
	return m, nil
}

// begin starts the download, once: at the first change recorded in the
// log (what the change was is logged), or at once for a move a crash
// interrupted. A move that is never changed downloads nothing.
func (m *Move) begin(what string, recovered bool) {
	m.begun.Do(func() {
		t := m.t
		path := filepath.Join(t.cfg.Root, m.rel)
		t.counters.Moves[m.cause].Add(1)
		t.cfg.Log.Info("an evicted file is changed: moving it back", "path", path, "key", m.rec.Key, "cause", m.cause.String(), "change", what, "recovered", recovered)
		go m.download(path)
	})
}

// download runs the move until it is done, retrying while the store
// fails; the ino claim taken by startMove is released at the end.
func (m *Move) download(path string) {
	t := m.t
	defer t.claims.release(inodeClaim(m.rec.Ino))
	defer close(m.finished)
	// Until it is in: a store that is down delays the move, and
	// meanwhile writes go on into the log.
	for attempt := 1; ; attempt++ {
		err := m.run(context.Background())
		if err == nil {
			return
		}
		t.counters.Errors.Add(1)
		t.cfg.Log.Error("moving an evicted file back failed; its changes stay in its catch-up log, and it is tried again", "path", path, "log", m.logf.Name(), "attempt", attempt, "err", err)
		select {
		case <-t.stop:
			m.err = err
			return
		case <-time.After(min(time.Duration(attempt)*time.Second, 30*time.Second)):
		}
	}
}

// append writes one record at the end of the log. Callers hold mu (or
// own the move alone).
func (m *Move) append(op byte, off int64, data []byte) error {
	rec := make([]byte, recHdrLen+len(data))
	rec[4] = op
	binary.BigEndian.PutUint64(rec[5:], uint64(off))
	binary.BigEndian.PutUint32(rec[13:], uint32(len(data)))
	copy(rec[recHdrLen:], data)
	binary.BigEndian.PutUint32(rec[0:], crc32.Checksum(rec[4:], castagnoli))
	if _, err := m.logf.WriteAt(rec, m.logEnd); err != nil {
		return err
	}
	m.logEnd += int64(len(rec))
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// records reads the log's records in order until its end or a torn
// tail, calling fn with each record's op, off, data position and length.
func readRecords(f *os.File, fn func(op byte, off, pos int64, n int, data []byte) error) (end int64, err error) {
	hdr := make([]byte, recHdrLen)
	var pos int64
	for {
		if _, err := f.ReadAt(hdr, pos); err != nil {
			return pos, nil // the end, or a torn header
		}
		n := int(binary.BigEndian.Uint32(hdr[13:]))
		if n > 64<<20 {
			return pos, nil
		}
		rec := make([]byte, recHdrLen+n)
		if _, err := f.ReadAt(rec, pos); err != nil {
			return pos, nil // torn data
		}
		if crc32.Checksum(rec[4:], castagnoli) != binary.BigEndian.Uint32(rec) {
			return pos, nil // torn
		}
		if err := fn(rec[4], int64(binary.BigEndian.Uint64(rec[5:])), pos+recHdrLen, n, rec[recHdrLen:]); err != nil {
			return pos, err
		}
		pos += int64(len(rec))
	}
}

// replayInto rebuilds the in-memory state from an existing log.
func (m *Move) replayInto() error {
	end, err := readRecords(m.logf, func(op byte, off, pos int64, n int, _ []byte) error {
		switch op {
		case recWrite:
			m.noteWrite(off, int64(n), pos)
		case recTruncate:
			m.noteTruncate(off)
		}
		return nil
	})
	if err != nil {
		return err
	}
	m.logEnd = end
	// Cut a torn tail, so new records follow the good ones.
	return m.logf.Truncate(end)
}

func (m *Move) noteWrite(off, n, pos int64) {
	end := off + n
	var out []extent
	for _, e := range m.ext {
		if e.end <= off || e.off >= end {
			out = append(out, e)
			continue
		}
		if e.off < off {
			out = append(out, extent{e.off, off, e.pos})
		}
		if e.end > end {
			out = append(out, extent{end, e.end, e.pos + (end - e.off)})
		}
	}
	out = append(out, extent{off, end, pos})
	sort.Slice(out, func(i, j int) bool { return out[i].off < out[j].off })
	m.ext = out
	m.size = max(m.size, end)
}

func (m *Move) noteTruncate(size int64) {
	var out []extent
	for _, e := range m.ext {
		if e.off >= size {
			continue
		}
		if e.end > size {
			e.end = size
		}
		out = append(out, e)
	}
	m.ext = out
	m.cut = min(m.cut, size)
	m.size = size
}

// ReadAt reads the file as it is now: its original bytes, under what
// was written since. os.ErrClosed: the move is over; read the file.
func (m *Move) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	if m.done {
		m.mu.Unlock()
		return 0, os.ErrClosed
	}
	size, cut := m.size, m.cut
	var ext []extent
	for _, e := range m.ext {
		if e.end > off && e.off < off+int64(len(p)) {
			ext = append(ext, e)
		}
	}
	m.mu.Unlock()
	// What the log holds never changes, and the original bytes never
	// do: the state copied above is read as it was then.
	if off >= size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), size-off))
	buf := p[:n]
	clear(buf)
	// The move may end meanwhile, closing what is read here: then the
	// caller reads the file.
	failed := func(err error) (int, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.done {
			return 0, os.ErrClosed
		}
		return 0, err
	}
	if orig := min(cut, m.rec.Size) - off; orig > 0 {
		k, err := m.remote.ReadAt(buf[:min(int64(n), orig)], off)
		if err != nil && !(errors.Is(err, io.EOF) && int64(k) == min(int64(n), orig)) {
			return failed(err)
		}
	}
	for _, e := range ext {
		lo, hi := max(e.off, off), min(e.end, off+int64(n))
		if _, err := m.logf.ReadAt(buf[lo-off:hi-off], e.pos+(lo-e.off)); err != nil {
			return failed(err)
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt appends the write to the catch-up log and returns: it never
// waits for the download.
func (m *Move) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return 0, os.ErrClosed
	}
	if len(p) == 0 {
		return 0, nil // changes nothing
	}
	pos := m.logEnd + recHdrLen
	if err := m.append(recWrite, off, p); err != nil {
		return 0, err
	}
	m.noteWrite(off, int64(len(p)), pos)
	m.mtimeNs = time.Now().UnixNano()
	m.begin(fmt.Sprintf("write of %d bytes at %d", len(p), off), false)
	return len(p), nil
}

// Truncate appends a truncate to the catch-up log.
func (m *Move) Truncate(size int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return os.ErrClosed
	}
	if size < 0 {
		return syscall.EINVAL
	}
	if size == m.size {
		return nil // changes nothing
	}
	if err := m.append(recTruncate, size, nil); err != nil {
		return err
	}
	from := m.size
	m.noteTruncate(size)
	m.mtimeNs = time.Now().UnixNano()
	m.begin(fmt.Sprintf("truncate from %d to %d bytes", from, size), false)
	return nil
}

// Sync makes the catch-up log durable.
func (m *Move) Sync() error {
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	if done {
		return os.ErrClosed
	}
	return m.logf.Sync()
}

// Attr is the file's size and mtime now.
func (m *Move) Attr() (size, mtimeNs int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.size, m.mtimeNs
}

// Wait waits for the move to end, and says how it did.
func (m *Move) Wait() error {
	<-m.finished
	return m.err
}

// run downloads the original bytes, puts them into the file, applies the
// log under the gate, and ends the move.
func (m *Move) run(ctx context.Context) error {
	t := m.t
	path := filepath.Join(t.cfg.Root, m.rel)
	m.mu.Lock()
	needOriginal := m.cut > 0
	m.mu.Unlock()
	// Unfreed while bytes go in: should tierfs die now, the next pass
	// frees them again, and the move starts over from the log.
	m.rec.Freed = false
	if err := writeRecordFd(int(m.fd.Fd()), m.rel, m.rec); err != nil {
		return err
	}
	if needOriginal {
		if err := t.hydrator.fetchInto(ctx, m.rec, m.fd); err != nil {
			return err
		}
	}
	unlock := t.cfg.Gate.Lock(m.rec.Ino)
	defer unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	// The log, in order, onto the original bytes.
	if _, err := readRecords(m.logf, func(op byte, off, _ int64, _ int, data []byte) error {
		switch op {
		case recWrite:
			_, err := m.fd.WriteAt(data, off)
			return err
		case recTruncate:
			return m.fd.Truncate(off)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("apply the catch-up log of %s: %w", path, err)
	}
	if err := m.fd.Sync(); err != nil {
		return err
	}
	// Local, and changed (a move begins only at a change): the remote
	// copy is stale. Its shipment goes the way of any changed file's.
	mt := unix.NsecToTimespec(m.mtimeNs)
	unix.UtimesNanoAt(unix.AT_FDCWD, procPath(m.fd), []unix.Timespec{{Nsec: unix.UTIME_OMIT}, mt}, 0)
	if err := unix.Fremovexattr(int(m.fd.Fd()), recordXattr); err != nil && !errors.Is(err, unix.ENODATA) {
		return err
	}
	if err := m.fd.Sync(); err != nil {
		return err
	}
	m.done = true
	// The log goes before the move leaves the table: whoever no longer
	// finds the move (a pass, a recovery, a test) finds no log either.
	// Nothing appends to it now: writers hold m.mu and see done.
	m.remote.Close()
	m.fd.Close()
	m.logf.Close()
	os.Remove(m.logf.Name())
	t.moves.remove(m.rec.Ino)
	t.changed(m.rec.Ino) // local and changed: its partition is touched, the next pass ships it again
	t.counters.HydratedSegments[m.cause].Add(1)
	t.counters.HydratedBytes[m.cause].Add(m.rec.Size)
	t.cfg.Log.Info("moved back: the file is local", "path", path, "cause", m.cause.String(), "bytes", m.rec.Size)
	return nil
}

func procPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }

// recoverMoves starts again the moves a crash interrupted: the bytes
// they had put in are freed first (they are remote and unfreed), then
// each move replays its log into a new download.
func (ms *moves) recoverMoves() {
	logs, _ := filepath.Glob(filepath.Join(ms.t.cfg.StateDir, "catchup", "*.log"))
	for _, p := range logs {
		if err := ms.recoverMove(p); err != nil {
			ms.t.counters.Errors.Add(1)
			lost := filepath.Join(ms.t.cfg.StateDir, "catchup", "lost")
			os.MkdirAll(lost, 0o700)
			os.Rename(p, filepath.Join(lost, filepath.Base(p)))
			ms.t.cfg.Log.Error("a catch-up log could not be applied; kept aside", "log", filepath.Join(lost, filepath.Base(p)), "err", err)
		}
	}
}

func (ms *moves) recoverMove(p string) error {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	var h moveHeader
	changes := 0
	_, err = readRecords(f, func(op byte, _, _ int64, _ int, data []byte) error {
		if op == recHeader && h.Rel == "" {
			return json.Unmarshal(data, &h)
		}
		if op == recWrite || op == recTruncate {
			changes++
		}
		return nil
	})
	if err == nil && h.Rel == "" {
		err = errors.New("no header")
	}
	if err != nil {
		f.Close()
		return err
	}
	path := filepath.Join(ms.t.cfg.Root, h.Rel)
	rec, has, err := readRecord(path)
	if err != nil || !has || rec.Key != h.Key || rec.Ino != h.Ino {
		f.Close()
		if err == nil {
			err = fmt.Errorf("%s is no longer the file the log is of (%s)", h.Rel, h.Key)
		}
		return err
	}
	if rec.State == StateRemote && !rec.Freed {
		if _, err := ms.t.evictor.finishEvict(segmentAt(path), rec); err != nil {
			f.Close()
			return err
		}
	}
	if changes == 0 {
		// The crash came before the first change was logged: no write
		// was acknowledged, and the file stays remote.
		f.Close()
		ms.t.cfg.Log.Info("a move a crash interrupted before its first change is dropped; the file stays remote", "path", path, "log", p)
		return os.Remove(p)
	}
	if h.Cause >= tiered.NumCauses {
		h.Cause = tiered.CauseWrite
	}
	ms.t.moves.start.Lock()
	defer ms.t.moves.start.Unlock()
	m, err := ms.startMove(h.Rel, h.Ino, f, h.Cause)
	if err != nil || m == nil {
		f.Close()
		if err == nil {
			err = fmt.Errorf("%s is not remote", h.Rel)
		}
		return err
	}
	ms.t.cfg.Log.Info("resumed a move a crash interrupted", "path", path, "log", p)
	return nil
}
