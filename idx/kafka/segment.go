package kafka

import (
	"errors"
	"io"
)

// SegmentSummary is what the tierer needs to know about a rolled segment.
type SegmentSummary struct {
	// LastOffset is the last offset of the last whole batch, or -1 when
	// the segment holds no batch.
	LastOffset int64
	// MaxTimestamp is the largest batch max timestamp, or -1 (Kafka's
	// NO_TIMESTAMP) when the segment holds no batch.
	MaxTimestamp int64
	// End is where the last whole batch ends; Torn says bytes follow it.
	End  int64
	Torn bool
	// Scanned counts the batch headers that were read: few when the
	// indexes could be used, all of them otherwise.
	Scanned int
	// FromIndex reports that the scan started at the last .index entry.
	FromIndex bool
}

// errStop ends a scan early without an error.
var errStop = errors.New("stop")

// SummarizeSegment finds a segment's last offset and max timestamp
// cheaply: it starts at the position of the last .index entry and hops
// batch headers to the end, taking the max timestamp so far from the last
// .timeindex entry. Kafka appends both index entries together, after the
// batch at that position was appended, so batches before the position are
// covered by the time index. When the index does not fit the segment (the
// position is not a batch holding the indexed offset), it falls back to a
// scan from position 0, and so it does when the last .timeindex entry
// names an offset past the segment's end: a stale index costs time.
func SummarizeSegment(name string, r io.ReaderAt, size int64, offIdx []OffsetEntry, timeIdx []TimeEntry) (SegmentSummary, error) {
	if len(offIdx) > 0 {
		last := offIdx[len(offIdx)-1]
		if s, ok, err := summarizeFrom(name, r, size, last, timeIdx); err != nil || ok {
			return s, err
		}
	}
	s, _, err := summarizeFrom(name, r, size, OffsetEntry{Offset: -1}, nil)
	return s, err
}

// summarizeFrom scans from start.Position. ok is false when the batch
// found there does not hold start.Offset (a stale index).
func summarizeFrom(name string, r io.ReaderAt, size int64, start OffsetEntry, timeIdx []TimeEntry) (SegmentSummary, bool, error) {
	s := SegmentSummary{LastOffset: -1, MaxTimestamp: -1, FromIndex: start.Offset >= 0}
	if len(timeIdx) > 0 {
		s.MaxTimestamp = timeIdx[len(timeIdx)-1].Timestamp
	}
	if start.Position > size {
		return s, false, nil
	}
	first := true
	res, err := ScanBatches(name, r, size, ScanOptions{Start: start.Position}, func(b Batch) error {
		if first && s.FromIndex && (start.Offset < b.BaseOffset || start.Offset > b.LastOffset) {
			return errStop
		}
		first = false
		s.Scanned++
		s.LastOffset = b.LastOffset
		s.MaxTimestamp = max(s.MaxTimestamp, b.MaxTimestamp)
		return nil
	})
	if errors.Is(err, errStop) {
		return s, false, nil
	}
	if err != nil {
		var fe *FormatError
		if s.FromIndex && errors.As(err, &fe) && fe.Offset == start.Position {
			// The indexed position is not a batch at all.
			return s, false, nil
		}
		return s, false, err
	}
	if s.FromIndex && (res.Batches == 0 || len(timeIdx) > 0 && timeIdx[len(timeIdx)-1].Offset > s.LastOffset) {
		return s, false, nil
	}
	s.End, s.Torn = res.End, res.Torn
	return s, true, nil
}
