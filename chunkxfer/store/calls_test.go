package store

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// deep recurses n frames down, as an SDK call's middleware does, and
// returns n.
func deep(n int) int {
	if n == 0 {
		return 0
	}
	var pad [256]byte
	pad[n%256] = byte(n)
	return deep(n-1) + 1 + int(pad[n%256]) - int(byte(n))
}

func TestCallPoolRunsEveryCallOnce(t *testing.T) {
	p := newCallPool(3, time.Hour)
	var ran atomic.Int32
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			got := 0
			p.run(func() { got = deep(200 + i); ran.Add(1) })
			if got != 200+i {
				t.Errorf("call %d returned %d, want %d", i, got, 200+i)
			}
		})
	}
	wg.Wait()
	if ran.Load() != 50 {
		t.Fatalf("%d calls ran, want 50", ran.Load())
	}
	if n := p.n.Load(); n < 1 || n > 3 {
		t.Fatalf("%d workers, want 1 to 3", n)
	}
}

func TestCallPoolRunsBeyondItsWorkersOnTheCaller(t *testing.T) {
	p := newCallPool(2, time.Hour)
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { p.run(func() { started <- struct{}{}; <-release }) })
	}
	<-started
	<-started
	// Both workers are busy: a third call must not wait for them.
	done := make(chan struct{})
	go func() { p.run(func() {}); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a call beyond the pool's workers waited for a worker")
	}
	if n := p.n.Load(); n != 2 {
		t.Fatalf("%d workers, want 2", n)
	}
	close(release)
	wg.Wait()
}

func TestCallPoolWorkersLeaveWhenIdle(t *testing.T) {
	p := newCallPool(4, 20*time.Millisecond)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { p.run(func() { time.Sleep(time.Millisecond) }) })
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for p.n.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers still there long after their idle time", p.n.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The pool serves again after its workers left.
	ok := false
	p.run(func() { ok = true })
	if !ok {
		t.Fatal("a call after the workers left did not run")
	}
}
