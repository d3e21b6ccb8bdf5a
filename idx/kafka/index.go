package kafka

import (
	"encoding/binary"
	"sort"
)

// Kafka's offset index (.index): 8-byte entries of relative offset (int32,
// from the segment's base offset) and byte position (int32) in the .log.
// Its time index (.timeindex): 12-byte entries of timestamp (int64) and
// relative offset (int32). Both are preallocated and mapped by the broker,
// so the tail of a file that is still active, or was not trimmed, is
// zeros; an index ends at its first entry that does not grow.

// OffsetEntry is one .index entry, made absolute.
type OffsetEntry struct {
	Offset   int64
	Position int64
}

// TimeEntry is one .timeindex entry, made absolute.
type TimeEntry struct {
	Timestamp int64
	Offset    int64
}

const (
	offsetEntrySize = 8
	timeEntrySize   = 12
)

// ParseOffsetIndex decodes a .index file of the segment with baseOffset.
// Entries must grow strictly in offset and position; the first entry that
// does not (the zero-filled preallocated tail) ends the index. A length that
// is not a multiple of the entry size is an error.
func ParseOffsetIndex(name string, baseOffset int64, data []byte) ([]OffsetEntry, error) {
	if len(data)%offsetEntrySize != 0 {
		return nil, formatErr(name, int64(len(data)-len(data)%offsetEntrySize), "offset index length %d is not a multiple of %d", len(data), offsetEntrySize)
	}
	var out []OffsetEntry
	for off := 0; off < len(data); off += offsetEntrySize {
		rel := int32(binary.BigEndian.Uint32(data[off:]))
		pos := int32(binary.BigEndian.Uint32(data[off+4:]))
		if rel < 0 || pos < 0 {
			return nil, formatErr(name, int64(off), "negative relative offset %d or position %d", rel, pos)
		}
		e := OffsetEntry{Offset: baseOffset + int64(rel), Position: int64(pos)}
		if len(out) == 0 && rel == 0 && pos == 0 {
			// Kafka adds an entry only after index.interval.bytes of
			// data, so a first entry at position 0 is padding.
			break
		}
		if len(out) > 0 {
			last := out[len(out)-1]
			if e.Offset <= last.Offset || e.Position <= last.Position {
				break
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// ParseTimeIndex decodes a .timeindex file of the segment with baseOffset.
// Timestamps and offsets never decrease; the first entry that goes back,
// or a zero entry after the first, ends the index.
func ParseTimeIndex(name string, baseOffset int64, data []byte) ([]TimeEntry, error) {
	if len(data)%timeEntrySize != 0 {
		return nil, formatErr(name, int64(len(data)-len(data)%timeEntrySize), "time index length %d is not a multiple of %d", len(data), timeEntrySize)
	}
	var out []TimeEntry
	for off := 0; off < len(data); off += timeEntrySize {
		ts := int64(binary.BigEndian.Uint64(data[off:]))
		rel := int32(binary.BigEndian.Uint32(data[off+8:]))
		if rel < 0 {
			return nil, formatErr(name, int64(off), "negative relative offset %d", rel)
		}
		e := TimeEntry{Timestamp: ts, Offset: baseOffset + int64(rel)}
		if ts == 0 && rel == 0 {
			break
		}
		if len(out) > 0 {
			last := out[len(out)-1]
			if e.Timestamp < last.Timestamp || e.Offset < last.Offset {
				break
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// LookupPosition returns the entry with the largest offset at or below
// target: where to start scanning the .log for target. ok is false when
// target is below the first entry (scan from position 0).
func LookupPosition(idx []OffsetEntry, target int64) (OffsetEntry, bool) {
	i := sort.Search(len(idx), func(i int) bool { return idx[i].Offset > target })
	if i == 0 {
		return OffsetEntry{}, false
	}
	return idx[i-1], true
}

// LookupTime returns the entry with the largest timestamp at or below ts.
func LookupTime(idx []TimeEntry, ts int64) (TimeEntry, bool) {
	i := sort.Search(len(idx), func(i int) bool { return idx[i].Timestamp > ts })
	if i == 0 {
		return TimeEntry{}, false
	}
	return idx[i-1], true
}
