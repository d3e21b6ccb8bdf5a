package memgov

import (
	"context"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
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

func (p *fakePool) SetRoom(n int64) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.room = n
	p.sets++
	return n
}

func (p *fakePool) state() (room int64, sets int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.room, p.sets
}

// collect runs collections until g has measured after one, and
// returns the room it set.
func collect(t *testing.T, g *Governor) int64 {
	t.Helper()
	passes := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.passes
	}
	runtime.GC() // a measure after this one sees what the caller kept
	before := passes()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		if passes() > before {
			room, _ := g.Room()
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
	runtime.GC() // what other tests kept is not live
	g := Start(budget, 32*mib, p, nil)
	defer g.Stop()
	base := collect(t, g)
	if base > budget || base < budget-64*mib {
		t.Fatalf("room of an idle test process: %d MiB of %d", base/mib, budget/mib)
	}

	// 64 MiB of pointers and bytes kept by the rest of the process.
	kept := make([][]byte, 64)
	for i := range kept {
		kept[i] = make([]byte, mib)
	}
	room := collect(t, g)
	if d := base - room; d < 48*mib || d > 80*mib {
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
	room = collect(t, g)
	if d := room - base; d < -8*mib || d > 8*mib {
		t.Fatalf("the pool's own memory took room: %d MiB, was %d", room/mib, base/mib)
	}
	if _, r := g.Room(); r > rest-48*mib {
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

// flooredPool keeps a least room of its own.
type flooredPool struct {
	fakePool
	floor int64
}

func (p *flooredPool) SetRoom(n int64) int64 { return p.fakePool.SetRoom(max(n, p.floor)) }

// logged counts the records logged at each level.
type logged struct {
	mu     sync.Mutex
	levels map[slog.Level]int
}

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.levels[r.Level]++
	return nil
}
func (l *logged) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logged) WithGroup(string) slog.Handler      { return l }
func (l *logged) count(level slog.Level) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.levels[level]
}

// TestGovernorWarnsOnceWhenThePoolCannotYield: a rest of the process
// that leaves the pool less than its least room is warned about once,
// however many collections see it, and its end is said once.
func TestGovernorWarnsOnceWhenThePoolCannotYield(t *testing.T) {
	const mib = 1 << 20
	p := &flooredPool{floor: 48 * mib}
	h := &logged{levels: map[slog.Level]int{}}
	runtime.GC()
	g := Start(64*mib, 32*mib, p, slog.New(h))
	defer g.Stop()
	collect(t, g)
	if n := h.count(slog.LevelWarn); n != 0 {
		t.Fatalf("%d warnings with room to spare (rest %d MiB)", n, g.rest/mib)
	}
	kept := make([][]byte, 32)
	for i := range kept {
		kept[i] = make([]byte, mib)
	}
	collect(t, g)
	collect(t, g)
	if n := h.count(slog.LevelWarn); n != 1 {
		t.Fatalf("%d warnings with 32 MiB more kept, want 1", n)
	}
	if room, _ := g.Room(); room != 48*mib {
		t.Fatalf("room %d MiB, want the pool's least, 48", room/mib)
	}
	runtime.KeepAlive(kept)
	kept = nil
	collect(t, g)
	collect(t, g)
	if w, i := h.count(slog.LevelWarn), h.count(slog.LevelInfo); w != 1 || i != 1 {
		t.Fatalf("after the 32 MiB went: %d warnings, %d infos, want 1 and 1", w, i)
	}
}

