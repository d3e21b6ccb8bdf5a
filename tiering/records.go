package tiering

import (
	"hash/fnv"
	"sync"
	"time"

	"github.com/tierfs/tierfs/internal/tiered"
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
//
// It keeps what the passes, status and the metrics ask of a record
// (recordState, 40 bytes an inode), not the record: at 100,000 segments
// the whole records were about 29 MiB of a mount's heap. A caller that
// needs the record itself reads it from the file.
type records struct {
	now func() time.Time

	mu    sync.Mutex
	byIno map[uint64]cachedRecord // GUARDED_BY(mu)
}

type cachedRecord struct {
	ctime int64 // ns
	rs    recordState
}

// recordState is what a segment's record says, as far as the passes
// ask.
type recordState struct {
	Has   bool // the file has a record (it was shipped)
	State tiered.State
	Freed bool // see Record.Freed
	// SameFile says the record was made of the file as it is: its
	// inode, size and mtime (a shipped file Kafka truncated since has
	// a stale copy).
	SameFile bool
	keyHash  uint64 // of Record.Key
}

// names says whether the record's key is key. Two keys of one hash
// would make a shipment look recorded by a file that recorded another:
// its copy would be kept, never a live one deleted.
func (rs recordState) names(key string) bool {
	return rs.Has && rs.keyHash == hashKey(key)
}

func hashKey(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()
}

// stateOf is what rec says of the file seg.
func stateOf(seg Segment, rec Record, has bool) recordState {
	if !has {
		return recordState{}
	}
	return recordState{Has: true, State: rec.State, Freed: rec.Freed,
		SameFile: rec.Ino == seg.Ino && rec.Size == seg.Size && rec.MtimeNs == seg.Mtime.UnixNano(),
		keyHash:  hashKey(rec.Key)}
}

// recordSettle is how old a ctime must be before a record read under
// it is kept.
const recordSettle = time.Second

// ctimeSettled says whether what was read of a file under ctime (ns; 0:
// unknown) may be kept: the ctime is at least recordSettle old at now.
func ctimeSettled(ctime int64, now time.Time) bool {
	return ctime != 0 && now.Sub(time.Unix(0, ctime)) >= recordSettle
}

func newRecords(now func() time.Time) *records {
	return &records{now: now, byIno: map[uint64]cachedRecord{}}
}

// of is what the record of segment seg (as Scan saw it: inode and
// ctime) says.
func (rc *records) of(seg Segment) (recordState, error) {
	if seg.Ctime != 0 {
		rc.mu.Lock()
		c, ok := rc.byIno[seg.Ino]
		rc.mu.Unlock()
		if ok && c.ctime == seg.Ctime {
			return c.rs, nil
		}
	}
	rec, has, err := readRecord(seg.LogPath())
	if err != nil {
		return recordState{}, err
	}
	rs := stateOf(seg, rec, has)
	if !ctimeSettled(seg.Ctime, rc.now()) {
		return rs, nil
	}
	rc.mu.Lock()
	rc.byIno[seg.Ino] = cachedRecord{ctime: seg.Ctime, rs: rs}
	rc.mu.Unlock()
	return rs, nil
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
