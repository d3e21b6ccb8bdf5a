package tiering

import (
	"sync"
)

// handles are the files the file system has open through Open, by
// inode. The tierer tells them when it changes a file's state (its
// record, a shipment or a move starting or ending): each keeps what it
// read of its state until then, so a read costs no getxattr. Its cost
// grows with the handles of the inode changed, not with all handles.
type handles struct {
	mu    sync.Mutex
	byIno map[uint64]map[*openFile]struct{} // GUARDED_BY(mu)
}

func newHandles() *handles { return &handles{byIno: map[uint64]map[*openFile]struct{}{}} }

func (h *handles) add(f *openFile) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.byIno[f.ino]
	if set == nil {
		set = map[*openFile]struct{}{}
		h.byIno[f.ino] = set
	}
	set[f] = struct{}{}
}

func (h *handles) remove(f *openFile) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.byIno[f.ino]
	delete(set, f)
	if len(set) == 0 {
		delete(h.byIno, f.ino)
	}
}

// changed tells the handles of inode ino that its state changed: call
// it after the change is written (a handle that read the state before
// reads it again; one that reads it after sees the change).
func (h *handles) changed(ino uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for f := range h.byIno[ino] {
		f.epoch.Add(1)
	}
}

// open counts the handles open (for tests and status).
func (h *handles) open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, set := range h.byIno {
		n += len(set)
	}
	return n
}

// changed is told of every change the tierer makes to the state of inode
// ino (its record, a shipment or a move starting or ending), after it is
// written: its open files read their state again, and so does the next
// pass.
func (t *Tierer) changed(ino uint64) {
	t.handles.changed(ino)
	t.records.forget(ino)
	// Its partition is scanned again at the next pass: what the scan
	// kept of it (the file's allocated bytes) no longer holds.
	t.scans.touch(ino)
}
