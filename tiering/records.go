package tiering

import (
	"sync"
	"time"
)

// records keeps what the tierer read of each segment's record (the
// trusted.tierfs attribute), by inode, for as long as the inode's ctime
// is the one the scan saw before the read. Any change to a file (its
// bytes, size, name, mode or record) moves its ctime, so a pass reads
// the record of a file that did not change from memory: an idle pass
// costs a directory read and a stat per segment, not a getxattr and a
// decode. A ctime younger than recordSettle is not trusted (two changes
// within one tick of the kernel's coarse clock can share one), and what
// the scan did not see again is forgotten.
type records struct {
	now func() time.Time

	mu    sync.Mutex
	byIno map[uint64]cachedRecord // GUARDED_BY(mu)
}

type cachedRecord struct {
	ctime int64 // ns
	rec   Record
	has   bool
}

// recordSettle is how old a ctime must be before a record read under
// it is kept.
const recordSettle = time.Second

func newRecords(now func() time.Time) *records {
	return &records{now: now, byIno: map[uint64]cachedRecord{}}
}

// of is the record of segment seg (as Scan saw it: inode and ctime).
func (rc *records) of(seg Segment) (Record, bool, error) {
	if seg.Ctime != 0 {
		rc.mu.Lock()
		c, ok := rc.byIno[seg.Ino]
		rc.mu.Unlock()
		if ok && c.ctime == seg.Ctime {
			return c.rec, c.has, nil
		}
	}
	rec, has, err := readRecord(seg.Path)
	if err != nil || seg.Ctime == 0 || rc.now().Sub(time.Unix(0, seg.Ctime)) < recordSettle {
		return rec, has, err
	}
	rc.mu.Lock()
	rc.byIno[seg.Ino] = cachedRecord{ctime: seg.Ctime, rec: rec, has: has}
	rc.mu.Unlock()
	return rec, has, nil
}

// keep forgets the inodes a full scan did not see.
func (rc *records) keep(seen map[uint64]*Segment) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for ino := range rc.byIno {
		if _, ok := seen[ino]; !ok {
			delete(rc.byIno, ino)
		}
	}
}

// size is the number of records kept.
func (rc *records) size() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.byIno)
}

// forget drops what was read of inode ino (the tierer changed it).
func (rc *records) forget(ino uint64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	delete(rc.byIno, ino)
}
