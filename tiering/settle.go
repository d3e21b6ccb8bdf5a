package tiering

import (
	"cmp"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// partScans remember what the last scan of each partition found, so
// that a pass scans again only a partition that may have changed: its
// directory changed (a segment created, renamed or removed: Kafka rolls,
// deletes and truncates segments by name), or it was not settled (a
// segment waited for something other than being the active one, a step
// failed, or a shipment's file was only found by handle), or a
// retention age falls due. A followed partition settles the same way:
// once each of its rolled segments is mapped onto the leader's upload
// (one that waits for the leader is looked at every pass). A settled partition costs a
// stat of its directory and of its active segment per pass, not a stat
// and a record per segment. Every Config.RescanInterval a pass scans
// every partition whatever it knows (the safety net for a change made
// in place, which no directory shows), and logs what it finds that the
// passes had not seen.
type partScans struct {
	log *slog.Logger

	mu       sync.RWMutex
	byName   map[string]*partScan // GUARDED_BY(mu)
	byIno    map[uint64]*partScan // the partition of each segment scanned; GUARDED_BY(mu)
	lastFull time.Time            // GUARDED_BY(mu)
}

type partScan struct {
	dir    dirStamp
	active uint64    // the active segment's inode when scanned
	p      Partition // as scanned, never changed after (see current)
	// byPass says a pass made this scan. One a view made is never
	// settled: no pass looked at what it found (a segment rolled since
	// the pass's own scan, say).
	byPass  bool
	settled atomic.Bool  // cleared by touch, at any time
	touched atomic.Bool  // a touch since the scan: the pass cannot settle it
	due     atomic.Int64 // scan again by then (unix ns; 0: no deadline)
	// rolled and local are what the summary (summarizeScan) and
	// eviction (evictor.localOf) found of the scan's rolled segments,
	// kept by keptRolled.
	rolled atomic.Pointer[PartitionSummary]
	local  atomic.Pointer[rolledLocal]
}

// keptRolled is what fold made of a scan's rolled segments (all but the
// active one), starting from the zero T, kept in slot once their records
// have settled (recordSettle, as the records cache keeps them) and fold
// found nothing amiss (it returns false on an error), and reused while
// the scan is: while a scan is reused none of its segments changed (any
// change touches it, and a touched scan is not reused).
func keptRolled[T any](slot *atomic.Pointer[T], rolled []Segment, now time.Time, fold func(*T, Segment) bool) *T {
	if r := slot.Load(); r != nil {
		return r
	}
	r, keep := new(T), true
	for _, seg := range rolled {
		keep = fold(r, seg) && ctimeSettled(seg.Ctime, now) && keep
	}
	if keep {
		slot.Store(r)
	}
	return r
}

// dirStamp identifies a directory's contents: any entry created,
// removed or renamed moves its mtime and ctime.
type dirStamp struct {
	ino          uint64
	mtime, ctime int64
}

func stampOf(dir string) (dirStamp, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return dirStamp{}, err
	}
	return dirStamp{ino: st.Ino, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, nil
}

func newPartScans(log *slog.Logger) *partScans {
	return &partScans{log: log, byName: map[string]*partScan{}, byIno: map[uint64]*partScan{}}
}

// fullDue says whether this pass scans every partition, and if so
// starts the interval again.
func (ps *partScans) fullDue(now time.Time, every time.Duration) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if every > 0 && !ps.lastFull.IsZero() && now.Sub(ps.lastFull) < every {
		return false
	}
	ps.lastFull = now
	return true
}

