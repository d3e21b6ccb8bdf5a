package idx

import (
	"errors"
	"fmt"
	"io"

	"github.com/tierfs/tierfs/idx/kafka"
)

// DefaultChunkSize is the data a chunk covers when no size is given.
const DefaultChunkSize = 8 << 20

// maxChunkSize keeps a chunk's length within the entry's int32 even with
// one oversized batch on top.
const maxChunkSize = 1 << 30

// Chunk is a contiguous byte range of a file and the index entry that will
// describe it once stored (the RDI is the store's to fill in).
type Chunk struct {
	Position int64
	Entry    Entry // DataLength is the chunk's length; RDI is empty
}

// Chunking is how a file was cut into chunks.
type Chunking struct {
	Chunks []Chunk
	// Opaque says the chunks are plain byte ranges, and Reason why: the
	// file is not a well-formed segment of record batches v2 (or is
	// empty of them).
	Opaque bool
	Reason error
}

// ChunkOptions tune ChunkSegment.
type ChunkOptions struct {
	// Size is the target chunk size (DefaultChunkSize when 0). A chunk
	// holds whole batches and ends before the batch that would take it
	// past Size; a batch larger than Size is a chunk of its own.
	Size int64
	// VerifyCRC checks each batch's CRC32C; a bad one makes the file
	// opaque.
	VerifyCRC bool
}

// ChunkSegment cuts the segment file name (size bytes, base offset base)
// into chunks that cover it from position 0 to its end. A well-formed
// segment gives chunks of whole record batches with their offsets and
// timestamps. Anything else (an older message format, a bad header or
// CRC, offsets below base or going back, a torn tail, which a rolled
// segment never has) gives opaque chunks of Size bytes, each with the
// base offset and no timestamps, so the file is still tierable.
func ChunkSegment(name string, r io.ReaderAt, size, base int64, opts ChunkOptions) (Chunking, error) {
	target := opts.Size
	if target == 0 {
		target = DefaultChunkSize
	}
	if target < 0 || target > maxChunkSize {
		return Chunking{}, fmt.Errorf("chunk size %d out of range (1..%d)", target, maxChunkSize)
	}
	if base < 0 {
		return Chunking{}, fmt.Errorf("negative base offset %d", base)
	}
	var out []Chunk
	var cur *Chunk
	last := base - 1
	res, err := kafka.ScanBatches(name, r, size, kafka.ScanOptions{VerifyCRC: opts.VerifyCRC}, func(b kafka.Batch) error {
		if b.BaseOffset <= last {
			return &FormatError{File: name, Offset: b.Position, Msg: fmt.Sprintf("batch offsets %d..%d do not follow offset %d", b.BaseOffset, b.LastOffset, last)}
		}
		last = b.LastOffset
		first, maxT := min(b.BaseTimestamp, b.MaxTimestamp), b.MaxTimestamp
		if cur != nil && int64(cur.Entry.DataLength)+b.Size > target {
			cur = nil
		}
		if cur == nil {
			out = append(out, Chunk{Position: b.Position, Entry: Entry{FirstOffset: b.BaseOffset, FirstTimestamp: first, LastTimestamp: maxT}})
			cur = &out[len(out)-1]
		}
		cur.Entry.LastOffset = b.LastOffset
		cur.Entry.FirstTimestamp = min(cur.Entry.FirstTimestamp, first)
		cur.Entry.LastTimestamp = max(cur.Entry.LastTimestamp, maxT)
		cur.Entry.DataLength += int32(b.Size)
		return nil
	})
	var fe *FormatError
	switch {
	case err != nil && !errors.As(err, &fe):
		return Chunking{}, err
	case err != nil:
		return opaqueChunks(size, base, target, err), nil
	case res.Torn:
		return opaqueChunks(size, base, target, &FormatError{File: name, Offset: res.End, Msg: fmt.Sprintf("torn batch: %d bytes after the last whole batch", size-res.End)}), nil
	case len(out) == 0 && size > 0:
		return opaqueChunks(size, base, target, fmt.Errorf("%s: no record batch", name)), nil
	}
	return Chunking{Chunks: out}, nil
}

// opaqueChunks cuts size bytes into chunks of target bytes.
func opaqueChunks(size, base, target int64, why error) Chunking {
	c := Chunking{Opaque: true, Reason: why}
	for pos := int64(0); pos < size; pos += target {
		n := min(target, size-pos)
		c.Chunks = append(c.Chunks, Chunk{Position: pos, Entry: Entry{
			FirstOffset: base, LastOffset: base, FirstTimestamp: NoTimestamp, LastTimestamp: NoTimestamp, DataLength: int32(n),
		}})
	}
	return c
}
