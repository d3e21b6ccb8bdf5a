// Package tiering ships cold Kafka segments of a backing directory to a
// store and frees their local bytes once the remote copy is verified. It
// knows Kafka's log directory layout and state files (through idx/kafka)
// and moves bytes through chunkxfer; it knows nothing of FUSE.
package tiering

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/idx/kafka"
)

// Segment is one .log file of a partition and what eligibility needs.
type Segment struct {
	Partition string // directory name, e.g. orders-0
	TP        kafka.TopicPartition
	Base      int64
	// Next is the base offset of the following segment, or -1 for the
	// active (last) segment.
	Next int64
	// Dir is the directory of the segment's .log (for a scanned segment
	// its partition's directory in the backing directory, where the file
	// is <Base>.log: LogPath), and of its other files.
	Dir string
	// path, when set, is the file's path instead (a segment found some
	// other way: segmentAt). A scan leaves it empty: at 100,000 segments
	// a path of each would be 8 MiB of the catalog's memory.
	path  string
	Size  int64
	Mtime time.Time
	Ino   uint64
	Ctime int64 // ns; 0 where unknown
	Alloc int64 // bytes allocated on disk
}

// LogPath is the absolute path of the segment's .log.
func (s Segment) LogPath() string {
	if s.path != "" {
		return s.path
	}
	return sidecar(s, kafka.KindLog)
}

// segmentAt is the segment whose .log is the file at path.
func segmentAt(path string) Segment {
	return Segment{Dir: filepath.Dir(path), path: path}
}

// Partition is a live partition directory and its segments, by offset.
type Partition struct {
	Name     string
	TP       kafka.TopicPartition
	Dir      string
	Segments []Segment
}

// Scan lists the live partitions under root and their .log segments.
// Directories being deleted, moved or left stray, the KRaft metadata log
// and tierfs's own state are left alone.
func Scan(root string) ([]Partition, error) {
	dirs, err := livePartitionDirs(root)
	if err != nil {
		return nil, err
	}
	var out []Partition
	for _, d := range dirs {
		p, err := scanPartition(root, d.name, d.pd)
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, p)
	}
	return out, nil
}

// liveDir is a live partition directory under the root.
type liveDir struct {
	name string
	pd   kafka.PartitionDir
}

// livePartitionDirs are the directories under root that tierfs tiers.
func livePartitionDirs(root string) ([]liveDir, error) {
	des, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []liveDir
	for _, de := range des {
		if !de.IsDir() {
			continue
		}
		if pd, ok := livePartitionDir(de.Name()); ok {
			out = append(out, liveDir{de.Name(), pd})
		}
	}
	return out, nil
}

// livePartitionDir parses name as a partition directory that tierfs
// tiers: live (not being deleted, moved or stray), and not the KRaft
// metadata log.
func livePartitionDir(name string) (kafka.PartitionDir, bool) {
	pd, ok := kafka.ParsePartitionDir(name)
	return pd, ok && pd.State == kafka.DirLive && pd.Topic != "__cluster_metadata"
}

// ScanPartition lists the segments of the live partition dir name.
func ScanPartition(root, name string) (Partition, error) {
	pd, ok := livePartitionDir(name)
	if !ok {
		return Partition{}, fmt.Errorf("%s is not a live partition directory", name)
	}
	return scanPartition(root, name, pd)
}

