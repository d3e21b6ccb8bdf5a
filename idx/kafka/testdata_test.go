package kafka

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"hash/crc32"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// batchSpec describes a batch to encode with franz-go's kmsg.
type batchSpec struct {
	base     int64
	records  int
	ts       int64
	attrs    int16 // compression, transactional, control bits
	epoch    int32
	producer int64
}

// encodeBatch builds a real v2 record batch: records encoded by kmsg,
// compressed with gzip when attrs say so, header from kmsg.RecordBatch, and
// the CRC32C computed as Kafka does.
func encodeBatch(s batchSpec) []byte {
	var recs []byte
	for i := range s.records {
		r := kmsg.Record{
			TimestampDelta64: int64(i),
			OffsetDelta:      int32(i),
			Key:              []byte{byte('k'), byte(i)},
			Value:            bytes.Repeat([]byte{byte(i)}, 100+i),
			Headers:          []kmsg.Header{{Key: "h", Value: []byte("v")}},
		}
		// Length is the size of the rest of the record: encode once
		// with 0 (a one-byte varint) to learn it.
		r.Length = int32(len(r.AppendTo(nil)) - 1)
		recs = r.AppendTo(recs)
	}
	if s.attrs&0x7 == 1 {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(recs)
		w.Close()
		recs = buf.Bytes()
	}
	b := kmsg.RecordBatch{
		FirstOffset:          s.base,
		PartitionLeaderEpoch: s.epoch,
		Magic:                2,
		Attributes:           s.attrs,
		LastOffsetDelta:      int32(s.records - 1),
		FirstTimestamp:       s.ts,
		MaxTimestamp:         s.ts + int64(s.records-1),
		ProducerID:           s.producer,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           int32(s.records),
		Records:              recs,
	}
	b.Length = int32(BatchHeaderSize - logOverhead + len(recs))
	out := b.AppendTo(nil)
	crc := crc32.Checksum(out[attrOffset:], crc32.MakeTable(crc32.Castagnoli))
	binary.BigEndian.PutUint32(out[crcOffset:], crc)
	return out
}

// segment concatenates batches as a .log file holds them.
func segment(specs ...batchSpec) []byte {
	var seg []byte
	for _, s := range specs {
		seg = append(seg, encodeBatch(s)...)
	}
	return seg
}
