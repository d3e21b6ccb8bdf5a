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
		s := PartitionSummary{Name: p.Name}
		for _, seg := range p.Segments {
			s.add(seg, state(seg))
		}
		out = append(out, s)
	}
	return out
}

// add counts segment seg, in state st, after those counted before it
// (in offset order).
func (s *PartitionSummary) add(seg Segment, st tiered.State) {
	s.Segments++
	s.OnDisk += seg.Alloc
	switch st {
	case StateRemote:
		s.Remote++
		s.InStore += seg.Size
		return
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

// summarizeScan summarizes partition p as a view found it in scan sc
// (nil: not kept). The summary of its rolled segments is kept in the
// scan (keptRolled): a scrape of a partition that did not change asks
// only its active segment's state.
func summarizeScan(p Partition, sc *partScan, state func(seg Segment) tiered.State, now time.Time) PartitionSummary {
	n := len(p.Segments)
	if sc == nil || n == 0 || p.Segments[n-1].Next >= 0 {
		return summarize([]Partition{p}, state)[0]
	}
	s := *keptRolled(&sc.rolled, p.Segments[:n-1], now, func(r *PartitionSummary, seg Segment) bool {
		r.add(seg, state(seg))
		return true
	})
	s.Name = p.Name
	s.add(p.Segments[n-1], state(p.Segments[n-1]))
	return s
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
	vs, rescanned, err := t.scans.viewScans(t.cfg.Root)
	t.counters.ViewScans.Add(int64(rescanned))
	if err != nil {
		return nil, err
	}
	state := func(seg Segment) tiered.State {
		rs, err := t.records.of(seg)
		if err != nil || !rs.Has {
			return StateLocal // counted as not shipped
		}
		return rs.State
	}
	now := t.cfg.Now()
	out := make([]PartitionSummary, 0, len(vs))
	for _, v := range vs {
		out = append(out, summarizeScan(v.p, v.s, state, now))
	}
	return out, nil
}
