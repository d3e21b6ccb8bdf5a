package chunkxfer

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/internal/fsutil"
)

// ErrSourceChanged is a file that changed while it was being uploaded.
//
// The uploader fails such a transfer (and aborts its upload) rather than
// keep the original chunks copy-on-write: the files tierfs ships are
// rolled Kafka segments, which never change in place, so a change means
// the broker is rewriting or removing the file and the tierer must decide
// again from what is there now; keeping old bytes of changed files is the
// job of change management (cm/), not of a transfer.
var ErrSourceChanged = errors.New("file changed during upload")

// Uploader uploads files as multipart objects.
type Uploader struct {
	Store      store.Store
	JournalDir string // where transfer journals live (the state dir)
	ChunkSize  int64  // part size; DefaultChunkSize when 0
	// BlockSize is the block of the manifests' block checksums
	// (Manifest.BlockSize): DefaultBlockSize when 0, none when
	// negative or when it does not divide the chunk size.
	BlockSize int64
	// InlineMax is the largest file UploadSmall stores in its manifest
	// alone (Manifest.Inline): DefaultInlineMax when 0, none when
	// negative. It is at most the chunk size.
	InlineMax int64
	Parallel  int // parts in flight; 4 when 0
	// Settle refuses files changed less than this long ago: ctime has
	// coarse (jiffy) granularity, so a write in the same tick as the
	// upload's first look could go unnoticed. 0 turns the check off.
	Settle time.Duration
	Log    *slog.Logger
	Now    func() time.Time // nil: time.Now
	// Broker, when set, names the uploader in each manifest (the
	// broker whose mount shipped the object, for tierfs status).
	Broker func() string

	bufMu   sync.Mutex
	bufs    [][]byte    // part buffers kept for the next upload, at most Parallel; GUARDED_BY(bufMu)
	bufDrop *time.Timer // drops them after partBufIdle unused; GUARDED_BY(bufMu)
	// Limit, when set, bounds the bytes per second of all uploads (a
	// golang.org/x/time/rate.Limiter is one); each part waits for its
	// bytes before it is sent.
	Limit Limiter

	// afterPart, when set (tests), runs after each confirmed part;
	// onStart when the parts to upload are known (fresh: no journal
	// could be resumed).
	afterPart func(part int32)
	onStart   func(resumed int, fresh bool)
}

// Limiter paces bytes.
type Limiter interface {
	WaitN(ctx context.Context, n int) error
	Burst() int
}

// Progress is told, after each confirmed part, how many of a file's
// bytes are in the store.
type Progress func(done, total int64)

// uploadHeader is the first line of an upload journal.
type uploadHeader struct {
	Key       string `json:"key"`
	Path      string `json:"path"`
	UploadID  string `json:"upload_id"`
	ChunkSize int64  `json:"chunk_size"`
	Source    Source `json:"source"`
	From      int64  `json:"from,omitempty"` // the file position the object starts at
}

// size is the object's size.
func (h uploadHeader) size() int64 { return h.Source.Size - h.From }

// partRecord is a confirmed part.
type partRecord struct {
	Part   int32  `json:"part"`
	ETag   string `json:"etag"`
	CRC32C uint32 `json:"crc32c"`
	Size   int64  `json:"size"`
	// The part's block checksums (Manifest.BlockCRC32C), in blocks of
	// BlockSize; none in journals of versions before 2026-12.
	BlockSize int64  `json:"block_size,omitempty"`
	Blocks    []byte `json:"blocks,omitempty"`
}

// blockSize is the block of this uploader's manifests, 0 for none.
func (u *Uploader) blockSize() int64 {
	bs := cmp.Or(u.BlockSize, DefaultBlockSize)
	if cs := u.chunkSize(); bs <= 0 || bs >= cs || cs%bs != 0 {
		return 0
	}
	return bs
}

// partBlocks are the block checksums of the parts recs (1 to n, each of
// blocks of bs), joined, or nil when any part has none or others.
func partBlocks(recs map[int32]partRecord, n int32, bs int64) []byte {
	if bs == 0 {
		return nil
	}
	var out []byte
	for i := int32(1); i <= n; i++ {
		r := recs[i]
		if r.BlockSize != bs || int64(len(r.Blocks)) != 4*blocksIn(r.Size, bs) {
			return nil
		}
		out = append(out, r.Blocks...)
	}
	return out
}

