package idx

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

func TestBatchRefsRoundTrip(t *testing.T) {
	seg := kafkatest.Segment(
		kafkatest.Batch{Base: 100, Records: 3, Epoch: 2},
		kafkatest.Batch{Base: 103, Records: 1, Epoch: 2, Attrs: 1},
		kafkatest.Batch{Base: 110, Records: 5, Epoch: 3},
	)
	all, err := BatchRefs("s.log", bytes.NewReader(seg), int64(len(seg)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].Base != 100 || all[0].Last != 102 || all[2].Base != 110 || all[2].Last != 114 || all[1].Epoch != 2 || all[2].Epoch != 3 {
		t.Fatalf("batches: %+v", all)
	}
	// From the second batch on, positions are relative to it.
	tail, err := BatchRefs("s.log", bytes.NewReader(seg), int64(len(seg)), all[1].Pos)
	if err != nil {
		t.Fatal(err)
	}
	if len(tail) != 2 || tail[0].Pos != 0 || !tail[0].Same(all[1]) || tail[1].Pos != int64(all[1].Size) {
		t.Fatalf("tail: %+v", tail)
	}
	b, err := MarshalBatches(tail)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseBatches("x.batches", b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != tail[i] {
			t.Fatalf("batch %d: %+v, want %+v", i, got[i], tail[i])
		}
	}
	if r, ok := FindBatch(got, 110); !ok || r.Pos != tail[1].Pos {
		t.Fatalf("find 110: %+v %v", r, ok)
	}
	if _, ok := FindBatch(got, 104); ok {
		t.Fatal("found a batch at 104")
	}
	// A batch whose body does not match its CRC is an error: its
	// header would claim bytes it does not hold.
	bad := append([]byte(nil), seg...)
	bad[len(bad)-1] ^= 1
	var fe *FormatError
	if _, err := BatchRefs("s.log", bytes.NewReader(bad), int64(len(bad)), 0); !errors.As(err, &fe) || fe.Offset != all[2].Pos {
		t.Fatalf("a corrupt batch: %v, want a format error at %d", err, all[2].Pos)
	}
	// Another epoch is another batch.
	other := all[2]
	other.Epoch++
	if other.Same(all[2]) {
		t.Fatal("batches of two epochs are the same")
	}
	// A torn tail is an error: such a file cannot be matched.
	if _, err := BatchRefs("s.log", bytes.NewReader(seg[:len(seg)-1]), int64(len(seg)-1), 0); err == nil {
		t.Fatal("a torn segment listed")
	}
	// Not following from 0.
	if _, err := MarshalBatches(all[1:]); err == nil {
		t.Fatal("marshalled a list that does not start at 0")
	}
}

func TestParseBatchesErrors(t *testing.T) {
	seg := kafkatest.Segment(kafkatest.Batch{Base: 0, Records: 2}, kafkatest.Batch{Base: 2, Records: 2})
	bs, _ := BatchRefs("s.log", bytes.NewReader(seg), int64(len(seg)), 0)
	good, _ := MarshalBatches(bs)
	for name, data := range map[string][]byte{
		"short":     good[:5],
		"magic":     append([]byte("XXXX"), good[4:]...),
		"truncated": good[:len(good)-1],
		"crc":       append(append([]byte(nil), good[:len(good)-1]...), good[len(good)-1]^1),
	} {
		_, err := ParseBatches("p/0-x.batches", data)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.File != "p/0-x.batches" {
			t.Errorf("%s: %v, want a format error naming the file", name, err)
		}
	}
}

func FuzzParseBatches(f *testing.F) {
	seg := kafkatest.Segment(kafkatest.Batch{Base: 5, Records: 2}, kafkatest.Batch{Base: 9, Records: 1})
	bs, _ := BatchRefs("s.log", bytes.NewReader(seg), int64(len(seg)), 0)
	good, _ := MarshalBatches(bs)
	f.Add(good)
	f.Add([]byte("TFB1\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseBatches("f", data)
		if err != nil {
			return
		}
		// What parses marshals back to the same bytes.
		again, err := MarshalBatches(got)
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("re-marshal: %v, equal %v", err, bytes.Equal(again, data))
		}
	})
}
