package kafka

import (
	"encoding/binary"
	"fmt"
	"io"
)

// DefaultIndexInterval is Kafka's index.interval.bytes.
const DefaultIndexInterval = 4096

// BuildIndexes makes the .index and .timeindex of a rolled segment the
// way the broker writes them as it appends: before a batch that starts
// more than interval bytes after the last entry, an offset entry (that
// batch's last offset and its position) and a time entry (the largest
// timestamp so far and its offset) if the timestamp grew; and, as at a
// roll, a last time entry for the largest timestamp of the segment. A
// segment that is not well-formed record batches is an error.
func BuildIndexes(name string, r io.ReaderAt, size, base int64, interval int64) (offsets, times []byte, err error) {
	if interval <= 0 {
		interval = DefaultIndexInterval
	}
	var since int64
	maxTS, maxTSOffset := int64(-1), int64(-1)
	lastTS := int64(-1) // of the last time entry
	prevLast := base - 1
	appendTime := func() {
		if maxTS > lastTS {
			times = binary.BigEndian.AppendUint64(times, uint64(maxTS))
			times = binary.BigEndian.AppendUint32(times, uint32(maxTSOffset-base))
			lastTS = maxTS
		}
	}
	res, err := ScanBatches(name, r, size, ScanOptions{}, func(b Batch) error {
		if b.BaseOffset < base || b.LastOffset < b.BaseOffset {
			return fmt.Errorf("%s: batch at %d: offsets %d..%d are not at or past the segment's base %d", name, b.Position, b.BaseOffset, b.LastOffset, base)
		}
		if b.BaseOffset <= prevLast {
			return fmt.Errorf("%s: batch at %d: offset %d does not follow the batch before (last offset %d)", name, b.Position, b.BaseOffset, prevLast)
		}
		prevLast = b.LastOffset
		if b.LastOffset-base > 1<<31-1 || b.Position > 1<<31-1 {
			return fmt.Errorf("%s: batch at %d: offset %d or position too far from base %d for an index", name, b.Position, b.LastOffset, base)
		}
		if b.MaxTimestamp > maxTS {
			maxTS, maxTSOffset = b.MaxTimestamp, b.LastOffset
		}
		if since > interval {
			offsets = binary.BigEndian.AppendUint32(offsets, uint32(b.LastOffset-base))
			offsets = binary.BigEndian.AppendUint32(offsets, uint32(b.Position))
			appendTime()
			since = 0
		}
		since += b.Size
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if res.Torn || res.End != size {
		return nil, nil, fmt.Errorf("%s: not whole record batches: the scan ends at byte %d of %d", name, res.End, size)
	}
	appendTime()
	return offsets, times, nil
}
