package tiering

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/tierfs/tierfs/chunkxfer"
)

// ErrNotEligible is a segment that cannot be shipped by hand: the
// broker's state says it may still change, or its partition is compacted.
var ErrNotEligible = errors.New("not safe to ship")

// ShipNow ships the segment rel (<partition dir>/<base>.log, from the log
// dir root) now, whatever its age: everything else that makes a segment
// safe to ship must hold (rolled, flushed, committed, indexes trimmed, no
// older version in the store). It returns the segment's state after.
func (t *Tierer) ShipNow(ctx context.Context, rel string, progress chunkxfer.Progress) (string, error) {
	if err := t.begin(); err != nil {
		return "", err
	}
	defer t.end()
	seg, err := t.findSegment(rel)
	if err != nil {
		return "", err
	}
	rec, has, err := readRecord(seg.Path)
	if err != nil {
		return "", err
	}
	if has {
		if progress != nil {
			progress(seg.Size, seg.Size)
		}
		return rec.State, nil
	}
	cp, err := ReadCheckpoints(t.cfg.Root)
	if err != nil {
		return "", err
	}
	if ok, why := (Policy{}).Eligible(seg, cp, t.cfg.Now()); !ok {
		return StateLocal, fmt.Errorf("%s: %w: %s", rel, ErrNotEligible, why)
	}
	var wait *WaitError
	if err := t.Ship(ctx, seg, progress); errors.As(err, &wait) {
		return StateLocal, fmt.Errorf("%s: %w: %s", rel, ErrNotEligible, wait.Why)
	} else if err != nil {
		return StateLocal, t.noteErr(seg.Partition, fmt.Errorf("ship %s: %w", rel, err))
	}
	return StateShipped, nil
}

// EvictNow frees the local bytes of the segment rel now, shipping it
// first if it is not shipped yet.
func (t *Tierer) EvictNow(ctx context.Context, rel string, progress chunkxfer.Progress) (string, error) {
	if err := t.begin(); err != nil {
		return "", err
	}
	defer t.end()
	st, err := t.ShipNow(ctx, rel, progress)
	if err != nil || st == StateRemote {
		return st, err
	}
	seg, err := t.findSegment(rel)
	if err != nil {
		return "", err
	}
	if err := t.Evict(seg.Path); err != nil {
		return st, t.noteErr(seg.Partition, fmt.Errorf("evict %s: %w", rel, err))
	}
	rec, _, err := readRecord(seg.Path)
	return rec.State, err
}

// findSegment is the segment at rel, with what eligibility needs.
func (t *Tierer) findSegment(rel string) (Segment, error) {
	if err := t.waitReady(); err != nil {
		return Segment{}, err
	}
	rel = filepath.Clean(rel)
	dir, name, ok := strings.Cut(rel, "/")
	if !ok || strings.Contains(name, "/") || dir == ".." || filepath.IsAbs(rel) {
		return Segment{}, fmt.Errorf("%s is not a segment (<partition dir>/<base offset>.log)", rel)
	}
	p, err := ScanPartition(t.cfg.Root, dir)
	if err != nil {
		return Segment{}, err
	}
	for _, seg := range p.Segments {
		if filepath.Base(seg.Path) == name {
			return seg, nil
		}
	}
	return Segment{}, fmt.Errorf("%s is not a segment (<partition dir>/<base offset>.log)", rel)
}
