package fs

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/testenv"
)

// TestOpenFilesTakeRoomFromNodes: with an open-file limit of 1024, a
// client that has looked up 1500 files (so nodes hold all the
// descriptors they may) can still hold 700 of them open at once through
// the mount, as it could on the plain directory: idle nodes give their
// descriptors back. Every open file reads its own bytes, and the files
// still read after they are closed and opened again.
func TestOpenFilesTakeRoomFromNodes(t *testing.T) {
	requireMount(t)
	for _, passthrough := range []bool{false, true} {
		t.Run(fmt.Sprintf("passthrough=%v", passthrough), func(t *testing.T) {
			backing := filepath.Join(t.TempDir(), "backing")
			if err := os.Mkdir(backing, 0o755); err != nil {
				t.Fatal(err)
			}
			const files, open = 1500, 700
			for i := range files {
				if err := os.WriteFile(filepath.Join(backing, fmt.Sprintf("f%04d", i)), []byte(fmt.Sprintf("file %d", i)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv(serveFileLimitEnv, "1024")
			srv := mountTest(t, backing, passthrough)
			for i := range files {
				if _, err := os.Stat(filepath.Join(srv.Mountpoint, fmt.Sprintf("f%04d", i))); err != nil {
					t.Fatal(err)
				}
			}
			var held []*os.File
			defer func() {
				for _, f := range held {
					f.Close()
				}
			}()
			buf := make([]byte, 64)
			for i := range open {
				f, err := os.OpenFile(filepath.Join(srv.Mountpoint, fmt.Sprintf("f%04d", i)), os.O_RDWR, 0)
				if err != nil {
					t.Fatalf("open %d of %d files at once (limit 1024): %v\n%s", i+1, open, err, srv.Log())
				}
				held = append(held, f)
			}
			for i, f := range held {
				n, err := f.ReadAt(buf, 0)
				if string(buf[:n]) != fmt.Sprintf("file %d", i) {
					t.Fatalf("file %d reads %q (%v)", i, buf[:n], err)
				}
			}
			for _, f := range held {
				f.Close()
			}
			held = nil
			// Nodes whose descriptor was reclaimed go on through their
			// handles.
			for i := range files {
				b, err := os.ReadFile(filepath.Join(srv.Mountpoint, fmt.Sprintf("f%04d", i)))
				if err != nil || string(b) != fmt.Sprintf("file %d", i) {
					t.Fatalf("file %d after: %q %v", i, b, err)
				}
			}
		})
	}
}

// TestFdPoolReclaimsIdleNodes: the pool gives a node a descriptor only
// while files leave room; when files need it, it closes descriptors of
// nodes no operation is using (and never of a pinned node, nor of one
// without a file handle), and a forgotten node's descriptor is closed
// when its last operation ends.
func TestFdPoolReclaimsIdleNodes(t *testing.T) {
	dir := t.TempDir()
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	h, err := nameToHandle(dfd, "")
	if err != nil {
		testenv.Missing(t, "no file handles here: %v", err)
	}
	r := &Root{backingFd: dfd, fds: newFdPool(fdReserve+10, 8)}
	mk := func(withHandle bool) *node {
		fd, err := unix.Open(dir, unix.O_PATH, 0)
		if err != nil {
			t.Fatal(err)
		}
		hh := h
		if !withHandle {
			hh = fileHandle{}
		}
		return newNode(r, fd, hh)
	}
	var nodes []*node
	for range 8 {
		nodes = append(nodes, mk(true))
	}
	if n := mk(true); n.fd != -1 {
		t.Fatal("a node past the budget kept its descriptor")
	}
	noHandle := nodes[7]
	noHandle.handle = fileHandle{}
	pinned := nodes[0]
	fd, unpin, err := pinned.pin()
	if err != nil || fd < 0 {
		t.Fatal(err)
	}
	// Three files open: held (8) + files (3) + reserve > limit.
	for range 3 {
		r.fds.fileOpened()
	}
	if got := r.fds.held.Load(); got != 2 {
		t.Fatalf("%d node descriptors held after files needed room; want 2 (the pinned one, the one without a handle)", got)
	}
	if pinned.fd < 0 {
		t.Fatal("a pinned node's descriptor was reclaimed")
	}
	if noHandle.fd < 0 {
		t.Fatal("the descriptor of a node without a file handle was reclaimed")
	}
	// A forget while pinned closes at the unpin.
	pinned.OnForget()
	if pinned.fd < 0 {
		t.Fatal("closed under an operation using it")
	}
	unpin()
	if pinned.fd >= 0 {
		t.Fatal("not closed after its last operation")
	}
	for range 3 {
		r.fds.fileClosed()
	}
	if !r.fds.room() || mk(true).fd < 0 {
		t.Fatal("no room for a node once the files were closed")
	}
	runtime.KeepAlive(nodes)
}
