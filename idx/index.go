package idx

import (
	"fmt"
	"iter"
	"slices"
	"sort"

	"github.com/tierfs/tierfs/idx/kafka"
)

// FormatError is malformed input at a byte offset of a named file.
type FormatError = kafka.FormatError

func formatErr(file string, off int64, format string, args ...any) *FormatError {
	return &FormatError{File: file, Offset: off, Msg: fmt.Sprintf(format, args...)}
}

// NoTimestamp is Kafka's "no timestamp" (-1): the timestamps of an opaque
// entry.
const NoTimestamp = -1

// Opaque reports an entry that describes bytes that are not (parsable)
// record batches: a run of opaque chunks of one file all carry the file's
// base offset as first and last offset, and no timestamps.
func (e Entry) Opaque() bool {
	return e.FirstOffset == e.LastOffset && e.FirstTimestamp == NoTimestamp && e.LastTimestamp == NoTimestamp
}

// Deleted reports a tombstone: the entry of data that was deleted from
// the store. Its RDI is all NUL bytes, as long as the RDI it replaced, so
// that no later entry moved (the remote indexes point at positions in the
// file). Lookups never return a tombstone and order ignores it.
func (e Entry) Deleted() bool { return len(e.RDI) > 0 && e.RDI[0] == 0 }

// checkOrder enforces the order of a partition's live entries by
// offset: each starts after the previous one ends, except that the chunks
// of one opaque file repeat its offsets.
func checkOrder(prev, e Entry) error {
	if e.FirstOffset > prev.LastOffset {
		return nil
	}
	if prev.Opaque() && e.Opaque() && e.FirstOffset == prev.FirstOffset {
		return nil
	}
	return fmt.Errorf("entry for offsets %d..%d does not follow %d..%d", e.FirstOffset, e.LastOffset, prev.FirstOffset, prev.LastOffset)
}

// Index is the decoded content of a remote log segment index file, with
// the lookups of the read path. It holds the live entries; tombstones
// only take their room in the file. The zero Index is empty and usable.
type Index struct {
	dead int // tombstones
	ents []Entry
	pos  []int64 // byte position of each entry in the file
	cum  []int64 // cum[i]: sum of DataLength before entry i
	maxT []int64 // maxT[i]: largest LastTimestamp of entries 0..i
	size int64   // bytes of whole entries
}

// MaxAppend bounds the bytes one append writes before it is synced, so
// that a crash can leave at most this much of a torn tail.
const MaxAppend = 64 << 10

// ParseIndex decodes an index file. An entry that does not decode within
// the last MaxAppend bytes is a torn append: the index ends before it, and
// valid < len(data) says there is a tail to cut. Such a cut can lose only
// entries that were never synced. A bad entry further from the end, or
// an entry out of order (it has a good CRC, so no crash wrote it), are errors naming the file and offset.
func ParseIndex(name string, data []byte) (x *Index, valid int64, err error) {
	x = &Index{}
	pos := 0
	for pos < len(data) {
		e, n, err := DecodeEntry(data[pos:])
		if err != nil {
			if len(data)-pos <= MaxAppend {
				break
			}
			return nil, 0, formatErr(name, int64(pos), "%v", err)
		}
		if err := x.add(e); err != nil {
			return nil, 0, formatErr(name, int64(pos), "%v", err)
		}
		pos += n
	}
	x.ownRDIs()
	return x, int64(pos), nil
}

// ownRDIs copies the RDIs of the entries, which alias the file's bytes,
// into one buffer of their own: a mount holds every partition's index,
// and the file's entry headers (most of its bytes, for small segments)
// need not stay in memory with them. Each RDI keeps its own capacity, so
// none can grow into the next.
func (x *Index) ownRDIs() {
	n := 0
	for _, e := range x.ents {
		n += len(e.RDI)
	}
	buf := make([]byte, 0, n)
	for i := range x.ents {
		at := len(buf)
		buf = append(buf, x.ents[i].RDI...)
		x.ents[i].RDI = buf[at:len(buf):len(buf)]
	}
}

// add adds a decoded entry (RDI already owned) to the in-memory index at
// its place by offset: usually the end, but a segment shipped again after
// its old version was deleted (the log cleaner, a truncation, a lost
// copy) lands between later ones. It must not overlap any live entry.
func (x *Index) add(e Entry) error {
	if e.Deleted() {
		x.dead++
		x.size += int64(e.Size())
		return nil
	}
	j := x.slot(e.FirstOffset)
	if err := x.fits(j, e, e); err != nil {
		return err
	}
	n := len(x.ents)
	x.ents = slices.Insert(x.ents, j, e)
	x.pos = slices.Insert(x.pos, j, x.size)
	x.cum = slices.Insert(x.cum, j, 0)
	x.maxT = slices.Insert(x.maxT, j, 0)
	x.size += int64(e.Size())
	for i := j; i <= n; i++ {
		x.cum[i], x.maxT[i] = 0, x.ents[i].LastTimestamp
		if i > 0 {
			x.cum[i] = x.cum[i-1] + int64(x.ents[i-1].DataLength)
			x.maxT[i] = max(x.maxT[i], x.maxT[i-1])
		}
	}
	return nil
}

