package idx

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func rdi(s string) []byte { return []byte(s) }

// partitionEntries is a partition with three segments: base 0 (two Kafka
// chunks), base 100 (an opaque file of three chunks), base 200 (three
// Kafka chunks with a compaction gap and a timestamp going back).
func partitionEntries() []Entry {
	return []Entry{
		{FirstOffset: 0, LastOffset: 49, FirstTimestamp: 1000, LastTimestamp: 1049, DataLength: 500, RDI: rdi("s0@0")},
		{FirstOffset: 50, LastOffset: 99, FirstTimestamp: 1050, LastTimestamp: 1099, DataLength: 400, RDI: rdi("s0@500")},
		{FirstOffset: 100, LastOffset: 100, FirstTimestamp: NoTimestamp, LastTimestamp: NoTimestamp, DataLength: 300, RDI: rdi("s100@0")},
		{FirstOffset: 100, LastOffset: 100, FirstTimestamp: NoTimestamp, LastTimestamp: NoTimestamp, DataLength: 300, RDI: rdi("s100@300")},
		{FirstOffset: 100, LastOffset: 100, FirstTimestamp: NoTimestamp, LastTimestamp: NoTimestamp, DataLength: 7, RDI: rdi("s100@600")},
		{FirstOffset: 200, LastOffset: 209, FirstTimestamp: 3000, LastTimestamp: 3009, DataLength: 100, RDI: rdi("s200@0")},
		{FirstOffset: 230, LastOffset: 239, FirstTimestamp: 2000, LastTimestamp: 2009, DataLength: 100, RDI: rdi("s200@100")},
		{FirstOffset: 240, LastOffset: 249, FirstTimestamp: 3500, LastTimestamp: 3600, DataLength: 100, RDI: rdi("s200@200")},
	}
}

