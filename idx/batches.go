package idx

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"sort"

	"github.com/tierfs/tierfs/idx/kafka"
)

// A batch list is shipped beside every segment object (`.batches`): the
// header fields of each record batch in the object, in order, so that
// another broker's mount can tell, without reading the object, whether
// its own copy of those offsets is the same bytes (Kafka replicas store
// the leader's batches unchanged). Layout, big-endian:
//
//	magic   [4]byte "TFB1"
//	count   uint32
//	count × { baseOffset int64, lastOffsetDelta int32, size int32,
//	          partitionLeaderEpoch int32, crc uint32 }   (24 bytes each)
//	crc     uint32  CRC32C of everything before it
//
// Batch i starts in the object where batch i-1 ends; the first at 0.

const (
	batchesMagic     = "TFB1"
	batchRefSize     = 24
	batchesFixedSize = 4 + 4 + 4
)

// BatchRef is one batch of a batch list: where it lies in its object and
// what identifies its bytes (the header fields Kafka's CRC does not cover,
// and the CRC of the rest).
type BatchRef struct {
	Base, Last int64 // offsets
	Pos        int64 // in the object
	Size       int32 // whole batch
	Epoch      int32 // partition leader epoch
	CRC        uint32
}

// Same says whether two batches are the same bytes as far as their
// headers tell: the same offsets, size, leader epoch and CRC32C of the
// rest (a CRC collision between two replicas' batches of the same offsets
// is the residual risk).
func (b BatchRef) Same(o BatchRef) bool {
	return b.Base == o.Base && b.Last == o.Last && b.Size == o.Size && b.Epoch == o.Epoch && b.CRC == o.CRC
}

// BatchRefs lists the batches of a segment from byte position from to
// its end, with positions relative to from. Every batch is read and its
// CRC32C checked, so that each listed CRC is that of the bytes there.
// A segment that is not whole well-formed record batches v2 from there
// to its end, or has a batch whose CRC is wrong, is an error (its bytes
// cannot be matched batch by batch).
func BatchRefs(name string, r io.ReaderAt, size, from int64) ([]BatchRef, error) {
	var out []BatchRef
	last := int64(-1)
	res, err := kafka.ScanBatches(name, r, size, kafka.ScanOptions{Start: from, VerifyCRC: true}, func(b kafka.Batch) error {
		if b.BaseOffset <= last {
			return formatErr(name, b.Position, "batch offsets %d..%d do not follow offset %d", b.BaseOffset, b.LastOffset, last)
		}
		if b.Size > 1<<31-1 {
			return formatErr(name, b.Position, "batch of %d bytes", b.Size)
		}
		last = b.LastOffset
		out = append(out, BatchRef{Base: b.BaseOffset, Last: b.LastOffset, Pos: b.Position - from, Size: int32(b.Size), Epoch: b.LeaderEpoch, CRC: b.CRC})
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case res.Torn:
		return nil, formatErr(name, res.End, "torn batch: %d bytes after the last whole batch", size-res.End)
	}
	return out, nil
}

// MarshalBatches encodes a batch list; the batches must follow each
// other from position 0.
func MarshalBatches(bs []BatchRef) ([]byte, error) {
	out := make([]byte, 0, batchesFixedSize+batchRefSize*len(bs))
	out = append(out, batchesMagic...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(bs)))
	var pos int64
	for i, b := range bs {
		if b.Pos != pos {
			return nil, fmt.Errorf("batch %d at position %d, want %d", i, b.Pos, pos)
		}
		if b.Last < b.Base || b.Last-b.Base > 1<<31-1 || b.Size <= 0 {
			return nil, fmt.Errorf("batch %d: offsets %d..%d, %d bytes", i, b.Base, b.Last, b.Size)
		}
		out = binary.BigEndian.AppendUint64(out, uint64(b.Base))
		out = binary.BigEndian.AppendUint32(out, uint32(b.Last-b.Base))
		out = binary.BigEndian.AppendUint32(out, uint32(b.Size))
		out = binary.BigEndian.AppendUint32(out, uint32(b.Epoch))
		out = binary.BigEndian.AppendUint32(out, b.CRC)
		pos += int64(b.Size)
	}
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli)), nil
}

// ParseBatches decodes a batch list; name is for errors.
func ParseBatches(name string, data []byte) ([]BatchRef, error) {
	if len(data) < batchesFixedSize {
		return nil, formatErr(name, 0, "batch list of %d bytes is shorter than its header and checksum", len(data))
	}
	if string(data[:4]) != batchesMagic {
		return nil, formatErr(name, 0, "not a batch list (magic %q)", data[:4])
	}
	n := int64(binary.BigEndian.Uint32(data[4:8]))
	if want := batchesFixedSize + batchRefSize*n; int64(len(data)) != want {
		return nil, formatErr(name, 4, "%d batches need %d bytes, the list has %d", n, want, len(data))
	}
	body := data[:len(data)-4]
	if got, want := crc32.Checksum(body, castagnoli), binary.BigEndian.Uint32(data[len(data)-4:]); got != want {
		return nil, formatErr(name, int64(len(body)), "CRC32C %08x, the list says %08x", got, want)
	}
	out := make([]BatchRef, 0, n)
	var pos int64
	last := int64(-1)
	for i := int64(0); i < n; i++ {
		off := 8 + i*batchRefSize
		e := data[off : off+batchRefSize]
		b := BatchRef{
			Base:  int64(binary.BigEndian.Uint64(e[0:8])),
			Size:  int32(binary.BigEndian.Uint32(e[12:16])),
			Epoch: int32(binary.BigEndian.Uint32(e[16:20])),
			CRC:   binary.BigEndian.Uint32(e[20:24]),
			Pos:   pos,
		}
		delta := int32(binary.BigEndian.Uint32(e[8:12]))
		switch {
		case b.Base < 0 || b.Base <= last:
			return nil, formatErr(name, off, "batch %d: base offset %d does not follow offset %d", i, b.Base, last)
		case delta < 0 || b.Base > 1<<63-1-int64(delta):
			return nil, formatErr(name, off+8, "batch %d: last offset delta %d", i, delta)
		case b.Size < kafka.BatchHeaderSize:
			return nil, formatErr(name, off+12, "batch %d: size %d is below a batch header's %d", i, b.Size, kafka.BatchHeaderSize)
		}
		b.Last = b.Base + int64(delta)
		last = b.Last
		pos += int64(b.Size)
		out = append(out, b)
	}
	return out, nil
}

// FindBatch returns the batch of bs (sorted by offset) with base offset
// base.
func FindBatch(bs []BatchRef, base int64) (BatchRef, bool) {
	i := sort.Search(len(bs), func(i int) bool { return bs[i].Base >= base })
	if i < len(bs) && bs[i].Base == base {
		return bs[i], true
	}
	return BatchRef{}, false
}
