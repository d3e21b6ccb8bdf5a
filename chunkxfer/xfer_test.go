package chunkxfer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/chunkxfer/store/s3test"
)

// backend is a store the same test bodies run against.
type backend struct {
	name  string
	s     store.Store
	chunk int64 // the smallest part size the store takes
	url   string
	creds store.S3Options
}

var (
	s3Once sync.Once
	s3Dir  string // the server's data, removed when the tests end
	s3Srv  *s3test.Server
	s3Err  error
)

// sharedS3 starts one versitygw for the package's tests.
func sharedS3(t *testing.T) *s3test.Server {
	s3Once.Do(func() {
		s3Dir, s3Err = os.MkdirTemp("", "tierfs-chunkxfer-s3-")
		if s3Err != nil {
			return
		}
		s3Srv, s3Err = s3test.Start(filepath.Join(s3Dir, "s3"))
	})
	if s3Err != nil {
		t.Fatal(s3Err)
	}
	return s3Srv
}

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	code := m.Run()
	if s3Srv != nil {
		s3Srv.Stop()
	}
	if s3Dir != "" {
		os.RemoveAll(s3Dir) // 160 MB a run was left in /tmp
	}
	os.Exit(code)
}

var bucketSeq int

func backends(t *testing.T) []backend {
	dir := t.TempDir()
	d, err := store.NewDir(filepath.Join(dir, "remote"))
	if err != nil {
		t.Fatal(err)
	}
	srv := sharedS3(t)
	bucketSeq++
	bucket := fmt.Sprintf("xfer-%d-%d", os.Getpid(), bucketSeq)
	s3s, err := srv.NewStore(context.Background(), bucket, "t/")
	if err != nil {
		t.Fatal(err)
	}
	return []backend{
		{name: "mem", s: store.NewMem(nil), chunk: 64 << 10},
		{name: "dir", s: d, chunk: 64 << 10, url: "file://" + filepath.Join(dir, "remote")},
		{name: "s3", s: s3s, chunk: 5 << 20, url: "s3://" + bucket + "/t/?endpoint=" + srv.Endpoint, creds: srv.Options(bucket, "t/")},
	}
}

func randomFile(t *testing.T, path string, n int64, seed uint64) []byte {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 3))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func noUploads(t *testing.T, s store.Store) {
	t.Helper()
	ups, err := s.ListMultipart(context.Background(), "")
	if err != nil || len(ups) != 0 {
		t.Fatalf("leaked uploads: %+v %v", ups, err)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			cs := b.chunk
			for i, size := range []int64{0, 1, cs - 1, cs, cs + 1, 3*cs + cs/2} {
				path := filepath.Join(dir, fmt.Sprintf("f%d", i))
				want := randomFile(t, path, size, uint64(i))
				key := fmt.Sprintf("p/f%d", i)
				up := &Uploader{Store: b.s, JournalDir: filepath.Join(dir, "journal"), ChunkSize: cs, Parallel: 3}
				m, err := up.Upload(ctx, path, key)
				if err != nil {
					t.Fatalf("upload %d bytes: %v", size, err)
				}
				if m.Size != size || int64(m.Chunks()) != (size+cs-1)/cs {
					t.Fatalf("manifest %+v", m)
				}
				if err := Verify(ctx, b.s, m); err != nil {
					t.Fatal(err)
				}
				if _, err := b.s.Head(ctx, key); size == 0 && !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("an empty file was stored as an object, not as its manifest alone: %v", err)
				}
				dl := &Downloader{Store: b.s, JournalDir: filepath.Join(dir, "journal"), Parallel: 3}
				dest := filepath.Join(dir, fmt.Sprintf("back%d", i))
				if _, err := dl.Download(ctx, key, dest); err != nil {
					t.Fatalf("download: %v", err)
				}
				if got, _ := os.ReadFile(dest); !bytes.Equal(got, want) {
					t.Fatalf("download of %d bytes differs", size)
				}
				cache, _ := NewPool(4*cs, nil)
				r, err := NewReader(ctx, b.s, key, cache, ReaderOptions{ReadAhead: 2})
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(io.NewSectionReader(r, 0, size))
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("reader: %d bytes, %v", len(got), err)
				}
				r.Close()
				cache.Close()
				// A second upload of the unchanged file is a no-op.
				m2, err := up.Upload(ctx, path, key)
				if err != nil || m2.ETag != m.ETag {
					t.Fatalf("re-upload: %v", err)
				}
			}
			if ents, _ := os.ReadDir(filepath.Join(dir, "journal")); len(ents) != 0 {
				t.Fatalf("journals left: %v", ents)
			}
			noUploads(t, b.s)
		})
	}
}