func scanPartition(root, name string, pd kafka.PartitionDir) (Partition, error) {
	p := Partition{Name: name, TP: kafka.TopicPartition{Topic: pd.Topic, Partition: pd.Partition}, Dir: filepath.Join(root, name)}
	files, err := os.ReadDir(p.Dir)
	if err != nil {
		return p, err
	}
	isSegment := func(f os.DirEntry) (kafka.SegmentName, bool) {
		sn, ok := kafka.ParseSegmentName(f.Name())
		return sn, ok && sn.Kind == kafka.KindLog && sn.Suffix == "" && f.Type().IsRegular()
	}
	// The scan is kept (partScans) until the partition changes: its
	// segments get a slice of their own size, not what appends grew.
	n := 0
	for _, f := range files {
		if _, ok := isSegment(f); ok {
			n++
		}
	}
	p.Segments = make([]Segment, 0, n)
	for _, f := range files {
		sn, ok := isSegment(f)
		if !ok {
			continue
		}
		fi, err := f.Info()
		if err != nil {
			continue
		}
		seg := Segment{Partition: p.Name, TP: p.TP, Base: sn.BaseOffset, Dir: p.Dir, Size: fi.Size(), Mtime: fi.ModTime()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			seg.Ino, seg.Ctime, seg.Alloc = st.Ino, st.Ctim.Nano(), st.Blocks*512
		}
		p.Segments = append(p.Segments, seg)
	}
	slices.SortFunc(p.Segments, func(a, b Segment) int { return cmp.Compare(a.Base, b.Base) })
	for i := range p.Segments {
		p.Segments[i].Next = -1
		if i+1 < len(p.Segments) {
			p.Segments[i].Next = p.Segments[i+1].Base
		}
	}
	return p, nil
}

// Checkpoints are the broker's offsets that bound what may be shipped.
type Checkpoints struct {
	Recovery      kafka.OffsetCheckpoint // recovery-point-offset-checkpoint: flushed up to
	HighWatermark kafka.OffsetCheckpoint // replication-offset-checkpoint: committed up to
	// Cleaner is the cleaner-offset-checkpoint: the partitions the log
	// cleaner compacts.
	Cleaner kafka.OffsetCheckpoint
}

// ReadCheckpoints reads the checkpoint files at the root of a log dir.
// A missing file is an empty checkpoint (nothing is flushed or
// committed yet, so nothing ships).
func ReadCheckpoints(root string) (Checkpoints, error) {
	return (*checkpointFiles)(nil).read(root, time.Time{})
}

// checkpointFiles keeps the checkpoint files as last parsed, by each
// file's stamp. A broker rewrites them (a new file renamed over the old):
// the recovery points once a minute, the high watermarks every 5 s, the
// cleaner's as it cleans (Kafka's defaults); a pass reads them every
// --tier-interval. A file is parsed again only when its inode, size,
// mtime or ctime moved.
// What it returns is shared between passes and never written.
type checkpointFiles struct {
	mu    sync.Mutex
	files map[string]parsedCheckpoint // by file name; GUARDED_BY(mu)
}

type parsedCheckpoint struct {
	ino, size, mtime, ctime int64
	cp                      kafka.OffsetCheckpoint
}

// read is ReadCheckpoints, keeping what it parsed (c nil: nothing kept).
// A file is kept once its ctime is recordSettle old at now, as records
// are: a rewrite in place within the ctime's resolution would not show.
func (c *checkpointFiles) read(root string, now time.Time) (Checkpoints, error) {
	var cp Checkpoints
	for _, f := range []struct {
		name string
		dst  *kafka.OffsetCheckpoint
	}{
		{"recovery-point-offset-checkpoint", &cp.Recovery},
		{"replication-offset-checkpoint", &cp.HighWatermark},
		{"cleaner-offset-checkpoint", &cp.Cleaner},
	} {
		path := filepath.Join(root, f.name)
		file, err := os.Open(path)
		if os.IsNotExist(err) {
			*f.dst = kafka.OffsetCheckpoint{}
			continue
		}
		if err != nil {
			return cp, err
		}
		*f.dst, err = c.parse(file, path, f.name, now)
		file.Close()
		if err != nil {
			return cp, err
		}
	}
	return cp, nil
}

