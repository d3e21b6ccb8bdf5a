package kafka

import (
	"encoding/binary"
	"hash/crc32"
	"io"
)

// Record batch v2 header layout (big-endian), as written in segments:
//
//	0  baseOffset           int64
//	8  batchLength          int32   bytes after this field
//	12 partitionLeaderEpoch int32
//	16 magic                int8    2
//	17 crc                  uint32  CRC32C of bytes 21..end
//	21 attributes           int16
//	23 lastOffsetDelta      int32
//	27 baseTimestamp        int64
//	35 maxTimestamp         int64
//	43 producerId           int64
//	51 producerEpoch        int16
//	53 baseSequence         int32
//	57 recordsCount         int32
//	61 records...
const (
	BatchHeaderSize = 61
	logOverhead     = 12 // baseOffset + batchLength
	magicOffset     = 16
	crcOffset       = 17
	attrOffset      = 21
	// maxBatchSize bounds batchLength so a corrupt length cannot make the
	// scanner allocate or skip absurdly: Kafka's message.max.bytes is far
	// below this.
	maxBatchSize = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Batch is the header of one record batch and where it lies in the segment.
type Batch struct {
	Position      int64 // byte offset of the batch in the segment
	Size          int64 // whole batch, header included
	BaseOffset    int64
	LastOffset    int64
	LeaderEpoch   int32
	Magic         int8
	CRC           uint32
	Attributes    int16
	BaseTimestamp int64
	MaxTimestamp  int64
	ProducerID    int64
	ProducerEpoch int16
	BaseSequence  int32
	RecordCount   int32
}

// Compression is the codec in the attributes (0 none, 1 gzip, 2 snappy,
// 3 lz4, 4 zstd).
func (b Batch) Compression() int { return int(b.Attributes & 0x7) }

// Transactional reports the transactional bit.
func (b Batch) Transactional() bool { return b.Attributes&0x10 != 0 }

// Control reports a control batch (transaction markers).
func (b Batch) Control() bool { return b.Attributes&0x20 != 0 }

// ScanResult says how a scan ended.
type ScanResult struct {
	Batches int
	// End is where the last whole batch ends. Past it, up to the file
	// size, is a torn tail (a batch whose header or body is incomplete),
	// which Kafka's recovery truncates.
	End  int64
	Torn bool
}

// ScanOptions tune ScanBatches.
type ScanOptions struct {
	// VerifyCRC reads each whole batch and checks its CRC32C.
	VerifyCRC bool
	// Start is the position of the first batch to read (a batch start,
	// such as an .index position); 0 scans the whole segment.
	Start int64
}

// ScanBatches walks the record batches of a segment of the given size,
// calling fn for each. It stops cleanly at a torn tail. Older message
// formats (magic 0 and 1) and impossible headers are errors that name
// the file and position; a CRC mismatch too, when verified.
func ScanBatches(name string, r io.ReaderAt, size int64, opts ScanOptions, fn func(Batch) error) (ScanResult, error) {
	var res ScanResult
	hdr := make([]byte, BatchHeaderSize)
	var body []byte
	pos := opts.Start
	res.End = pos
	for pos < size {
		if size-pos < BatchHeaderSize {
			res.Torn = true
			break
		}
		if _, err := r.ReadAt(hdr, pos); err != nil {
			return res, &ReadError{File: name, Offset: pos, Err: err}
		}
		b, err := parseHeader(name, pos, hdr)
		if err != nil {
			return res, err
		}
		if pos+b.Size > size {
			res.Torn = true
			break
		}
		if opts.VerifyCRC {
			n := b.Size - attrOffset
			if int64(cap(body)) < n {
				body = make([]byte, n)
			}
			body = body[:n]
			if _, err := r.ReadAt(body, pos+attrOffset); err != nil {
				return res, &ReadError{File: name, Offset: pos, Err: err}
			}
			if got := crc32.Checksum(body, castagnoli); got != b.CRC {
				return res, formatErr(name, pos, "batch at offset %d: CRC32C %08x, header says %08x", b.BaseOffset, got, b.CRC)
			}
		}
		if err := fn(b); err != nil {
			return res, err
		}
		res.Batches++
		pos += b.Size
		res.End = pos
	}
	return res, nil
}

// parseHeader decodes and checks one v2 header at pos.
func parseHeader(name string, pos int64, h []byte) (Batch, error) {
	be := binary.BigEndian
	length := int32(be.Uint32(h[8:]))
	magic := int8(h[magicOffset])
	if magic == 0 || magic == 1 {
		return Batch{}, formatErr(name, pos, "message format v%d (magic %d): only record batch v2 segments are parsed", magic, magic)
	}
	if magic != 2 {
		return Batch{}, formatErr(name, pos, "bad magic %d", magic)
	}
	if length < BatchHeaderSize-logOverhead || length > maxBatchSize {
		return Batch{}, formatErr(name, pos, "bad batch length %d", length)
	}
	b := Batch{
		Position:      pos,
		Size:          int64(length) + logOverhead,
		BaseOffset:    int64(be.Uint64(h[0:])),
		LeaderEpoch:   int32(be.Uint32(h[12:])),
		Magic:         magic,
		CRC:           be.Uint32(h[crcOffset:]),
		Attributes:    int16(be.Uint16(h[21:])),
		BaseTimestamp: int64(be.Uint64(h[27:])),
		MaxTimestamp:  int64(be.Uint64(h[35:])),
		ProducerID:    int64(be.Uint64(h[43:])),
		ProducerEpoch: int16(be.Uint16(h[51:])),
		BaseSequence:  int32(be.Uint32(h[53:])),
		RecordCount:   int32(be.Uint32(h[57:])),
	}
	delta := int32(be.Uint32(h[23:]))
	if b.BaseOffset < 0 || delta < 0 || b.RecordCount < 0 {
		return Batch{}, formatErr(name, pos, "bad header: base offset %d, last offset delta %d, %d records", b.BaseOffset, delta, b.RecordCount)
	}
	b.LastOffset = b.BaseOffset + int64(delta)
	if b.LastOffset < b.BaseOffset {
		return Batch{}, formatErr(name, pos, "last offset overflows")
	}
	return b, nil
}