// TestUploadFrom ships a file's tail: the object holds the bytes from
// the given position, is resumed as any upload, and is never mistaken
// for an upload of the whole file.
func TestUploadFrom(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			cs := b.chunk
			path := filepath.Join(dir, "f")
			want := randomFile(t, path, 3*cs+cs/3, 9)
			up := &Uploader{Store: b.s, JournalDir: filepath.Join(dir, "journal"), ChunkSize: cs, Parallel: 3}
			for _, from := range []int64{cs / 2, cs, int64(len(want)), 0} {
				key := fmt.Sprintf("p/tail-%d", from)
				m, err := up.UploadFrom(ctx, path, key, from, nil)
				if err != nil {
					t.Fatalf("upload from %d: %v", from, err)
				}
				if m.From != from || m.Size != int64(len(want))-from {
					t.Fatalf("manifest from %d: %+v", from, m)
				}
				if from == int64(len(want)) {
					// An empty tail is its manifest alone.
					if _, err := b.s.Head(ctx, key); !m.NoObject() || !errors.Is(err, store.ErrNotFound) {
						t.Fatalf("empty tail: manifest %+v, object %v", m, err)
					}
				} else if got, err := store.ReadAll(b.s.Get(ctx, key, 0, -1, store.GetOptions{})); err != nil || !bytes.Equal(got, want[from:]) {
					t.Fatalf("object from %d: %d bytes, %v", from, len(got), err)
				}
				if err := Verify(ctx, b.s, m); err != nil {
					t.Fatal(err)
				}
			}
			// The same key from another position is another upload.
			m, err := up.UploadFrom(ctx, path, "p/tail-0", cs, nil)
			if err != nil || m.From != cs {
				t.Fatalf("upload of another tail to the same key: %+v %v", m, err)
			}
			if _, err := up.UploadFrom(ctx, path, "p/x", int64(len(want))+1, nil); err == nil {
				t.Fatal("an upload from past the end")
			}
			noUploads(t, b.s)
		})
	}
}

func TestSourceChanges(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			cs := b.chunk
			for _, change := range []string{"write", "append", "truncate", "replace"} {
				path := filepath.Join(dir, "seg-"+change)
				randomFile(t, path, 4*cs, 9)
				key := "c/" + change
				up := &Uploader{Store: b.s, JournalDir: filepath.Join(dir, "journal"), ChunkSize: cs, Parallel: 1}
				up.afterPart = func(n int32) {
					if n != 2 {
						return
					}
					time.Sleep(10 * time.Millisecond) // a later ctime tick
					switch change {
					case "write":
						f, _ := os.OpenFile(path, os.O_WRONLY, 0)
						f.WriteAt([]byte("X"), 5)
						f.Close()
					case "append":
						f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
						f.Write([]byte("more"))
						f.Close()
					case "truncate":
						os.Truncate(path, cs)
					case "replace":
						os.WriteFile(path+".new", []byte("new"), 0o644)
						os.Rename(path+".new", path)
					}
				}
				_, err := up.Upload(ctx, path, key)
				if !errors.Is(err, ErrSourceChanged) {
					t.Fatalf("%s during upload: %v", change, err)
				}
				if _, err := b.s.Head(ctx, key); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("%s: an object was stored: %v", change, err)
				}
				if _, err := LoadManifest(ctx, b.s, key); err == nil {
					t.Fatalf("%s: a manifest was stored", change)
				}
			}
			noUploads(t, b.s)
			// A file written just now is refused when Settle is set.
			path := filepath.Join(dir, "fresh")
			randomFile(t, path, 10, 1)
			up := &Uploader{Store: b.s, JournalDir: filepath.Join(dir, "journal"), ChunkSize: cs, Settle: time.Minute}
			if _, err := up.Upload(ctx, path, "c/fresh"); !errors.Is(err, ErrSourceChanged) {
				t.Fatalf("fresh file: %v", err)
			}
		})
	}
}

// TestMemFaults: with random faults on every call, transfers either
// succeed byte-exact or fail with an error; they never return or store
// wrong bytes.
func TestMemFaults(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const cs = 32 << 10
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 20*cs+77, 5)
	boom := errors.New("injected 503")
	ok, failed := 0, 0
	for seed := range uint64(30) {
		m := store.NewMem(nil)
		r := rand.New(rand.NewPCG(seed, 11))
		for range 8 {
			f := store.Fault{Skip: r.IntN(30), Times: 1 + r.IntN(3)}
			switch r.IntN(4) {
			case 0:
				f.Err = boom
			case 1:
				f.DieAfter = 1 + r.Int64N(cs)
			case 2:
				f.Op, f.Truncate = store.OpGet, 1+r.Int64N(cs)
			case 3:
				f.Op, f.FlipAt = store.OpGet, 1+r.Int64N(cs)
			}
			m.Inject(f)
		}
		jd := filepath.Join(dir, fmt.Sprint("j", seed))
		up := &Uploader{Store: m, JournalDir: jd, ChunkSize: cs, Parallel: 4}
		man, err := up.Upload(ctx, path, "k")
		if err != nil {
			failed++
			continue
		}
		dest := filepath.Join(dir, fmt.Sprint("d", seed))
		dl := &Downloader{Store: m, JournalDir: jd, Parallel: 4}
		if _, err := dl.Download(ctx, "k", dest); err == nil {
			if got, _ := os.ReadFile(dest); !bytes.Equal(got, want) {
				t.Fatalf("seed %d: download returned wrong bytes", seed)
			}
		}
		cache, _ := NewPool(2*cs, nil)
		rd, err := NewReader(ctx, m, "k", cache, ReaderOptions{ReadAhead: 2})
		if err == nil {
			got := make([]byte, len(want))
			n, err := rd.ReadAt(got, 0)
			if err == nil && !bytes.Equal(got[:n], want) {
				t.Fatalf("seed %d: reader returned wrong bytes", seed)
			}
			rd.Close()
		}
		cache.Close()
		// Stored bytes are right, whatever the transfers saw.
		m.ClearFaults()
		if err := Verify(ctx, m, man); err != nil {
			t.Fatalf("seed %d: stored object is wrong: %v", seed, err)
		}
		ok++
	}
	t.Logf("%d uploads succeeded, %d failed cleanly", ok, failed)
	if ok == 0 {
		t.Fatal("no upload survived the faults: retries do not work")
	}
	// A chunk that is always corrupt is an error, never data.
	m := store.NewMem(nil)
	up := &Uploader{Store: m, JournalDir: filepath.Join(dir, "jx"), ChunkSize: cs}
	if _, err := up.Upload(ctx, path, "k"); err != nil {
		t.Fatal(err)
	}
	cache, _ := NewPool(1<<20, nil)
	defer cache.Close()
	rd, err := NewReader(ctx, m, "k", cache, ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.Inject(store.Fault{Op: store.OpGet, KeyPrefix: "k", FlipAt: 100})
	buf := make([]byte, 10)
	if n, err := rd.ReadAt(buf, 3*cs); !errors.Is(err, ErrChecksum) || n != 0 {
		t.Fatalf("corrupt chunk: %d bytes, %v", n, err)
	}
}

