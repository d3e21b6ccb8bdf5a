// Package idx holds tierfs's on-disk index formats: the per-partition
// remote log segment index (docs/formats.md) and, in idx/kafka,
// Kafka's own files. It is pure format code.
package idx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Entry is one remote log segment index entry: a contiguous run of whole
// record batches stored remotely.
//
// Layout, big-endian:
//
//	0  magic          int16  0
//	2  length         int16  of the whole entry, in bytes
//	4  crc            uint32 CRC32C of bytes 8..length
//	8  firstOffset    int64
//	16 lastOffset     int64
//	24 firstTimestamp int64
//	32 lastTimestamp  int64
//	40 dataLength     int32  length of the remote data
//	44 rdiLength      int16
//	46 rdi            bytes  remote data identifier (the store's own format)
type Entry struct {
	FirstOffset    int64
	LastOffset     int64
	FirstTimestamp int64
	LastTimestamp  int64
	DataLength     int32
	RDI            []byte
}

const (
	entryMagic = 0
	// EntryHeaderSize is the size of an entry without its RDI.
	EntryHeaderSize = 46
	// MaxRDILength keeps the whole entry within the int16 length field.
	MaxRDILength = 1<<15 - 1 - EntryHeaderSize
	crcStart     = 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Size is the encoded size of the entry.
func (e Entry) Size() int { return EntryHeaderSize + len(e.RDI) }

// Validate checks what the layout cannot express or what no valid entry has.
func (e Entry) Validate() error {
	switch {
	case len(e.RDI) > MaxRDILength:
		return fmt.Errorf("rdi of %d bytes exceeds %d", len(e.RDI), MaxRDILength)
	case e.FirstOffset < 0 || e.LastOffset < e.FirstOffset:
		return fmt.Errorf("offsets %d..%d out of order", e.FirstOffset, e.LastOffset)
	case e.LastTimestamp < e.FirstTimestamp:
		return fmt.Errorf("timestamps %d..%d out of order", e.FirstTimestamp, e.LastTimestamp)
	case e.DataLength < 0:
		return fmt.Errorf("negative data length %d", e.DataLength)
	}
	return nil
}

// AppendTo appends the encoded entry to dst.
func (e Entry) AppendTo(dst []byte) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return dst, err
	}
	start := len(dst)
	be := binary.BigEndian
	dst = be.AppendUint16(dst, entryMagic)
	dst = be.AppendUint16(dst, uint16(e.Size()))
	dst = be.AppendUint32(dst, 0) // crc, filled below
	dst = be.AppendUint64(dst, uint64(e.FirstOffset))
	dst = be.AppendUint64(dst, uint64(e.LastOffset))
	dst = be.AppendUint64(dst, uint64(e.FirstTimestamp))
	dst = be.AppendUint64(dst, uint64(e.LastTimestamp))
	dst = be.AppendUint32(dst, uint32(e.DataLength))
	dst = be.AppendUint16(dst, uint16(len(e.RDI)))
	dst = append(dst, e.RDI...)
	be.PutUint32(dst[start+4:], crc32.Checksum(dst[start+crcStart:], castagnoli))
	return dst, nil
}

// ErrShortEntry means the input ends inside an entry: at the end of an
// index file, a torn last append.
var ErrShortEntry = errors.New("entry is cut short")

// DecodeEntry decodes the entry at the start of b and returns it with its
// encoded size. The RDI aliases b.
func DecodeEntry(b []byte) (Entry, int, error) {
	be := binary.BigEndian
	if len(b) < 4 {
		return Entry{}, 0, ErrShortEntry
	}
	if magic := be.Uint16(b); magic != entryMagic {
		return Entry{}, 0, fmt.Errorf("bad magic %d", int16(magic))
	}
	length := int(be.Uint16(b[2:]))
	if length < EntryHeaderSize || length > 1<<15-1 {
		return Entry{}, 0, fmt.Errorf("bad entry length %d", length)
	}
	if len(b) < length {
		return Entry{}, 0, ErrShortEntry
	}
	b = b[:length]
	if got, want := crc32.Checksum(b[crcStart:], castagnoli), be.Uint32(b[4:]); got != want {
		return Entry{}, 0, fmt.Errorf("CRC32C %08x, entry says %08x", got, want)
	}
	e := Entry{
		FirstOffset:    int64(be.Uint64(b[8:])),
		LastOffset:     int64(be.Uint64(b[16:])),
		FirstTimestamp: int64(be.Uint64(b[24:])),
		LastTimestamp:  int64(be.Uint64(b[32:])),
		DataLength:     int32(be.Uint32(b[40:])),
	}
	rdiLen := int(be.Uint16(b[44:]))
	if EntryHeaderSize+rdiLen != length {
		return Entry{}, 0, fmt.Errorf("rdi length %d does not fit entry length %d", rdiLen, length)
	}
	e.RDI = b[EntryHeaderSize:length]
	if err := e.Validate(); err != nil {
		return Entry{}, 0, err
	}
	return e, length, nil
}
