package kafka

import (
	"bytes"
	"testing"
)

func TestSummarizeSegment(t *testing.T) {
	var specs []batchSpec
	ts := int64(1_700_000_000_000)
	for i := range 20 {
		// Timestamps go back now and then (CreateTime is the producer's).
		specs = append(specs, batchSpec{base: 100 + int64(i)*5, records: 5, ts: ts + int64(i%7)*1000})
	}
	seg := segment(specs...)
	var pos []int64
	var p int64
	for _, s := range specs {
		pos = append(pos, p)
		p += int64(len(encodeBatch(s)))
	}
	wantMax := ts + 6*1000 + 4
	r := bytes.NewReader(seg)
	size := int64(len(seg))

	full, err := SummarizeSegment("s.log", r, size, nil, nil)
	if err != nil || full.LastOffset != 199 || full.MaxTimestamp != wantMax || full.End != size || full.Torn || full.Scanned != 20 || full.FromIndex {
		t.Fatalf("full scan: %+v %v", full, err)
	}
	// Index entries as Kafka writes them: the batch's last offset at its
	// position, and the max timestamp so far with its offset.
	offIdx := []OffsetEntry{{Offset: 114, Position: pos[2]}, {Offset: 184, Position: pos[16]}}
	timeIdx := []TimeEntry{{Timestamp: ts + 6004, Offset: 134}}
	s, err := SummarizeSegment("s.log", r, size, offIdx, timeIdx)
	if err != nil || s.LastOffset != 199 || s.MaxTimestamp != wantMax || s.End != size || s.Scanned != 4 || !s.FromIndex {
		t.Fatalf("from index: %+v %v", s, err)
	}
	// A stale index (position not a batch start, or a batch without the
	// offset, or a time index past the end) falls back to a full scan.
	for name, oi := range map[string][]OffsetEntry{
		"not a batch":   {{Offset: 184, Position: pos[16] + 3}},
		"wrong batch":   {{Offset: 184, Position: pos[10]}},
		"past the end":  {{Offset: 184, Position: size + 100}},
		"at the end":    {{Offset: 184, Position: size}},
		"time past end": {{Offset: 184, Position: pos[16]}},
	} {
		ti := timeIdx
		if name == "time past end" {
			ti = []TimeEntry{{Timestamp: ts + 99999, Offset: 500}}
		}
		s, err := SummarizeSegment("s.log", r, size, oi, ti)
		if err != nil || s.LastOffset != 199 || s.MaxTimestamp != wantMax || s.FromIndex || s.Scanned != 20 {
			t.Errorf("%s: %+v %v", name, s, err)
		}
	}
	// A torn tail is reported and not counted.
	torn := append(append([]byte{}, seg...), encodeBatch(batchSpec{base: 200, records: 3, ts: ts + 99999})[:40]...)
	s, err = SummarizeSegment("s.log", bytes.NewReader(torn), int64(len(torn)), offIdx, timeIdx)
	if err != nil || s.LastOffset != 199 || s.MaxTimestamp != wantMax || s.End != size || !s.Torn {
		t.Fatalf("torn: %+v %v", s, err)
	}
	// An empty segment.
	s, err = SummarizeSegment("e.log", bytes.NewReader(nil), 0, nil, nil)
	if err != nil || s.LastOffset != -1 || s.MaxTimestamp != -1 || s.End != 0 {
		t.Fatalf("empty: %+v %v", s, err)
	}
	// Corruption after the index position is an error naming the position.
	bad := append([]byte{}, seg...)
	bad[pos[18]+magicOffset] = 1
	if _, err := SummarizeSegment("b.log", bytes.NewReader(bad), size, offIdx, timeIdx); err == nil {
		t.Fatal("corrupt batch: no error")
	} else if fe, ok := err.(*FormatError); !ok || fe.Offset != pos[18] || fe.File != "b.log" {
		t.Fatalf("corrupt batch: %v", err)
	}
}

func FuzzSummarizeSegment(f *testing.F) {
	seg := segment(batchSpec{base: 10, records: 3, ts: 5}, batchSpec{base: 13, records: 2, ts: 9})
	f.Add(seg, offsetIndexBytes(2, int32(len(encodeBatch(batchSpec{base: 10, records: 3, ts: 5})))), make([]byte, 12))
	f.Add([]byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, data, oi, ti []byte) {
		offIdx, err1 := ParseOffsetIndex("f.index", 10, oi)
		timeIdx, err2 := ParseTimeIndex("f.timeindex", 10, ti)
		if err1 != nil || err2 != nil {
			return
		}
		s, err := SummarizeSegment("f.log", bytes.NewReader(data), int64(len(data)), offIdx, timeIdx)
		if err == nil && (s.End > int64(len(data)) || s.End < 0 || s.Torn != (s.End < int64(len(data)))) {
			t.Fatalf("summary %+v of %d bytes", s, len(data))
		}
	})
}