// parse reads the open checkpoint file, or takes what was parsed of it
// while its stamp is the same.
func (c *checkpointFiles) parse(file *os.File, path, name string, now time.Time) (kafka.OffsetCheckpoint, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(file.Fd()), &st); err != nil {
		return nil, err
	}
	stamp := parsedCheckpoint{ino: int64(st.Ino), size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
	if c != nil {
		c.mu.Lock()
		kept, ok := c.files[name]
		c.mu.Unlock()
		if ok && kept.ino == stamp.ino && kept.size == stamp.size && kept.mtime == stamp.mtime && kept.ctime == stamp.ctime {
			return kept.cp, nil
		}
	}
	data, err := io.ReadAll(file)
	if err != nil {
		return nil, err
	}
	cp, err := kafka.ParseOffsetCheckpoint(path, data)
	if err != nil {
		return nil, err
	}
	if c != nil && ctimeSettled(stamp.ctime, now) && int64(len(data)) == stamp.size {
		stamp.cp = cp
		c.mu.Lock()
		if c.files == nil {
			c.files = map[string]parsedCheckpoint{}
		}
		c.files[name] = stamp
		c.mu.Unlock()
	}
	return cp, nil
}

// Policy decides which segments may ship.
type Policy struct {
	ShipAfter time.Duration // a segment must be this old (by mtime)
}

// whyActive is why the active segment waits: a partition where nothing
// else waits is settled (see partScans).
const whyActive = "active segment"

// Eligible says whether seg may be shipped now, and if not, why.
func (p Policy) Eligible(seg Segment, cp Checkpoints, now time.Time) (bool, string) {
	if seg.Next < 0 {
		return false, whyActive
	}
	if _, ok := cp.Cleaner[seg.TP]; ok {
		// The cleaner rewrites the segments of a compacted topic again and
		// again; Kafka keeps such topics out of its tiered storage too.
		return false, "compacted topic (in cleaner-offset-checkpoint): kept local"
	}
	if rp, ok := cp.Recovery[seg.TP]; !ok || rp < seg.Next {
		return false, fmt.Sprintf("not flushed: recovery point %s is below the next segment's base offset %d", offsetOrNone(rp, ok), seg.Next)
	}
	if hw, ok := cp.HighWatermark[seg.TP]; !ok || hw < seg.Next {
		return false, fmt.Sprintf("above the high watermark %s (next segment starts at %d)", offsetOrNone(hw, ok), seg.Next)
	}
	if age := now.Sub(seg.Mtime); age < p.ShipAfter {
		return false, fmt.Sprintf("younger than ship-after (%v < %v)", age.Round(time.Second), p.ShipAfter)
	}
	if why := untrimmed(seg); why != "" {
		return false, why
	}
	return true, ""
}

func offsetOrNone(o int64, ok bool) string {
	if !ok {
		return "(none)"
	}
	return fmt.Sprint(o)
}

// untrimmed reports an .index or .timeindex that still has the
// preallocated zero tail Kafka cuts off when it rolls a segment.
func untrimmed(seg Segment) string {
	for _, c := range []struct {
		kind string
		size int
	}{{kafka.KindIndex, 8}, {kafka.KindTimeIndex, 12}} {
		path := sidecar(seg, c.kind)
		f, err := os.Open(path)
		if err != nil {
			continue // absent: Kafka rebuilds missing indexes, nothing to wait for
		}
		fi, err := f.Stat()
		if err == nil && fi.Size() > 0 {
			last := make([]byte, c.size)
			if fi.Size()%int64(c.size) != 0 {
				f.Close()
				return fmt.Sprintf("%s not trimmed (%d bytes)", filepath.Base(path), fi.Size())
			}
			if _, err := f.ReadAt(last, fi.Size()-int64(c.size)); err == nil && allZero(last) {
				f.Close()
				return fmt.Sprintf("%s not trimmed (zero tail)", filepath.Base(path))
			}
		}
		f.Close()
	}
	return ""
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// sidecar is the path of the segment's file of another kind.
func sidecar(seg Segment, kind string) string {
	return filepath.Join(seg.Dir, kafka.SegmentName{BaseOffset: seg.Base, Kind: kind}.String())
}
