package tiering

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"golang.org/x/sys/unix"
)

// evictor frees the local bytes of shipped segments under the local
// retention: each only once its store copy is checked, under the
// file's gate, recorded remote before a byte is freed.
type evictor struct{ t *Tierer }

// evictUnderRetention frees shipped segments past the local retention:
// by age, then the oldest first in each partition over its byte limit,
// then the oldest first anywhere while the total is over its limit.
//
// from are the scans parts came from (partScans.scan; nil: none kept): what
// a partition's rolled segments hold is kept in its scan (localOf), so a
// pass over partitions that did not change reads one record each, not
// one per segment.
func (ev *evictor) evictUnderRetention(ctx context.Context, parts []Partition, from []*partScan, now time.Time) (int, []error) {
	c := ev.t.cfg
	if c.LocalRetentionAge == 0 && c.LocalRetentionBytes == 0 && c.LocalRetentionTotalBytes == 0 {
		return 0, nil
	}
	type cand struct {
		part string
		seg  Segment
	}
	evicted := 0
	var errs []error
	var rest []cand // shipped segments still local after the per-partition pass
	var total int64 // local .log bytes of all partitions
	for i, p := range parts {
		var sc *partScan
		if from != nil {
			sc = from[i]
		}
		rl, perrs := ev.localOf(p, sc, now)
		for _, err := range perrs {
			errs = append(errs, ev.t.status.noteErr(p.Name, err))
		}
		local := rl.bytes
		for _, seg := range rl.shipped {
			cd := cand{p.Name, seg}
			old := c.LocalRetentionAge > 0 && now.Sub(cd.seg.Mtime) > c.LocalRetentionAge
			over := c.LocalRetentionBytes > 0 && local > c.LocalRetentionBytes
			if !old && !over {
				rest = append(rest, cd)
				continue
			}
			if err := ev.Evict(cd.seg.LogPath()); err != nil {
				errs = append(errs, ev.t.status.noteErr(p.Name, fmt.Errorf("evict %s: %w", cd.seg.LogPath(), err)))
				rest = append(rest, cd)
				continue
			}
			local -= cd.seg.Size
			evicted++
		}
		total += local
	}
	if c.LocalRetentionTotalBytes > 0 && total > c.LocalRetentionTotalBytes {
		sort.SliceStable(rest, func(i, j int) bool { return rest[i].seg.Mtime.Before(rest[j].seg.Mtime) })
		for _, cd := range rest {
			if total <= c.LocalRetentionTotalBytes {
				break
			}
			if err := ev.Evict(cd.seg.LogPath()); err != nil {
				errs = append(errs, ev.t.status.noteErr(cd.part, fmt.Errorf("evict %s: %w", cd.seg.LogPath(), err)))
				continue
			}
			total -= cd.seg.Size
			evicted++
		}
	}
	return evicted, errs
}

// Evict frees the local bytes of a shipped segment: under the gate, it
// marks the file remote, punches out its bytes (keeping its size) and
// restores its mtime. A crash in between is finished by the next pass.
func (ev *evictor) Evict(path string) error {
	if !ev.t.claims.take(pathClaim(path)) {
		return nil
	}
	defer ev.t.claims.release(pathClaim(path))
	rec, has, err := readRecord(path)
	if err != nil {
		return err
	}
	if !has || rec.State != StateShipped {
		return fmt.Errorf("%s is not shipped", path)
	}
	// The copy was verified when it shipped; it must still be there,
	// unchanged, now.
	if err := ev.t.copies.checkCopies(rec); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			// Gone or replaced: forget the copy; the segment ships again.
			unix.Removexattr(path, recordXattr)
			ev.t.changed(rec.Ino)
		}
		return fmt.Errorf("not freeing the local bytes of %s: %w", path, err)
	}
	if ev.t.cfg.BeforeFree != nil {
		if err := ev.t.cfg.BeforeFree(path); err != nil {
			return fmt.Errorf("%s: not freeing local bytes: %w", path, err)
		}
	}
	// Under the gate no read or write of the file is under way, so the
	// identity checked here is what gets freed.
	unlock := ev.t.cfg.Gate.Lock(rec.Ino)
	defer unlock()
	if ev.t.cfg.Gate.Held(rec.Ino) {
		return fmt.Errorf("%s: %w", path, ErrHeldOpen)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return err
	}
	if st.Ino != rec.Ino || st.Size != rec.Size || st.Mtim.Nano() != rec.MtimeNs {
		// Changed since it was shipped: the copy is stale. Forget it;
		// the next pass ships the file again if it is still eligible.
		if err := unix.Removexattr(path, recordXattr); err != nil {
			return err
		}
		ev.t.changed(rec.Ino)
		return fmt.Errorf("%s changed since it was shipped; shipping it again: %w", path, chunkxfer.ErrSourceChanged)
	}
	rec.State = StateRemote
	if err := writeRecord(path, rec); err != nil {
		return err
	}
	// Told under the gate: no handle reads the local bytes now, and
	// each reads the record again before it reads any.
	ev.t.changed(rec.Ino)
	ev.t.crashPoint(CrashEvictMarked)
	if _, err := ev.finishEvict(segmentAt(path), rec); err != nil {
		return err
	}
	ev.t.counters.EvictedSegments.Add(1)
	ev.t.counters.FreedBytes.Add(st.Blocks * 512)
	ev.t.cfg.Log.Info("evicted", "segment", path, "freed_bytes", st.Blocks*512)
	return nil
}

