package chunkxfer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/internal/fsutil"
)

// Downloader fetches objects to local files in parallel ranged GETs,
// every chunk checked against the manifest, resumable from its journal.
type Downloader struct {
	Store      store.Store
	JournalDir string
	Parallel   int // chunks in flight; 4 when 0
	Log        *slog.Logger
}

type downloadHeader struct {
	Key  string `json:"key"`
	ETag string `json:"etag"`
	Dest string `json:"dest"`
	Size int64  `json:"size"`
}

type chunkRecord struct {
	Chunk int `json:"chunk"`
}

// tempSuffix marks a download in progress beside its destination.
const tempSuffix = ".tierfs-download"

// Download fetches key into dest (replaced atomically when complete,
// synced). An interrupted download of the same object resumes: chunks
// the journal lists are checked against their CRC32C in the partial file
// and fetched again only if they do not match.
func (d *Downloader) Download(ctx context.Context, key, dest string) (*Manifest, error) {
	m, err := LoadManifest(ctx, d.Store, key)
	if err != nil {
		return nil, err
	}
	tmp := dest + tempSuffix
	jp := journalPath(d.JournalDir, "download", dest)
	h := downloadHeader{Key: key, ETag: m.ETag, Dest: dest, Size: m.Size}
	var old downloadHeader
	done := map[int]bool{}
	ok, err := readJournal(jp, &old, func(raw json.RawMessage) error {
		var r chunkRecord
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		done[r.Chunk] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	var f *os.File
	var j *journal
	if ok && old == h {
		if f, err = os.OpenFile(tmp, os.O_RDWR, 0); err == nil {
			if fi, serr := f.Stat(); serr != nil || fi.Size() != m.Size {
				f.Close()
				f = nil
			}
		}
		if f != nil {
			if j, err = reopenJournal(jp, false); err != nil {
				f.Close()
				return nil, err
			}
		}
	}
	if f == nil {
		done = map[int]bool{}
		if f, err = os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644); err != nil {
			return nil, err
		}
		if err := f.Truncate(m.Size); err != nil {
			f.Close()
			return nil, err
		}
		if j, err = createJournal(jp, h, false); err != nil {
			f.Close()
			return nil, err
		}
	}
	defer f.Close()
	if err := d.fetchAll(ctx, m, f, j, done); err != nil {
		j.close()
		if errors.Is(err, store.ErrPrecondition) || errors.Is(err, store.ErrNotFound) {
			// The object changed or went: this partial file is of no use.
			os.Remove(tmp)
			os.Remove(jp)
		}
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dest); err != nil {
		return nil, err
	}
	if err := fsutil.SyncDir(filepath.Dir(dest)); err != nil {
		return nil, err
	}
	if err := j.remove(); err != nil {
		d.log().Warn("cannot remove download journal", "path", jp, "err", err)
	}
	return m, nil
}

func (d *Downloader) log() *slog.Logger {
	if d.Log != nil {
		return d.Log
	}
	return slog.New(slog.DiscardHandler)
}

// fetchAll fetches every chunk not already good in f.
func (d *Downloader) fetchAll(ctx context.Context, m *Manifest, f *os.File, j *journal, done map[int]bool) error {
	workers := d.Parallel
	if workers <= 0 {
		workers = 4
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, m.ChunkSize)
			for i := range next {
				if err := d.fetchOne(ctx, m, f, j, i, done[i], buf); err != nil {
					cancel(err)
				}
			}
		}()
	}
	resumed := 0
	for i := range m.Chunks() {
		if done[i] {
			resumed++
		}
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	if resumed > 0 {
		d.log().Info("resumed download", "key", m.Key, "chunks_journaled", resumed, "chunks", m.Chunks())
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// fetchOne makes chunk i good in f: a journaled chunk is checked in place
// first (the journal is not synced; the data check is what counts).
func (d *Downloader) fetchOne(ctx context.Context, m *Manifest, f *os.File, j *journal, i int, journaled bool, buf []byte) error {
	off, n := m.ChunkRange(i)
	buf = buf[:n]
	if journaled {
		if _, err := f.ReadAt(buf, off); err == nil && crc32c(buf) == m.CRC32C[i] {
			return nil
		}
	}
	if err := fetchChunk(ctx, d.Store, m, i, buf); err != nil {
		return err
	}
	if _, err := f.WriteAt(buf, off); err != nil {
		return fmt.Errorf("download %s: write chunk %d: %w", m.Key, i, err)
	}
	return j.append(chunkRecord{Chunk: i})
}
