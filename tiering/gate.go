package tiering

import "sync"

// Gate orders reads of a file against its eviction: readers of local
// bytes hold it shared; the evictor holds it exclusively while it marks
// the file remote and frees its bytes, so no read sees a punched hole.
type Gate struct {
	mu    sync.Mutex
	locks map[uint64]*gateLock // GUARDED_BY(mu)
}

type gateLock struct {
	rw   sync.RWMutex
	refs int
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
