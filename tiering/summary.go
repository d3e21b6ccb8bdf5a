package tiering

import (
	"time"

	"github.com/tierfs/tierfs/internal/tiered"
)

// PartitionSummary is where a partition's segments are: what tierfs
// status prints and the metrics report.
type PartitionSummary struct {
	Name            string    `json:"partition"`
	Segments        int       `json:"segments"`
	Local           int       `json:"local"`             // segments only on the local disk
	Shipped         int       `json:"shipped"`           // in the store, local bytes kept
	Remote          int       `json:"remote"`            // in the store only
	OnDisk          int64     `json:"on_disk_bytes"`     // bytes of .log files allocated on the local disk
	InStore         int64     `json:"in_store_bytes"`    // bytes of .log files with a copy in the store
	LagSegments     int       `json:"ship_lag_segments"` // rolled segments not shipped yet
	LagBytes        int64     `json:"ship_lag_bytes"`    // and their bytes
	OldestLocal     time.Time `json:"oldest_local,omitzero"`
	OldestUnshipped time.Time `json:"oldest_unshipped,omitzero"` // the oldest rolled segment not shipped
}

// Summarize reads the partitions under root and where their segments
// are; state gives a segment's state (it differs through a mount and on a
// backing directory). It touches no store.
func Summarize(root string, state func(seg Segment) tiered.State) ([]PartitionSummary, error) {
	parts, err := Scan(root)
	if err != nil {
		return nil, err
	}
	return summarize(parts, state), nil
}

func summarize(parts []Partition, state func(seg Segment) tiered.State) []PartitionSummary {
	out := make([]PartitionSummary, 0, len(parts))
	for _, p := range parts {
		s := PartitionSummary{Name: p.Name, Segments: len(p.Segments)}
		for _, seg := range p.Segments {
			s.OnDisk += seg.Alloc
			switch state(seg) {
			case StateRemote:
				s.Remote++
				s.InStore += seg.Size
				continue
			case StateShipped:
				s.Shipped++
				s.InStore += seg.Size
			default:
				s.Local++
				if seg.Next >= 0 {
					s.LagSegments++
					s.LagBytes += seg.Size
					if s.OldestUnshipped.IsZero() {
						s.OldestUnshipped = seg.Mtime
					}
				}
			}
			if s.OldestLocal.IsZero() {
				s.OldestLocal = seg.Mtime
			}
		}
		out = append(out, s)
	}
	return out
}

// Summary summarizes the tierer's log directory.
func (t *Tierer) Summary() ([]PartitionSummary, error) {
	if err := t.waitReady(); err != nil {
		return nil, err
	}
	// Partitions as last scanned, unless they changed since (then scanned
	// now, and kept as scanned); the records of segments that did not
	// change come from memory. A scrape of the metrics then costs what
	// changed since the last one, not a stat and a record per segment.
	parts, rescanned, err := t.scans.view(t.cfg.Root, t.cfg.Now())
	t.counters.ViewScans.Add(int64(rescanned))
	if err != nil {
		return nil, err
	}
	return summarize(parts, func(seg Segment) tiered.State {
		rs, err := t.records.of(seg)
		if err != nil || !rs.Has {
			return StateLocal // counted as not shipped
		}
		return rs.State
	}), nil
}