func TestReaderRandomReads(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			cs := b.chunk
			path := filepath.Join(dir, "f")
			size := 6*cs + 1234
			randomFile(t, path, size, 8)
			up := &Uploader{Store: b.s, JournalDir: dir, ChunkSize: cs}
			if _, err := up.Upload(ctx, path, "r/f"); err != nil {
				t.Fatal(err)
			}
			local, _ := os.Open(path)
			defer local.Close()
			cache, _ := NewPool(2*cs, nil) // holds two chunks of seven
			defer cache.Close()
			rd, err := NewReader(ctx, b.s, "r/f", cache, ReaderOptions{ReadAhead: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			r := rand.New(rand.NewPCG(1, 2))
			steps := 300
			if b.name == "s3" {
				steps = 60
			}
			for range steps {
				off := r.Int64N(size + 100)
				n := r.Int64N(2*cs + 10)
				got, want := make([]byte, n), make([]byte, n)
				gn, gerr := rd.ReadAt(got, off)
				wn, werr := local.ReadAt(want, off)
				if gn != wn || (gerr == nil) != (werr == nil) || !bytes.Equal(got[:gn], want[:wn]) {
					t.Fatalf("ReadAt(%d, %d): %d %v, file gives %d %v", n, off, gn, gerr, wn, werr)
				}
				if sl, release, ok, err := rd.Slice(ctx, off, int(n)); ok {
					if err != nil || !bytes.Equal(sl, want[:wn]) {
						t.Fatalf("Slice(%d, %d): %d bytes, %v; file gives %d", off, n, len(sl), err, wn)
					}
					release()
				} else if n > 0 && off < size && (off/cs == (min(off+n, size)-1)/cs) {
					t.Fatalf("Slice(%d, %d) refused a range within one chunk", off, n)
				}
			}
		})
	}
}

func TestReaderSingleflight(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 4<<16, 4)
	m := store.NewMem(nil)
	up := &Uploader{Store: m, JournalDir: dir, ChunkSize: 1 << 16}
	if _, err := up.Upload(ctx, path, "s"); err != nil {
		t.Fatal(err)
	}
	cache, _ := NewPool(1<<20, nil)
	defer cache.Close()
	rd, err := NewReader(ctx, m, "s", cache, ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	m.Inject(store.Fault{Op: store.OpGet, Latency: 100 * time.Millisecond})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 100)
			if _, err := rd.ReadAt(b, int64(1<<16+i*100)); err != nil || !bytes.Equal(b, want[1<<16+i*100:][:100]) {
				t.Errorf("reader %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if rd.Fetches() != 1 {
		t.Fatalf("16 concurrent misses of one chunk made %d fetches", rd.Fetches())
	}
	// Sequential reads fetch ahead: after reading chunk 0, chunk 1 is
	// already there.
	m.ClearFaults()
	cache2, _ := NewPool(1<<20, nil)
	defer cache2.Close()
	rd2, _ := NewReader(ctx, m, "s", cache2, ReaderOptions{ReadAhead: 2})
	defer rd2.Close()
	b := make([]byte, 1<<16)
	rd2.ReadAt(b, 0)
	deadline := time.Now().Add(5 * time.Second)
	for rd2.Fetches() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	waitIdle(t, cache2)
	before := rd2.Fetches()
	rd2.ReadAt(b, 1<<16)
	if before != 3 || rd2.Fetches() != before+0 && rd2.Fetches() != before+1 {
		t.Fatalf("read-ahead: %d fetches before the second read, %d after", before, rd2.Fetches())
	}
}

