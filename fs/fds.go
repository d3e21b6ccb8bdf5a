package fs

import (
	"sync"
	"sync/atomic"
	"weak"

	"golang.org/x/sys/unix"
)

// fdReserve is how many descriptors the pool leaves to tierfs itself
// (the FUSE device, the store's connections, the tierer's and change
// management's own files, directory handles).
const fdReserve = 256

// fdPool owns the descriptors a mount holds for the backing tree: one
// O_PATH descriptor per node that has one (see node), and one per open
// file handle. Files come first: a broker keeps every segment open, so
// a mount must be able to hold as many open files as the broker could on
// the plain directory, within the same limit. Node descriptors only
// save open_by_handle_at calls, so they take what files leave: a node
// gets one only while there is room, and when files need the room,
// descriptors of idle nodes are closed (reclaimed) and those nodes go on
// through their file handles.
type fdPool struct {
	limit  int64 // the process's open-file limit
	budget int64 // node descriptors at most (half the limit, or MaxNodeFds)

	held      atomic.Int64 // node descriptors held
	files     atomic.Int64 // descriptors of open file handles
	reclaimed atomic.Int64 // node descriptors closed to make room for files

	mu    sync.Mutex
	nodes map[int]weak.Pointer[node] // nodes holding a descriptor, by it; GUARDED_BY(mu)
}

func newFdPool(limit, budget int64) *fdPool {
	return &fdPool{limit: limit, budget: budget, nodes: map[int]weak.Pointer[node]{}}
}

// room says whether a new node may keep a descriptor.
func (p *fdPool) room() bool {
	h := p.held.Load()
	return h < p.budget && h+p.files.Load()+fdReserve < p.limit
}

// add records that n holds fd.
func (p *fdPool) add(fd int, n *node) {
	p.held.Add(1)
	p.mu.Lock()
	p.nodes[fd] = weak.Make(n)
	p.mu.Unlock()
}

// remove forgets fd before it is closed (so the number, once reused, is
// not taken for this node's).
func (p *fdPool) remove(fd int) {
	p.mu.Lock()
	delete(p.nodes, fd)
	p.mu.Unlock()
	p.held.Add(-1)
}

// fileOpened counts a file handle's descriptor, reclaiming node
// descriptors first when files would run short of room.
func (p *fdPool) fileOpened() {
	if over := p.files.Add(1) + p.held.Load() + fdReserve - p.limit; over >= 0 {
		p.reclaim(int(over) + 64)
	}
}

func (p *fdPool) fileClosed() { p.files.Add(-1) }

// reclaim closes up to k descriptors of nodes that no operation is
// using and that can go on through a file handle; it returns how many it
// closed.
func (p *fdPool) reclaim(k int) int {
	var cand []*node
	p.mu.Lock()
	for _, w := range p.nodes {
		if n := w.Value(); n != nil {
			cand = append(cand, n)
			if len(cand) == 2*k {
				break
			}
		}
	}
	p.mu.Unlock()
	done := 0
	for _, n := range cand {
		if done == k {
			break
		}
		if n.dropFd(true) {
			done++
		}
	}
	p.reclaimed.Add(int64(done))
	return done
}

// closeFd is the cleanup of a node that was never forgotten (go-fuse
// kept an equal node instead), run once it is garbage collected.
func (p *fdPool) closeFd(fd int) {
	p.remove(fd)
	unix.Close(fd)
}
