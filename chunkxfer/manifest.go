// Package chunkxfer moves files to and from a store.Store in fixed-size
// chunks, each with its CRC32C: a resumable multipart Uploader, a
// resumable Downloader and a ranged Reader with a byte-bounded cache. A
// transfer journal in the state directory lets every transfer resume
// from its last confirmed chunk after a crash.
package chunkxfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// DefaultChunkSize is the part and chunk size: 8 MiB is the usual S3
// part size sweet spot (above the 5 MiB minimum, few enough parts that a
// 80 GiB file fits in S3's 10,000).
const DefaultChunkSize = 8 << 20

// Manifest describes a stored object: its size, the chunk size, and the
// CRC32C of every chunk. It is stored beside the object (ManifestKey).
type Manifest struct {
	Version   int      `json:"version"`
	Key       string   `json:"key"`
	ETag      string   `json:"etag"` // the object's, when the manifest was written
	Size      int64    `json:"size"`
	ChunkSize int64    `json:"chunk_size"`
	CRC32C    []uint32 `json:"crc32c"`
	// Whole is the whole-file checksum: CRC32C over the big-endian
	// chunk CRCs (a composite checksum, as S3 computes for multipart
	// objects), written "crc32c-composite:%08x-N".
	Whole  string `json:"whole"`
	Source Source `json:"source"`
	// From is where in the source file the object starts (an object of
	// a file's tail, shipped after another broker shipped its head).
	From   int64     `json:"from,omitempty"`
	Stored time.Time `json:"stored"`
	// Broker names the broker whose mount uploaded the object (its
	// node.id or --broker-id); empty in manifests of tierfs before 0.x
	// and of uploads outside a broker's mount.
	Broker string `json:"broker,omitempty"`
	// BlockSize and BlockCRC32C, when set, cut the object into blocks
	// of BlockSize (a divisor of ChunkSize; the last block shorter) and
	// give the CRC32C of each, big-endian, 4 bytes a block: a read of a
	// few bytes fetches and checks the blocks that hold them, not a
	// whole chunk. Objects of at most one block, and manifests of
	// versions before 2026-12, have none.
	BlockSize   int64  `json:"block_size,omitempty"`
	BlockCRC32C []byte `json:"block_crc32c,omitempty"`
	// Inline, when set, is the whole object: a small file is stored in
	// its manifest alone (version 2, no object, no ETag), one request
	// instead of two. Its one chunk's CRC32C is checked as any other.
	Inline []byte `json:"inline,omitempty"`
	// Attached is what the uploader's caller stored with the object
	// (UploadOptions.Attach): tiering's batch list of a small .log
	// object (docs/formats.md). chunkxfer does not read it.
	Attached []byte `json:"attached,omitempty"`
	// Files are small files stored with the object in its manifest
	// (UploadOptions.Files), each checked by its CRC32C when the manifest
	// is read: tiering's index files, producer snapshot and leader-epoch
	// checkpoint of a small segment, which then have no key of their own.
	Files []File `json:"files,omitempty"`
}

// File is a small file held by another object's manifest
// (Manifest.Files): its name, unique in the manifest, its bytes and
// their CRC32C.
type File struct {
	Name   string `json:"name"`
	Data   []byte `json:"data"`
	CRC32C uint32 `json:"crc32c"`
}

// NewFile is a File of name holding b, with its checksum.
func NewFile(name string, b []byte) File { return File{Name: name, Data: b, CRC32C: crc32c(b)} }

// File is the bytes of the file name held by the manifest (checked
// against its CRC32C when the manifest was read), if it holds one.
func (m *Manifest) File(name string) ([]byte, bool) {
	for _, f := range m.Files {
		if f.Name == name {
			return f.Data, true
		}
	}
	return nil, false
}

// checkFiles checks the files a manifest holds: named, each name once,
// each the bytes its CRC32C says.
func (m *Manifest) checkFiles() error {
	for i, f := range m.Files {
		switch {
		case f.Name == "":
			return fmt.Errorf("manifest of %s: file %d has no name", m.Key, i)
		case slices.ContainsFunc(m.Files[:i], func(o File) bool { return o.Name == f.Name }):
			return fmt.Errorf("manifest of %s: file %q held twice", m.Key, f.Name)
		case crc32c(f.Data) != f.CRC32C:
			return fmt.Errorf("manifest of %s: file %q (%d bytes) has CRC32C %08x, the manifest says %08x: %w", m.Key, f.Name, len(f.Data), crc32c(f.Data), f.CRC32C, ErrChecksum)
		}
	}
	return nil
}

// DefaultInlineMax is the largest file an Uploader stores in its
// manifest (Uploader.UploadSmall): the index files, producer snapshot
// and leader-epoch checkpoint of a segment of up to about 20 MiB.
const DefaultInlineMax = 64 << 10

// DefaultBlockSize is the block of a first read: about one GET's
// latency of transfer on a fast network, so that the first byte costs
// about one small GET, not a whole chunk's.
const DefaultBlockSize = 256 << 10

// Blocks is the number of blocks (0 when the manifest has none).
func (m *Manifest) Blocks() int { return len(m.BlockCRC32C) / 4 }