// finishEvictRead is finishEvict with the record read from the file
// (the records cache keeps only its state).
func (ev *evictor) finishEvictRead(seg Segment) (bool, error) {
	rec, has, err := readRecord(seg.LogPath())
	if err != nil || !has || rec.State != StateRemote {
		return false, err // changed since: the next pass sees it as it is
	}
	return ev.finishEvict(seg, rec)
}

// finishEvict makes a remote-marked file hold no local bytes and carry
// its recorded mtime, then records that; it reports whether it had
// anything to do.
func (ev *evictor) finishEvict(seg Segment, rec Record) (bool, error) {
	logPath := seg.LogPath()
	if rec.Freed {
		return false, nil
	}
	f, err := os.OpenFile(logPath, os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false, err
	}
	if st.Ino != rec.Ino || st.Size != rec.Size {
		return false, fmt.Errorf("%s is marked remote but is another file now (inode %d, %d bytes; recorded %d, %d bytes)", logPath, st.Ino, st.Size, rec.Ino, rec.Size)
	}
	if st.Size == 0 {
		// Nothing to free (the cleaner can leave empty segments).
	} else if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, st.Size); err != nil {
		return false, fmt.Errorf("free %s: %w", logPath, err)
	}
	mt := unix.NsecToTimespec(rec.MtimeNs)
	at := unix.Timespec{Sec: st.Atim.Sec, Nsec: st.Atim.Nsec}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, logPath, []unix.Timespec{at, mt}, 0); err != nil {
		return false, err
	}
	if err := f.Sync(); err != nil {
		return false, err
	}
	rec.Freed = true
	return true, writeRecord(logPath, rec)
}

// rolledLocal is what eviction reads of a partition's segments: the
// bytes of the .log files not remote, and the segments shipped and still
// local, oldest first.
type rolledLocal struct {
	bytes   int64
	shipped []Segment
}

// localOf reads rolledLocal of partition p, scanned in sc (nil: not
// kept). The part of its rolled segments (all but the active one) is
// kept in sc (keptRolled), as the summary's is; the active segment is
// read every time: it grows.
func (ev *evictor) localOf(p Partition, sc *partScan, now time.Time) (rolledLocal, []error) {
	var errs []error
	add := func(r *rolledLocal, seg Segment) bool {
		rs, err := ev.t.records.of(seg)
		if err != nil {
			errs = append(errs, err)
			return false
		}
		if rs.Has && rs.State == StateRemote {
			return true
		}
		r.bytes += seg.Size
		if rs.Has && rs.State == StateShipped {
			r.shipped = append(r.shipped, seg) // in offset order, as scanned
		}
		return true
	}
	var r rolledLocal
	n := len(p.Segments)
	if sc == nil || n == 0 || p.Segments[n-1].Next >= 0 {
		for _, seg := range p.Segments {
			add(&r, seg)
		}
		return r, errs
	}
	r = *keptRolled(&sc.local, p.Segments[:n-1], now, add)
	r.shipped = slices.Clip(r.shipped) // the kept list is never appended to
	add(&r, p.Segments[n-1])
	return r, errs
}

// retentionDue is when a local retention age falls due in partition p:
// the oldest shipped segment still local passes the age then (zero:
// never, or no age limit).
func (ev *evictor) retentionDue(p Partition) time.Time {
	if ev.t.cfg.LocalRetentionAge <= 0 {
		return time.Time{}
	}
	for _, seg := range p.Segments {
		if rs, err := ev.t.records.of(seg); err == nil && rs.Has && rs.State == StateShipped {
			return seg.Mtime.Add(ev.t.cfg.LocalRetentionAge)
		}
	}
	return time.Time{}
}