func TestDownloadResume(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const cs = 1 << 16
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 40*cs, 6)
	m := store.NewMem(nil)
	up := &Uploader{Store: m, JournalDir: dir, ChunkSize: cs}
	if _, err := up.Upload(ctx, path, "d"); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(dir, "out")
	// The store dies after 25 chunk GETs (plus the manifest's).
	m.Inject(store.Fault{Op: store.OpGet, Skip: 26, Err: errors.New("network gone")})
	dl := &Downloader{Store: m, JournalDir: filepath.Join(dir, "j"), Parallel: 2}
	if _, err := dl.Download(ctx, "d", dest); err == nil {
		t.Fatal("download survived a dead network")
	}
	if _, err := os.Stat(dest); err == nil {
		t.Fatal("a partial download was put in place")
	}
	// Corrupt one journaled chunk of the partial file: it is fetched again.
	f, _ := os.OpenFile(dest+tempSuffix, os.O_WRONLY, 0)
	f.WriteAt([]byte("garbage"), 3*cs+5)
	f.Close()
	m.ClearFaults()
	gets := m.Calls(store.OpGet)
	if _, err := dl.Download(ctx, "d", dest); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dest); !bytes.Equal(got, want) {
		t.Fatal("resumed download differs")
	}
	refetched := m.Calls(store.OpGet) - gets - 1 // minus the manifest
	if refetched >= 40 || refetched < 15 {
		t.Fatalf("resume fetched %d of 40 chunks", refetched)
	}
	t.Logf("resume fetched %d of 40 chunks", refetched)
}

// TestS3ThroughFaultyProxy runs transfers against versitygw through a
// proxy that answers 503, resets connections, is slow, and cuts bodies:
// they succeed byte-exact (the SDK and chunk retries absorb the faults)
// or fail with an error, never with wrong bytes.
func TestS3ThroughFaultyProxy(t *testing.T) {
	srv := sharedS3(t)
	proxy, err := s3test.StartFaultProxy(srv.Endpoint, 0.15, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.Slow = 200 * time.Millisecond
	ctx := context.Background()
	direct, err := srv.NewStore(ctx, "faulty", "")
	if err != nil {
		t.Fatal(err)
	}
	o := srv.Options("faulty", "")
	o.Endpoint, o.MaxAttempts = proxy.URL, 8
	s, err := store.NewS3(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const cs = 5 << 20
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 4*cs+999, 12)
	ok := 0
	for i := range 3 {
		key := fmt.Sprintf("f%d", i)
		up := &Uploader{Store: s, JournalDir: filepath.Join(dir, "j"), ChunkSize: cs, Parallel: 4}
		if _, err := up.Upload(ctx, path, key); err != nil {
			t.Logf("upload %d failed: %v", i, err)
			continue
		}
		// What is stored is right, read past the proxy.
		if got, err := store.ReadAll(direct.Get(ctx, key, 0, -1, store.GetOptions{})); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("upload %d stored wrong bytes (%v)", i, err)
		}
		dl := &Downloader{Store: s, JournalDir: filepath.Join(dir, "j"), Parallel: 4}
		dest := filepath.Join(dir, key+".back")
		if _, err := dl.Download(ctx, key, dest); err != nil {
			t.Logf("download %d failed: %v", i, err)
		} else if got, _ := os.ReadFile(dest); !bytes.Equal(got, want) {
			t.Fatalf("download %d returned wrong bytes", i)
		}
		cache, _ := NewPool(2*cs, nil)
		rd, err := NewReader(ctx, s, key, cache, ReaderOptions{ReadAhead: 1})
		if err == nil {
			got := make([]byte, len(want))
			if n, err := rd.ReadAt(got, 0); err == nil && !bytes.Equal(got[:n], want) {
				t.Fatalf("reader %d returned wrong bytes", i)
			}
			rd.Close()
		}
		cache.Close()
		ok++
	}
	counts := proxy.Counts()
	t.Logf("faults injected: %v; %d of 3 rounds completed", counts, ok)
	if ok == 0 {
		t.Fatal("no transfer got through a 15% fault rate")
	}
	for _, k := range []string{"503", "reset", "slow", "cut"} {
		if counts[k] == 0 {
			t.Errorf("no %s fault was injected", k)
		}
	}
	noUploads(t, direct)
}

// TestUploadFinishesACompletedUpload: a crash after completing the
// multipart upload but before the manifest is stored (here: the manifest
// PUT fails) is finished by the next run without sending the file again.
func TestUploadFinishesACompletedUpload(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 5<<16+3, 21)
	m := store.NewMem(nil)
	m.Inject(store.Fault{Op: store.OpPut, KeyPrefix: ManifestKey("k"), Times: 1, Err: errors.New("crash")})
	up := &Uploader{Store: m, JournalDir: filepath.Join(dir, "j"), ChunkSize: 1 << 16}
	if _, err := up.Upload(ctx, path, "k"); err == nil {
		t.Fatal("manifest fault did not fail the upload")
	}
	parts := m.Calls(store.OpUploadPart)
	man, err := up.Upload(ctx, path, "k")
	if err != nil {
		t.Fatal(err)
	}
	if m.Calls(store.OpUploadPart) != parts || m.Calls(store.OpCreateMultipart) != 1 {
		t.Fatalf("the file was sent again: %d parts before, %d after, %d uploads", parts, m.Calls(store.OpUploadPart), m.Calls(store.OpCreateMultipart))
	}
	if got, _ := store.ReadAll(m.Get(ctx, "k", 0, -1, store.GetOptions{})); !bytes.Equal(got, want) || man.Size != int64(len(want)) {
		t.Fatal("object differs")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "j")); len(ents) != 0 {
		t.Fatalf("journal left: %v", ents)
	}
}

