package tiering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/internal/tiered"
)

// hydrator brings evicted files' bytes back to local disk (tierfs
// hydrate): downloaded, checked, put in place, with their indexes.
type hydrator struct{ t *Tierer }

// HydrateNow brings the bytes of the evicted segment rel back to local
// disk (see Hydrate). It returns the segment's state after: shipped (the
// remote copy stays valid until the file changes), or local for a file
// that was never shipped.
func (t *Tierer) HydrateNow(ctx context.Context, rel string, progress chunkxfer.Progress) (tiered.State, error) {
	if err := t.work.begin(); err != nil {
		return 0, err
	}
	defer t.work.end()
	seg, err := t.shipper.findSegment(rel)
	if err != nil {
		return 0, err
	}
	if err := t.hydrator.Hydrate(ctx, seg.LogPath(), progress); err != nil {
		return StateRemote, t.status.noteErr(seg.Partition, fmt.Errorf("hydrate %s: %w", rel, err))
	}
	st, _, err := t.copies.stateOf(seg.LogPath())
	return st, err
}

// ErrBusy is a segment another transfer is moving.
var ErrBusy = errors.New("another transfer of it is under way")

// Hydrate downloads the bytes of the evicted file at path (parallel
// ranged GETs, each chunk checked, resumable from the transfer journal)
// and puts them back into the file, which keeps its inode, size and
// mtime. Until it is done the file stays remote, and reads are served
// from the store. The record is marked unfreed first: should tierfs die
// before the end, the next tiering pass punches out what was written
// (as for an interrupted eviction), and the file is remote as before.
// Once the bytes are in and synced, the file is shipped: local, with
// its remote copy still valid.
func (hy *hydrator) Hydrate(ctx context.Context, path string, progress chunkxfer.Progress) error {
	if !hy.t.claims.take(pathClaim(path)) {
		return fmt.Errorf("%s: %w", path, ErrBusy)
	}
	defer hy.t.claims.release(pathClaim(path))
	rec, has, err := readRecord(path)
	if err != nil {
		return err
	}
	if !hy.t.claims.take(inodeClaim(rec.Ino)) {
		return fmt.Errorf("%s: %w", path, ErrBusy)
	}
	defer hy.t.claims.release(inodeClaim(rec.Ino))
	if !has || rec.State != StateRemote {
		if progress != nil {
			progress(1, 1)
		}
		return nil // local already
	}
	if err := hy.t.waitReady(); err != nil {
		return err
	}
	if src, err := hy.t.copies.openSource(rec); err != nil {
		return err
	} else {
		src.Close()
	}
	rec.Freed = false
	if err := writeRecord(path, rec); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var fst syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &fst); err != nil {
		return err
	}
	if fst.Ino != rec.Ino || fst.Size != rec.Size {
		return fmt.Errorf("%s is another file now (inode %d, %d bytes; recorded %d, %d bytes)", path, fst.Ino, fst.Size, rec.Ino, rec.Size)
	}
	hy.t.crashPoint(CrashHydrateMarked)
	if err := hy.fetchInto(ctx, rec, f); err != nil {
		return err
	}
	if err := hy.restoreIndexes(ctx, path, rec); err != nil {
		return err
	}
	hy.t.crashPoint(CrashHydrateFetched)
	// Under the gate no read of local bytes or write is under way: the
	// file becomes local with its own mtime back.
	unlock := hy.t.cfg.Gate.Lock(rec.Ino)
	defer unlock()
	now, has, err := readRecord(path)
	if err != nil {
		return err
	}
	if !has || now.Key != rec.Key {
		return fmt.Errorf("%s changed while it was hydrated", path)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return err
	}
	if st.Ino != rec.Ino || st.Size != rec.Size {
		return fmt.Errorf("%s is another file now (inode %d, %d bytes; recorded %d, %d bytes)", path, st.Ino, st.Size, rec.Ino, rec.Size)
	}
	mt := unix.NsecToTimespec(rec.MtimeNs)
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, []unix.Timespec{{Sec: st.Atim.Sec, Nsec: st.Atim.Nsec}, mt}, 0); err != nil {
		return err
	}
	rec.State = StateShipped
	if err := writeRecord(path, rec); err != nil {
		return err
	}
	hy.t.changed(rec.Ino)
	hy.t.counters.HydratedSegments[tiered.CauseHydrate].Add(1)
	hy.t.counters.HydratedBytes[tiered.CauseHydrate].Add(rec.Size)
	if progress != nil {
		progress(rec.Size, rec.Size)
	}
	hy.t.cfg.Log.Info("hydrated", "segment", path, "key", rec.Key, "bytes", rec.Size)
	return nil
}