func encodeAll(t testing.TB, es []Entry) []byte {
	var b []byte
	for _, e := range es {
		var err error
		if b, err = e.AppendTo(b); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func TestIndexLookups(t *testing.T) {
	x, valid, err := ParseIndex("p.idx", encodeAll(t, partitionEntries()))
	if err != nil || x.Len() != 8 || valid != x.Size() {
		t.Fatalf("parse: %d entries, valid %d, %v", x.Len(), valid, err)
	}
	for off, want := range map[int64]int{0: 0, 49: 0, 50: 1, 99: 1, 100: 2, 150: 2, 199: 2, 200: 5, 215: 6, 229: 6, 230: 6, 249: 7} {
		if got, ok := x.LookupOffset(off); !ok || got != want {
			t.Errorf("offset %d: entry %d %v, want %d", off, got, ok, want)
		}
	}
	if _, ok := x.LookupOffset(250); ok {
		t.Error("offset past the end found")
	}
	for ts, want := range map[int64]int{0: 0, 1049: 0, 1050: 1, 1100: 5, 3009: 5, 3010: 7, 3600: 7} {
		if got, ok := x.LookupTimestamp(ts); !ok || got != want {
			t.Errorf("timestamp %d: entry %d %v, want %d", ts, got, ok, want)
		}
	}
	if _, ok := x.LookupTimestamp(3601); ok {
		t.Error("timestamp past the end found")
	}
	type posCase struct {
		base, next, pos int64
		entry           int
		within          int64
	}
	for _, c := range []posCase{
		{0, 100, 0, 0, 0}, {0, 100, 499, 0, 499}, {0, 100, 500, 1, 0}, {0, 100, 899, 1, 399},
		{100, 200, 0, 2, 0}, {100, 200, 300, 3, 0}, {100, 200, 606, 4, 6},
		{200, math.MaxInt64, 250, 7, 50},
	} {
		i, within, ok := x.LookupPosition(c.base, c.next, c.pos)
		if !ok || i != c.entry || within != c.within {
			t.Errorf("segment %d position %d: entry %d+%d %v, want %d+%d", c.base, c.pos, i, within, ok, c.entry, c.within)
		}
	}
	for _, c := range []posCase{{0, 100, 900, 0, 0}, {100, 200, 607, 0, 0}, {300, 400, 0, 0, 0}, {0, 100, -1, 0, 0}} {
		if i, within, ok := x.LookupPosition(c.base, c.next, c.pos); ok {
			t.Errorf("segment %d position %d: found entry %d+%d", c.base, c.pos, i, within)
		}
	}
	if n := x.SegmentLength(100, 200); n != 607 {
		t.Errorf("segment 100 length %d", n)
	}
}

func TestParseIndexErrors(t *testing.T) {
	es := partitionEntries()
	good := encodeAll(t, es)
	// Overlapping, whichever comes first in the file.
	over := Entry{FirstOffset: 40, LastOffset: 60, DataLength: 1, RDI: rdi("x@0")}
	for _, pair := range [][]Entry{{es[0], over}, {over, es[0]}} {
		if _, _, err := ParseIndex("p.idx", encodeAll(t, pair)); err == nil || !strings.Contains(err.Error(), "p.idx: offset "+fmt.Sprint(pair[0].Size())+":") {
			t.Errorf("overlap: %v", err)
		}
	}
	// Not overlapping but out of file order: a segment shipped again
	// after its old version was deleted. Lookups see offset order.
	x, _, err := ParseIndex("p.idx", encodeAll(t, []Entry{es[5], es[0], es[1]}))
	if err != nil || x.Len() != 3 || x.Entry(0).FirstOffset != 0 || x.Position(0) != int64(es[5].Size()) {
		t.Fatalf("out of file order: %v", err)
	}
	if i, ok := x.LookupOffset(60); !ok || i != 1 {
		t.Fatalf("lookup: %d %v", i, ok)
	}
	// Corruption far from the end is an error naming the offset.
	var big []Entry
	for i := range 2000 {
		big = append(big, Entry{FirstOffset: int64(i) * 10, LastOffset: int64(i)*10 + 9, DataLength: 1, RDI: rdi("0123456789012345678901234567890123456789")})
	}
	data := encodeAll(t, big)
	data[86*10+20] ^= 1
	if _, _, err := ParseIndex("p.idx", data); err == nil || !strings.Contains(err.Error(), "p.idx: offset 860: CRC32C") {
		t.Errorf("corrupt entry: %v", err)
	}
	var fe *FormatError
	if _, _, err := ParseIndex("p.idx", data); !errors.As(err, &fe) || fe.Offset != 860 {
		t.Errorf("not a FormatError at 860: %v", err)
	}
	// Every cut inside the last entry, and junk or zeros after the last
	// entry, are a torn tail.
	last := len(encodeAll(t, es[:7]))
	for cut := last; cut < len(good); cut++ {
		x, valid, err := ParseIndex("p.idx", good[:cut])
		if err != nil || x.Len() != 7 || valid != int64(last) {
			t.Fatalf("cut at %d: %d entries, valid %d, %v", cut, x.Len(), valid, err)
		}
	}
	for _, tail := range [][]byte{make([]byte, 4096), bytes.Repeat([]byte{0xff}, 100)} {
		x, valid, err := ParseIndex("p.idx", append(append([]byte{}, good...), tail...))
		if err != nil || x.Len() != 8 || valid != int64(len(good)) {
			t.Fatalf("tail %x...: %d entries, valid %d, %v", tail[:4], x.Len(), valid, err)
		}
	}
	// A whole entry that repeats the last one has a good CRC: no crash
	// wrote it, so it is an error, not a tail to cut.
	if _, _, err := ParseIndex("p.idx", append(append([]byte{}, good...), good[last:]...)); err == nil || !strings.Contains(err.Error(), "does not follow") {
		t.Fatalf("repeated entry: %v", err)
	}
}

func TestFileAppendReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "orders-0.idx")
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	es := partitionEntries()
	if err := f.Append(es[:3]...); err != nil {
		t.Fatal(err)
	}
	if err := f.Append(es[3:]...); err != nil {
		t.Fatal(err)
	}
	// Out of order and invalid entries are refused and change nothing.
	if err := f.Append(Entry{FirstOffset: 240, LastOffset: 260}); err == nil {
		t.Fatal("overlapping append accepted")
	}
	if err := f.Append(Entry{FirstOffset: 300, LastOffset: 310}, Entry{FirstOffset: 305, LastOffset: 320}); err == nil {
		t.Fatal("append out of order within itself accepted")
	}
	if err := f.Append(Entry{FirstOffset: 400, LastOffset: 390}); err == nil {
		t.Fatal("invalid entry accepted")
	}
	if e, pos, ok := f.LookupOffset(215); !ok || string(e.RDI) != "s200@100" || pos == 0 {
		t.Fatalf("lookup: %+v %d %v", e, pos, ok)
	}
	f.Close()
	st, _ := os.Stat(path)
	if want := int64(len(encodeAll(t, es))); st.Size() != want {
		t.Fatalf("file is %d bytes, want %d", st.Size(), want)
	}
	// A crash in the middle of the next append: every prefix of its
	// bytes reopens to the entries before it, with the tail cut.
	extra := Entry{FirstOffset: 250, LastOffset: 260, FirstTimestamp: 1, LastTimestamp: 2, DataLength: 9, RDI: rdi("s250@0")}
	eb, _ := extra.AppendTo(nil)
	good, _ := os.ReadFile(path)
	for n := 1; n < len(eb); n++ {
		os.WriteFile(path, append(append([]byte{}, good...), eb[:n]...), 0o644)
		f, err := OpenFile(path)
		if err != nil {
			t.Fatalf("torn at %d: %v", n, err)
		}
		if f.Len() != 8 || f.Cut() != int64(n) {
			t.Fatalf("torn at %d: %d entries, cut %d", n, f.Len(), f.Cut())
		}
		if err := f.Append(extra); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if f, err = OpenFile(path); err != nil || f.Len() != 9 || f.Cut() != 0 {
			t.Fatalf("after append: %v", err)
		}
		var got []string
		for _, e := range f.Entries() {
			got = append(got, string(e.RDI))
		}
		if got[8] != "s250@0" || got[0] != "s0@0" {
			t.Fatalf("entries %v", got)
		}
		f.Close()
	}
}