// countingLimiter is a Limiter that lets everything through and counts.
type countingLimiter struct {
	mu    sync.Mutex
	bytes int64
	calls int
}

func (c *countingLimiter) WaitN(ctx context.Context, n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n > c.Burst() {
		return fmt.Errorf("wait of %d exceeds the burst", n)
	}
	c.bytes += int64(n)
	c.calls++
	return ctx.Err()
}

func (c *countingLimiter) Burst() int { return 1000 }

// TestUploadPacedWithProgress: every byte sent waits for the limiter, in
// pieces within its burst; progress grows to the size, and a resumed
// upload starts from what was confirmed; Abandon leaves no upload behind.
func TestUploadPacedWithProgress(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := store.NewMem(nil)
	path := filepath.Join(dir, "f")
	const cs = 4096
	randomFile(t, path, 5*cs+7, 1)
	lim := &countingLimiter{}
	up := &Uploader{Store: s, JournalDir: filepath.Join(dir, "journal"), ChunkSize: cs, Parallel: 1, Limit: lim}
	// The third part fails: the upload stops with two confirmed.
	s.Inject(store.Fault{Op: store.OpUploadPart, Skip: 2, Err: errors.New("injected")})
	var seen []int64
	if _, err := up.UploadProgress(ctx, path, "k", func(done, total int64) { seen = append(seen, done) }); err == nil {
		t.Fatal("upload did not fail")
	}
	if fmt.Sprint(seen) != fmt.Sprint([]int64{0, cs, 2 * cs}) {
		t.Fatalf("progress %v", seen)
	}
	first := lim.bytes
	if first < 3*cs || first%cs != 0 {
		t.Fatalf("limiter saw %d bytes for two parts and the failing one's attempts", first)
	}
	s.ClearFaults()
	seen = nil
	var total int64
	if _, err := up.UploadProgress(ctx, path, "k", func(done, tot int64) { seen = append(seen, done); total = tot }); err != nil {
		t.Fatal(err)
	}
	if seen[0] != 2*cs || seen[len(seen)-1] != 5*cs+7 || total != 5*cs+7 {
		t.Fatalf("resumed progress %v of %d", seen, total)
	}
	// The resumed upload sends (and waits for) the three parts left.
	if got, want := lim.bytes-first, int64(3*cs+7); got != want || lim.calls < int(lim.bytes/1000) {
		t.Fatalf("limiter saw %d bytes in %d calls, want %d", got, lim.calls, want)
	}
	// An upload given up for good: its journal and parts go.
	path2 := filepath.Join(dir, "g")
	randomFile(t, path2, 3*cs, 2)
	s.Inject(store.Fault{Op: store.OpUploadPart, Skip: 1, Err: errors.New("injected")})
	if _, err := up.Upload(ctx, path2, "g"); err == nil {
		t.Fatal("upload did not fail")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "journal")); len(ents) != 1 {
		t.Fatalf("journals: %v", ents)
	}
	s.ClearFaults()
	if err := up.Abandon(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "journal")); len(ents) != 0 {
		t.Fatalf("journals left: %v", ents)
	}
	noUploads(t, s)
}

// An object of at most one chunk (and smallUpload bytes) goes in one
// request: no multipart upload, no journal. A put that fails is retried;
// a journal left by an earlier multipart upload of the key sends it down
// the multipart path, which aborts what that upload left.
func TestSmallUploadIsOneRequest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const cs = 64 << 10
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 5000, 9)
	m := store.NewMem(nil)
	m.Inject(store.Fault{Op: store.OpCreateMultipart, Err: errors.New("no multipart for a small object")})
	m.Inject(store.Fault{Op: store.OpPut, KeyPrefix: "k", Times: 1, Err: errors.New("injected 503")})
	jd := filepath.Join(dir, "journal")
	up := &Uploader{Store: m, JournalDir: jd, ChunkSize: cs}
	man, err := up.Upload(ctx, path, "k")
	if err != nil {
		t.Fatal(err)
	}
	if man.Size != 5000 || man.Chunks() != 1 || man.CRC32C[0] != crc32c(want) {
		t.Fatalf("manifest %+v", man)
	}
	if err := Verify(ctx, m, man); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(jd); len(ents) != 0 {
		t.Fatalf("journals: %v", ents)
	}
	m.ClearFaults()

	// A multipart upload of a larger version was cut short (its journal
	// and its upload are left); the file is now small.
	want = randomFile(t, path, 3*cs, 10)
	m.Inject(store.Fault{Op: store.OpCompleteMultipart, Err: errors.New("cut short")})
	if _, err := up.Upload(ctx, path, "k2"); err == nil {
		t.Fatal("the cut upload succeeded")
	}
	m.ClearFaults()
	if ents, _ := os.ReadDir(jd); len(ents) != 1 {
		t.Fatalf("journals after the cut upload: %v", ents)
	}
	want = randomFile(t, path, 100, 11)
	man, err = up.Upload(ctx, path, "k2")
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.ReadAll(m.Get(ctx, "k2", 0, -1, store.GetOptions{}))
	if err != nil || !bytes.Equal(got, want) || man.Size != 100 {
		t.Fatalf("k2: %d bytes, %v", len(got), err)
	}
	noUploads(t, m)
	if ents, _ := os.ReadDir(jd); len(ents) != 0 {
		t.Fatalf("journals left: %v", ents)
	}
}

