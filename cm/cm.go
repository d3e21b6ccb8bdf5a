// Package cm is change management: before a file is deleted, replaced by a
// rename, truncated or overwritten in place through the mount, its original
// is retained in the cmroot, named by its checksum, and every change is an
// event with a growing id in an append-only log. From the log and the
// retained files, cm reconstructs the tree as it was at any retained event:
// to restore a deleted file or directory, or to dump the changes between
// two events for a replica, which loads exactly that state.
//
// The cmroot is a directory (by default in the mount's state dir, on the
// same file system as the tree, so retaining a file going away is a
// rename):
//
//	events/<first id>.log   the event log (see eventLog)
//	files/<path>_<sha256>   retained originals, by the path they had
//	by-sum/<sha256>         a second name of each, for lookups by checksum
//	tmp/                    originals being retained; adopted after a crash
//
// LOCK ORDERING: Manager.tree (held shared by every change, exclusively by
// a dump's walk of the tree) before Manager.mu before eventLog.mu.
package cm

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Config says where the cmroot is and how long it keeps things.
type Config struct {
	// Retain is how long a retained original and its events are kept
	// after the last event that refers to it (default 24h).
	Retain time.Duration
	// MaxBytes caps the space of retained originals; the oldest go first
	// (0: no cap).
	MaxBytes int64
	// Exclude are globs (path.Match) of paths, relative to the tree's
	// root, that are not tracked; a glob without a slash matches the base
	// name (e.g. "*.tmp" for Kafka's checkpoint temporaries).
	Exclude []string
	// SyncInterval is how often the event log is synced to disk (an event
	// reaches the kernel at once, so a crash of tierfs loses none; a crash
	// of the machine loses at most this much). Default 1s.
	SyncInterval time.Duration
	// Hide is a name at the top of the tree that is not part of it (the
	// mount's state dir).
	Hide string
	// Remote reads evicted files' bytes from the store; nil without one.
	Remote Remote
	Log    *slog.Logger
	Now    func() time.Time
}

