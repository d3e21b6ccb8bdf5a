package tiering

import (
	"fmt"
	"maps"
	"path/filepath"
	"sync"
	"time"
)

// PartitionError is the last thing that went wrong with a partition.
type PartitionError struct {
	Time time.Time `json:"time,omitzero"`
	Err  string    `json:"error,omitempty"`
	Kept string    `json:"kept_local,omitempty"` // why a segment is kept local, if one waits for more than its age
}

// partStatus is what status says of each partition beyond its segments:
// its last error, and why its first segment that waits is kept local.
type partStatus struct {
	now func() time.Time

	mu      sync.Mutex
	lastErr map[string]PartitionError // by partition; GUARDED_BY(mu)
	kept    map[string]string         // by partition; GUARDED_BY(mu)
}

func newPartStatus(now func() time.Time) *partStatus {
	return &partStatus{now: now, lastErr: map[string]PartitionError{}, kept: map[string]string{}}
}

// noteErr remembers err as the partition's last error and returns it.
func (ps *partStatus) noteErr(partition string, err error) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.lastErr[partition] = PartitionError{Time: ps.now(), Err: err.Error()}
	return err
}

// noteKept remembers why segment seg of a partition waits (the first
// in the pass); an empty why starts the pass over.
func (ps *partStatus) noteKept(partition string, seg Segment, why string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if why == "" {
		delete(ps.kept, partition)
		return
	}
	if _, ok := ps.kept[partition]; !ok {
		ps.kept[partition] = fmt.Sprintf("%s: %s", filepath.Base(seg.LogPath()), why)
	}
}

// all are the last errors, with why segments are kept, by partition.
func (ps *partStatus) all() map[string]PartitionError {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := maps.Clone(ps.lastErr)
	for p, why := range ps.kept {
		e := out[p]
		e.Kept = why
		out[p] = e
	}
	return out
}
