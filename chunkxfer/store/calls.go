package store

import (
	"sync/atomic"
	"time"
)

// callPool runs calls on goroutines that live on between calls.
//
// An SDK request goes down some two hundred frames of middleware. Run
// on a goroutine of its own (every upload runs on one), the goroutine's
// stack starts small and is grown, copied whole each time, several
// times per request: a profile of shipping 2,000 small segments to S3
// put a tenth of tierfs's CPU in that copying (runtime.copystack). A
// goroutine of the pool keeps the stack it grew, so only its first
// calls pay. The caller waits for its call: nothing changes for it but
// the goroutine the call runs on.
type callPool struct {
	jobs chan func() // unbuffered: a send succeeds only where a worker waits
	n    atomic.Int32
	max  int32
	idle time.Duration
}

// Workers of the pool: as many as requests commonly go at once (a call
// beyond them runs on its caller's goroutine), each gone after idling
// this long.
const (
	poolWorkers = 64
	poolIdle    = 30 * time.Second
)

func newCallPool(max int, idle time.Duration) *callPool {
	return &callPool{jobs: make(chan func()), max: int32(max), idle: idle}
}

// run calls f on a worker of the pool, or on the caller's goroutine when
// all are busy, and returns when f has returned.
func (p *callPool) run(f func()) {
	done := make(chan struct{})
	job := func() { f(); close(done) }
	select {
	case p.jobs <- job:
	default:
		if p.n.Add(1) > p.max {
			p.n.Add(-1)
			f()
			return
		}
		go p.work(job)
	}
	<-done
}

// work runs job, then those sent to it, until it idles for p.idle. It
// waits for work deeper in its stack than the GC would shrink it from
// (a goroutine that uses less than a quarter of its stack has it
// halved at each collection, and would grow it again at its next call):
// see keepStack.
func (p *callPool) work(job func()) {
	defer p.n.Add(-1)
	keepStack(func() {
		t := time.NewTimer(p.idle)
		defer t.Stop()
		for {
			job()
			t.Reset(p.idle)
			select {
			case job = <-p.jobs:
			case <-t.C:
				return
			}
		}
	})
}

// keptStack is the stack a worker waits below: with the frames of an SDK
// call its stack grows to 64 KiB or so, of which the GC leaves a goroutine
// that uses more than a quarter.
const keptStack = 24 << 10

// keepStack runs f below a frame of keptStack bytes.
//
//go:noinline
func keepStack(f func()) {
	var frame [keptStack]byte
	frame[0] = 1
	f()
	if frame[0] != 1 { // never: keeps the frame alive across the call
		panic("store: stack frame overwritten")
	}
}