func (u *Uploader) chunkSize() int64 {
	if u.ChunkSize > 0 {
		return u.ChunkSize
	}
	return DefaultChunkSize
}

// OneRequest says whether an upload of n bytes is sent in one request,
// read into memory whole (at most smallUpload and one chunk), rather than
// as a multipart upload whose parts in flight (up to Parallel) each hold
// a chunk-sized buffer. A resumed upload is multipart whatever its size.
func (u *Uploader) OneRequest(n int64) bool {
	return n <= min(smallUpload, u.chunkSize())
}

// partBuf is a buffer for parts of size bytes: one kept from an earlier
// upload, or a new one. A kept buffer is not zeroed: uploadPart fills
// every byte it sends (a ReadAt of the part's whole length, or an
// error), and a store has read a part's body before UploadPart returns.
func (u *Uploader) partBuf(size int64) []byte {
	u.bufMu.Lock()
	defer u.bufMu.Unlock()
	for i, b := range u.bufs {
		if int64(cap(b)) >= size {
			u.bufs = append(u.bufs[:i], u.bufs[i+1:]...)
			return b[:size]
		}
	}
	return make([]byte, size)
}

// Verify is the package's Verify with a buffer of u's: the tierer
// verifies every segment it ships, hundreds a second when they are small.
func (u *Uploader) Verify(ctx context.Context, s store.Store, m *Manifest) error {
	buf := u.partBuf(verifyLen(m))
	defer u.putPartBuf(buf)
	return verify(ctx, s, m, buf)
}

// putPartBuf keeps b for the next upload, unless Parallel are kept.
// They are dropped once no upload took one for partBufIdle: memory
// outside the chunk budget is held only while uploads follow each other.
func (u *Uploader) putPartBuf(b []byte) {
	u.bufMu.Lock()
	defer u.bufMu.Unlock()
	keep := u.Parallel
	if keep <= 0 {
		keep = 4
	}
	if len(u.bufs) < keep {
		u.bufs = append(u.bufs, b)
	}
	if u.bufDrop == nil {
		u.bufDrop = time.AfterFunc(partBufIdle, u.DropBuffers)
	} else {
		u.bufDrop.Reset(partBufIdle)
	}
}

// DropBuffers lets go of the part buffers kept for the next upload (the
// tierer does at the end of each pass: they are memory outside the chunk
// budget).
func (u *Uploader) DropBuffers() {
	u.bufMu.Lock()
	defer u.bufMu.Unlock()
	u.bufs = nil
}

// partBufIdle is how long part buffers are kept unused.
const partBufIdle = 5 * time.Second

func (u *Uploader) broker() string {
	if u.Broker == nil {
		return ""
	}
	return u.Broker()
}

func (u *Uploader) log() *slog.Logger {
	if u.Log != nil {
		return u.Log
	}
	return slog.New(slog.DiscardHandler)
}

func sourceOf(fi os.FileInfo) Source {
	st := fi.Sys().(*syscall.Stat_t)
	return Source{Ino: st.Ino, Size: st.Size, MtimeNs: st.Mtim.Nano(), CtimeNs: st.Ctim.Nano()}
}

func statSource(f *os.File) (Source, error) {
	fi, err := f.Stat()
	if err != nil {
		return Source{}, err
	}
	return sourceOf(fi), nil
}

// Upload uploads the file at path to key, resuming an earlier upload of
// the same unchanged file from its journal, and stores the manifest. It
// returns the manifest once the object is complete.
func (u *Uploader) Upload(ctx context.Context, path, key string) (*Manifest, error) {
	return u.UploadProgress(ctx, path, key, nil)
}

// UploadProgress is Upload, telling progress (which may be nil) how far
// it got.
func (u *Uploader) UploadProgress(ctx context.Context, path, key string, progress Progress) (*Manifest, error) {
	return u.UploadFrom(ctx, path, key, 0, progress)
}

// UploadFrom is UploadProgress of the file's bytes from position from
// to its end: the object holds them from its position 0, and its
// manifest says where in the file it starts (Manifest.From).
func (u *Uploader) UploadFrom(ctx context.Context, path, key string, from int64, progress Progress) (*Manifest, error) {
	return u.UploadWith(ctx, path, key, UploadOptions{From: from, Progress: progress})
}

