package tiering

import (
	"context"
	"errors"
	"fmt"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/internal/tiered"
)

// ErrNotEligible is a segment that cannot be shipped by hand: the
// broker's state says it may still change, or its partition is compacted.
var ErrNotEligible = errors.New("not safe to ship")

// ShipNow ships the segment rel (<partition dir>/<base>.log, from the log
// dir root) now, whatever its age: everything else that makes a segment
// safe to ship must hold (rolled, flushed, committed, indexes trimmed, no
// older version in the store). It returns the segment's state after.
func (t *Tierer) ShipNow(ctx context.Context, rel string, progress chunkxfer.Progress) (tiered.State, error) {
	if err := t.work.begin(); err != nil {
		return 0, err
	}
	defer t.work.end()
	seg, err := t.shipper.findSegment(rel)
	if err != nil {
		return 0, err
	}
	rec, has, err := readRecord(seg.LogPath())
	if err != nil {
		return 0, err
	}
	if has {
		if progress != nil {
			progress(seg.Size, seg.Size)
		}
		return rec.State, nil
	}
	cp, err := t.checkpoints.read(t.cfg.Root, t.cfg.Now())
	if err != nil {
		return 0, err
	}
	if ok, why := (Policy{}).Eligible(seg, cp, t.cfg.Now()); !ok {
		return StateLocal, fmt.Errorf("%s: %w: %s", rel, ErrNotEligible, why)
	}
	var wait *WaitError
	if err := t.shipper.Ship(ctx, seg, progress); errors.As(err, &wait) {
		return StateLocal, fmt.Errorf("%s: %w: %s", rel, ErrNotEligible, wait.Why)
	} else if err != nil {
		return StateLocal, t.status.noteErr(seg.Partition, fmt.Errorf("ship %s: %w", rel, err))
	}
	return StateShipped, nil
}

// EvictNow frees the local bytes of the segment rel now, shipping it
// first if it is not shipped yet.
func (t *Tierer) EvictNow(ctx context.Context, rel string, progress chunkxfer.Progress) (tiered.State, error) {
	if err := t.work.begin(); err != nil {
		return 0, err
	}
	defer t.work.end()
	st, err := t.ShipNow(ctx, rel, progress)
	if err != nil || st == StateRemote {
		return st, err
	}
	seg, err := t.shipper.findSegment(rel)
	if err != nil {
		return 0, err
	}
	if err := t.evictor.Evict(seg.LogPath()); err != nil {
		return st, t.status.noteErr(seg.Partition, fmt.Errorf("evict %s: %w", rel, err))
	}
	rec, _, err := readRecord(seg.LogPath())
	return rec.State, err
}
