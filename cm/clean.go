package cm

import (
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Clean removes retained originals whose last event is older than the
// retention, then the oldest until the rest fit in MaxBytes, and then the
// event log segments that only hold events older than the retention. It
// returns how many originals it removed.
func (m *Manager) Clean() (int, error) {
	if err := m.wait(); err != nil {
		return 0, err
	}
	m.flushFiler()
	now := m.cfg.Now()
	horizon := now.Add(-m.cfg.Retain)
	type aged struct {
		sum string
		rc  *retainedCopy
	}
	m.mu.Lock()
	all := make([]aged, 0, len(m.retained))
	for s, rc := range m.retained {
		all = append(all, aged{s, rc})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].rc.last.Before(all[j].rc.last) })
	var drop []aged
	total := m.bytes
	for _, a := range all {
		if a.rc.last.Before(horizon) || (m.cfg.MaxBytes > 0 && total > m.cfg.MaxBytes) {
			drop = append(drop, a)
			total -= a.rc.bytes
			delete(m.retained, a.sum)
			m.bytes -= a.rc.bytes
		}
	}
	m.mu.Unlock()
	var firstErr error
	for _, a := range drop {
		// by-sum last: until it goes, the content counts as retained.
		if err := os.Remove(filepath.Join(m.dir, a.rc.name)); err != nil && !os.IsNotExist(err) && firstErr == nil {
			firstErr = err
		}
		removeEmptyParents(filepath.Dir(filepath.Join(m.dir, a.rc.name)), filepath.Join(m.dir, "files"))
		if err := os.Remove(filepath.Join(m.dir, "by-sum", a.sum)); err != nil && !os.IsNotExist(err) && firstErr == nil {
			firstErr = err
		}
		m.stats.Expired.Add(1)
	}
	if err := m.dropOldSegments(horizon); err != nil && firstErr == nil {
		firstErr = err
	}
	return len(drop), firstErr
}

// dropOldSegments removes the log segments, except the newest, whose
// events all happened before horizon.
func (m *Manager) dropOldSegments(horizon time.Time) error {
	ids, err := segments(m.log.dir)
	if err != nil {
		return err
	}
	for i := 0; i+1 < len(ids); i++ {
		// A segment's last event is just before the next one's first.
		var newest int64
		err := readEvents(m.log.dir, ids[i+1]-1, ids[i+1]-1, func(ev Event) error {
			newest = ev.TimeNs
			return nil
		})
		if err != nil {
			return err
		}
		if time.Unix(0, newest).After(horizon) {
			return nil
		}
		if err := os.Remove(filepath.Join(m.log.dir, segName(ids[i]))); err != nil {
			return err
		}
	}
	return nil
}

// removeEmptyParents removes dir and its parents up to (not including)
// stop while they are empty.
func removeEmptyParents(dir, stop string) {
	for dir != stop && len(dir) > len(stop) {
		if os.Remove(dir) != nil {
			return
		}
		dir = filepath.Dir(dir)
	}
}
