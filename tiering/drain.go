package tiering

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// ErrDraining refuses new work while the mount is being unmounted.
var ErrDraining = errors.New("the mount is being unmounted: no new transfers")

// work counts the work under way (passes, tierfs ship and evict), and
// refuses new work while draining.
type work struct {
	draining atomic.Bool
	active   atomic.Int64
}

// begin counts one piece of work, unless draining; end must follow.
func (w *work) begin() error {
	w.active.Add(1)
	if w.draining.Load() {
		w.active.Add(-1)
		return ErrDraining
	}
	return nil
}

func (w *work) end() { w.active.Add(-1) }

// drain stops new work and waits until the work under way is done or
// ctx ends; it returns how much was under way when it started.
func (w *work) drain(ctx context.Context) (int, error) {
	w.draining.Store(true)
	was := int(w.active.Load())
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for w.active.Load() > 0 {
		select {
		case <-ctx.Done():
			return was, ctx.Err()
		case <-tick.C:
		}
	}
	return was, nil
}

// Drain stops the tierer from starting new work (passes, tierfs ship and
// evict) and waits until the work under way is done or ctx ends. It
// returns how many pieces of work were under way when it started. Undrain
// lets work start again (an unmount that failed).
func (t *Tierer) Drain(ctx context.Context) (int, error) { return t.work.drain(ctx) }

// Undrain ends a Drain.
func (t *Tierer) Undrain() { t.work.draining.Store(false) }

// Active is how many passes or manual transfers are under way.
func (t *Tierer) Active() int { return int(t.work.active.Load()) }
