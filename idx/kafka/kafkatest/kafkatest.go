// Package kafkatest writes real Kafka record batches (v2) for tests and
// benchmarks: records encoded by franz-go's kmsg, optionally compressed,
// with the CRC32C computed as the broker does.
package kafkatest

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"hash/crc32"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Batch describes a batch to encode.
type Batch struct {
	Base    int64
	Records int
	// ValueSize is each record's value size; 0 gives 100+i bytes for
	// record i.
	ValueSize int
	TS        int64
	Attrs     int16 // compression (1 = gzip), transactional 0x10, control 0x20
	Epoch     int32
	Producer  int64
}

const (
	headerSize  = 61
	logOverhead = 12
	crcOffset   = 17
	attrOffset  = 21
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode builds the batch as a segment holds it.
func Encode(s Batch) []byte {
	var recs []byte
	for i := range s.Records {
		n := s.ValueSize
		if n == 0 {
			n = 100 + i
		}
		r := kmsg.Record{
			TimestampDelta64: int64(i),
			OffsetDelta:      int32(i),
			Key:              []byte{byte('k'), byte(i)},
			Value:            bytes.Repeat([]byte{byte(i)}, n),
			Headers:          []kmsg.Header{{Key: "h", Value: []byte("v")}},
		}
		// Length is the size of the rest of the record: encode once
		// with 0 (a one-byte varint) to learn it.
		r.Length = int32(len(r.AppendTo(nil)) - 1)
		recs = r.AppendTo(recs)
	}
	if s.Attrs&0x7 == 1 {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(recs)
		w.Close()
		recs = buf.Bytes()
	}
	b := kmsg.RecordBatch{
		FirstOffset:          s.Base,
		PartitionLeaderEpoch: s.Epoch,
		Magic:                2,
		Attributes:           s.Attrs,
		LastOffsetDelta:      int32(s.Records - 1),
		FirstTimestamp:       s.TS,
		MaxTimestamp:         s.TS + int64(s.Records-1),
		ProducerID:           s.Producer,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           int32(s.Records),
		Records:              recs,
	}
	b.Length = int32(headerSize - logOverhead + len(recs))
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[crcOffset:], crc32.Checksum(out[attrOffset:], castagnoli))
	return out
}

// Segment concatenates batches as a .log file holds them.
func Segment(specs ...Batch) []byte {
	var seg []byte
	for _, s := range specs {
		seg = append(seg, Encode(s)...)
	}
	return seg
}