// TestGovernorLeavesSmallChangesAlone: a change of the rest smaller than
// a 1/hysteresis of the budget leaves the pool's room as it is (a pool
// that let buffers go and allocated them again at each collection would
// make garbage); a larger one sets it.
func TestGovernorLeavesSmallChangesAlone(t *testing.T) {
	const budget = 1 << 30 // changes of 32 MiB or more
	const mib = 1 << 20
	p := &fakePool{}
	runtime.GC()
	g := Start(budget, 8*budget/hysteresis, p, nil) // a margin of 256 MiB: steps of a 1/hysteresis
	defer g.Stop()
	base := collect(t, g)
	_, sets := p.state()
	small := make([][]byte, 8)
	for i := range small {
		small[i] = make([]byte, mib)
	}
	if room := collect(t, g); room != base {
		t.Fatalf("8 MiB more kept moved the room from %d to %d MiB", base/mib, room/mib)
	}
	if _, n := p.state(); n != sets {
		t.Fatalf("8 MiB more kept set the room %d times", n-sets)
	}
	large := make([][]byte, 64)
	for i := range large {
		large[i] = make([]byte, mib)
	}
	// The room follows within a 1/hysteresis of the budget (automatic
	// collections while large was made may have set it part way).
	room := collect(t, g)
	_, rest := g.Room()
	if d := budget - rest - room; room == base || d >= budget/hysteresis || -d >= budget/hysteresis {
		t.Fatalf("72 MiB more kept: room %d MiB (was %d), the rest %d MiB", room/mib, base/mib, rest/mib)
	}
	runtime.KeepAlive(small)
	runtime.KeepAlive(large)
}

// TestRoomLeavesTheRuntimesHeadroom: under a memory limit of the budget
// plus the margin, the pool's room leaves the share of the limit the
// runtime keeps its heap goal below it by, so that what is live stays
// the margin below the goal at any budget; with a limit far above the
// budget, or none, the room is what the rest leaves of the budget.
func TestRoomLeavesTheRuntimesHeadroom(t *testing.T) {
	const mib = 1 << 20
	for _, budget := range []int64{64 * mib, 256 * mib, 1 << 30, 8 << 30} {
		const margin, rest = 32 * mib, 40 * mib
		limit := budget + margin
		room := RoomFor(budget, margin, limit, rest)
		if want := budget - limit/100*runtimeHeadroomPercent - rest; room != want {
			t.Errorf("budget %d MiB: room %d, want %d", budget/mib, room, want)
		}
		// The heap at the runtime's goal (less what is outside it,
		// here nothing) is the margin above the pool and the rest.
		goal := limit - limit/100*runtimeHeadroomPercent
		if grow := goal - room - rest; grow != margin {
			t.Errorf("budget %d MiB: the heap grows by %d MiB between collections, want the margin", budget/mib, grow/mib)
		}
		if got := RoomFor(budget, margin, math.MaxInt64, rest); got != budget-rest {
			t.Errorf("budget %d MiB, no limit: room %d, want %d", budget/mib, got, budget-rest)
		}
		if got := RoomFor(budget, margin, 4*budget, rest); got != budget-rest {
			t.Errorf("budget %d MiB, a limit of 4 budgets: room %d, want %d", budget/mib, got, budget-rest)
		}
	}
}

// TestGovernorUnderAMemoryLimit: with the runtime's memory limit set to
// the budget plus the margin, as the mount sets it, the governor gives
// the pool RoomFor's room, and follows changes of a quarter of the
// margin (at 1 GiB a 1/hysteresis of the budget is the whole margin).
func TestGovernorUnderAMemoryLimit(t *testing.T) {
	const mib = 1 << 20
	const budget, margin = 1 << 30, 32 * mib
	old := debug.SetMemoryLimit(budget + margin)
	defer debug.SetMemoryLimit(old)
	p := &fakePool{}
	runtime.GC()
	g := Start(budget, margin, p, nil)
	defer g.Stop()
	base := collect(t, g)
	_, rest := g.Room()
	step := int64(margin / 4)
	if want := RoomFor(budget, margin, budget+margin, rest); base > want+step || base < want-step {
		t.Fatalf("room %d MiB with the rest at %d MiB, want about %d", base/mib, rest/mib, want/mib)
	}
	if base > budget-(budget+margin)/100*runtimeHeadroomPercent {
		t.Fatalf("room %d MiB leaves the runtime no headroom below its goal", base/mib)
	}
	more := make([][]byte, 16)
	for i := range more {
		more[i] = make([]byte, mib)
	}
	if room := collect(t, g); base-room < 16*mib-step || base-room > 16*mib+step {
		t.Fatalf("16 MiB more kept moved the room from %d to %d MiB", base/mib, room/mib)
	}
	runtime.KeepAlive(more)
}
