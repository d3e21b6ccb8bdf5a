package cm

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The filer names retained originals by checksum after their change is
// done: a change through the mount costs one rename (or link, or sparse
// copy) and one event, and the hashing happens here, off the request's
// path. Each original waits in tmp/ (its event's Pending) until the filer
// links it as by-sum/<sum> and files/<path>_<sum> (or finds the content
// already retained) and records an EvFiled event that completes the
// original event.

type fileJob struct {
	id       uint64
	tmp, rel string
	at       time.Time // of the event
}

// filer is the queue of originals to file.
type filer struct {
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []fileJob // GUARDED_BY(mu)
	busy    bool      // GUARDED_BY(mu)
	closing bool      // GUARDED_BY(mu)
}

// maxQueue bounds the originals waiting to be filed; past it a change
// waits for the filer (each waiting original is a few hundred bytes of
// memory, and its file in tmp/).
const maxQueue = 10000

// captured records ev and, when it retained an original, queues it for
// filing.
func (m *Manager) captured(ev Event) {
	id, at := m.record(ev)
	if ev.Pending == "" || id == 0 {
		return
	}
	// The tmp dir's entry is synced with the log. So are the bytes of a
	// copy cm made; an original moved or linked out of the tree has the
	// durability its writer gave it, as it had in the tree.
	// (A flag, not the dirty set: this is on every change's path, and
	// the filer holds mu while it links.)
	m.tmpDirty.Store(true)
	if isCopy(ev.Pending) {
		m.markDirty(filepath.Join(m.dir, ev.Pending))
	}
	f := &m.filer
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.queue) >= maxQueue {
		f.cond.Wait()
	}
	f.queue = append(f.queue, fileJob{id: id, tmp: ev.Pending, rel: retainedPath(ev), at: at})
	f.cond.Broadcast()
}

// retainedPath is the tree path of the original an event retained.
func retainedPath(ev Event) string {
	if ev.Type == EvRename {
		return ev.To
	}
	return ev.Path
}

func (m *Manager) fileLoop() {
	defer m.wg.Done()
	// Filing is background work: on its own thread at a lower priority,
	// so on a busy machine the requests of the broker come first.
	runtime.LockOSThread()
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 10)
	f := &m.filer
	for {
		f.mu.Lock()
		for len(f.queue) == 0 && !f.closing {
			f.cond.Wait()
		}
		if len(f.queue) == 0 {
			f.mu.Unlock()
			return
		}
		j := f.queue[0]
		f.queue = f.queue[1:]
		f.busy = true
		f.mu.Unlock()
		m.fileOne(j)
		f.mu.Lock()
		f.busy = false
		f.cond.Broadcast()
		f.mu.Unlock()
	}
}

// flushFiler waits until every queued original is filed.
func (m *Manager) flushFiler() {
	f := &m.filer
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.queue) > 0 || f.busy {
		f.cond.Wait()
	}
}

// fileOne names one original by its checksum. On failure the original
// stays in tmp and is filed at the next start.
func (m *Manager) fileOne(j fileJob) {
	sum, st, err := m.sumRetained(j.tmp)
	var name string
	var fresh bool
	if err == nil {
		name, fresh, err = m.keep(j.tmp, j.rel, sum, j.at, &st)
	}
	if err != nil {
		m.stats.Errors.Add(1)
		m.cfg.Log.Error("cm: retained original not filed; it stays in tmp until the next start", "path", j.rel, "tmp", j.tmp, "err", err)
		return
	}
	// The record first, then the original moves from tmp to its name: a
	// crash in between leaves a tmp name that a filed event names, which
	// recovery moves (or removes, when the content was kept already).
	// Until it has moved, by-sum/<sum> reads it.
	m.record(Event{Type: EvFiled, Ref: j.id, Path: j.rel, Sum: sum, Name: name, Size: st.Size})
	if !fresh {
		unix.Unlinkat(m.dirFd, j.tmp, 0)
		return
	}
	if err := m.moveIn(j.tmp, name); err != nil {
		m.stats.Errors.Add(1)
		m.cfg.Log.Error("cm: retained original not moved to its name; by-sum has it, and the next start moves it", "path", j.rel, "name", name, "err", err)
	} else if isCopy(j.tmp) {
		m.markDirty(filepath.Join(m.dir, name))
	}
}