// BlockRange is the byte range of block b.
func (m *Manifest) BlockRange(b int) (off, n int64) {
	off = int64(b) * m.BlockSize
	return off, min(m.BlockSize, m.Size-off)
}

// blocksRange is the byte range of blocks b0 to b1.
func (m *Manifest) blocksRange(b0, b1 int) (off, n int64) {
	off, _ = m.BlockRange(b0)
	last, lastN := m.BlockRange(b1)
	return off, last + lastN - off
}

// halfPiece is half of a piece of w bytes (a chunk, or a piece of one)
// when that is whole blocks: pieces are a chunk halved while they are.
func (m *Manifest) halfPiece(w int64) (int64, bool) {
	if m.Blocks() == 0 || w%2 != 0 || (w/2)%m.BlockSize != 0 {
		return 0, false
	}
	return w / 2, true
}

// blocksIn is how many blocks of bs make size bytes.
func blocksIn(size, bs int64) int64 { return (size + bs - 1) / bs }

// blockCRC is the checksum of block b.
func (m *Manifest) blockCRC(b int) uint32 { return binary.BigEndian.Uint32(m.BlockCRC32C[4*b:]) }

// Source identifies the local file an object was uploaded from.
type Source struct {
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	CtimeNs int64  `json:"ctime_ns"`
}

const manifestVersion = 1

// inlineVersion is the version of a manifest that holds its object
// (Inline): a version that does not know the field refuses it by its
// version rather than looking for an object that is not there.
const inlineVersion = 2

// manifestSuffix ends every manifest's key.
const manifestSuffix = ".tierfs-manifest"

// ManifestKey is where an object's manifest is stored.
func ManifestKey(key string) string { return key + manifestSuffix }

// ManifestOf is the key of the object whose manifest is stored at key,
// if key is a manifest's.
func ManifestOf(key string) (string, bool) { return strings.CutSuffix(key, manifestSuffix) }

// NoObject says the manifest is the whole of what is stored: an empty
// file (no ETag) has no object, nor has a small one stored in its
// manifest (Inline). Manifests of versions before 2026-12 name an empty
// object, with its ETag.
func (m *Manifest) NoObject() bool { return m.ETag == "" && int64(len(m.Inline)) == m.Size }

// Chunks is the number of chunks.
func (m *Manifest) Chunks() int { return len(m.CRC32C) }

// ChunkRange is the byte range of chunk i.
func (m *Manifest) ChunkRange(i int) (off, n int64) {
	off = int64(i) * m.ChunkSize
	return off, min(m.ChunkSize, m.Size-off)
}

func compositeChecksum(crcs []uint32) string {
	b := make([]byte, 0, 4*len(crcs))
	for _, c := range crcs {
		b = binary.BigEndian.AppendUint32(b, c)
	}
	return fmt.Sprintf("crc32c-composite:%08x-%d", crc32c(b), len(crcs))
}

// check verifies the manifest is self-consistent.
func (m *Manifest) check() error {
	switch {
	case m.Version != manifestVersion && m.Version != inlineVersion:
		return fmt.Errorf("manifest of %s: version %d, want %d or %d", m.Key, m.Version, manifestVersion, inlineVersion)
	case (m.Version == inlineVersion) != (m.Inline != nil):
		return fmt.Errorf("manifest of %s: version %d with %d inline bytes (only version %d holds its object)", m.Key, m.Version, len(m.Inline), inlineVersion)
	case m.Inline != nil && (int64(len(m.Inline)) != m.Size || m.Size == 0 || m.Size > m.ChunkSize || m.ETag != ""):
		return fmt.Errorf("manifest of %s: %d inline bytes for an object of %d (etag %q, chunk size %d)", m.Key, len(m.Inline), m.Size, m.ETag, m.ChunkSize)
	case m.ChunkSize <= 0 || m.Size < 0:
		return fmt.Errorf("manifest of %s: size %d, chunk size %d", m.Key, m.Size, m.ChunkSize)
	case int64(len(m.CRC32C)) != (m.Size+m.ChunkSize-1)/m.ChunkSize:
		return fmt.Errorf("manifest of %s: %d checksums for %d bytes in chunks of %d", m.Key, len(m.CRC32C), m.Size, m.ChunkSize)
	case m.Whole != compositeChecksum(m.CRC32C):
		return fmt.Errorf("manifest of %s: whole-file checksum %s does not match its chunk checksums", m.Key, m.Whole)
	case m.Inline != nil && crc32c(m.Inline) != m.CRC32C[0]:
		return fmt.Errorf("manifest of %s: its inline bytes have CRC32C %08x, its chunk checksum says %08x: %w", m.Key, crc32c(m.Inline), m.CRC32C[0], ErrChecksum)
	case m.BlockSize == 0 && len(m.BlockCRC32C) == 0:
		// no blocks
	case m.BlockSize <= 0 || m.ChunkSize%m.BlockSize != 0:
		return fmt.Errorf("manifest of %s: block size %d does not divide chunk size %d", m.Key, m.BlockSize, m.ChunkSize)
	case int64(len(m.BlockCRC32C)) != 4*blocksIn(m.Size, m.BlockSize):
		return fmt.Errorf("manifest of %s: %d bytes of block checksums for %d bytes in blocks of %d", m.Key, len(m.BlockCRC32C), m.Size, m.BlockSize)
	}
	return m.checkFiles()
}