// A fresh upload (UploadOptions.Fresh) does not look for a finished
// upload of the key: a small file is one put of the object and one of
// its manifest, nothing read.
func TestFreshUploadLooksForNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 3000, 12)
	m := store.NewMem(nil)
	up := &Uploader{Store: m, JournalDir: filepath.Join(dir, "journal"), ChunkSize: 64 << 10}
	man, err := up.UploadWith(ctx, path, "k", UploadOptions{Fresh: true})
	if err != nil {
		t.Fatal(err)
	}
	if m.Calls(store.OpGet)+m.Calls(store.OpHead) != 0 || m.Calls(store.OpPut) != 2 {
		t.Fatalf("%d gets, %d heads, %d puts", m.Calls(store.OpGet), m.Calls(store.OpHead), m.Calls(store.OpPut))
	}
	got, err := store.ReadAll(m.Get(ctx, "k", 0, -1, store.GetOptions{}))
	if err != nil || !bytes.Equal(got, want) || Verify(ctx, m, man) != nil {
		t.Fatalf("object: %d bytes, %v", len(got), err)
	}
	// UploadFrom of the same unchanged file finds that upload.
	puts := m.Calls(store.OpPut)
	if again, err := up.UploadFrom(ctx, path, "k", 0, nil); err != nil || again.ETag != man.ETag || m.Calls(store.OpPut) != puts {
		t.Fatalf("UploadFrom after a fresh upload: %v, %d more puts", err, m.Calls(store.OpPut)-puts)
	}
}

// TestEmptyObjectOfAnOlderVersion: a store written before empty files
// were stored as their manifest alone holds an empty object and a
// manifest with its ETag; it still loads, checked against that object.
func TestEmptyObjectOfAnOlderVersion(t *testing.T) {
	ctx := context.Background()
	s := store.NewMem(nil)
	info, err := s.Put(ctx, "p/empty", bytes.NewReader(nil), 0)
	if err != nil {
		t.Fatal(err)
	}
	up := &Uploader{Store: s, ChunkSize: 64 << 10}
	if err := putManifest(ctx, s, up.manifest("p/empty", info.ETag, 0, 64<<10, nil, Source{}, 0, UploadOptions{})); err != nil {
		t.Fatal(err)
	}
	m, err := LoadManifest(ctx, s, "p/empty")
	if err != nil || m.NoObject() || m.ETag != info.ETag {
		t.Fatalf("%+v %v", m, err)
	}
	if err := s.Delete(ctx, "p/empty"); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadManifest(ctx, s, "p/empty"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("its object gone, the manifest loads: %v", err)
	}
}

// An upload goes in one request up to 1 MiB, and never past one chunk.
func TestOneRequest(t *testing.T) {
	for _, c := range []struct {
		chunk, n int64
		want     bool
	}{
		{8 << 20, 0, true}, {8 << 20, 1 << 20, true}, {8 << 20, 1<<20 + 1, false}, {8 << 20, 8 << 20, false},
		{64 << 10, 64 << 10, true}, {64 << 10, 64<<10 + 1, false},
	} {
		u := &Uploader{ChunkSize: c.chunk}
		if got := u.OneRequest(c.n); got != c.want {
			t.Errorf("chunk %d: OneRequest(%d) = %v, want %v", c.chunk, c.n, got, c.want)
		}
	}
}

// TestUploadFromSendsATornObjectAgain: a deferred view of a directory
// store syncs a new object's bytes at its next Flush, so a machine crash
// before it can leave the object's name with fewer bytes (here: cut)
// and its manifest whole. The upload that resumes it must not take it
// as done: it sends the object again, and the result verifies.
func TestUploadFromSendsATornObjectAgain(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	d, err := store.NewDir(filepath.Join(dir, "remote"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 3000, 13)
	up := &Uploader{Store: d.Deferred(), JournalDir: filepath.Join(dir, "journal"), ChunkSize: 64 << 10}
	if _, err := up.UploadWith(ctx, path, "p/k", UploadOptions{Fresh: true}); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "remote", "p", "k"), 1000); err != nil {
		t.Fatal(err)
	}
	man, err := up.UploadFrom(ctx, path, "p/k", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(ctx, d, man); err != nil {
		t.Fatalf("the resumed upload took the torn object: %v", err)
	}
	got, err := store.ReadAll(d.Get(ctx, "p/k", 0, -1, store.GetOptions{}))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("object: %d bytes, %v", len(got), err)
	}
}

