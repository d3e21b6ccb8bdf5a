package chunkxfer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

// TestFirstReadFetchesBlocks: the first read of a run fetches only the
// blocks that hold it, checked against the manifest's block checksums,
// and the reads after it are served from whole chunks; on every store.
func TestFirstReadFetchesBlocks(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			cs := b.chunk
			bs := cs / 8
			if b.name == "s3" {
				bs = cs / 20 // 5 MiB chunks: blocks of 256 KiB
			}
			size := 3*cs + cs/2 + 5
			path := filepath.Join(dir, "f")
			want := randomFile(t, path, size, 21)
			up := &Uploader{Store: b.s, JournalDir: filepath.Join(dir, "j"), ChunkSize: cs, BlockSize: bs, Parallel: 2}
			m, err := up.Upload(ctx, path, "blocks/f")
			if err != nil {
				t.Fatal(err)
			}
			if m.BlockSize != bs || int64(m.Blocks()) != (size+bs-1)/bs {
				t.Fatalf("manifest has %d blocks of %d, want %d of %d", m.Blocks(), m.BlockSize, (size+bs-1)/bs, bs)
			}
			for blk := range m.Blocks() {
				off, n := m.BlockRange(blk)
				if got := crc32c(want[off : off+n]); got != m.blockCRC(blk) {
					t.Fatalf("block %d: manifest says %08x, bytes have %08x", blk, m.blockCRC(blk), got)
				}
			}
			if err := Verify(ctx, b.s, m); err != nil {
				t.Fatal(err)
			}
			pool, _ := NewPool(8*cs, nil)
			defer pool.Close()
			rd, err := NewReader(ctx, b.s, "blocks/f", pool, ReaderOptions{ReadAhead: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			read := func(off int64, n int) {
				t.Helper()
				got := make([]byte, n)
				k, err := rd.ReadAt(got, off)
				if err != nil || !bytes.Equal(got[:k], want[off:off+int64(k)]) || k != n {
					t.Fatalf("read %d at %d: %d bytes, %v (or wrong bytes)", n, off, k, err)
				}
			}
			// A random read inside one block of chunk 1: one block GET.
			off := cs + 3*bs + 17
			read(off, 100)
			if rd.BlockFetches() != 1 {
				t.Fatalf("first read: %d block fetches, want 1", rd.BlockFetches())
			}
			// The chunk was fetched ahead at the same time: the next
			// read of it finds it.
			read(off+100, int(bs))
			if rd.BlockFetches() != 1 {
				t.Fatalf("a read that follows the first fetched blocks again (%d)", rd.BlockFetches())
			}
			// A first read across two blocks of chunk 3 (chunk 2 was
			// read ahead): one GET of both.
			read(3*cs+2*bs-10, 20)
			if rd.BlockFetches() != 2 {
				t.Fatalf("read across two blocks: %d block fetches, want 2", rd.BlockFetches())
			}
			// More than maxBlockRead blocks: the whole chunk.
			pool1, _ := NewPool(8*cs, nil)
			defer pool1.Close()
			rd2, _ := NewReader(ctx, b.s, "blocks/f", pool1, ReaderOptions{})
			defer rd2.Close()
			got := make([]byte, 3*bs)
			if k, err := rd2.ReadAt(got, 2*cs+1); err != nil || !bytes.Equal(got[:k], want[2*cs+1:2*cs+1+int64(k)]) {
				t.Fatalf("read of 3 blocks: %d, %v", k, err)
			}
			if rd2.BlockFetches() != 0 {
				t.Fatalf("a read of 3 blocks fetched blocks (%d)", rd2.BlockFetches())
			}
			// The object's last block is short.
			pool2, _ := NewPool(8*cs, nil)
			defer pool2.Close()
			rd4, _ := NewReader(ctx, b.s, "blocks/f", pool2, ReaderOptions{})
			defer rd4.Close()
			tail := make([]byte, 64)
			k, err := rd4.ReadAt(tail, size-10)
			if k != 10 || err == nil || !bytes.Equal(tail[:k], want[size-10:]) {
				t.Fatalf("read past the end: %d, %v", k, err)
			}
			if rd4.BlockFetches() != 1 {
				t.Fatalf("read of the last block: %d block fetches", rd4.BlockFetches())
			}
		})
	}
}