// scan is the live partitions under root, each scanned again or, when
// settled and unchanged (and full is false), as last scanned; scanned
// says which were scanned.
// from are the scans they came from (reused or made now), in the order
// of parts.
func (ps *partScans) scan(root string, full bool, now time.Time) (parts []Partition, from []*partScan, scanned map[string]bool, err error) {
	dirs, err := livePartitionDirs(root)
	if err != nil {
		return nil, nil, nil, err
	}
	// The directories are read without the lock (each last scan is
	// looked up under it alone): touch, on the write path, never waits
	// for a scan.
	last := func(name string) *partScan {
		ps.mu.RLock()
		defer ps.mu.RUnlock()
		return ps.byName[name]
	}
	scanned = map[string]bool{}
	fresh := map[string]*partScan{}
	parts, from = make([]Partition, 0, len(dirs)), make([]*partScan, 0, len(dirs))
	for _, d := range dirs {
		name, pd := d.name, d.pd
		stamp, err := stampOf(filepath.Join(root, name))
		if err != nil {
			continue // removed meanwhile
		}
		old := last(name)
		if !full && old.reusable(stamp, now) {
			parts, from = append(parts, old.current()), append(from, old)
			continue
		}
		p, err := scanPartition(root, name, pd)
		if err != nil {
			continue
		}
		if full && old != nil && old.settled.Load() && old.dir == stamp {
			if what := changedInPlace(old.p, p); what != "" {
				ps.log.Info("a full scan found a change in place that the passes had not seen", "partition", name, "segment", what)
			}
		}
		ns := newScan(stamp, p)
		ns.byPass = true
		fresh[name] = ns
		parts, from = append(parts, p), append(from, ns)
		scanned[name] = true
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, ns := range fresh {
		ps.installLocked(ns)
	}
	// A partition whose directory is gone (or was removed while it was
	// read) is forgotten. parts are in the order of dirs, by name.
	for name, old := range ps.byName {
		if _, ok := slices.BinarySearchFunc(parts, name, func(p Partition, name string) int { return cmp.Compare(p.Name, name) }); !ok {
			ps.dropLocked(old)
			delete(ps.byName, name)
		}
	}
	return parts, from, scanned, nil
}

// newScan is what a scan of partition p under the directory stamp found.
func newScan(stamp dirStamp, p Partition) *partScan {
	ns := &partScan{dir: stamp, p: p}
	if n := len(p.Segments); n > 0 {
		ns.active = p.Segments[n-1].Ino
	}
	return ns
}

// installLocked makes ns its partition's last scan. GUARDED_BY(mu).
func (ps *partScans) installLocked(ns *partScan) {
	if old := ps.byName[ns.p.Name]; old != nil {
		ps.dropLocked(old)
	}
	for _, seg := range ns.p.Segments {
		ps.byIno[seg.Ino] = ns
	}
	ps.byName[ns.p.Name] = ns
}

// dropLocked forgets the segments of s. GUARDED_BY(mu).
func (ps *partScans) dropLocked(s *partScan) {
	for _, seg := range s.p.Segments {
		if ps.byIno[seg.Ino] == s {
			delete(ps.byIno, seg.Ino)
		}
	}
}

// viewed is a partition as a view found it, and the scan it is of (nil
// when that scan was not kept: a pass replaced it meanwhile).
type viewed struct {
	p Partition
	s *partScan
}

// viewScans is the live partitions under root, by name, each with the
// scan it is of, for status and the metrics: each as last scanned while
// that scan still holds (settled and unchanged, or not settled but
// neither its directory nor its files changed since: what a pass still
// has to do there is not what is on disk), the others scanned now. A partition it scans again keeps that
// scan as its last, unsettled: its next pass looks at it as before, and a
// view after it scans only what changed since. So a scraper costs what
// changed between two scrapes, not a scan of every partition the passes
// have not settled (all of them while a backlog ships).
func (ps *partScans) viewScans(root string) (vs []viewed, rescanned int, err error) {
	dirs, err := livePartitionDirs(root)
	if err != nil {
		return nil, 0, err
	}
	for _, d := range dirs {
		name, pd := d.name, d.pd
		stamp, err := stampOf(filepath.Join(root, name))
		if err != nil {
			continue // removed meanwhile
		}
		ps.mu.RLock()
		old := ps.byName[name]
		ps.mu.RUnlock()
		if old.unchanged(stamp) { // (every reusable scan is)
			vs = append(vs, viewed{old.current(), old})
			continue
		}
		p, err := scanPartition(root, name, pd)
		if err != nil {
			continue
		}
		var kept *partScan
		ps.mu.Lock()
		if ps.byName[name] == old {
			// Not replaced by a pass meanwhile (whose scan it would
			// be older than).
			kept = newScan(stamp, p)
			ps.installLocked(kept)
		}
		ps.mu.Unlock()
		vs = append(vs, viewed{p, kept})
		rescanned++
	}
	return vs, rescanned, nil
}

// unchanged says whether nothing changed in a partition since s scanned
// it: its directory as it was (stamp now), and no touch since.
func (s *partScan) unchanged(stamp dirStamp) bool {
	return s != nil && s.dir == stamp && !s.touched.Load()
}

// reusable says whether a partition last scanned as s (nil: never) can
// be taken as it is: settled, its directory unchanged (stamp now), and
// no retention age due.
func (s *partScan) reusable(stamp dirStamp, now time.Time) bool {
	return s != nil && s.settled.Load() && s.dir == stamp && (s.due.Load() == 0 || now.UnixNano() < s.due.Load())
}

// current is the partition as scanned, with its active segment's size
// brought up to date. What was scanned is never changed (a scan and a
// view may run at once, and their callers keep what they got): while
// the active segment is as scanned, that is returned as it is; once it
// changed, a copy. An idle partition costs no allocation.
func (s *partScan) current() Partition {
	p := s.p
	n := len(p.Segments)
	if n == 0 {
		return p
	}
	last := p.Segments[n-1]
	var st syscall.Stat_t
	if syscall.Stat(last.LogPath(), &st) != nil || st.Ino != last.Ino {
		return p
	}
	if st.Size == last.Size && st.Mtim.Nano() == last.Mtime.UnixNano() && st.Ctim.Nano() == last.Ctime && st.Blocks*512 == last.Alloc {
		return p
	}
	p.Segments = slices.Clone(p.Segments)
	a := &p.Segments[n-1]
	a.Size, a.Mtime, a.Ctime, a.Alloc = st.Size, time.Unix(0, st.Mtim.Nano()), st.Ctim.Nano(), st.Blocks*512
	return p
}

// changedInPlace names a rolled segment that differs between two scans
// of an unchanged directory ("" if none does).
func changedInPlace(old, now Partition) string {
	if len(old.Segments) != len(now.Segments) {
		return "(the segment list)"
	}
	for i, a := range old.Segments {
		b := now.Segments[i]
		if i == len(old.Segments)-1 {
			break // the active segment grows
		}
		if a.Ino != b.Ino || a.Size != b.Size || !a.Mtime.Equal(b.Mtime) {
			return filepath.Base(b.LogPath())
		}
	}
	return ""
}

// settle records what a pass over a scanned partition found: settled,
// and when it falls due.
func (ps *partScans) settle(name string, settled bool, due time.Time) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if s := ps.byName[name]; s != nil && s.byPass {
		s.settled.Store(settled && !s.touched.Load())
		if due.IsZero() {
			s.due.Store(0)
		} else {
			s.due.Store(due.UnixNano())
		}
	}
}

// touch unsettles the partition of segment inode ino (it was written or
// truncated through the mount, or the tierer changed its state): the
// next pass looks at it. The active segment's writes do not count (its
// size is looked at anyway). Cheap enough for every write.
func (ps *partScans) touch(ino uint64) {
	ps.mu.RLock()
	s := ps.byIno[ino]
	ps.mu.RUnlock()
	if s == nil {
		return
	}
	if s.active == ino {
		return
	}
	s.touched.Store(true)
	s.settled.Store(false)
}

// settledPassOf says whether a pass's report over one partition leaves
// it settled: nothing waited but the active segment, nothing failed or
// was recovered.
func settledPassOf(r Report) bool {
	if len(r.Errors) > 0 || r.Recovered > 0 {
		return false
	}
	for why := range r.Waiting {
		if why != whyActive {
			return false
		}
	}
	return true
}