// fetchInto downloads the copy rec names (parallel ranged GETs, each
// chunk checked, resumable from the transfer journal) into the state dir,
// copies it into f from its start (in the kernel where it can), and syncs
// f.
func (hy *hydrator) fetchInto(ctx context.Context, rec Record, f *os.File) error {
	if len(rec.Extents) > 0 {
		return hy.copyExtentsInto(ctx, rec, f)
	}
	dir := filepath.Join(hy.t.cfg.StateDir, "hydrate")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(dir, fmt.Sprintf("%d-%s", rec.Ino, filepath.Base(rec.Key)))
	defer os.Remove(tmp)
	dl := &chunkxfer.Downloader{Store: hy.t.cfg.Store, JournalDir: filepath.Join(hy.t.cfg.StateDir, "journal"), Parallel: 4, Log: hy.t.cfg.Log}
	got, err := dl.Download(ctx, rec.Key, tmp)
	if err != nil {
		return err
	}
	if got.ETag != rec.ETag || got.Size != rec.Size {
		return fmt.Errorf("the store's %s is not the copy shipped (etag %s, %d bytes; shipped %s, %d bytes)", rec.Key, got.ETag, got.Size, rec.ETag, rec.Size)
	}
	src, err := os.Open(tmp)
	if err != nil {
		return err
	}
	defer src.Close()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	n, err := io.Copy(f, src) // copy_file_range
	if err != nil {
		return fmt.Errorf("fill %s: %w", f.Name(), err)
	}
	if n != rec.Size {
		return fmt.Errorf("fill %s: %d bytes of %d", f.Name(), n, rec.Size)
	}
	return f.Sync()
}

// copyExtentsInto reads a file held by several objects through their
// readers (each chunk checked, with read-ahead) into f from its start,
// and syncs f.
func (hy *hydrator) copyExtentsInto(ctx context.Context, rec Record, f *os.File) error {
	src, err := hy.t.copies.openSource(rec)
	if err != nil {
		return err
	}
	defer src.Close()
	buf := make([]byte, 1<<20)
	for off := int64(0); off < rec.Size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := int(min(int64(len(buf)), rec.Size-off))
		if _, err := src.ReadAt(buf[:n], off); err != nil {
			return fmt.Errorf("read %s at %d: %w", rec.Key, off, err)
		}
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			return fmt.Errorf("fill %s: %w", f.Name(), err)
		}
		off += int64(n)
	}
	return f.Sync()
}

// restoreIndexes puts back a hydrated segment's .index and .timeindex if
// they are missing (Kafka keeps them local, but a user may have removed
// them): the copies shipped with it, or, where the store has none,
// rebuilt from its records as the broker writes them.
func (hy *hydrator) restoreIndexes(ctx context.Context, path string, rec Record) error {
	sn, ok := kafka.ParseSegmentName(filepath.Base(path))
	if !ok || sn.Kind != kafka.KindLog || sn.Suffix != "" {
		return nil // being deleted or cleaned: the broker does not need them
	}
	var built map[string][]byte
	var logM *chunkxfer.Manifest
	for _, kind := range []string{kafka.KindIndex, kafka.KindTimeIndex} {
		p := strings.TrimSuffix(path, kafka.KindLog) + kind
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if logM == nil {
			// A small segment's index files are held by its .log's
			// manifest (the store's copy: the local one keeps none).
			logM, _ = chunkxfer.ReadManifest(ctx, hy.t.cfg.Store, rec.Key)
			if logM == nil {
				logM = &chunkxfer.Manifest{}
			}
		}
		key := strings.TrimSuffix(rec.Key, kafka.KindLog) + kind
		b, held := logM.File(kind)
		var err error
		if !held {
			b, err = store.ReadAll(hy.t.cfg.Store.Get(ctx, key, 0, -1, store.GetOptions{}))
		}
		if errors.Is(err, store.ErrNotFound) {
			// An empty or small one is its manifest alone.
			if m, merr := chunkxfer.LoadManifest(ctx, hy.t.cfg.Store, key); merr == nil && m.NoObject() {
				b, err = m.Inline, nil
			}
		}
		if errors.Is(err, store.ErrNotFound) {
			if built == nil {
				f, err := os.Open(path)
				if err != nil {
					return err
				}
				offs, times, err := kafka.BuildIndexes(path, f, rec.Size, sn.BaseOffset, kafka.DefaultIndexInterval)
				f.Close()
				if err != nil {
					return fmt.Errorf("rebuild the indexes of %s: %w", path, err)
				}
				built = map[string][]byte{kafka.KindIndex: offs, kafka.KindTimeIndex: times}
			}
			b, err = built[kind], nil
			hy.t.cfg.Log.Info("rebuilt a missing index of a hydrated segment", "index", p)
		} else if err == nil {
			hy.t.cfg.Log.Info("restored a missing index of a hydrated segment from the store", "index", p)
		}
		if err != nil {
			return fmt.Errorf("restore %s: %w", p, err)
		}
		if err := writeFileAtomic(p, b); err != nil {
			return err
		}
	}
	return nil
}