// servedByBlocks says whether blocks of bs serve m's object: it has
// more than one.
func (m *Manifest) servedByBlocks(bs int64) bool { return bs > 0 && m.Size > bs }

// setBlocks gives m the block checksums crcs of blocks of bs, where
// they serve (servedByBlocks).
func (m *Manifest) setBlocks(bs int64, crcs []byte) {
	if crcs != nil && m.servedByBlocks(bs) {
		m.BlockSize, m.BlockCRC32C = bs, crcs
	}
}

// blockCRCs are the CRC32Cs of the blocks of b (from its start), as a
// manifest holds them.
func blockCRCs(b []byte, blockSize int64) []byte {
	out := make([]byte, 0, 4*blocksIn(int64(len(b)), blockSize))
	for off := int64(0); off < int64(len(b)); off += blockSize {
		out = binary.BigEndian.AppendUint32(out, crc32c(b[off:min(off+blockSize, int64(len(b)))]))
	}
	return out
}

// LoadManifest reads and checks key's manifest, and that the object is
// still the one it describes.
func LoadManifest(ctx context.Context, s store.Store, key string) (*Manifest, error) {
	m, err := ReadManifest(ctx, s, key)
	if err != nil || m.NoObject() {
		return m, err
	}
	info, err := s.Head(ctx, key)
	if err != nil {
		return nil, err
	}
	if info.ETag != m.ETag || info.Size != m.Size {
		return nil, fmt.Errorf("object %s (etag %s, %d bytes) is not the one its manifest describes (etag %s, %d bytes): %w", key, info.ETag, info.Size, m.ETag, m.Size, store.ErrPrecondition)
	}
	return m, nil
}

// ReadManifest reads and checks key's manifest, but not the object: for
// a caller that checks the object's ETag itself before it relies on the
// manifest (every read of the object carries it too).
func ReadManifest(ctx context.Context, s store.Store, key string) (*Manifest, error) {
	b, err := store.ReadAll(s.Get(ctx, ManifestKey(key), 0, -1, store.GetOptions{}))
	if err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", key, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", key, err)
	}
	if m.Key != key {
		return nil, fmt.Errorf("manifest of %s names %s", key, m.Key)
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

// ParseManifest decodes and checks a manifest (a local copy of one).
func ParseManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

func putManifest(ctx context.Context, s store.Store, m *Manifest) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = s.Put(ctx, ManifestKey(m.Key), bytes.NewReader(b), int64(len(b)))
	return err
}

// ErrChecksum is a chunk whose bytes do not match its CRC32C.
var ErrChecksum = errors.New("checksum mismatch")

// Verify reads the whole object back and checks every chunk against the
// manifest: the check before local bytes may be freed. An object stored
// in its manifest (Inline) is read back by reading the manifest back.
func Verify(ctx context.Context, s store.Store, m *Manifest) error {
	return verify(ctx, s, m, make([]byte, verifyLen(m)))
}

// verifyInline reads back the manifest of m, whose object it holds, and
// checks that the store's copy holds the same bytes.
func verifyInline(ctx context.Context, s store.Store, m *Manifest) error {
	got, err := LoadManifest(ctx, s, m.Key)
	if err != nil {
		return fmt.Errorf("verify %s: %w", m.Key, err)
	}
	if !bytes.Equal(got.Inline, m.Inline) || got.Source != m.Source || got.From != m.From {
		return fmt.Errorf("verify %s: the store's manifest holds %d other bytes (of %v at %d): %w", m.Key, len(got.Inline), got.Source, got.From, ErrChecksum)
	}
	return nil
}

// verifyLen is the buffer Verify needs: a small object needs no whole
// chunk.
func verifyLen(m *Manifest) int64 { return min(m.ChunkSize, m.Size) }

// verify is Verify with a buffer of at least verifyLen(m) bytes, every
// byte of which it fills before it reads it.
func verify(ctx context.Context, s store.Store, m *Manifest, buf []byte) error {
	if m.Inline != nil {
		return verifyInline(ctx, s, m)
	}
	for i := range m.Chunks() {
		off, n := m.ChunkRange(i)
		if err := fetchChunk(ctx, s, m, i, buf[:n]); err != nil {
			return fmt.Errorf("verify %s: chunk %d at %d: %w", m.Key, i, off, err)
		}
		// The block checksums serve reads too: they must hold.
		if m.Blocks() > 0 {
			got := blockCRCs(buf[:n], m.BlockSize)
			if b0 := 4 * (off / m.BlockSize); !bytes.Equal(got, m.BlockCRC32C[b0:b0+int64(len(got))]) {
				return fmt.Errorf("verify %s: chunk %d at %d: its block checksums do not match the manifest's: %w", m.Key, i, off, ErrChecksum)
			}
		}
	}
	return nil
}