// isCopy says whether the tmp name is of a copy cm made (see takeAway).
func isCopy(tmp string) bool {
	return strings.HasPrefix(filepath.Base(tmp), tmpCopy+"-")
}

// sumRetained is the checksum and stat of an original in tmp (tmp is its
// cmroot name). Its checksum is not cached on it: nothing hashes a
// retained original again.
func (m *Manager) sumRetained(tmp string) (string, unix.Stat_t, error) {
	fd, st, err := openRegular(m.dirFd, tmp)
	if err != nil {
		return "", st, err
	}
	defer unix.Close(fd)
	// The store reads an evicted one by a path (its tierer state is an
	// attribute); the descriptor's is one.
	sum, _, err := m.sumOpen(fd, "/proc/self/fd/"+strconv.Itoa(fd), &st)
	return sum, st, err
}

// keep decides the cmroot name of the original at tmp (of path rel,
// checksum sum, stat st, retained at at). Content already retained is
// kept once: fresh is false, and the original can go. Otherwise the
// original is linked as by-sum/<sum>, which says the content is
// retained, and fresh is true: the caller moves it to name.
func (m *Manager) keep(tmp, rel, sum string, at time.Time, st *unix.Stat_t) (name string, fresh bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rc, ok := m.retained[sum]; ok {
		var kept unix.Stat_t
		if unix.Fstatat(m.dirFd, "by-sum/"+sum, &kept, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if at.After(rc.last) {
				rc.last = at
			}
			m.stats.Deduplicated.Add(1)
			return rc.name, false, nil
		}
	}
	if err := unix.Linkat(m.dirFd, tmp, m.dirFd, "by-sum/"+sum, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", false, &os.LinkError{Op: "link", Old: tmp, New: "by-sum/" + sum, Err: err}
	}
	rc := &retainedCopy{name: "files/" + rel + "_" + sum, bytes: st.Blocks * 512, last: at}
	m.retained[sum] = rc
	m.bytes += rc.bytes
	m.stats.RetainedFiles.Add(1)
	m.stats.RetainedBytes.Add(st.Size)
	m.dirty[filepath.Join(m.dir, "by-sum")] = true
	return rc.name, true, nil
}

// moveIn renames the original at tmp to its cmroot name (both relative to
// the cmroot), making the directory it goes in (once: the cleaner may
// remove one since, and then it is made again).
func (m *Manager) moveIn(tmp, name string) error {
	dir := filepath.Join(m.dir, filepath.Dir(name))
	m.mu.Lock()
	made := m.madeDirs[dir]
	m.mu.Unlock()
	if !made {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	}
	err := unix.Renameat(m.dirFd, tmp, m.dirFd, name)
	if errors.Is(err, unix.ENOENT) {
		if err = os.MkdirAll(dir, 0o700); err == nil {
			err = unix.Renameat(m.dirFd, tmp, m.dirFd, name)
		}
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: tmp, New: name, Err: err}
	}
	m.mu.Lock()
	m.madeDirs[dir] = true
	m.dirty[dir] = true
	m.mu.Unlock()
	return nil
}

// markDirty notes files and directories of the cmroot to sync with the
// event log.
func (m *Manager) markDirty(paths ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range paths {
		m.dirty[p] = true
	}
}

// syncAll makes what the cmroot gained durable, then the event log, so a
// machine crash loses at most the last sync interval of both together.
func (m *Manager) syncAll() error {
	m.mu.Lock()
	dirty := m.dirty
	m.dirty = map[string]bool{}
	m.mu.Unlock()
	if m.tmpDirty.Swap(false) {
		dirty[filepath.Join(m.dir, "tmp")] = true
	}
	for p := range dirty {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // filed and gone since
		}
		unix.Fsync(fd)
		unix.Close(fd)
	}
	return m.log.sync()
}

