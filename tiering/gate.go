package tiering

import "sync"

// Gate orders reads of a file against its eviction: readers of local
// bytes hold it shared; the evictor holds it exclusively while it marks
// the file remote and frees its bytes, so no read sees a punched hole.
//
// It also counts holds: handles that read the backing file directly
// (kernel passthrough, not through the gate) for as long as they are
// open. The evictor frees nothing while an inode is held, since such a
// reader would see the punched hole.
type Gate struct {
	mu    sync.Mutex
	locks map[uint64]*gateLock // GUARDED_BY(mu)
}

type gateLock struct {
	rw    sync.RWMutex
	refs  int // GUARDED_BY(Gate.mu)
	holds int // GUARDED_BY(Gate.mu)
}

// NewGate returns an empty gate.
func NewGate() *Gate { return &Gate{locks: map[uint64]*gateLock{}} }

func (g *Gate) get(ino uint64) *gateLock {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.locks[ino]
	if l == nil {
		l = &gateLock{}
		g.locks[ino] = l
	}
	l.refs++
	return l
}

func (g *Gate) put(ino uint64, l *gateLock) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(g.locks, ino)
	}
}

// RLock holds inode ino shared until the returned func is called.
func (g *Gate) RLock(ino uint64) func() {
	l := g.get(ino)
	l.rw.RLock()
	return func() { l.rw.RUnlock(); g.put(ino, l) }
}

// Lock holds inode ino exclusively until the returned func is called.
func (g *Gate) Lock(ino uint64) func() {
	l := g.get(ino)
	l.rw.Lock()
	return func() { l.rw.Unlock(); g.put(ino, l) }
}

// Hold keeps inode ino from being evicted until the returned func is
// called. It waits for an eviction under way to finish, so a caller that
// reads the file's state after Hold sees either the eviction or a state
// no eviction can change while the hold lasts.
func (g *Gate) Hold(ino uint64) func() {
	l := g.get(ino)
	l.rw.RLock()
	g.mu.Lock()
	l.holds++
	g.mu.Unlock()
	l.rw.RUnlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			l.holds--
			g.mu.Unlock()
			g.put(ino, l)
		})
	}
}

// Held says whether inode ino is held. Under Lock(ino) the answer cannot
// change until the lock is released: Hold waits for it.
func (g *Gate) Held(ino uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.locks[ino]
	return l != nil && l.holds > 0
}
