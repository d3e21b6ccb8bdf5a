package fs

import (
	"github.com/hanwen/go-fuse/v2/fuse"
)

// passthroughWatch wraps go-fuse's request bridge to notice when kernel
// passthrough silently stops. go-fuse turns it off for the whole mount after
// one backing file registration fails and says nothing; the only trace is
// that opens of local files stop coming back with FOPEN_PASSTHROUGH.
//
// Local files are opened with no open flags of their own, and go-fuse clears
// FOPEN_KEEP_CACHE whenever it sets FOPEN_PASSTHROUGH. So an open reply with
// neither flag, while passthrough is on, is a local file that did not get
// passthrough. (Handles that keep the page cache, such as remote-backed
// files, set FOPEN_KEEP_CACHE and are not counted.)
type passthroughWatch struct {
	fuse.RawFileSystem
	root *Root
}

func (w *passthroughWatch) check(out *fuse.OpenOut) {
	if w.root.passthrough.Load() && out.OpenFlags&(fuse.FOPEN_PASSTHROUGH|fuse.FOPEN_KEEP_CACHE) == 0 {
		if w.root.expectedCached.Add(-1) >= 0 {
			return // cached on purpose
		}
		w.root.expectedCached.Add(1)
		w.root.notePassthroughLost()
	}
}

func (w *passthroughWatch) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := w.RawFileSystem.Open(cancel, in, out)
	if st.Ok() {
		w.check(out)
	}
	return st
}

func (w *passthroughWatch) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	st := w.RawFileSystem.Create(cancel, in, name, out)
	if st.Ok() {
		w.check(&out.OpenOut)
	}
	return st
}

// notePassthroughLost logs, once, that the kernel no longer gets backing
// files for this mount.
func (r *Root) notePassthroughLost() {
	if !r.passthroughLost.Swap(true) {
		r.log.Warn("kernel passthrough stopped for this mount: a backing file registration failed; local files are now served through FUSE reads and writes (slower, still correct)")
	}
}
