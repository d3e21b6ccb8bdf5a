// Package memgov keeps a process's memory to one budget shared by a pool
// of buffers and everything else: after every garbage collection it
// measures what the rest of the process keeps (live heap beside the
// pool, goroutine stacks, the runtime's own metadata) and gives the pool
// the remainder of the budget as its room.
//
// The runtime's memory limit is the budget plus a margin (the caller
// sets it). Without a governor the pool could fill the whole budget, and
// with the rest of the process above the margin the live heap reached
// the limit: the collector then ran back to back (a consumer catching
// up on 1,000 partitions spent three quarters of the mount's CPU in it,
// BENCHMARKS.md). With one, what is live stays within the budget
// and the margin is what the heap grows by between collections.
//
// The runtime keeps its heap goal below the memory limit by a share of
// the limit of its own (runtimeHeadroomPercent), which a fixed margin
// does not hold at every budget: at 1 GiB it is the whole of 32 MiB,
// and the collector ran back to back again (the catch-up on 1,000
// partitions ran at half the speed of a 256 MiB budget, BENCHMARKS.md).
// So the pool also leaves that share: what is live stays below the
// runtime's goal by the margin, whatever the budget.
//
// Like internal/gctune it runs after each collection (internal/aftergc),
// so an idle process pays nothing for it.
package memgov

import (
	"log/slog"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"

	"github.com/tierfs/tierfs/internal/aftergc"
)

// hysteresis: the room changes only by a 1/hysteresis of the budget or
// more (8 MiB of 256 MiB), and at most by a quarter of the margin (at
// 1 GiB a 1/hysteresis would be all of a 32 MiB margin).
const hysteresis = 32

// runtimeHeadroomPercent is the share of the memory limit (less the
// memory outside the heap) the Go runtime keeps its heap goal below the
// limit by: memoryLimitHeapGoalHeadroomPercent in runtime/mgcpacer.go.
const runtimeHeadroomPercent = 3

// Pool is the memory a Governor makes room for.
type Pool interface {
	// Used is the bytes the pool holds now (live in the heap).
	Used() int64
	// SetRoom sets how many bytes the pool may hold until the next
	// call, and returns the room it took: more than n when it keeps a
	// least room of its own.
	SetRoom(n int64) int64
}

// Governor sets a Pool's room after each collection.
type Governor struct {
	budget int64
	margin int64 // what the heap grows by between collections
	pool   Pool
	log    *slog.Logger

	mu      sync.Mutex
	stopped bool  // GUARDED_BY(mu)
	room    int64 // the room set last; GUARDED_BY(mu)
	rest    int64 // what the rest of the process kept at the last collection; GUARDED_BY(mu)
	over    bool  // the pool took more room than the rest left it; GUARDED_BY(mu)
	passes  int   // measures made; GUARDED_BY(mu)
}

// Memory is what the runtime reports after a collection, in bytes (the
// names are runtime/metrics').
type Memory struct {
	Live     uint64 // /gc/heap/live:bytes: heap objects the collection marked
	Total    uint64 // /memory/classes/total:bytes: all the runtime maps
	Released uint64 // /memory/classes/heap/released:bytes: returned to the OS
	Free     uint64 // /memory/classes/heap/free:bytes: free heap, not returned
	Objects  uint64 // /memory/classes/heap/objects:bytes: heap objects, live or not yet swept
	Unused   uint64 // /memory/classes/heap/unused:bytes: heap spans' room for objects
}

// ReadMemory reads Memory from the runtime.
func ReadMemory() Memory {
	samples := []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
	}
	metrics.Read(samples)
	v := make([]uint64, len(samples))
	for i, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	return Memory{Live: v[0], Total: v[1], Released: v[2], Free: v[3], Objects: v[4], Unused: v[5]}
}

// Rest is what a process keeps beside a pool holding poolUsed bytes: the
// live heap and the memory outside the heap the runtime counts against
// its limit (goroutine stacks, metadata, profiling buckets), less the
// pool. Free heap, room in spans and garbage not yet swept are not kept:
// they are what the heap grows into between collections.
func Rest(m Memory, poolUsed int64) int64 {
	outside := int64(m.Total) - int64(m.Released) - int64(m.Free) - int64(m.Objects) - int64(m.Unused)
	return max(0, int64(m.Live)+max(0, outside)-poolUsed)
}

// Start governs pool's room within budget bytes until Stop, measuring
// once now and then after every collection. margin is what the heap
// should have to grow into between collections, above what is live: the
// caller sets the runtime's memory limit to the budget plus it.
func Start(budget, margin int64, pool Pool, log *slog.Logger) *Governor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Governor{budget: budget, margin: margin, pool: pool, log: log, room: budget}
	g.measure()
	aftergc.Run(g.measure)
	return g
}

// Stop ends the governing and gives the pool the whole budget back.
func (g *Governor) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.stopped {
		g.stopped = true
		g.pool.SetRoom(g.budget)
	}
}

// Room is the room set last, and what the rest of the process kept then.
func (g *Governor) Room() (room, rest int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.room, g.rest
}

// RoomFor is what a pool may hold beside rest, within budget and below the
// heap goal the runtime keeps at memory limit limit (math.MaxInt64: none)
// by margin: the heap then has margin to grow into between collections.
func RoomFor(budget, margin, limit, rest int64) int64 {
	room := budget - rest
	if limit < math.MaxInt64 {
		room = min(room, limit-limit/100*runtimeHeadroomPercent-margin-rest)
	}
	return room
}

// measure sets the pool's room from the memory now; false once stopped.
func (g *Governor) measure() bool {
	m := ReadMemory()
	rest := Rest(m, g.pool.Used())
	room := RoomFor(g.budget, g.margin, debug.SetMemoryLimit(-1), rest)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.passes++
	step := min(g.budget/hysteresis, max(1, g.margin/4))
	if d := room - g.room; d < step && -d < step {
		// A small change is left for a larger one: a pool that lets
		// buffers go at one collection and allocates them again at the
		// next makes garbage for the collector.
		g.rest = rest
		return true
	}
	took := g.pool.SetRoom(room)
	g.log.Debug("chunk memory room set", "room", took, "rest_of_process", rest, "budget", g.budget)
	switch over := took > room; {
	case over && !g.over:
		g.log.Warn("the rest of the process keeps more of the memory budget than the pool can spare: memory is over the budget and the garbage collector runs often; raise the budget",
			"budget", g.budget, "rest_of_process", rest, "pool_room", took)
		g.over = true
	case !over && g.over:
		g.log.Info("the memory budget holds the pool and the rest of the process again", "budget", g.budget, "rest_of_process", rest, "pool_room", took)
		g.over = false
	}
	g.room, g.rest = took, rest
	return true
}
