package idx

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

func TestChunkSegment(t *testing.T) {
	var specs []kafkatest.Batch
	var sizes []int
	for i := range 40 {
		s := kafkatest.Batch{Base: 1000 + int64(i)*10, Records: 10, ValueSize: 200 + i*40, TS: 5000 + int64(i%9)*100, Attrs: int16(i%2) * 1}
		if i%7 == 3 {
			s.Attrs |= 0x10 // transactional
		}
		specs = append(specs, s)
		sizes = append(sizes, len(kafkatest.Encode(s)))
	}
	seg := kafkatest.Segment(specs...)
	const target = 16 << 10
	c, err := ChunkSegment("s.log", bytes.NewReader(seg), int64(len(seg)), 1000, ChunkOptions{Size: target, VerifyCRC: true})
	if err != nil || c.Opaque {
		t.Fatalf("chunk: %v %v", err, c.Reason)
	}
	// Chunks cover the file in order, hold whole batches, and stay under
	// the target unless one batch alone is over it.
	pos, batch := int64(0), 0
	for _, ch := range c.Chunks {
		if ch.Position != pos {
			t.Fatalf("chunk at %d, want %d", ch.Position, pos)
		}
		var n int64
		first := batch
		for n < int64(ch.Entry.DataLength) {
			n += int64(sizes[batch])
			batch++
		}
		if n != int64(ch.Entry.DataLength) {
			t.Fatalf("chunk at %d splits a batch", ch.Position)
		}
		if n > target && batch-first > 1 {
			t.Fatalf("chunk at %d of %d bytes holds %d batches", ch.Position, n, batch-first)
		}
		if batch < len(specs) && n+int64(sizes[batch]) <= target {
			t.Fatalf("chunk at %d ends early", ch.Position)
		}
		if ch.Entry.FirstOffset != specs[first].Base || ch.Entry.LastOffset != specs[batch-1].Base+9 {
			t.Fatalf("chunk offsets %d..%d", ch.Entry.FirstOffset, ch.Entry.LastOffset)
		}
		minT, maxT := int64(math.MaxInt64), int64(0)
		for _, s := range specs[first:batch] {
			minT, maxT = min(minT, s.TS), max(maxT, s.TS+9)
		}
		if ch.Entry.FirstTimestamp != minT || ch.Entry.LastTimestamp != maxT {
			t.Fatalf("chunk timestamps %d..%d, want %d..%d", ch.Entry.FirstTimestamp, ch.Entry.LastTimestamp, minT, maxT)
		}
		pos += n
	}
	if pos != int64(len(seg)) || len(c.Chunks) < 5 {
		t.Fatalf("%d chunks cover %d of %d bytes", len(c.Chunks), pos, len(seg))
	}
	// The chunks go into an index whose lookups find them.
	path := t.TempDir() + "/p.idx"
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var es []Entry
	for _, ch := range c.Chunks {
		e := ch.Entry
		e.RDI = []byte("obj")
		es = append(es, e)
	}
	if err := f.Append(es...); err != nil {
		t.Fatal(err)
	}
	if e, within, ok := f.LookupPosition(1000, math.MaxInt64, int64(sizes[0])+5); !ok || e.FirstOffset != 1000 || within != int64(sizes[0])+5 {
		t.Fatalf("position lookup: %+v %d %v", e, within, ok)
	}
}

func TestChunkSegmentOpaque(t *testing.T) {
	seg := kafkatest.Segment(kafkatest.Batch{Base: 10, Records: 5, TS: 1}, kafkatest.Batch{Base: 15, Records: 5, TS: 2})
	crcBad := append([]byte{}, seg...)
	crcBad[len(crcBad)-1] ^= 1
	magic1 := append([]byte{}, seg...)
	magic1[16] = 1
	cases := map[string]struct {
		data   []byte
		verify bool
	}{
		"text file":        {bytes.Repeat([]byte("hello, world\n"), 1000), false},
		"torn tail":        {seg[:len(seg)-3], false},
		"bad crc":          {crcBad, true},
		"message format 1": {magic1, false},
		"offsets back":     {kafkatest.Segment(kafkatest.Batch{Base: 10, Records: 5}, kafkatest.Batch{Base: 12, Records: 5}), false},
		"below base":       {kafkatest.Segment(kafkatest.Batch{Base: 3, Records: 5}), false},
	}
	for name, c := range cases {
		ch, err := ChunkSegment(name, bytes.NewReader(c.data), int64(len(c.data)), 10, ChunkOptions{Size: 1000, VerifyCRC: c.verify})
		if err != nil || !ch.Opaque || ch.Reason == nil {
			t.Fatalf("%s: %v opaque=%v", name, err, ch.Opaque)
		}
		var fe *FormatError
		if name != "text file" && !errors.As(ch.Reason, &fe) {
			t.Errorf("%s: reason %v is not a FormatError", name, ch.Reason)
		}
		pos := int64(0)
		for i, c := range ch.Chunks {
			e := c.Entry
			if c.Position != pos || !e.Opaque() || e.FirstOffset != 10 || (e.DataLength != 1000 && i != len(ch.Chunks)-1) {
				t.Fatalf("%s: chunk %d: %+v", name, i, c)
			}
			pos += int64(e.DataLength)
		}
		if pos != int64(len(c.data)) {
			t.Fatalf("%s: chunks cover %d of %d", name, pos, len(c.data))
		}
	}
	// An empty file has no chunks; a read error is an error, not opaque.
	if ch, err := ChunkSegment("e.log", bytes.NewReader(nil), 0, 0, ChunkOptions{}); err != nil || len(ch.Chunks) != 0 || ch.Opaque {
		t.Fatalf("empty: %+v %v", ch, err)
	}
	if _, err := ChunkSegment("r.log", errReaderAt{}, 100, 0, ChunkOptions{}); err == nil {
		t.Fatal("read error hidden")
	}
	if _, err := ChunkSegment("r.log", bytes.NewReader(seg), int64(len(seg))+1000, 10, ChunkOptions{}); err == nil {
		t.Fatal("file shorter than its size hidden")
	}
}

func FuzzChunkSegment(f *testing.F) {
	f.Add(kafkatest.Segment(kafkatest.Batch{Base: 0, Records: 3, TS: 1}, kafkatest.Batch{Base: 3, Records: 2, TS: 1, Attrs: 1}), int64(100))
	f.Fuzz(func(t *testing.T, data []byte, size int64) {
		size = size%(1<<20) + 1
		if size <= 0 {
			size = 1
		}
		c, err := ChunkSegment("f.log", bytes.NewReader(data), int64(len(data)), 0, ChunkOptions{Size: size})
		if err != nil {
			t.Fatal(err)
		}
		pos := int64(0)
		x := &Index{}
		for _, ch := range c.Chunks {
			if ch.Position != pos || ch.Entry.DataLength <= 0 {
				t.Fatalf("chunk %+v at %d", ch, pos)
			}
			pos += int64(ch.Entry.DataLength)
			if err := x.add(ch.Entry); err != nil {
				t.Fatalf("chunks do not make an index: %v", err)
			}
		}
		if pos != int64(len(data)) {
			t.Fatalf("chunks cover %d of %d", pos, len(data))
		}
	})
}

type errReaderAt struct{}

func (errReaderAt) ReadAt([]byte, int64) (int, error) { return 0, errors.New("disk on fire") }
