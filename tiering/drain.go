package tiering

import (
	"context"
	"errors"
	"time"
)

// ErrDraining refuses new work while the mount is being unmounted.
var ErrDraining = errors.New("the mount is being unmounted: no new transfers")

// Drain stops the tierer from starting new work (passes, tierfs ship and
// evict) and waits until the work under way is done or ctx ends. It
// returns how many pieces of work were under way when it started. Undrain
// lets work start again (an unmount that failed).
func (t *Tierer) Drain(ctx context.Context) (int, error) {
	t.draining.Store(true)
	was := int(t.active.Load())
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for t.active.Load() > 0 {
		select {
		case <-ctx.Done():
			return was, ctx.Err()
		case <-tick.C:
		}
	}
	return was, nil
}

// Undrain ends a Drain.
func (t *Tierer) Undrain() { t.draining.Store(false) }

// Active is how many passes or manual transfers are under way.
func (t *Tierer) Active() int { return int(t.active.Load()) }

// begin counts one piece of work, unless draining; end must follow.
func (t *Tierer) begin() error {
	t.active.Add(1)
	if t.draining.Load() {
		t.active.Add(-1)
		return ErrDraining
	}
	return nil
}

func (t *Tierer) end() { t.active.Add(-1) }