// countingUploader is an Uploader on b's store that counts its
// requests, with a work directory for its journals and files.
func countingUploader(t *testing.T, b backend, inlineMax int64) (*Uploader, *store.Requests, string) {
	dir := t.TempDir()
	calls := &store.Requests{}
	return &Uploader{Store: store.Counted(b.s, calls), JournalDir: filepath.Join(dir, "journal"), ChunkSize: b.chunk, InlineMax: inlineMax}, calls, dir
}

// TestUploadSmallInline (all three stores): UploadSmall stores a file of
// up to InlineMax bytes in its manifest alone, one put and no object; it
// reads back through LoadManifest, the Reader, the Downloader and Verify,
// each byte checked; a second UploadSmall of the unchanged file sends
// nothing; a larger file is an object as before. A manifest whose inline
// bytes were changed in the store fails Verify and every read, and one
// of another version than 2 is refused.
func TestUploadSmallInline(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			up, calls, dir := countingUploader(t, b, 4<<10)
			path := filepath.Join(dir, "f")
			want := randomFile(t, path, 4<<10, 21)
			m, err := up.UploadSmall(ctx, path, "p/small", true)
			if err != nil {
				t.Fatal(err)
			}
			if got := calls.Total(); got != 1 {
				t.Fatalf("%d requests for a small file, want 1 (its manifest)", got)
			}
			if !bytes.Equal(m.Inline, want) || !m.NoObject() || m.Version != inlineVersion {
				t.Fatalf("manifest: version %d, %d inline bytes, no object %v", m.Version, len(m.Inline), m.NoObject())
			}
			if _, err := b.s.Head(ctx, "p/small"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("a small file has an object: %v", err)
			}
			loaded, err := LoadManifest(ctx, b.s, "p/small")
			if err != nil || !bytes.Equal(loaded.Inline, want) {
				t.Fatalf("load: %v", err)
			}
			if err := Verify(ctx, b.s, m); err != nil {
				t.Fatal(err)
			}
			dest := filepath.Join(dir, "back")
			if _, err := (&Downloader{Store: b.s, JournalDir: filepath.Join(dir, "journal")}).Download(ctx, "p/small", dest); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(dest); !bytes.Equal(got, want) {
				t.Fatal("download differs")
			}
			pool, _ := NewPool(4*b.chunk, nil)
			defer pool.Close()
			r, err := NewReader(ctx, b.s, "p/small", pool, ReaderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(io.NewSectionReader(r, 0, r.Size()))
			r.Close()
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("reader: %d bytes, %v", len(got), err)
			}
			before := calls.Total()
			if again, err := up.UploadSmall(ctx, path, "p/small", false); err != nil || !bytes.Equal(again.Inline, want) || calls.Total() != before+1 {
				t.Fatalf("UploadSmall of the unchanged file: %v, %d requests (want one read of the manifest)", err, calls.Total()-before)
			}

			// One byte over InlineMax: an object and its manifest.
			big := filepath.Join(dir, "big")
			randomFile(t, big, 4<<10+1, 22)
			mb, err := up.UploadSmall(ctx, big, "p/big", true)
			if err != nil || mb.Inline != nil || mb.ETag == "" {
				t.Fatalf("a file over InlineMax: %+v, %v", mb, err)
			}

			// The store's copy changed: the same size and version, one
			// byte flipped, its checksums left as they were.
			bad := *m
			bad.Inline = bytes.Clone(m.Inline)
			bad.Inline[100] ^= 1
			raw, _ := json.Marshal(&bad)
			if _, err := b.s.Put(ctx, ManifestKey("p/small"), bytes.NewReader(raw), int64(len(raw))); err != nil {
				t.Fatal(err)
			}
			if err := Verify(ctx, b.s, m); !errors.Is(err, ErrChecksum) {
				t.Fatalf("verify of a changed copy: %v", err)
			}
			if _, err := LoadManifest(ctx, b.s, "p/small"); !errors.Is(err, ErrChecksum) {
				t.Fatalf("load of a changed copy: %v", err)
			}
			if _, err := NewReader(ctx, b.s, "p/small", pool, ReaderOptions{}); err == nil {
				t.Fatal("a reader opened a changed copy")
			}
			// Version 1 does not hold its object.
			v1 := *m
			v1.Version = manifestVersion
			raw, _ = json.Marshal(&v1)
			if _, err := ParseManifest(raw); err == nil {
				t.Fatal("a version 1 manifest with inline bytes parsed")
			}
		})
	}
}

