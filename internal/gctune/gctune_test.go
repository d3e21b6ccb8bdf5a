package gctune

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercentFor(t *testing.T) {
	for _, c := range []struct {
		live, headroom uint64
		want           int
	}{
		{0, 48 << 20, 100},
		{20 << 20, 48 << 20, 100},
		{48 << 20, 48 << 20, 100},
		{96 << 20, 48 << 20, 50},
		{120 << 20, 48 << 20, 40},
		{1 << 30, 48 << 20, MinPercent},
	} {
		if got := PercentFor(c.live, c.headroom); got != c.want {
			t.Errorf("PercentFor(%d MiB, %d MiB) = %d, want %d", c.live>>20, c.headroom>>20, got, c.want)
		}
	}
}

// TestTunerFollowsTheLiveHeap: with 64 MiB live and a headroom of 16,
// the collector runs at 25 % after the next collection; once the memory
// goes, at 100 % again; Stop puts the old percentage back.
func TestTunerFollowsTheLiveHeap(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	live := make([][]byte, 64)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	tu := Start(16<<20, nil)
	waitPercent(t, tu, 25)
	if got := debug.SetGCPercent(25); got != 25 {
		t.Fatalf("the runtime's percentage is %d, the tuner says 25", got)
	}
	runtime.KeepAlive(live)
	live = nil
	waitPercent(t, tu, 100)
	tu.Stop()
	debug.SetGCPercent(70)
	tu2 := Start(16<<20, nil)
	tu2.Stop()
	runtime.GC() // a finalizer of a stopped tuner changes nothing
	if got := debug.SetGCPercent(100); got != 70 {
		t.Fatalf("after Stop the percentage is %d, want the 70 from before Start", got)
	}
}

func waitPercent(t *testing.T, tu *Tuner, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); tu.Percent() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("percentage %d, want %d", tu.Percent(), want)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}