// Manager is the change management of one tree.
type Manager struct {
	cfg Config

	// tree is held shared by every change (its syscall and its event
	// together) and exclusively while a dump walks the tree, so the walk
	// sees the tree exactly as of one event.
	tree sync.RWMutex

	ready    chan struct{}
	readyErr error
	root     string          // the tree, as reachable by this process
	dir      string          // the cmroot
	dirFd    int             // an O_PATH descriptor of it
	madeDirs map[string]bool // directories of files/ made; GUARDED_BY(mu)
	dirName  string          // the cmroot as the kernel names it (no /proc links)
	log      *eventLog
	tmpSeq   atomic.Uint64
	tmpDirty atomic.Bool // tmp/ gained an entry since the last sync

	mu       sync.Mutex
	retained map[string]*retainedCopy // by checksum; GUARDED_BY(mu)
	bytes    int64                    // allocated bytes of all retained; GUARDED_BY(mu)
	dirty    map[string]bool          // cmroot paths to sync with the log; GUARDED_BY(mu)

	filer filer
	bufs  sync.Pool // of hash buffers

	stats     Stats
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// retainedCopy is one retained original.
type retainedCopy struct {
	name  string // relative to the cmroot
	bytes int64  // allocated on disk
	last  time.Time
}

// Stats count what cm did since the start.
type Stats struct {
	Events        atomic.Int64
	RetainedFiles atomic.Int64 // originals retained (not counting duplicates)
	RetainedBytes atomic.Int64 // bytes of originals retained
	Deduplicated  atomic.Int64 // originals whose content was already retained
	Expired       atomic.Int64 // retained originals removed by the cleaner
	Errors        atomic.Int64 // changes refused because the original could not be retained
}

// New makes a Manager; it serves changes once Attach has opened its cmroot.
func New(cfg Config) *Manager {
	if cfg.Retain <= 0 {
		cfg.Retain = 24 * time.Hour
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Manager{cfg: cfg, ready: make(chan struct{}), dirFd: -1, retained: map[string]*retainedCopy{}, dirty: map[string]bool{}, madeDirs: map[string]bool{}, stop: make(chan struct{})}
	m.filer.cond = sync.NewCond(&m.filer.mu)
	return m
}

// Attach opens the cmroot dir for the tree at root (both as reachable by
// this process), recovers what a crash left, and starts the background
// syncer and cleaner. Changes wait until it is done.
func (m *Manager) Attach(root, dir string) error {
	m.root, m.dir = root, dir
	err := m.open()
	m.readyErr = err
	close(m.ready)
	if err != nil {
		if m.dirFd >= 0 {
			unix.Close(m.dirFd)
		}
		return err
	}
	m.wg.Add(2)
	go m.background()
	go m.fileLoop()
	return nil
}

// Stats returns the counters.
func (m *Manager) Stats() *Stats { return &m.stats }

// Retained is how many originals the cmroot holds and the bytes they
// take on disk.
func (m *Manager) Retained() (files int, bytes int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.retained), m.bytes
}

// Flush files every original waiting and syncs the log and the cmroot.
func (m *Manager) Flush() error {
	if err := m.wait(); err != nil {
		return err
	}
	m.flushFiler()
	return m.syncAll()
}

// Pending is how many originals wait to be filed.
func (m *Manager) Pending() int {
	m.filer.mu.Lock()
	defer m.filer.mu.Unlock()
	return len(m.filer.queue)
}

// Dir is the cmroot and Root the tree, as this process reaches them.
func (m *Manager) Dir() string  { return m.dir }
func (m *Manager) Root() string { return m.root }

// Holds says whether path, the name the kernel gives an open file's inode
// (readlink of its /proc/self/fd link), is inside the cmroot: the file
// was deleted and lives on as a retained original only. The file system
// then shows its link count as 0, as natively.
func (m *Manager) Holds(path string) bool {
	return m.dirName != "" && strings.HasPrefix(path, m.dirName+"/")
}

// Remote is how evicted files are read (nil: no store).
func (m *Manager) Remote() Remote { return m.cfg.Remote }

func (m *Manager) open() error {
	for _, d := range []string{"files", "by-sum", "tmp"} {
		if err := os.MkdirAll(filepath.Join(m.dir, d), 0o700); err != nil {
			return fmt.Errorf("cmroot %s: %w", m.dir, err)
		}
	}
	// Changes work in the cmroot relative to a descriptor of it: its
	// path is often through /proc/self/fd (the mount hides the backing
	// dir), and the kernel would walk and revalidate that at every step.
	fd, err := unix.Open(m.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cmroot %s: %w", m.dir, err)
	}
	m.dirFd = fd
	if d, err := filepath.EvalSymlinks(m.dir); err == nil {
		m.dirName = d
	}
	if m.log, err = openLog(filepath.Join(m.dir, "events")); err != nil {
		return err
	}
	if err := m.loadRetained(); err != nil {
		return err
	}
	return m.recoverTmp()
}

// loadRetained rebuilds the index of retained originals from the log and
// the by-sum directory.
func (m *Manager) loadRetained() error {
	first, err := firstID(m.log.dir)
	if err != nil {
		return err
	}
	err = readEvents(m.log.dir, first, ^uint64(0), func(ev Event) error {
		if ev.Type == EvFiled {
			m.noteRetained(ev.Sum, ev.Name, time.Unix(0, ev.TimeNs))
		}
		return nil
	})
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(filepath.Join(m.dir, "by-sum"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		sum := e.Name()
		if _, ok := m.retained[sum]; !ok && ValidSum(sum) {
			// Retained but its events are gone (a crash before the
			// event, or a log cut by hand): kept until it expires.
			m.retained[sum] = &retainedCopy{name: "by-sum/" + sum, last: m.cfg.Now()}
		}
	}
	for sum, rc := range m.retained {
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(m.dir, "by-sum", sum), &st) != nil {
			delete(m.retained, sum) // expired, or never finished
			continue
		}
		rc.bytes = st.Blocks * 512
		m.bytes += rc.bytes
	}
	return nil
}

func (m *Manager) noteRetained(sum, name string, at time.Time) {
	rc := m.retained[sum]
	if rc == nil {
		rc = &retainedCopy{name: name}
		m.retained[sum] = rc
	}
	if at.After(rc.last) {
		rc.last = at
	}
}

// wait blocks until Attach finished.
func (m *Manager) wait() error {
	<-m.ready
	return m.readyErr
}

// Close stops the background work and syncs the log. Closing again does
// nothing.
func (m *Manager) Close() error {
	select {
	case <-m.ready:
	default:
		return nil
	}
	if m.readyErr != nil {
		return nil
	}
	m.closeOnce.Do(func() { m.closeErr = m.close() })
	return m.closeErr
}

func (m *Manager) close() error {
	m.filer.mu.Lock()
	m.filer.closing = true
	m.filer.cond.Broadcast()
	m.filer.mu.Unlock()
	close(m.stop)
	m.wg.Wait()
	err := m.syncAll()
	if cerr := m.log.close(); err == nil {
		err = cerr
	}
	unix.Close(m.dirFd)
	return err
}

func (m *Manager) background() {
	defer m.wg.Done()
	sync := time.NewTicker(m.cfg.SyncInterval)
	defer sync.Stop()
	clean := time.NewTicker(cleanInterval(m.cfg.Retain))
	defer clean.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-sync.C:
			if err := m.syncAll(); err != nil {
				m.cfg.Log.Error("cm: sync of the event log failed", "err", err)
			}
		case <-clean.C:
			if n, err := m.Clean(); err != nil {
				m.cfg.Log.Warn("cm: cleaning", "err", err)
			} else if n > 0 {
				m.cfg.Log.Info("cm: expired retained originals", "count", n)
			}
		}
	}
}