// TestUploadAttach (all three stores): what the caller attaches is
// stored in the manifest, whether the object is an object (one request
// or multipart) or held by the manifest; an upload of the unchanged file
// with the same attachment sends nothing, and with another one puts the
// manifest again, not the object.
func TestUploadAttach(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			up, calls, dir := countingUploader(t, b, 1<<10)
			for i, size := range []int64{100, 5000, 2*b.chunk + 1} {
				path := filepath.Join(dir, fmt.Sprint("f", i))
				randomFile(t, path, size, uint64(30+i))
				key := fmt.Sprint("p/a", i)
				attach := []byte(fmt.Sprint("batches of ", key))
				m, err := up.UploadWith(ctx, path, key, UploadOptions{Fresh: true, Inline: true, Attach: attach})
				if err != nil || !bytes.Equal(m.Attached, attach) {
					t.Fatalf("%d bytes: %+v, %v", size, m, err)
				}
				if got, err := LoadManifest(ctx, b.s, key); err != nil || !bytes.Equal(got.Attached, attach) {
					t.Fatalf("%d bytes: the store's manifest has %q, %v", size, got.Attached, err)
				}
				puts := func() int64 {
					n, _ := calls.Count(store.OpPut)
					p, _ := calls.Count(store.OpUploadPart)
					return n + p
				}
				before := puts()
				if _, err := up.UploadWith(ctx, path, key, UploadOptions{Inline: true, Attach: attach}); err != nil || puts() != before {
					t.Fatalf("%d bytes, unchanged: %v, %d puts", size, err, puts()-before)
				}
				other := []byte("another list")
				if m, err := up.UploadWith(ctx, path, key, UploadOptions{Inline: true, Attach: other}); err != nil || puts() != before+1 || !bytes.Equal(m.Attached, other) {
					t.Fatalf("%d bytes, another attachment: %v, %d puts", size, err, puts()-before)
				}
				if got, err := LoadManifest(ctx, b.s, key); err != nil || !bytes.Equal(got.Attached, other) || Verify(ctx, b.s, got) != nil {
					t.Fatalf("%d bytes: after the second attachment %q, %v", size, got.Attached, err)
				}
			}
			noUploads(t, b.s)
		})
	}
}

// TestUploadFiles: small files given with an upload are held by its
// manifest, each read back checked by its CRC32C: a resumed upload of
// the same file and files sends nothing, one with other files stores the
// manifest again (not the object), and a manifest whose file does not
// match its checksum, or that holds a name twice, is refused with an
// error that names it.
func TestUploadFiles(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			up, calls, dir := countingUploader(t, b, 1<<10)
			for i, size := range []int64{0, 100, 5000, 2*b.chunk + 1} {
				path := filepath.Join(dir, fmt.Sprint("f", i))
				randomFile(t, path, size, uint64(40+i))
				key := fmt.Sprint("p/f", i)
				files := []File{NewFile(".index", nil), NewFile(".timeindex", []byte("0123456789ab")), NewFile(".snapshot", bytes.Repeat([]byte{byte(i)}, 3000))}
				m, err := up.UploadWith(ctx, path, key, UploadOptions{Fresh: true, Files: files})
				if err != nil || !sameFiles(m.Files, files) {
					t.Fatalf("%d bytes: %+v, %v", size, m, err)
				}
				got, err := LoadManifest(ctx, b.s, key)
				if err != nil {
					t.Fatalf("%d bytes: %v", size, err)
				}
				for _, f := range files {
					if data, ok := got.File(f.Name); !ok || !bytes.Equal(data, f.Data) {
						t.Fatalf("%d bytes: the store's manifest holds %s: %v, %d bytes", size, f.Name, ok, len(data))
					}
				}
				if _, ok := got.File(".txnindex"); ok {
					t.Fatalf("%d bytes: a file not given is held", size)
				}
				puts := func() int64 {
					n, _ := calls.Count(store.OpPut)
					p, _ := calls.Count(store.OpUploadPart)
					return n + p
				}
				before := puts()
				if _, err := up.UploadWith(ctx, path, key, UploadOptions{Files: files}); err != nil || puts() != before {
					t.Fatalf("%d bytes, unchanged: %v, %d puts", size, err, puts()-before)
				}
				other := append(slices.Clone(files[:2]), NewFile(".snapshot", []byte("newer")))
				if m, err := up.UploadWith(ctx, path, key, UploadOptions{Files: other}); err != nil || puts() != before+1 || !sameFiles(m.Files, other) {
					t.Fatalf("%d bytes, other files: %v, %d puts", size, err, puts()-before)
				}
				if got, err := LoadManifest(ctx, b.s, key); err != nil || !sameFiles(got.Files, other) {
					t.Fatalf("%d bytes: after the other files: %v", size, err)
				}
			}
			// A file's bytes changed in the store, and a name held twice.
			m, err := ReadManifest(ctx, b.s, "p/f1")
			if err != nil {
				t.Fatal(err)
			}
			bad := *m
			bad.Files = slices.Clone(m.Files)
			bad.Files[1].Data = []byte("0123456789aB")
			if err := putManifest(ctx, b.s, &bad); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadManifest(ctx, b.s, "p/f1"); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), `".timeindex"`) || !strings.Contains(err.Error(), "p/f1") {
				t.Fatalf("a changed file: %v", err)
			}
			bad.Files = []File{m.Files[0], m.Files[0]}
			if err := putManifest(ctx, b.s, &bad); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadManifest(ctx, b.s, "p/f1"); err == nil || !strings.Contains(err.Error(), "twice") {
				t.Fatalf("a name held twice: %v", err)
			}
			noUploads(t, b.s)
		})
	}
}
