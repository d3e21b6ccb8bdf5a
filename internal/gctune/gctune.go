// Package gctune keeps what the Go heap grows by between collections to
// a fixed headroom, not to a share of what is live.
//
// With the runtime's default (GOGC=100) a heap of long-lived metadata
// doubles before it is collected: a mount that catalogues 100,000
// segments in 100 MiB would hold 200 MiB of heap while doing nothing.
// A Tuner sets the GC percentage after every collection so that the
// next one runs after about Headroom bytes of allocation (never more than
// the default's 100 % of the live heap, never less than MinPercent). It
// costs nothing between collections: it runs from a finalizer the
// collector calls, not from a timer.
package gctune

import (
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync"

	"github.com/tierfs/tierfs/internal/aftergc"
)

// MinPercent is the lowest GC percentage a Tuner sets: below it a large
// live heap would be collected too often for its headroom.
const MinPercent = 25

// Tuner adjusts the GC percentage after each collection.
type Tuner struct {
	headroom uint64
	log      *slog.Logger

	mu      sync.Mutex
	stopped bool // GUARDED_BY(mu)
	percent int  // the percentage set last; GUARDED_BY(mu)
	restore int  // the percentage before Start; GUARDED_BY(mu)
}

// Start tunes the collector for a headroom of headroom bytes until Stop.
func Start(headroom uint64, log *slog.Logger) *Tuner {
	t := &Tuner{headroom: headroom, log: log}
	t.restore = debug.SetGCPercent(100)
	debug.SetGCPercent(t.restore)
	t.percent = t.restore
	t.tune()
	aftergc.Run(t.tune)
	return t
}

// Stop ends the tuning and puts back the percentage from before Start.
func (t *Tuner) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.stopped = true
		debug.SetGCPercent(t.restore)
	}
}

// Percent is the GC percentage set last.
func (t *Tuner) Percent() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.percent
}

// tune sets the percentage for the live heap now; false once stopped.
func (t *Tuner) tune() bool {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	live := uint64(0)
	if sample[0].Value.Kind() == metrics.KindUint64 {
		live = sample[0].Value.Uint64()
	}
	p := PercentFor(live, t.headroom)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	if p != t.percent {
		debug.SetGCPercent(p)
		if t.log != nil {
			t.log.Debug("gc percentage set", "percent", p, "live_heap", live)
		}
		t.percent = p
	}
	return true
}

// PercentFor is the GC percentage that lets a heap of live bytes grow by
// headroom: 100 (the runtime's default) at most, MinPercent at least.
func PercentFor(live, headroom uint64) int {
	if live == 0 || headroom >= live {
		return 100
	}
	return max(MinPercent, int(100*headroom/live))
}