// cleanInterval: often enough that retention is kept to within a few
// percent, at most once a minute.
func cleanInterval(retain time.Duration) time.Duration {
	return min(max(retain/50, time.Second), time.Minute)
}

// Excluded says whether rel is not tracked.
func (m *Manager) Excluded(rel string) bool {
	base := path.Base(rel)
	if strings.HasPrefix(base, tempPrefix) {
		return true // a load's own temporary file
	}
	for _, g := range m.cfg.Exclude {
		target := rel
		if !strings.Contains(g, "/") {
			target = base
		}
		if ok, _ := path.Match(g, target); ok {
			return true
		}
	}
	return false
}

// Enter is called before a change through the mount (its syscall and its
// event); the returned func after. It fails only when the cmroot could not
// be opened.
func (m *Manager) Enter() (leave func(), err error) {
	if err := m.wait(); err != nil {
		return nil, err
	}
	m.tree.RLock()
	return m.tree.RUnlock, nil
}

// record appends ev to the log; a failure is logged (the change happened,
// and saying no now would not undo it).
func (m *Manager) record(ev Event) (uint64, time.Time) {
	now := m.cfg.Now()
	ev.TimeNs = now.UnixNano()
	if err := m.log.append(&ev); err != nil {
		m.stats.Errors.Add(1)
		m.cfg.Log.Error("cm: event not recorded", "type", ev.Type, "path", ev.Path, "err", err)
		return 0, now
	}
	m.stats.Events.Add(1)
	return ev.ID, now
}

// errRetain wraps a failure to retain an original: the change is refused.
type errRetain struct {
	path string
	err  error
}

func (e *errRetain) Error() string {
	return fmt.Sprintf("change management: cannot retain the original of %s, change refused: %v", e.path, e.err)
}
func (e *errRetain) Unwrap() error { return e.err }

// ErrNotRetained is what errors from a refused change match.
var ErrNotRetained = errors.New("original not retained")

func (e *errRetain) Is(target error) bool { return target == ErrNotRetained }