// TestBlockReadsAreChecked: a block whose bytes do not match its
// checksum is an error, never data; a manifest without blocks (of an
// older version, or an uploader with none) reads whole chunks.
func TestBlockReadsAreChecked(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const cs, bs = 64 << 10, 8 << 10
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 3*cs, 4)
	m := store.NewMem(nil)
	up := &Uploader{Store: m, JournalDir: filepath.Join(dir, "j"), ChunkSize: cs, BlockSize: bs}
	if _, err := up.Upload(ctx, path, "k"); err != nil {
		t.Fatal(err)
	}
	pool, _ := NewPool(4*cs, nil)
	defer pool.Close()
	rd, err := NewReader(ctx, m, "k", pool, ReaderOptions{Attempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	m.Inject(store.Fault{Op: store.OpGet, KeyPrefix: "k", FlipAt: 100, Times: 1000})
	buf := make([]byte, 10)
	n, err := rd.ReadAt(buf, cs+5*bs+1)
	if !errors.Is(err, ErrChecksum) || n != 0 || !strings.Contains(err.Error(), "block 13 of k") {
		t.Fatalf("corrupt block: %d bytes, %v", n, err)
	}
	if rd.BlockFetches() != 1 {
		t.Fatalf("%d block fetches", rd.BlockFetches())
	}
	// Once the fault is gone the same read returns the bytes: a failed
	// block read leaves nothing behind. (The chunk fetched ahead beside
	// it fails too, and leaves the table.)
	for deadline := time.Now().Add(10 * time.Second); pool.covers(rd, cs); {
		if time.Now().After(deadline) {
			t.Fatal("the chunk fetched beside the blocks never ended")
		}
		time.Sleep(time.Millisecond)
	}
	m.ClearFaults()
	if n, err := rd.ReadAt(buf, cs+5*bs+1); err != nil || !bytes.Equal(buf[:n], want[cs+5*bs+1:cs+5*bs+11]) {
		t.Fatalf("after the fault: %d, %v", n, err)
	}
	if u := pool.Usage(); u.Used() > 4*cs {
		t.Fatalf("pool over its limit: %+v", u)
	}

	// No blocks: an uploader without them, as versions before 2026-12.
	old := &Uploader{Store: m, JournalDir: filepath.Join(dir, "j"), ChunkSize: cs, BlockSize: -1}
	om, err := old.Upload(ctx, path, "old")
	if err != nil || om.Blocks() != 0 || om.BlockSize != 0 {
		t.Fatalf("uploader without blocks: %+v, %v", om, err)
	}
	b, _ := json.Marshal(om)
	if strings.Contains(string(b), "block") {
		t.Fatalf("a manifest without blocks writes them: %s", b)
	}
	rdo, _ := NewReader(ctx, m, "old", pool, ReaderOptions{})
	defer rdo.Close()
	if n, err := rdo.ReadAt(buf, cs+7); err != nil || !bytes.Equal(buf[:n], want[cs+7:cs+17]) || rdo.BlockFetches() != 0 || rdo.Fetches() != 1 {
		t.Fatalf("reader of a manifest without blocks: %d, %v, %d block fetches, %d chunk fetches", n, err, rdo.BlockFetches(), rdo.Fetches())
	}
}

// TestBlockChecksumsOfResumedUpload: an upload resumed from its journal
// keeps each part's block checksums; a journal of a version without them
// gives a manifest without blocks, never wrong ones.
func TestBlockChecksumsOfResumedUpload(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const cs, bs = 64 << 10, 16 << 10
	path := filepath.Join(dir, "f")
	want := randomFile(t, path, 5*cs+3, 8)
	m := store.NewMem(nil)
	jd := filepath.Join(dir, "j")
	boom := errors.New("stop")
	up := &Uploader{Store: m, JournalDir: jd, ChunkSize: cs, BlockSize: bs, Parallel: 1}
	up.afterPart = func(n int32) {
		if n == 2 {
			up.afterPart = nil
			m.Inject(store.Fault{Op: store.OpUploadPart, Err: boom, Times: 100})
		}
	}
	if _, err := up.Upload(ctx, path, "k"); err == nil {
		t.Fatal("upload did not fail")
	}
	m.ClearFaults()
	man, err := up.Upload(ctx, path, "k")
	if err != nil {
		t.Fatal(err)
	}
	if man.Blocks() != (len(want)+bs-1)/bs {
		t.Fatalf("resumed upload: %d blocks", man.Blocks())
	}
	if err := Verify(ctx, m, man); err != nil {
		t.Fatal(err)
	}
	recs := map[int32]partRecord{1: {Size: cs, BlockSize: bs, Blocks: make([]byte, 16)}, 2: {Size: 10, CRC32C: 1}}
	if got := partBlocks(recs, 2, bs); got != nil {
		t.Fatalf("a part without blocks: %x", got)
	}
	recs[2] = partRecord{Size: 10, BlockSize: 2 * bs, Blocks: make([]byte, 4)}
	if got := partBlocks(recs, 2, bs); got != nil {
		t.Fatalf("a part of other blocks: %x", got)
	}
}

// TestManifestBlockChecks: a manifest's blocks must fit its chunks and
// size.
func TestManifestBlockChecks(t *testing.T) {
	good := &Manifest{Version: manifestVersion, Key: "k", Size: 100, ChunkSize: 64, CRC32C: []uint32{1, 2}}
	good.Whole = compositeChecksum(good.CRC32C)
	for _, c := range []struct {
		bs   int64
		crcs int
		want string
	}{
		{0, 0, ""},
		{32, 4, ""},
		{16, 7, ""},
		{16, 6, "bytes of block checksums"},
		{48, 3, "does not divide"},
		{-16, 7, "does not divide"},
		{0, 2, "does not divide"},
	} {
		m := *good
		m.BlockSize, m.BlockCRC32C = c.bs, make([]byte, 4*c.crcs)
		b, _ := json.Marshal(m)
		_, err := ParseManifest(b)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("blocks of %d, %d checksums: %v, want %q", c.bs, c.crcs, err, c.want)
		}
	}
}

