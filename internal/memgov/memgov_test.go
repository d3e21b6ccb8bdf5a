package memgov

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestRestIsWhatTheProcessKeepsBesideThePool(t *testing.T) {
	m := Memory{Live: 300, Total: 1000, Released: 200, Free: 150, Objects: 350, Unused: 50}
	// Outside the heap: 1000-200-150-350-50 = 250; live 300; the pool 200.
	if got := Rest(m, 200); got != 350 {
		t.Fatalf("Rest = %d, want 350", got)
	}
	if got := Rest(m, 1000); got != 0 {
		t.Fatalf("Rest of a pool larger than the live heap = %d, want 0", got)
	}
}

// fakePool is a pool holding real heap memory.
type fakePool struct {
	mu   sync.Mutex
	bufs [][]byte
	room int64
	sets int
}

func (p *fakePool) Used() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.bufs {
		n += len(b)
	}
	return int64(n)
}

func (p *fakePool) SetRoom(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.room = n
	p.sets++
}

func (p *fakePool) state() (room int64, sets int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.room, p.sets
}

// collect runs collections until the governor has measured after one.
func collect(t *testing.T, p *fakePool) int64 {
	t.Helper()
	_, before := p.state()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		if room, sets := p.state(); sets > before {
			return room
		}
		if time.Now().After(deadline) {
			t.Fatal("no measure after a collection in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGovernorGivesThePoolWhatTheRestLeaves: memory the rest of the
// process keeps live takes room from the pool, and gives it back when
// it is let go; the pool's own memory does not count against it.
func TestGovernorGivesThePoolWhatTheRestLeaves(t *testing.T) {
	const budget = 512 << 20
	const mib = 1 << 20
	p := &fakePool{}
	g := Start(budget, p, nil)
	defer g.Stop()
	base := collect(t, p)
	if base > budget || base < budget-64*mib {
		t.Fatalf("room of an idle test process: %d MiB of %d", base/mib, budget/mib)
	}

	// 64 MiB of pointers and bytes kept by the rest of the process.
	kept := make([][]byte, 64)
	for i := range kept {
		kept[i] = make([]byte, mib)
	}
	room := collect(t, p)
	if d := base - room; d < 60*mib || d > 72*mib {
		t.Fatalf("with 64 MiB more kept, the room went from %d to %d MiB", base/mib, room/mib)
	}
	_, rest := g.Room()
	runtime.KeepAlive(kept)
	kept = nil

	// 128 MiB in the pool: not the rest's.
	p.mu.Lock()
	for range 128 {
		p.bufs = append(p.bufs, make([]byte, mib))
	}
	p.mu.Unlock()
	room = collect(t, p)
	if d := room - base; d < -8*mib || d > 8*mib {
		t.Fatalf("the pool's own memory took room: %d MiB, was %d", room/mib, base/mib)
	}
	if _, r := g.Room(); r > rest-56*mib {
		t.Fatalf("the rest after 64 MiB was let go: %d MiB, was %d", r/mib, rest/mib)
	}

	g.Stop()
	if room, _ := p.state(); room != budget {
		t.Fatalf("after Stop the pool's room is %d, want the budget", room)
	}
	_, sets := p.state()
	runtime.GC()
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
	if _, n := p.state(); n != sets {
		t.Fatal("the room was set after Stop")
	}
}
