package fs

import (
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
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
	// backingFd is a descriptor of the backing directory, opened before
	// the mount. Every node is reached from it (see node), so a mount
	// placed over the backing directory itself (an in-place mount) never
	// sends requests back into the mount.
	backingFd   int
	backingPath string
	dev         uint64
	log         *slog.Logger

	// handles says whether the backing filesystem supports file handles
	// (name_to_handle_at); they give inodes a reliable generation (see
	// stableAttr).
	// kernel asked for, even while a rename replaces the name.
	handles bool

	// passthrough says whether local files are offered to the kernel for
	// FUSE passthrough. It is set only after the mount's probe showed that
	// the kernel accepts backing files; opens before that are served by
	// FUSE reads and writes.
	passthrough atomic.Bool

	// asRoot is true when tierfs runs as uid 0; new files are then given
	// to the caller's uid and gid.
	asRoot bool

	// fds owns the descriptors held for nodes and open files.
	fds *fdPool

	passthroughLost atomic.Bool
	// expectedCached counts opens of local files that were served cached
	// on purpose (see ioModes), so the passthrough watch does not take
	// them for a lost passthrough.
	expectedCached atomic.Int64
	rootNode       *node

	// tiering, when set, serves the files it says are tiered (see
	// Tiering); nil means a plain loopback.
	tiering Tiering

	// ops, when set, observes requests (see Config.Ops); nil: none.
	ops OpObserver

	// changes, when set, retains what changes lose (see Changes).
	changes Changes
}

// rootConfig is what newRoot needs.
type rootConfig struct {
	backingDir string
	maxNodeFds int
	log        *slog.Logger
	tiering    Tiering
	ops        OpObserver
	changes    Changes
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
		asRoot:      os.Geteuid() == 0,
		tiering:     cfg.tiering,
		ops:         cfg.ops,
		changes:     cfg.changes,
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	_, err = nameToHandle(fd, "")
	r.handles = err == nil
	if !r.handles {
		r.log.Warn("backing filesystem does not support file handles; inode generations fall back to birth times, which can repeat when inode numbers are reused quickly",
			"backing", cfg.backingDir, "err", err)
	}
	// The root node's descriptor is the backing descriptor; it is closed
	// by close, not by OnForget.
	r.rootNode = &node{root: r, fd: fd}
	r.rootNode.unpinFn = r.rootNode.unpin
	r.fds = newFdPool(nodeFdBudget(r.log, cfg.maxNodeFds))
	return r, nil
}

// close releases the backing directory descriptor. Call it after unmount.
func (r *Root) close() error {
	return unix.Close(r.backingFd)
}

// stateDirPath creates (if needed) the hidden state directory and returns
// its path as reachable by tierfs itself (through the backing descriptor, so
// it works for in-place mounts too).
func (r *Root) stateDirPath() (string, error) {
	err := unix.Mkdirat(r.backingFd, StateDirName, 0o700)
	if err != nil && err != unix.EEXIST {
		return "", fmt.Errorf("create state directory %s/%s: %w", r.backingPath, StateDirName, err)
	}
	return procFd(r.backingFd) + "/" + StateDirName, nil
}

// stableAttr builds the identity go-fuse uses to recognise an inode: the
// backing inode number (with the device mixed in when it is not the
// backing directory's own) and a generation that tells a reused inode
// number from the file that had it before.
//
// The generation comes from the file handle where there is one: it carries
// the filesystem's own generation number (ext4 and xfs draw a new one for
// every inode they allocate). The birth time is the fallback; it is not
// enough on its own, because it has the kernel's coarse clock granularity
// and ext4 reuses a freed inode number at once: a checkpoint file written
// and renamed over its predecessor within the same tick would look like the
// file it replaced.
func (r *Root) stableAttr(st *unix.Statx_t, h fileHandle) gofs.StableAttr {
	dev := unix.Mkdev(st.Dev_major, st.Dev_minor)
	ino := st.Ino
	if dev != r.dev {
		ino ^= (dev << 32) | (dev >> 32)
	}
	var gen uint64
	if h.ok {
		f := fnv.New64a()
		f.Write(h.h.Bytes())
		gen = f.Sum64()
	} else if st.Mask&unix.STATX_BTIME != 0 {
		gen = uint64(st.Btime.Sec)*1e9 + uint64(st.Btime.Nsec)
	}
	if gen == 0 {
		gen = 1
	}
	return gofs.StableAttr{Mode: uint32(st.Mode) & syscall.S_IFMT, Ino: ino, Gen: gen}
}

// nodeFdBudget raises the open-file limit as far as allowed and returns
// it, with half of it for node descriptors (the other half is for files
// the clients hold open, each one backing descriptor here, and for
// tierfs itself; files take node descriptors' room when they need it).
// A positive max caps the node half further.
func nodeFdBudget(log *slog.Logger, max int) (limit, budget int64) {
	limit = int64(raiseFileLimit(log))
	budget = limit / 2
	if max > 0 && int64(max) < budget {
		budget = int64(max)
	}
	return limit, budget
}