func TestFileBigAppendIsSyncedInPieces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.idx")
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var es []Entry
	for i := range 3000 {
		es = append(es, Entry{FirstOffset: int64(i), LastOffset: int64(i), FirstTimestamp: int64(i), LastTimestamp: int64(i), DataLength: 1, RDI: rdi(fmt.Sprintf("rdi-%06d", i))})
	}
	if err := f.Append(es...); err != nil {
		t.Fatal(err)
	}
	f.Close()
	data, _ := os.ReadFile(path)
	// A crash that kept only the first piece reopens to its entries.
	pieces := 0
	for size := 0; size < len(data); pieces++ {
		size += (MaxAppend / es[0].Size()) * es[0].Size()
	}
	if pieces < 2 {
		t.Fatalf("only %d pieces", pieces)
	}
	first := (MaxAppend / es[0].Size()) * es[0].Size()
	os.WriteFile(path, append(data[:first:first], data[first:first+30]...), 0o644)
	f, err = OpenFile(path)
	if err != nil || f.Len() != first/es[0].Size() || f.Cut() != 30 {
		t.Fatalf("reopen: %v", err)
	}
	f.Close()
}

func TestFileConcurrentLookups(t *testing.T) {
	f, err := OpenFile(filepath.Join(t.TempDir(), "p.idx"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(1, 2))
			for {
				select {
				case <-stop:
					return
				default:
				}
				off := r.Int64N(10000)
				if e, _, ok := f.LookupOffset(off); ok && (e.FirstOffset > off && off >= 10 || e.LastOffset < off) {
					t.Errorf("offset %d: entry %d..%d", off, e.FirstOffset, e.LastOffset)
					return
				}
				for _, e := range f.Entries() {
					_ = e
				}
			}
		}()
	}
	for i := range 1000 {
		if err := f.Append(Entry{FirstOffset: int64(i) * 10, LastOffset: int64(i)*10 + 9, DataLength: 1, RDI: rdi("x")}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

func TestRemoteIndexes(t *testing.T) {
	x, _, err := ParseIndex("p.idx", encodeAll(t, partitionEntries()))
	if err != nil {
		t.Fatal(err)
	}
	ri, err := x.BuildRemoteIndexes(200, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	p := func(i int) int64 { return x.Position(i) }
	if want := []RemoteOffset{{200, p(5)}, {230, p(6)}, {240, p(7)}}; fmt.Sprint(ri.Offsets) != fmt.Sprint(want) {
		t.Fatalf("offsets %v, want %v", ri.Offsets, want)
	}
	if want := []RemoteTime{{3009, p(5)}, {3600, p(7)}}; fmt.Sprint(ri.Times) != fmt.Sprint(want) {
		t.Fatalf("times %v, want %v", ri.Times, want)
	}
	// The opaque segment has one offset entry and no time entries.
	op, _ := x.BuildRemoteIndexes(100, 200)
	if len(op.Offsets) != 1 || op.Offsets[0].Position != p(2) || len(op.Times) != 0 {
		t.Fatalf("opaque: %+v", op)
	}
	// Golden bytes, from the layout.
	if got := fmt.Sprintf("%x", ri.MarshalOffsets()); got != fmt.Sprintf("00000000%08x0000001e%08x00000028%08x", p(5), p(6), p(7)) {
		t.Fatalf("offset index bytes %s", got)
	}
	if got := fmt.Sprintf("%x", ri.MarshalTimes()); got != fmt.Sprintf("%016x%08x%016x%08x", 3009, p(5), 3600, p(7)) {
		t.Fatalf("time index bytes %s", got)
	}
	if pos, ok := ri.LookupOffset(235); !ok || pos != p(6) {
		t.Errorf("lookup 235: %d", pos)
	}
	if pos, ok := ri.LookupTimestamp(3010); !ok || pos != p(7) {
		t.Errorf("lookup ts 3010: %d", pos)
	}
	// Missing files are rebuilt; present ones are checked.
	dir := t.TempDir()
	got, rebuilt, err := LoadRemoteIndexes(dir, x, 200, math.MaxInt64)
	if err != nil || !rebuilt || fmt.Sprint(got) != fmt.Sprint(ri) {
		t.Fatalf("rebuild: %v %v %+v", rebuilt, err, got)
	}
	got, rebuilt, err = LoadRemoteIndexes(dir, x, 200, math.MaxInt64)
	if err != nil || rebuilt || fmt.Sprint(got) != fmt.Sprint(ri) {
		t.Fatalf("load: %v %v %+v", rebuilt, err, got)
	}
	stale := ri
	stale.Offsets = stale.Offsets[:2]
	os.WriteFile(filepath.Join(dir, RemoteOffsetIndexName(200)), stale.MarshalOffsets(), 0o644)
	if _, _, err := LoadRemoteIndexes(dir, x, 200, math.MaxInt64); err == nil || !strings.Contains(err.Error(), "00000000000000000200.rindex: offset 16: does not match") {
		t.Fatalf("stale: %v", err)
	}
	os.WriteFile(filepath.Join(dir, RemoteOffsetIndexName(200)), []byte("junk"), 0o644)
	if _, _, err := LoadRemoteIndexes(dir, x, 200, math.MaxInt64); err == nil || !strings.Contains(err.Error(), "offset 0: length 4") {
		t.Fatalf("junk: %v", err)
	}
}

func FuzzParseIndex(f *testing.F) {
	f.Add(encodeAll(f, partitionEntries()))
	f.Add([]byte{0, 0, 0, 46})
	f.Fuzz(func(t *testing.T, data []byte) {
		x, valid, err := ParseIndex("f.idx", data)
		if err != nil {
			return
		}
		if valid > int64(len(data)) || valid != x.Size() || int64(len(data))-valid > MaxAppend {
			t.Fatalf("valid %d of %d, size %d", valid, len(data), x.Size())
		}
		// Each live entry re-encodes to its bytes in the file, in
		// offset order, and lookups stay in range.
		for i, e := range x.All() {
			back, _ := e.AppendTo(nil)
			if p := x.Position(i); !bytes.Equal(back, data[p:p+int64(len(back))]) {
				t.Fatalf("entry %d re-encodes differently", i)
			}
			if i > 0 && x.Entry(i-1).FirstOffset > e.FirstOffset {
				t.Fatalf("entry %d out of offset order", i)
			}
		}
		for _, off := range []int64{0, 1, 1 << 40} {
			if i, ok := x.LookupOffset(off); ok && (i < 0 || i >= x.Len()) {
				t.Fatalf("lookup %d: %d", off, i)
			}
		}
		if x.Len() > 0 {
			base := x.Entry(0).FirstOffset
			ri, err := x.BuildRemoteIndexes(base, math.MaxInt64)
			if err == nil {
				if _, err := ParseRemoteOffsetIndex("f.rindex", base, ri.MarshalOffsets()); err != nil {
					t.Fatalf("built remote index does not parse: %v", err)
				}
				if _, err := ParseRemoteTimeIndex("f.rtimeindex", ri.MarshalTimes()); err != nil {
					t.Fatalf("built remote time index does not parse: %v", err)
				}
			}
		}
	})
}

func FuzzRemoteIndexes(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 20})
	f.Fuzz(func(t *testing.T, data []byte) {
		if o, err := ParseRemoteOffsetIndex("f.rindex", 5, data); err == nil {
			ri := RemoteIndexes{Base: 5, Offsets: o}
			if !bytes.Equal(ri.MarshalOffsets(), data) {
				t.Fatal("offset index does not round-trip")
			}
		}
		if tm, err := ParseRemoteTimeIndex("f.rtimeindex", data); err == nil {
			ri := RemoteIndexes{Times: tm}
			if !bytes.Equal(ri.MarshalTimes(), data) {
				t.Fatal("time index does not round-trip")
			}
		}
	})
}

func TestFileTombstones(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	es := partitionEntries()
	if err := f.Append(es...); err != nil {
		t.Fatal(err)
	}
	var before *Index
	f.View(func(x *Index) { before = x })
	ri200, _ := before.BuildRemoteIndexes(200, math.MaxInt64)
	size := before.Size()

	// Delete the opaque segment in the middle: its entries are gone from
	// every lookup, nothing else moves.
	n, err := f.Tombstone(func(e Entry) bool { return bytes.HasPrefix(e.RDI, []byte("s100@")) })
	if err != nil || n != 3 {
		t.Fatalf("tombstone: %d %v", n, err)
	}
	check := func(f *File) {
		t.Helper()
		f.View(func(x *Index) {
			if x.Len() != 5 || x.Tombstones() != 3 || x.Size() != size {
				t.Fatalf("%d live, %d dead, %d bytes", x.Len(), x.Tombstones(), x.Size())
			}
			if lo, hi := x.Segment(100, 200); lo != hi {
				t.Fatalf("deleted segment still has entries %d..%d", lo, hi)
			}
			if i, ok := x.LookupOffset(100); !ok || string(x.Entry(i).RDI) != "s200@0" {
				t.Fatalf("lookup of a deleted offset: %d %v", i, ok)
			}
			if err := x.CheckRemoteIndexes("200.rindex", ri200, math.MaxInt64); err != nil {
				t.Fatalf("remote indexes of a later segment moved: %v", err)
			}
		})
	}
	check(f)
	f.Close()
	if f, err = OpenFile(path); err != nil {
		t.Fatal(err)
	}
	check(f)
	if n, err := f.Tombstone(func(e Entry) bool { return bytes.HasPrefix(e.RDI, []byte("s100@")) }); n != 0 || err != nil {
		t.Fatalf("second tombstone: %d %v", n, err)
	}
	// The deleted segment ships again (a new version): it goes back
	// between its neighbours, and its remote indexes build.
	v2 := []Entry{
		{FirstOffset: 100, LastOffset: 150, FirstTimestamp: 5, LastTimestamp: 6, DataLength: 10, RDI: rdi("v2@0")},
		{FirstOffset: 160, LastOffset: 199, FirstTimestamp: 7, LastTimestamp: 8, DataLength: 10, RDI: rdi("v2@10")},
	}
	if err := f.Append(Entry{FirstOffset: 100, LastOffset: 200, DataLength: 1, RDI: rdi("big@0")}); err == nil {
		t.Fatal("append overlapping the next segment accepted")
	}
	if err := f.Append(v2...); err != nil {
		t.Fatal(err)
	}
	f.View(func(x *Index) {
		if i, ok := x.LookupOffset(120); !ok || string(x.Entry(i).RDI) != "v2@0" {
			t.Fatalf("lookup in the re-shipped segment: %d %v", i, ok)
		}
		if i, within, ok := x.LookupPosition(100, 200, 15); !ok || string(x.Entry(i).RDI) != "v2@10" || within != 5 {
			t.Fatalf("position lookup: %d %d %v", i, within, ok)
		}
		if i, ok := x.LookupTimestamp(7); !ok || string(x.Entry(i).RDI) != "s0@0" {
			// s0's timestamps (1000+) are all later than 7: the prefix max.
			t.Fatalf("timestamp lookup: %d %v", i, ok)
		}
		ri, err := x.BuildRemoteIndexes(100, 200)
		if err != nil || len(ri.Offsets) != 2 || ri.Offsets[0].Position != size {
			t.Fatalf("remote indexes: %+v %v", ri, err)
		}
	})
	if _, err := f.Tombstone(func(e Entry) bool { return bytes.HasPrefix(e.RDI, []byte("v2@")) }); err != nil {
		t.Fatal(err)
	}
	// Once the last segment is deleted too, its offsets can be written
	// again (Kafka truncated the log and wrote new data).
	if err := f.Append(Entry{FirstOffset: 200, LastOffset: 205, DataLength: 9, RDI: rdi("new200@0")}); err == nil {
		t.Fatal("append over live offsets accepted")
	}
	if _, err := f.Tombstone(func(e Entry) bool { return bytes.HasPrefix(e.RDI, []byte("s200@")) }); err != nil {
		t.Fatal(err)
	}
	if err := f.Append(Entry{FirstOffset: 200, LastOffset: 205, DataLength: 9, RDI: rdi("new200@0")}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	f, err = OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	for _, e := range f.Entries() {
		got = append(got, string(e.RDI))
	}
	if fmt.Sprint(got) != "[s0@0 s0@500 new200@0]" {
		t.Fatalf("entries %v", got)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary left: %v", err)
	}
}

// TestParseIndexOwnsItsRDIs: a parsed index keeps none of the file's
// bytes (a mount holds every partition's index), and no RDI can grow
// into another.
func TestParseIndexOwnsItsRDIs(t *testing.T) {
	es := partitionEntries()
	data := encodeAll(t, es)
	x, _, err := ParseIndex("idx", data)
	if err != nil {
		t.Fatal(err)
	}
	for i := range data {
		data[i] = 0xff
	}
	if x.Len() != len(es) {
		t.Fatalf("%d entries, want %d", x.Len(), len(es))
	}
	for i := range es {
		if got := x.Entry(i).RDI; !bytes.Equal(got, es[i].RDI) {
			t.Fatalf("entry %d: RDI %q after the file's bytes changed, want %q", i, got, es[i].RDI)
		}
	}
	grown := append(x.Entry(0).RDI, "XXXXXXXX"...)
	if !bytes.Equal(x.Entry(1).RDI, es[1].RDI) || !bytes.HasPrefix(grown, es[0].RDI) {
		t.Fatalf("an append to one RDI changed the next: %q", x.Entry(1).RDI)
	}
}
