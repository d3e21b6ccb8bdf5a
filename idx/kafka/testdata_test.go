package kafka

import "github.com/tierfs/tierfs/idx/kafka/kafkatest"

// batchSpec describes a batch to encode with kafkatest (franz-go's kmsg).
type batchSpec struct {
	base     int64
	records  int
	ts       int64
	attrs    int16 // compression, transactional, control bits
	epoch    int32
	producer int64
}

func (s batchSpec) real() kafkatest.Batch {
	return kafkatest.Batch{Base: s.base, Records: s.records, TS: s.ts, Attrs: s.attrs, Epoch: s.epoch, Producer: s.producer}
}

// encodeBatch builds a real v2 record batch.
func encodeBatch(s batchSpec) []byte { return kafkatest.Encode(s.real()) }

// segment concatenates batches as a .log file holds them.
func segment(specs ...batchSpec) []byte {
	var seg []byte
	for _, s := range specs {
		seg = append(seg, encodeBatch(s)...)
	}
	return seg
}