// UploadSmall uploads the whole of a file that may be small enough to be
// stored in its manifest alone (UploadOptions.Inline); fresh as
// UploadOptions.Fresh.
func (u *Uploader) UploadSmall(ctx context.Context, path, key string, fresh bool) (*Manifest, error) {
	return u.UploadWith(ctx, path, key, UploadOptions{Fresh: fresh, Inline: true})
}

// UploadOptions are the choices of an upload (UploadWith).
type UploadOptions struct {
	// From is where in the file the object starts: it holds the file's
	// bytes from there to its end (Manifest.From).
	From int64
	// Progress, when set, is told how far the upload got.
	Progress Progress
	// Fresh says the key was never uploaded to (tiering catalogs every
	// object before its first byte is sent, under a name no other
	// version has): no finished upload of it is looked for in the store
	// first. A journal of the key is still resumed.
	Fresh bool
	// Inline stores a file of at most InlineMax bytes in its manifest
	// alone (Manifest.Inline): one request instead of two, for the index
	// files, producer snapshot and leader-epoch checkpoint of a small
	// segment. Stores read by versions that do not know such manifests
	// (before 2026-12-07) refuse them by their version, so should not be
	// given any.
	Inline bool
	// Attach, when set, is stored in the manifest (Manifest.Attached):
	// a few KiB at most that belong with the object, saved a request of
	// their own (tiering: a small object's batch list).
	Attach []byte
	// Files are small files stored in the manifest (Manifest.Files),
	// checked by their CRC32C on every read of it: a few KiB at most
	// that belong with the object (tiering: a small segment's index
	// files), each saved a request of its own.
	Files []File
}

// UploadWith uploads the file at path (from o.From to its end) to key
// and stores its manifest, resuming a journalled upload of it; an
// unchanged file already uploaded is not sent again.
func (u *Uploader) UploadWith(ctx context.Context, path, key string, o UploadOptions) (*Manifest, error) {
	return u.upload(ctx, path, key, o)
}

// inlineMax is the largest file UploadSmall stores inline.
func (u *Uploader) inlineMax() int64 {
	switch {
	case u.InlineMax < 0:
		return 0
	case u.InlineMax == 0:
		return min(DefaultInlineMax, u.chunkSize())
	}
	return min(u.InlineMax, u.chunkSize())
}

func (u *Uploader) upload(ctx context.Context, path, key string, o UploadOptions) (*Manifest, error) {
	from, progress := o.From, o.Progress
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	src, err := statSource(f)
	if err != nil {
		return nil, err
	}
	now := time.Now
	if u.Now != nil {
		now = u.Now
	}
	if u.Settle > 0 && now().Sub(time.Unix(0, src.CtimeNs)) < u.Settle {
		return nil, fmt.Errorf("upload %s: changed %v ago, less than %v: %w", path, now().Sub(time.Unix(0, src.CtimeNs)).Round(time.Millisecond), u.Settle, ErrSourceChanged)
	}
	if from < 0 || from > src.Size {
		return nil, fmt.Errorf("upload %s from %d: the file has %d bytes", path, from, src.Size)
	}
	if m, err := u.uploaded(ctx, key, src, o); m != nil || err != nil {
		return m, err
	}
	if src.Size == from {
		return u.putEmpty(ctx, key, src, o)
	}
	if u.OneRequest(src.Size - from) {
		if _, err := os.Stat(journalPath(u.JournalDir, "upload", key)); errors.Is(err, os.ErrNotExist) {
			return u.putSmall(ctx, f, path, key, src, o)
		}
		// An upload of the key left a journal: the multipart path
		// resumes or aborts it.
	}
	if m, err := u.finishCompleted(ctx, path, key, src, o); m != nil || err != nil {
		return m, err
	}
	t, err := u.start(ctx, path, key, src, from)
	if err != nil {
		return nil, err
	}
	t.progress, t.opts = progress, o
	m, err := t.run(ctx, f)
	if err != nil {
		t.j.close()
		if errors.Is(err, ErrSourceChanged) || errors.Is(err, store.ErrNotFound) {
			u.discard(t)
		}
		return nil, err
	}
	return m, nil
}

