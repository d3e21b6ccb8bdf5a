package fs

import (
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// StateDirName is the directory inside the backing directory where tierfs
// keeps its own state. The mount never shows it.
const StateDirName = ".tierfs"

// Root is the shared state of one mounted tree: the descriptor of the
// backing directory and the settings every node reads. Its fields are set
// once by newRoot and never change, except the counters, which are atomic.
type Root struct {
	// backingFd is a descriptor of the backing directory, opened
	// before the mount. Every lower path is resolved relative to it, so a
	// mount placed over the backing directory itself (an in-place mount)
	// never sends requests back into the mount. It is not O_PATH because
	// open_by_handle_at needs a real descriptor of the filesystem.
	backingFd   int
	backingPath string
	dev         uint64
	log         *slog.Logger

	// handles says whether the backing filesystem supports file handles
	// (name_to_handle_at). With them, an open reaches exactly the inode the
	// kernel asked for, even while a rename replaces the name.
	handles bool

	// passthrough says whether local files are offered to the kernel for
	// FUSE passthrough.
	passthrough bool

	// asRoot is true when tierfs runs as uid 0; new files are then given
	// to the caller's uid and gid.
	asRoot bool

	passthroughLost atomic.Bool
	rootNode        *node
	onceWarnOrphan  sync.Once
}

// rootConfig is what newRoot needs.
type rootConfig struct {
	backingDir  string
	passthrough bool
	log         *slog.Logger
}

func newRoot(cfg rootConfig) (*Root, error) {
	fd, err := unix.Open(cfg.backingDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open backing directory %s: %w", cfg.backingDir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat backing directory %s: %w", cfg.backingDir, err)
	}
	r := &Root{
		backingFd:   fd,
		backingPath: cfg.backingDir,
		dev:         uint64(st.Dev),
		log:         cfg.log,
		passthrough: cfg.passthrough,
		asRoot:      os.Geteuid() == 0,
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	h, err := nameToHandle(fd, "")
	r.handles = err == nil && os.Geteuid() == 0
	if !r.handles {
		r.log.Warn("backing filesystem does not support file handles; opens go by path, and an open racing a rename-over may be retried by the kernel",
			"backing", cfg.backingDir, "err", err)
	}
	r.rootNode = &node{root: r, handle: h}
	return r, nil
}

// close releases the backing directory descriptor. Call it after unmount.
func (r *Root) close() error {
	return unix.Close(r.backingFd)
}

// StateDir opens (creating if needed) the hidden state directory and returns
// its path as reachable by tierfs itself (through the backing descriptor, so
// it works for in-place mounts too).
func (r *Root) stateDirPath() (string, error) {
	err := unix.Mkdirat(r.backingFd, StateDirName, 0o700)
	if err != nil && err != unix.EEXIST {
		return "", fmt.Errorf("create state directory %s/%s: %w", r.backingPath, StateDirName, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", r.backingFd, StateDirName), nil
}

// stableAttr builds the identity go-fuse uses to recognise an inode: the
// backing inode number (with the device mixed in when it is not the
// backing directory's own) and a generation from the birth time, so that a
// reused inode number is not mistaken for the old file.
func (r *Root) stableAttr(st *unix.Statx_t) gofs.StableAttr {
	dev := unix.Mkdev(st.Dev_major, st.Dev_minor)
	ino := st.Ino
	if dev != r.dev {
		ino ^= (dev << 32) | (dev >> 32)
	}
	gen := uint64(1)
	if st.Mask&unix.STATX_BTIME != 0 && (st.Btime.Sec != 0 || st.Btime.Nsec != 0) {
		gen = uint64(st.Btime.Sec)*1e9 + uint64(st.Btime.Nsec)
	}
	return gofs.StableAttr{Mode: uint32(st.Mode) & syscall.S_IFMT, Ino: ino, Gen: gen}
}
