package tiering

import (
	"sync"
	"sync/atomic"
)

// moves are the moves under way, by inode (see Move), and what starts
// them: a change to an evicted file, or a catch-up log a crash left. A read of a tiered
// file asks of its own inode only after the tierer told it of a change,
// and count answers without the lock when nothing moves.
type moves struct {
	t     *Tierer
	start sync.Mutex // one move starts at a time
	mu    sync.Mutex
	byIno map[uint64]*Move // GUARDED_BY(mu)
	n     atomic.Int64
}

func newMoves(t *Tierer) *moves { return &moves{t: t, byIno: map[uint64]*Move{}} }

// of is the move of inode ino under way, or nil.
func (ms *moves) of(ino uint64) *Move {
	if ms.n.Load() == 0 {
		return nil
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.byIno[ino]
}

func (ms *moves) add(ino uint64, m *Move) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.byIno[ino] = m
	ms.n.Add(1)
}

func (ms *moves) remove(ino uint64) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if _, ok := ms.byIno[ino]; ok {
		delete(ms.byIno, ino)
		ms.n.Add(-1)
	}
}

// count is the number of moves under way.
func (ms *moves) count() int { return int(ms.n.Load()) }