// readResolved returns the events from..to (filed records left out,
// each merged into the event it completes).
func readResolved(dir string, from, to uint64) ([]Event, error) {
	var out []Event
	filed := map[uint64]Event{}
	err := readEvents(dir, from, ^uint64(0), func(ev Event) error {
		if ev.Type == EvFiled {
			filed[ev.Ref] = ev
		} else if ev.ID <= to {
			out = append(out, ev)
		}
		return nil
	})
	for i := range out {
		if f, ok := filed[out[i].ID]; ok {
			out[i].Sum, out[i].Name, out[i].Pending = f.Sum, f.Name, ""
		}
	}
	return out, err
}

// recoverTmp deals with what a crash left in tmp: originals whose event
// was recorded are filed; an original moved out of the tree whose event
// was not is filed with a recovered delete event; a link or copy whose
// change did not happen is removed.
func (m *Manager) recoverTmp() error {
	waiting := map[string]Event{}
	filed := map[uint64]string{} // event id: the name its original was filed as
	err := readEvents(m.log.dir, 0, ^uint64(0), func(ev Event) error {
		if ev.Type == EvFiled {
			filed[ev.Ref] = ev.Name
		} else if ev.Pending != "" {
			waiting[ev.Pending] = ev
		}
		return nil
	})
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(filepath.Join(m.dir, "tmp"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := "tmp/" + e.Name()
		full := filepath.Join(m.dir, name)
		if ev, ok := waiting[name]; ok {
			delete(waiting, name)
			filedAs, done := filed[ev.ID]
			switch {
			case !done:
				m.fileOne(fileJob{id: ev.ID, tmp: name, rel: retainedPath(ev), at: time.Unix(0, ev.TimeNs)})
			case e.Type().IsRegular() && filedAs != "" && !exists(filepath.Join(m.dir, filedAs)):
				// Filed, but the crash came before it moved to its name.
				if err := m.moveIn(name, filedAs); err != nil {
					m.cfg.Log.Error("cm: retained original not moved to its name; by-sum has it", "event", ev.ID, "name", filedAs, "err", err)
				}
			default:
				os.RemoveAll(full) // filed, and its content is at its name
			}
			continue
		}
		how, rel := parseTmpName(e.Name())
		if !e.Type().IsRegular() || rel == "" || (how != tmpMove && !m.replacedInTree(full, rel, how)) {
			os.RemoveAll(full) // its change never happened
			continue
		}
		var st unix.Stat_t
		unix.Lstat(full, &st)
		id, at := m.record(Event{Type: EvDelete, Kind: KindFile, Path: rel, Recovered: true, Pending: name, Size: st.Size})
		m.fileOne(fileJob{id: id, tmp: name, rel: rel, at: at})
		m.cfg.Log.Warn("cm: an original retained just before a crash was filed; its event is marked recovered", "path", rel)
	}
	for name, ev := range waiting {
		if _, done := filed[ev.ID]; !done {
			m.cfg.Log.Error("cm: an event's retained original is missing from tmp; that version cannot be restored", "event", ev.ID, "path", ev.Path, "tmp", name)
		}
	}
	return nil
}

// replacedInTree says whether the original linked into tmp (how is
// tmpLink) was replaced in the tree by the rename it was taken for.
// Copies are taken before their change, whose event would name them.
func (m *Manager) replacedInTree(full, rel, how string) bool {
	if how != tmpLink {
		return false
	}
	var kept, now unix.Stat_t
	if unix.Lstat(full, &kept) != nil {
		return false
	}
	if unix.Lstat(filepath.Join(m.root, rel), &now) != nil {
		return true
	}
	return !sameInode(&kept, &now)
}

func exists(path string) bool {
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil
}

func parseTmpName(n string) (how, rel string) {
	parts := strings.SplitN(n, "-", 4)
	if len(parts) != 4 {
		return "", ""
	}
	rel, _ = url.PathUnescape(parts[3])
	return parts[0], rel
}
