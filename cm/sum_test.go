package cm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/testenv"
)

// TestSparseReaderReadsWhatTheFileHolds: files of data extents and holes
// in random places (a hole at the start, at the end, none at all, data
// ending inside a block) read the same through sparseReader, with any
// buffer size, as with a plain read; and its checksum is sha256sum's.
func TestSparseReaderReadsWhatTheFileHolds(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 60 {
		path := filepath.Join(dir, "f")
		os.Remove(path)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		size := rng.Int64N(3 << 20)
		if i%10 == 0 {
			size = 0
		}
		f.Truncate(size)
		for range rng.IntN(6) {
			if size == 0 {
				break
			}
			off := rng.Int64N(size)
			b := make([]byte, rng.Int64N(min(size-off, 300<<10))+1)
			for j := range b {
				b[j] = byte(rng.IntN(255) + 1)
			}
			f.WriteAt(b, off)
		}
		f.Close()
		want, _ := os.ReadFile(path)
		fd, st, err := openRegular(unix.AT_FDCWD, path)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1+rng.IntN(256<<10))
		var got bytes.Buffer
		_, err = io.CopyBuffer(&got, io.LimitReader(&sparseReader{fd: fd, size: st.Size}, st.Size+1), buf)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("file %d (%d bytes, buffer %d): sparseReader read other bytes", i, size, len(buf))
		}
		r, done, err := contentAt(nil, path, fd, st.Size)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := hashReader(r, st.Size, nil)
		done()
		unix.Close(fd)
		if w := sha256.Sum256(want); err != nil || sum != hex.EncodeToString(w[:]) {
			t.Fatalf("file %d: checksum %s, %v", i, sum, err)
		}
	}
}

// TestSparseReaderSaysWhenTheFileShrank: a file cut shorter than the size
// it was read for is an error, not zeros.
func TestSparseReaderSaysWhenTheFileShrank(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, bytes.Repeat([]byte{1}, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, st, err := openRegular(unix.AT_FDCWD, path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for _, cut := range []int64{4096, 100, 0} {
		os.Truncate(path, cut)
		_, err := hashReader(&sparseReader{fd: fd, size: st.Size}, st.Size, nil)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("cut to %d: %v, want io.ErrUnexpectedEOF", cut, err)
		}
	}
}

// BenchmarkSumOfAPreallocatedIndex: the checksum of a Kafka index that
// was deleted untrimmed (10 MiB, 4 KiB of it data), read through
// sparseReader and, for comparison, with pread only; each time from
// outside the page cache, as the filer reads an original once.
func BenchmarkSumOfAPreallocatedIndex(b *testing.B) {
	path := filepath.Join(b.TempDir(), "00.index")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	f.Truncate(10 << 20)
	f.WriteAt(bytes.Repeat([]byte{7}, 4096), 0)
	f.Close()
	fd, st, err := openRegular(unix.AT_FDCWD, path)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 256<<10)
	for _, rd := range []struct {
		name string
		r    func() io.Reader
	}{
		{"sparse", func() io.Reader { return &sparseReader{fd: fd, size: st.Size} }},
		{"pread", func() io.Reader { return io.NewSectionReader(preader(fd), 0, st.Size) }},
	} {
		b.Run(rd.name, func(b *testing.B) {
			b.SetBytes(st.Size)
			for b.Loop() {
				unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
				if _, err := hashReader(rd.r(), st.Size, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type preader int

func (p preader) ReadAt(b []byte, off int64) (int, error) {
	n, err := unix.Pread(int(p), b, off)
	if err == nil && n < len(b) {
		err = io.EOF
	}
	return n, err
}

// TestCacheSumCachesAFreshFile: the tierer caches a segment's checksum
// just before it frees its bytes, however new its mtime; the cached value
// is sha256sum's and holds for that version only.
func TestCacheSumCachesAFreshFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "00.log")
	content := bytes.Repeat([]byte("batch"), 100_000)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	m := New(Config{})
	if err := m.CacheSum(path); err != nil {
		testenv.Missing(t, "no trusted xattrs here: %v", err)
	}
	fd, _, err := openRegular(unix.AT_FDCWD, path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	want := sha256.Sum256(content)
	if s, ok := cachedSum(fd); !ok || s != hex.EncodeToString(want[:]) {
		t.Fatalf("cached %q, %v; want %x", s, ok, want)
	}
	if err := os.WriteFile(path, []byte("another version"), 0o644); err != nil {
		t.Fatal(err)
	}
	if s, ok := cachedSum(fd); ok {
		t.Fatalf("the checksum %s is still cached for a new version", s)
	}
}