// uploaded is the manifest of an earlier upload of the same unchanged
// file to key that finished but left its journal (a crash right after
// completing), or nil; o.Fresh says there cannot be one. Its manifest
// is stored again if it lacks what o attaches.
func (u *Uploader) uploaded(ctx context.Context, key string, src Source, o UploadOptions) (*Manifest, error) {
	if o.Fresh {
		return nil, nil
	}
	m, err := LoadManifest(ctx, u.Store, key)
	if err != nil || m.Source != src || m.From != o.From || m.ChunkSize != u.chunkSize() {
		return nil, nil
	}
	if !bytes.Equal(m.Attached, o.Attach) || !sameFiles(m.Files, o.Files) {
		m.Attached, m.Files = o.Attach, o.Files
		if err := putManifest(ctx, u.Store, m); err != nil {
			return nil, err
		}
	}
	os.Remove(journalPath(u.JournalDir, "upload", key))
	if u.onStart != nil {
		u.onStart(m.Chunks(), false) // every part kept
	}
	return m, nil
}

// upload is one transfer in progress.
type upload struct {
	u      *Uploader
	h      uploadHeader
	j      *journal
	mu     sync.Mutex
	parts  map[int32]partRecord // confirmed; GUARDED_BY(mu)
	done   int64                // bytes of the confirmed parts; GUARDED_BY(mu)
	nParts int32

	progress Progress
	opts     UploadOptions // what the manifest holds beside the object (Attach, Files)
}