// slot is where an entry starting at first goes: after every entry that
// starts at or before it.
func (x *Index) slot(first int64) int {
	n := len(x.ents)
	if n == 0 || x.ents[n-1].FirstOffset <= first {
		return n
	}
	return sort.Search(n, func(i int) bool { return x.ents[i].FirstOffset > first })
}

// fits checks that a run of entries from first to last (in order among
// themselves) can go at slot j: after the entry before it, before the
// entry at it.
func (x *Index) fits(j int, first, last Entry) error {
	if j > 0 {
		if err := checkOrder(x.ents[j-1], first); err != nil {
			return err
		}
	}
	if j < len(x.ents) {
		if err := checkOrder(last, x.ents[j]); err != nil {
			return err
		}
	}
	return nil
}

// Len is the number of live entries.
func (x *Index) Len() int { return len(x.ents) }

// Tombstones is the number of entries of deleted data.
func (x *Index) Tombstones() int { return x.dead }

// Entry returns entry i. Its RDI must not be modified.
func (x *Index) Entry(i int) Entry { return x.ents[i] }

// Position is the byte position of entry i in the file.
func (x *Index) Position(i int) int64 { return x.pos[i] }

// Size is the length of the file's whole entries.
func (x *Index) Size() int64 { return x.size }

// All yields each live entry with its index.
func (x *Index) All() iter.Seq2[int, Entry] {
	return func(yield func(int, Entry) bool) {
		for i, e := range x.ents {
			if !yield(i, e) {
				return
			}
		}
	}
}

// LookupOffset returns the entry to start reading at for Kafka offset off:
// the entry that holds it; the next one when off falls in a gap (offsets
// removed by compaction); the first entry for an offset below the first;
// the first chunk of an opaque file whose base offset is the last at or
// below off. ok is false past the last entry.
func (x *Index) LookupOffset(off int64) (int, bool) {
	n := len(x.ents)
	j := sort.Search(n, func(i int) bool { return x.ents[i].FirstOffset > off }) - 1
	switch {
	case n == 0:
		return 0, false
	case j < 0:
		return 0, true
	case x.ents[j].Opaque():
		for j > 0 && x.ents[j-1].Opaque() && x.ents[j-1].FirstOffset == x.ents[j].FirstOffset {
			j--
		}
		return j, true
	case x.ents[j].LastOffset >= off:
		return j, true
	case j+1 < n:
		return j + 1, true
	}
	return 0, false
}

// LookupTimestamp returns the first entry with a timestamp at or after ts
// (Kafka's ListOffsets by time). Opaque entries have no timestamps and are
// never the answer. ok is false when no entry reaches ts.
func (x *Index) LookupTimestamp(ts int64) (int, bool) {
	i := sort.Search(len(x.maxT), func(i int) bool { return x.maxT[i] >= ts })
	return i, i < len(x.maxT)
}

// Segment returns the entries [lo, hi) of the segment with base offset
// base whose successor starts at next (math.MaxInt64 for the last).
func (x *Index) Segment(base, next int64) (lo, hi int) {
	lo = sort.Search(len(x.ents), func(i int) bool { return x.ents[i].FirstOffset >= base })
	hi = sort.Search(len(x.ents), func(i int) bool { return x.ents[i].FirstOffset >= next })
	return lo, max(lo, hi)
}

// LookupPosition returns the entry that holds byte pos of the segment
// [base, next) and the position within that entry's data. The entries of a
// segment cover its bytes in order from position 0.
func (x *Index) LookupPosition(base, next, pos int64) (i int, within int64, ok bool) {
	lo, hi := x.Segment(base, next)
	if lo == hi || pos < 0 {
		return 0, 0, false
	}
	start := x.cum[lo]
	i = lo + sort.Search(hi-lo, func(k int) bool {
		e := lo + k
		return x.cum[e]+int64(x.ents[e].DataLength)-start > pos
	})
	if i == hi {
		return 0, 0, false
	}
	return i, pos - (x.cum[i] - start), true
}

// SegmentLength is the number of data bytes the entries of segment
// [base, next) cover.
func (x *Index) SegmentLength(base, next int64) int64 {
	lo, hi := x.Segment(base, next)
	if lo == hi {
		return 0
	}
	return x.cum[hi-1] + int64(x.ents[hi-1].DataLength) - x.cum[lo]
}