// FuzzParseManifest: any input is a manifest whose ranges and checksums
// can all be read, or an error; never a panic.
func FuzzParseManifest(f *testing.F) {
	m := &Manifest{Version: manifestVersion, Key: "k", Size: 100, ChunkSize: 64, CRC32C: []uint32{1, 2}, BlockSize: 32, BlockCRC32C: make([]byte, 16)}
	m.Whole = compositeChecksum(m.CRC32C)
	b, _ := json.Marshal(m)
	f.Add(b)
	f.Add([]byte(`{"version":1,"key":"k","size":0,"chunk_size":8,"crc32c":[],"whole":"crc32c-composite:00000000-0"}`))
	f.Add([]byte(`{"version":1,"block_size":-1}`))
	in := &Manifest{Version: inlineVersion, Key: "k", Size: 5, ChunkSize: 64, Inline: []byte("hello")}
	in.CRC32C = []uint32{crc32c(in.Inline)}
	in.Whole = compositeChecksum(in.CRC32C)
	b, _ = json.Marshal(in)
	f.Add(b)
	withFiles := *m
	withFiles.Files = []File{NewFile(".index", nil), NewFile(".timeindex", []byte("0123456789ab"))}
	b, _ = json.Marshal(&withFiles)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b)
		if err != nil {
			return
		}
		if m.Inline != nil {
			// Every byte of an inline object reads, and checks.
			rc, err := getRange(context.Background(), nil, m, 0, m.Size)
			if err != nil {
				t.Fatalf("inline manifest of %d bytes: %v", m.Size, err)
			}
			if got, err := readFullCRC(rc, make([]byte, m.Size)); err != nil || got != m.CRC32C[0] {
				t.Fatalf("inline bytes read %v, CRC32C %08x, manifest says %08x", err, got, m.CRC32C[0])
			}
		}
		// Every file it holds is the bytes its checksum says.
		for _, fl := range m.Files {
			if got, ok := m.File(fl.Name); !ok || crc32c(got) != fl.CRC32C {
				t.Fatalf("file %q: held %v, CRC32C %08x, manifest says %08x", fl.Name, ok, crc32c(got), fl.CRC32C)
			}
		}
		for i := range min(m.Chunks(), 1000) {
			if off, n := m.ChunkRange(i); off < 0 || n <= 0 || off+n > m.Size {
				t.Fatalf("chunk %d: %d+%d of %d", i, off, n, m.Size)
			}
		}
		for blk := range min(m.Blocks(), 1000) {
			if off, n := m.BlockRange(blk); off < 0 || n <= 0 || off+n > m.Size {
				t.Fatalf("block %d: %d+%d of %d", blk, off, n, m.Size)
			}
			_ = m.blockCRC(blk)
		}
	})
}

// TestReadAtZeroStartsAPass: a read at offset 0 starts a pass wherever
// the last read ended, also within a chunk of 0 (a second consumer of a
// segment no bigger than a chunk): its pass then claims what it reads.
func TestReadAtZeroStartsAPass(t *testing.T) {
	pool, _ := NewPool(64<<10, nil)
	defer pool.Close()
	r := &Reader{m: &Manifest{Size: 100 << 10, ChunkSize: 64 << 10}, pool: pool}
	r.lastEnd.Store(-1)
	if m := r.mode(0); m != readStart {
		t.Fatalf("first read at 0: mode %d", m)
	}
	r.lastEnd.Store(r.m.Size) // a pass ended at the end
	if m := r.mode(0); m != readStart {
		t.Fatalf("read at 0 after a pass: mode %d, want readStart", m)
	}
	if m := r.mode(r.m.Size - 10); m != readSequential {
		t.Fatalf("read just behind the last end: mode %d, want readSequential", m)
	}
	r.lastEnd.Store(10 << 10)
	if m := r.mode(8 << 10); m != readSequential {
		t.Fatalf("read slightly out of order: mode %d", m)
	}
}
