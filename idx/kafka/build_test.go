package kafka_test

import (
	"bytes"
	"testing"

	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

func TestBuildIndexes(t *testing.T) {
	var seg []byte
	var batches []kafka.Batch
	base := int64(1000)
	for i := range 200 {
		// Timestamps mostly grow, with some going back.
		ts := int64(5000 + i*10)
		if i%7 == 3 {
			ts -= 500
		}
		seg = append(seg, kafkatest.Encode(kafkatest.Batch{Base: base + int64(i)*4, Records: 4, ValueSize: 300 + i%5*100, TS: ts})...)
	}
	kafka.ScanBatches("seg", bytes.NewReader(seg), int64(len(seg)), kafka.ScanOptions{}, func(b kafka.Batch) error { batches = append(batches, b); return nil })
	offs, times, err := kafka.BuildIndexes("seg", bytes.NewReader(seg), int64(len(seg)), base, 4096)
	if err != nil {
		t.Fatal(err)
	}
	oi, err := kafka.ParseOffsetIndex("seg.index", base, offs)
	if err != nil || len(oi) != len(offs)/8 || len(oi) < 10 {
		t.Fatalf("offset index: %d entries of %d bytes, %v", len(oi), len(offs), err)
	}
	ti, err := kafka.ParseTimeIndex("seg.timeindex", base, times)
	if err != nil || len(ti) != len(times)/12 || len(ti) < 5 {
		t.Fatalf("time index: %d entries, %v", len(ti), err)
	}
	starts := map[int64]kafka.Batch{}
	for _, b := range batches {
		starts[b.Position] = b
	}
	prev := int64(0)
	for _, e := range oi {
		b, ok := starts[e.Position]
		if !ok || b.LastOffset != e.Offset {
			t.Fatalf("entry %+v is not a batch's last offset at its start", e)
		}
		if e.Position-prev <= 4096 && prev != 0 {
			t.Errorf("entries %d and %d are not an interval apart", prev, e.Position)
		}
		prev = e.Position
	}
	// Every batch is found from the index: the entry before it is at or
	// before it.
	for _, b := range batches {
		if e, ok := kafka.LookupPosition(oi, b.BaseOffset); ok && e.Position > b.Position {
			t.Fatalf("lookup of %d gives position %d past the batch at %d", b.BaseOffset, e.Position, b.Position)
		}
	}
	// The last time entry is the segment's largest timestamp.
	var maxTS int64
	for _, b := range batches {
		maxTS = max(maxTS, b.MaxTimestamp)
	}
	if last := ti[len(ti)-1]; last.Timestamp != maxTS {
		t.Errorf("last time entry %+v, max timestamp %d", last, maxTS)
	}
	// A torn segment is refused.
	if _, _, err := kafka.BuildIndexes("torn", bytes.NewReader(seg[:len(seg)-3]), int64(len(seg)-3), base, 4096); err == nil {
		t.Error("a torn segment was indexed")
	}
}

// FuzzBuildIndexes: any bytes give indexes that parse, or an error;
// never a panic.
func FuzzBuildIndexes(f *testing.F) {
	var seg []byte
	for i := range 30 {
		seg = append(seg, kafkatest.Encode(kafkatest.Batch{Base: int64(i) * 3, Records: 3, ValueSize: 200, TS: int64(100 + i)})...)
	}
	f.Add(seg, int64(0), int64(512))
	f.Add(seg[:100], int64(0), int64(0))
	f.Fuzz(func(t *testing.T, b []byte, base, interval int64) {
		offs, times, err := kafka.BuildIndexes("fuzz", bytes.NewReader(b), int64(len(b)), base, interval%100000)
		if err != nil {
			return
		}
		if _, err := kafka.ParseOffsetIndex("fuzz.index", base, offs); err != nil {
			t.Fatalf("built offset index does not parse: %v", err)
		}
		if _, err := kafka.ParseTimeIndex("fuzz.timeindex", base, times); err != nil {
			t.Fatalf("built time index does not parse: %v", err)
		}
	})
}