// start resumes the journaled upload of key if it is for this very file,
// or starts a new one, aborting any other upload of key.
func (u *Uploader) start(ctx context.Context, path, key string, src Source, from int64) (*upload, error) {
	jp := journalPath(u.JournalDir, "upload", key)
	t := &upload{u: u, parts: map[int32]partRecord{}}
	var old uploadHeader
	recs := map[int32]partRecord{}
	ok, err := readJournal(jp, &old, func(raw json.RawMessage) error {
		var r partRecord
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		recs[r.Part] = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	if ok && old.Key == key && old.Path == path && old.Source == src && old.From == from && old.ChunkSize == u.chunkSize() {
		// The store must still hold every journaled part as recorded.
		stored, err := u.Store.ListParts(ctx, key, old.UploadID)
		if err == nil {
			byNum := map[int32]store.Part{}
			for _, p := range stored {
				byNum[p.Number] = p
			}
			for n, r := range recs {
				if p, ok := byNum[n]; ok && p.ETag == r.ETag && p.Size == r.Size {
					t.parts[n] = r
				}
			}
			if t.j, err = reopenJournal(jp, true); err != nil {
				return nil, err
			}
			t.h = old
			u.log().Info("resuming upload", "key", key, "parts_done", len(t.parts))
			u.abortOthers(ctx, key, old.UploadID)
			if u.onStart != nil {
				u.onStart(len(t.parts), false)
			}
			return t, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	if ok {
		// The file changed, or the upload is gone: start over.
		u.abortUpload(ctx, old.Key, old.UploadID)
	}
	u.abortOthers(ctx, key, "")
	id, err := u.Store.CreateMultipart(ctx, key)
	if err != nil {
		return nil, err
	}
	t.h = uploadHeader{Key: key, Path: path, UploadID: id, ChunkSize: u.chunkSize(), Source: src, From: from}
	if t.j, err = createJournal(jp, t.h, true); err != nil {
		u.abortUpload(ctx, key, id)
		return nil, err
	}
	if u.onStart != nil {
		u.onStart(0, true)
	}
	return t, nil
}

// Abandon gives up every upload of key, in progress or left by a crash:
// its journal goes and its multipart uploads are aborted. For a source
// that is gone for good (the broker deleted the segment).
func (u *Uploader) Abandon(ctx context.Context, key string) error {
	if err := os.Remove(journalPath(u.JournalDir, "upload", key)); err != nil && !os.IsNotExist(err) {
		return err
	}
	ups, err := u.Store.ListMultipart(ctx, key)
	if err != nil {
		return fmt.Errorf("list uploads of %s: %w", key, err)
	}
	for _, up := range ups {
		if up.Key == key {
			if err := u.Store.AbortMultipart(ctx, key, up.UploadID); err != nil && !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("abort upload of %s: %w", key, err)
			}
		}
	}
	return nil
}

// abortOthers aborts uploads of exactly key other than keep: leftovers
// of a crash between creating an upload and journaling it. One tierfs
// owns its keys (the backing directory lock), so none is anyone else's.
func (u *Uploader) abortOthers(ctx context.Context, key, keep string) {
	ups, err := u.Store.ListMultipart(ctx, key)
	if err != nil {
		u.log().Warn("cannot list uploads to clean up", "key", key, "err", err)
		return
	}
	for _, up := range ups {
		if up.Key == key && up.UploadID != keep {
			u.abortUpload(ctx, key, up.UploadID)
		}
	}
}

func (u *Uploader) abortUpload(ctx context.Context, key, id string) {
	if err := u.Store.AbortMultipart(ctx, key, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		u.log().Warn("cannot abort upload", "key", key, "upload", id, "err", err)
	}
}

// discard abandons a transfer for good.
func (u *Uploader) discard(t *upload) {
	u.abortUpload(context.Background(), t.h.Key, t.h.UploadID)
	os.Remove(t.j.path)
}

// run uploads the missing parts, checks the file did not change,
// completes the upload and stores the manifest.
func (t *upload) run(ctx context.Context, f *os.File) (*Manifest, error) {
	size, cs := t.h.size(), t.h.ChunkSize
	t.nParts = int32((size + cs - 1) / cs)
	if t.nParts > store.MaxParts {
		return nil, fmt.Errorf("upload %s: %d bytes need %d parts of %d, more than %d", t.h.Path, size, t.nParts, cs, store.MaxParts)
	}
	var todo []int32
	for n := int32(1); n <= t.nParts; n++ {
		if r, ok := t.parts[n]; !ok {
			todo = append(todo, n)
		} else {
			t.done += r.Size
		}
	}
	if t.progress != nil {
		t.progress(t.done, size)
	}
	if err := t.uploadParts(ctx, f, todo); err != nil {
		return nil, err
	}
	if err := t.checkSource(f); err != nil {
		return nil, err
	}
	parts := make([]store.Part, 0, t.nParts)
	crcs := make([]uint32, 0, t.nParts)
	for n := int32(1); n <= t.nParts; n++ {
		r := t.parts[n]
		parts = append(parts, store.Part{Number: n, ETag: r.ETag, Size: r.Size})
		crcs = append(crcs, r.CRC32C)
	}
	info, err := t.u.Store.CompleteMultipart(ctx, t.h.Key, t.h.UploadID, parts)
	if err != nil {
		return nil, err
	}
	if info.ETag == "" {
		if info, err = t.u.Store.Head(ctx, t.h.Key); err != nil {
			return nil, err
		}
	}
	m := t.u.manifest(t.h.Key, info.ETag, size, cs, crcs, t.h.Source, t.h.From, t.opts)
	m.setBlocks(t.u.blockSize(), partBlocks(t.parts, t.nParts, t.u.blockSize()))
	if err := putManifest(ctx, t.u.Store, m); err != nil {
		return nil, err
	}
	if err := t.j.remove(); err != nil {
		t.u.log().Warn("cannot remove upload journal", "path", t.j.path, "err", err)
	}
	return m, nil
}

// checkSource fails when the open file is no longer what the upload
// started from, or the path names another file now.
func (t *upload) checkSource(f *os.File) error { return checkSource(f, t.h.Path, t.h.Source) }

// checkSource fails when the open file f is no longer src, or path names
// another file now.
func checkSource(f *os.File, path string, src Source) error {
	now, err := statSource(f)
	if err != nil {
		return err
	}
	if now != src {
		return fmt.Errorf("upload %s: size %d→%d, mtime or ctime moved: %w", path, src.Size, now.Size, ErrSourceChanged)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("upload %s: %v: %w", path, err, ErrSourceChanged)
	}
	if sourceOf(fi) != src {
		return fmt.Errorf("upload %s: the path names another file now: %w", path, ErrSourceChanged)
	}
	return nil
}

// uploadParts uploads parts with Parallel workers; the first error
// stops the rest.
func (t *upload) uploadParts(ctx context.Context, f *os.File, todo []int32) error {
	workers := t.u.Parallel
	if workers <= 0 {
		workers = 4
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int32)
	var wg sync.WaitGroup
	for range min(workers, max(1, len(todo))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := t.u.partBuf(t.h.ChunkSize)
			defer t.u.putPartBuf(buf)
			for n := range next {
				if err := t.uploadPart(ctx, f, n, buf); err != nil {
					cancel(err)
				}
			}
		}()
	}
	for _, n := range todo {
		select {
		case next <- n:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// uploadPart reads part n, checks the file is unchanged after reading
// it, uploads it and journals it.
func (t *upload) uploadPart(ctx context.Context, f *os.File, n int32, buf []byte) error {
	off := int64(n-1) * t.h.ChunkSize
	size := min(t.h.ChunkSize, t.h.size()-off)
	buf = buf[:size]
	if _, err := f.ReadAt(buf, t.h.From+off); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%v: %w", err, ErrSourceChanged) // it shrank
		}
		return fmt.Errorf("upload %s: read part %d: %w", t.h.Path, n, err)
	}
	if err := t.checkSource(f); err != nil {
		return err
	}
	crc := crc32c(buf)
	bs := t.u.blockSize()
	var blocks []byte
	if bs > 0 {
		blocks = blockCRCs(buf, bs)
	}
	var p store.Part
	err := defaultRetry.do(ctx, func() error {
		var err error
		if err := pace(ctx, t.u.Limit, size); err != nil {
			return err
		}
		p, err = t.u.Store.UploadPart(ctx, t.h.Key, t.h.UploadID, n, bytes.NewReader(buf), size)
		return err
	})
	if err != nil {
		return err
	}
	rec := partRecord{Part: n, ETag: p.ETag, CRC32C: crc, Size: size, BlockSize: bs, Blocks: blocks}
	if err := t.j.append(rec); err != nil {
		return err
	}
	t.mu.Lock()
	t.parts[n] = rec
	t.done += size
	done := t.done
	t.mu.Unlock()
	if t.progress != nil {
		t.progress(done, t.h.size())
	}
	if t.u.afterPart != nil {
		t.u.afterPart(n)
	}
	return nil
}

// smallUpload is the largest object sent in one request, without a
// multipart upload or a journal: a crash before the request ends leaves
// nothing to resume, and one after it leaves the object to put again.
const smallUpload = 1 << 20

// putSmall stores bytes [from, size) of a file of at most one chunk and
// smallUpload bytes in one request: read, checked to be what the file
// still holds, checksummed, then put, and its manifest after it.
func (u *Uploader) putSmall(ctx context.Context, f *os.File, path, key string, src Source, o UploadOptions) (*Manifest, error) {
	from, progress := o.From, o.Progress
	size := src.Size - from
	buf := make([]byte, size)
	if _, err := f.ReadAt(buf, from); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%v: %w", err, ErrSourceChanged) // it shrank
		}
		return nil, fmt.Errorf("upload %s: %w", path, err)
	}
	if err := checkSource(f, path, src); err != nil {
		return nil, err
	}
	if u.onStart != nil {
		u.onStart(0, true)
	}
	if progress != nil {
		progress(0, size)
	}
	crcs := []uint32{crc32c(buf)}
	if o.Inline && size <= u.inlineMax() {
		// The manifest is the object: no object, no ETag.
		m := u.manifest(key, "", size, u.chunkSize(), crcs, src, from, o)
		m.Version, m.Inline = inlineVersion, buf
		if err := putManifest(ctx, u.Store, m); err != nil {
			return nil, err
		}
		if progress != nil {
			progress(size, size)
		}
		return m, nil
	}
	var info store.ObjectInfo
	err := defaultRetry.do(ctx, func() error {
		if err := pace(ctx, u.Limit, size); err != nil {
			return err
		}
		var err error
		info, err = u.Store.Put(ctx, key, bytes.NewReader(buf), size)
		return err
	})
	if err != nil {
		return nil, err
	}
	if info.ETag == "" {
		if info, err = u.Store.Head(ctx, key); err != nil {
			return nil, err
		}
	}
	if progress != nil {
		progress(size, size)
	}
	m := u.manifest(key, info.ETag, size, u.chunkSize(), crcs, src, from, o)
	if bs := u.blockSize(); m.servedByBlocks(bs) {
		m.setBlocks(bs, blockCRCs(buf, bs))
	}
	return m, putManifest(ctx, u.Store, m)
}

// manifest is the manifest of an object this uploader stored: key and
// etag, size bytes in chunks of chunkSize with checksums crcs, of the
// file src from position from, with what the caller attached and the
// files it gave (o.Attach, o.Files).
func (u *Uploader) manifest(key, etag string, size, chunkSize int64, crcs []uint32, src Source, from int64, o UploadOptions) *Manifest {
	return &Manifest{Version: manifestVersion, Key: key, ETag: etag, Size: size, ChunkSize: chunkSize, CRC32C: crcs,
		Whole: compositeChecksum(crcs), Source: src, From: from, Stored: time.Now().UTC(), Broker: u.broker(), Attached: o.Attach, Files: o.Files}
}

// sameFiles says a and b hold the same files, in the same order.
func sameFiles(a, b []File) bool {
	return slices.EqualFunc(a, b, func(x, y File) bool {
		return x.Name == y.Name && x.CRC32C == y.CRC32C && bytes.Equal(x.Data, y.Data)
	})
}

// putEmpty stores an empty file as its manifest alone: no object (a
// request saved, and S3 wants at least one part, of which an empty one
// is not accepted everywhere), no chunks, no ETag.
func (u *Uploader) putEmpty(ctx context.Context, key string, src Source, o UploadOptions) (*Manifest, error) {
	m := u.manifest(key, "", 0, u.chunkSize(), nil, src, o.From, o)
	return m, putManifest(ctx, u.Store, m)
}

// finishCompleted handles a crash after the upload was completed but
// before its manifest was stored: the journal holds every part, the
// store no longer knows the upload, and an object of the right size is
// there. The object is read back against the journaled checksums; if it
// matches, its manifest is written and the upload is done without
// sending the file again. Anything else returns nil, nil (start over).
func (u *Uploader) finishCompleted(ctx context.Context, path, key string, src Source, o UploadOptions) (*Manifest, error) {
	from := o.From
	jp := journalPath(u.JournalDir, "upload", key)
	var h uploadHeader
	recs := map[int32]partRecord{}
	ok, err := readJournal(jp, &h, func(raw json.RawMessage) error {
		var r partRecord
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		recs[r.Part] = r
		return nil
	})
	cs := u.chunkSize()
	size := src.Size - from
	n := int32((size + cs - 1) / cs)
	if err != nil || !ok || h.Key != key || h.Path != path || h.Source != src || h.From != from || h.ChunkSize != cs || int32(len(recs)) != n {
		return nil, nil
	}
	if _, err := u.Store.ListParts(ctx, key, h.UploadID); !errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	info, err := u.Store.Head(ctx, key)
	if err != nil || info.Size != size {
		return nil, nil
	}
	crcs := make([]uint32, 0, n)
	for i := int32(1); i <= n; i++ {
		r, ok := recs[i]
		if !ok {
			return nil, nil
		}
		crcs = append(crcs, r.CRC32C)
	}
	m := u.manifest(key, info.ETag, size, cs, crcs, src, from, o)
	m.setBlocks(u.blockSize(), partBlocks(recs, n, u.blockSize()))
	if err := u.Verify(ctx, u.Store, m); err != nil {
		u.log().Warn("completed upload does not verify; uploading again", "key", key, "err", err)
		return nil, nil
	}
	if err := putManifest(ctx, u.Store, m); err != nil {
		return nil, err
	}
	os.Remove(jp)
	fsutil.SyncDir(u.JournalDir)
	u.log().Info("finished an upload completed before a crash", "key", key)
	if u.onStart != nil {
		u.onStart(int(n), false)
	}
	return m, nil
}

// pace waits until lim allows n more bytes (in pieces of its burst).
// Whole parts are paced before they are sent, not as the store reads
// them: a store may read a body twice (to sign it, then to send it).
func pace(ctx context.Context, lim Limiter, n int64) error {
	if lim == nil {
		return nil
	}
	burst := int64(max(lim.Burst(), 1))
	for n > 0 {
		k := min(n, burst)
		if err := lim.WaitN(ctx, int(k)); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
