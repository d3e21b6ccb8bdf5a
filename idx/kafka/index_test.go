package kafka

import (
	"encoding/binary"
	"strings"
	"testing"
)

func offsetIndexBytes(pairs ...int32) []byte {
	var b []byte
	for i := 0; i < len(pairs); i += 2 {
		b = binary.BigEndian.AppendUint32(b, uint32(pairs[i]))
		b = binary.BigEndian.AppendUint32(b, uint32(pairs[i+1]))
	}
	return b
}

func TestOffsetIndex(t *testing.T) {
	// Three entries, then the zero-filled preallocated tail.
	data := append(offsetIndexBytes(10, 4100, 25, 8300, 40, 12500), make([]byte, 8*5)...)
	idx, err := ParseOffsetIndex("00000000000000001000.index", 1000, data)
	if err != nil {
		t.Fatal(err)
	}
	want := []OffsetEntry{{1010, 4100}, {1025, 8300}, {1040, 12500}}
	if len(idx) != 3 || idx[0] != want[0] || idx[2] != want[2] {
		t.Fatalf("got %v", idx)
	}
	for target, wantPos := range map[int64]int64{1009: -1, 1010: 4100, 1024: 4100, 1025: 8300, 9999: 12500} {
		e, ok := LookupPosition(idx, target)
		if (wantPos < 0) == ok || (ok && e.Position != wantPos) {
			t.Errorf("lookup %d: %v %v, want position %d", target, e, ok, wantPos)
		}
	}
	if idx, err := ParseOffsetIndex("x.index", 0, make([]byte, 80)); err != nil || len(idx) != 0 {
		t.Errorf("all-zero index: %v %v", idx, err)
	}
	_, err = ParseOffsetIndex("x.index", 0, make([]byte, 13))
	if err == nil || !strings.Contains(err.Error(), "x.index: offset 8:") {
		t.Errorf("bad length: %v", err)
	}
	_, err = ParseOffsetIndex("x.index", 0, offsetIndexBytes(5, 100, -3, 200))
	if err == nil || !strings.Contains(err.Error(), "offset 8:") {
		t.Errorf("negative entry: %v", err)
	}
}

func TestTimeIndex(t *testing.T) {
	var data []byte
	for _, e := range []struct {
		ts  int64
		rel int32
	}{{1000, 5}, {1000, 9}, {2000, 30}} {
		data = binary.BigEndian.AppendUint64(data, uint64(e.ts))
		data = binary.BigEndian.AppendUint32(data, uint32(e.rel))
	}
	data = append(data, make([]byte, 24)...)
	idx, err := ParseTimeIndex("t.timeindex", 100, data)
	if err != nil || len(idx) != 3 || idx[2] != (TimeEntry{2000, 130}) {
		t.Fatalf("got %v %v", idx, err)
	}
	if e, ok := LookupTime(idx, 1500); !ok || e.Offset != 109 {
		t.Errorf("lookup 1500: %v %v", e, ok)
	}
	if _, ok := LookupTime(idx, 999); ok {
		t.Error("lookup before first entry found one")
	}
}

func FuzzIndexes(f *testing.F) {
	f.Add(offsetIndexBytes(10, 4100, 25, 8300))
	f.Add(make([]byte, 24))
	f.Fuzz(func(t *testing.T, data []byte) {
		if idx, err := ParseOffsetIndex("f.index", 1<<40, data); err == nil {
			for i := 1; i < len(idx); i++ {
				if idx[i].Offset <= idx[i-1].Offset || idx[i].Position <= idx[i-1].Position {
					t.Fatalf("index not increasing: %v", idx)
				}
			}
		}
		if idx, err := ParseTimeIndex("f.timeindex", 0, data); err == nil {
			for i := 1; i < len(idx); i++ {
				if idx[i].Timestamp < idx[i-1].Timestamp {
					t.Fatalf("time index going back: %v", idx)
				}
			}
		}
	})
}
