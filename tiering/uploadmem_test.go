package tiering

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// uploadsInFlight is a memory store that counts the segments being
// uploaded at once: puts of a whole .log, and multipart uploads (from
// their creation to their completion). Each is slowed down so that
// uploads the tierer runs at once overlap.
type uploadsInFlight struct {
	*store.Mem
	mu                sync.Mutex
	puts, multipart   int // in flight now
	peakPuts, peakMul int
}

const uploadLatency = 20 * time.Millisecond

func (s *uploadsInFlight) count(n *int, peak *int, d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*n += d
	*peak = max(*peak, *n)
}

func (s *uploadsInFlight) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) (store.ObjectInfo, error) {
	if strings.HasSuffix(key, ".log") {
		s.count(&s.puts, &s.peakPuts, 1)
		defer s.count(&s.puts, &s.peakPuts, -1)
		time.Sleep(uploadLatency)
	}
	return s.Mem.Put(ctx, key, body, size)
}

func (s *uploadsInFlight) CreateMultipart(ctx context.Context, key string) (string, error) {
	s.count(&s.multipart, &s.peakMul, 1)
	return s.Mem.CreateMultipart(ctx, key)
}

func (s *uploadsInFlight) UploadPart(ctx context.Context, key, uploadID string, num int32, body io.ReadSeeker, size int64) (store.Part, error) {
	time.Sleep(uploadLatency)
	return s.Mem.UploadPart(ctx, key, uploadID, num, body, size)
}

func (s *uploadsInFlight) CompleteMultipart(ctx context.Context, key, uploadID string, parts []store.Part) (store.ObjectInfo, error) {
	defer s.count(&s.multipart, &s.peakMul, -1)
	return s.Mem.CompleteMultipart(ctx, key, uploadID, parts)
}

// Small segments of more partitions than Concurrency ship at once (their
// cost is latency, not memory); large ones, uploaded in parts, never
// more than Concurrency at once.
func TestShipConcurrencySmallAndLarge(t *testing.T) {
	for _, c := range []struct {
		name      string
		valueSize int // of 8 records a batch, 40 batches a segment; chunks are 64 KiB
		large     bool
	}{{"small", 40, false}, {"two chunks", 400, true}, {"five chunks", 1000, true}} {
		t.Run(c.name, func(t *testing.T) {
			s := &uploadsInFlight{Mem: store.NewMem(nil)}
			root := filepath.Join(t.TempDir(), "kafka-logs")
			if _, err := (kafkatest.LogDir{Topic: "s", Partitions: 8, Segments: 3, Batches: 40, Records: 8, ValueSize: c.valueSize, Age: time.Hour}).Write(root); err != nil {
				t.Fatal(err)
			}
			tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: s, ChunkSize: 64 << 10, Concurrency: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			rep := tr.RunOnce(context.Background())
			if len(rep.Errors) > 0 || rep.Shipped != 16 {
				t.Fatalf("pass: %+v", rep)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if c.large {
				if s.peakPuts != 0 || s.peakMul != 1 {
					t.Errorf("large segments: %d multipart uploads and %d whole puts at once, want 1 and 0 (Concurrency 1)", s.peakMul, s.peakPuts)
				}
				return
			}
			if s.peakMul != 0 || s.peakPuts < 2 || s.peakPuts > partitionsPerUpload {
				t.Errorf("small segments: %d uploads at once (and %d multipart), want 2 to %d with Concurrency 1", s.peakPuts, s.peakMul, partitionsPerUpload)
			}
		})
	}
}

func TestUploadMemory(t *testing.T) {
	tr := &Tierer{cfg: Config{ChunkSize: 8 << 20}, up: &chunkxfer.Uploader{ChunkSize: 8 << 20}}
	for _, c := range []struct{ n, want int64 }{
		{0, 1}, {4096, 4096}, {1 << 20, 1 << 20}, // one request: its bytes
		{1<<20 + 1, 32 << 20}, {8 << 20, 32 << 20}, {20 << 20, 32 << 20}, {1 << 30, 32 << 20}, // in parts: a whole share
	} {
		if got := tr.uploadMemory(c.n); got != c.want {
			t.Errorf("uploadMemory(%d) = %d, want %d", c.n, got, c.want)
		}
	}
	if tr.uploadCap() != 32<<20 {
		t.Errorf("uploadCap = %d", tr.uploadCap())
	}
}
