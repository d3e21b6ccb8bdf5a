package fs

import (
	"bufio"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hanwen/go-fuse/v2/splice"
	"golang.org/x/sys/unix"
)

// Config says what to mount where.
type Config struct {
	// Backing is the directory whose files are served. Empty means the
	// mount point itself (an in-place mount).
	Backing    string
	Mountpoint string

	// Passthrough offers local files to the kernel for FUSE passthrough
	// (Linux 6.9 or later, as root). Off, or unsupported, local files are
	// served by FUSE reads (spliced from the backing file) and writes.
	Passthrough bool

	// EntryTimeout and AttrTimeout are how long the kernel may cache names
	// and attributes. tierfs owns the backing directory, so changes made
	// through the mount are always seen at once; the timeouts only bound
	// how stale the view of changes made behind its back can be.
	EntryTimeout time.Duration
	AttrTimeout  time.Duration

	// MaxNodeFds caps the descriptors held for inodes the kernel knows
	// (0: half the open-file limit). Past it, inodes are reached through
	// file handles.
	MaxNodeFds int

	// Debug logs every FUSE request.
	Debug bool

	// ReadOnly mounts read-only: the kernel refuses every change (EROFS).
	ReadOnly bool

	// Ops, when set, is told of every FUSE request (op, duration,
	// status) and of every read served from the store (op
	// "read_remote"); it must be cheap and safe for concurrent use. Nil
	// leaves the request path as it is.
	Ops OpObserver
	// Changes, when set, is change management: the originals of files
	// deleted, replaced, truncated or overwritten are retained first.
	Changes Changes
	// Tiering, when set, serves tiered files (segments that may be
	// shipped and evicted); nil serves a plain directory.
	Tiering Tiering
	// ReadAhead is the kernel's readahead window for the mount in bytes:
	// 0 for tierfs's default (1 MiB), negative to leave the kernel's own
	// (128 KiB). It matters for files served by FUSE reads (tiered
	// segments); passthrough files use the backing disk's readahead.
	ReadAhead int64

	Log *slog.Logger
}

// PassthroughState says how local files are being served.
type PassthroughState struct {
	On     bool
	Reason string // why it is off
}

func (p PassthroughState) String() string {
	if p.On {
		return "kernel passthrough"
	}
	return "FUSE read/write (splice); passthrough off: " + p.Reason
}

// Mounted is a live mount.
type Mounted struct {
	Config      Config
	Passthrough PassthroughState
	// ACLs says whether the kernel checks the backing files' POSIX ACLs
	// (the backing file system has them), not only their modes.
	ACLs bool
	// StateDir is tierfs's own directory inside the backing directory,
	// reachable by this process only.
	StateDir string

	root   *Root
	server *fuse.Server
	lock   *os.File
}

// maxWrite is the largest WRITE the kernel sends without passthrough.
// 1 MiB is the kernel's maximum (256 pages) and measured ~35% faster for
// large writes than the 128 KiB default.
const maxWrite = 1 << 20

// maxIO is the largest READ and WRITE the kernel sends (go-fuse sets
// max_read to MaxWrite): maxWrite, less what a read reply must leave of
// the largest pipe (fs.pipe-max-size, 1 MiB by default) for its header
// and the page go-fuse keeps free, so that every read of a local file
// is spliced (a 1 MiB read and its header never fit a 1 MiB pipe, and
// go-fuse copied each one instead).
func maxIO() int {
	page := os.Getpagesize()
	fit := (splice.MaxPipeSize() - 2*page) / page * page
	return max(min(maxWrite, fit), 32*page)
}

// maxBackground is how many background requests (readahead) the
// kernel may have in flight to the mount at once.
const maxBackground = 1024

// maxReadAhead is what the init reply allows the kernel's readahead to be
// (the largest --read-ahead that takes effect).
const maxReadAhead = 64 << 20

// hasACLs says whether the file system of dir has POSIX ACLs: it
// answers for an access ACL of dir (with one, or with none) instead of
// refusing the name.
func hasACLs(dir string) bool {
	_, err := unix.Getxattr(dir, "system.posix_acl_access", nil)
	return err == nil || errors.Is(err, unix.ENODATA)
}

// ErrAlreadyMounted is returned when the mount point is already a tierfs
// mount or the backing directory is already served.
var ErrAlreadyMounted = errors.New("already mounted")

// Mount mounts cfg.Backing at cfg.Mountpoint and serves it until Unmount.
func Mount(cfg Config) (*Mounted, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	mp, err := filepath.Abs(cfg.Mountpoint)
	if err != nil {
		return nil, err
	}
	cfg.Mountpoint = mp
	if cfg.Backing == "" {
		cfg.Backing = mp
	}
	if cfg.Backing, err = filepath.Abs(cfg.Backing); err != nil {
		return nil, err
	}
	if err := detachDeadMounts(cfg.Mountpoint, cfg.Log); err != nil {
		return nil, err
	}
	if err := checkCanMount(cfg.Mountpoint); err != nil {
		return nil, err
	}
	root, err := newRoot(rootConfig{backingDir: cfg.Backing, maxNodeFds: cfg.MaxNodeFds, log: cfg.Log, tiering: cfg.Tiering, ops: cfg.Ops, changes: cfg.Changes})
	if err != nil {
		return nil, err
	}
	m := &Mounted{Config: cfg, root: root}
	if err := m.start(); err != nil {
		m.cleanup()
		return nil, err
	}
	return m, nil
}

func (m *Mounted) start() error {
	cfg := m.Config
	var err error
	if m.StateDir, err = m.root.stateDirPath(); err != nil {
		return err
	}
	if m.lock, err = lockStateDir(m.StateDir, cfg.Backing); err != nil {
		return err
	}
	// New files get exactly the mode the caller asked for: the kernel has
	// already applied the caller's umask, so tierfs's own must not apply
	// a second time.
	unix.Umask(0)

	m.ACLs = hasACLs(cfg.Backing)
	entry, attr := cfg.EntryTimeout, cfg.AttrTimeout
	opts := &gofs.Options{
		// A file or directory with no permission bits (mode 0000) is
		// shown as it is: go-fuse would show 0644 (0755), and the kernel
		// checks access (default_permissions) against what is shown.
		NullPermissions: true,
		EntryTimeout:    &entry,
		AttrTimeout:     &attr,
		NegativeTimeout: &entry,
		MountOptions: fuse.MountOptions{
			FsName:     cfg.Backing,
			Name:       "tierfs",
			AllowOther: m.root.asRoot,
			Options:    []string{"default_permissions"},
			MaxWrite:   maxIO(),
			// Reads of evicted files may wait for chunk memory, each
			// holding one of the kernel's background request slots
			// (readahead is sent as background requests). With the
			// default 12, readers waiting for memory took every slot
			// and the readers holding the memory could not send the
			// reads that would release it: 40 readers ran at 0.2× one
			// reader. With 1024, 40 and 200 readers at once run at about 2×
			// (bench/tierload).
			MaxBackground: maxBackground,
			// The cap on kernel readahead: the window is set after the
			// mount (setReadAhead).
			MaxReadAhead: maxReadAhead,
			DirectMount:  true,
			Debug:        cfg.Debug,
			// The kernel asks for READDIRPLUS (names with attributes,
			// a lookup of every entry) for the start of a listing and
			// after lookups in the directory, plain READDIR for the
			// rest, as libfuse's default: a program that lists a
			// directory for its names (a broker at start-up) does not
			// pay a lookup of every entry.
			ExtraCapabilities: fuse.CAP_READDIRPLUS_AUTO |
				// The kernel keeps that a file has no
				// security.capability (else it asks before every
				// write); the mount clears set-ID bits on a
				// truncate (killpriv.go).
				fuse.CAP_HANDLE_KILLPRIV_V2,
			// The kernel checks POSIX ACLs (the backing files'
			// system.posix_acl_* attributes) as well as the mode, as
			// the backing file system does: without it an ACL entry
			// that refused a user was not enforced through the mount.
			// Where the backing file system has no ACLs there is
			// nothing to check: a check costs requests (the kernel
			// asks for a file's ACL at a permission check by anyone
			// but its owner, and forgets it at every refresh of its
			// attributes; docs/design.md).
			// With them, tierfs applies the creator's umask
			// (FUSE_DONT_MASK, umask.go).
			EnableAcl: m.ACLs,
			// Each open file's kernel passthrough needs the kernel to
			// accept backing files one level below FUSE.
			MaxStackDepth: 1,
		},
	}
	if cfg.ReadOnly {
		opts.MountOptions.Options = append(opts.MountOptions.Options, "ro")
	}
	if m.ACLs {
		opts.MountOptions.ExtraCapabilities |= fuse.CAP_DONT_MASK
	}
	// go-fuse's own messages go to the mount's logger (as warnings: it
	// writes only when something is off); with Debug, its trace of every
	// request goes to stderr as it is.
	opts.Logger = slog.NewLogLogger(cfg.Log.Handler(), slog.LevelWarn)
	opts.MountOptions.Logger = opts.Logger
	if cfg.Debug {
		opts.MountOptions.Logger = log.New(os.Stderr, "go-fuse: ", 0)
	}
	var raw fuse.RawFileSystem = gofs.NewNodeFS(m.root.rootNode, opts)
	if m.ACLs {
		raw = &umaskCarrier{RawFileSystem: raw}
	}
	raw = &passthroughWatch{RawFileSystem: raw, root: m.root}
	if cfg.Ops != nil {
		raw = &observed{RawFileSystem: raw, obs: cfg.Ops}
	}
	m.server, err = fuse.NewServer(raw, cfg.Mountpoint, &opts.MountOptions)
	if err != nil {
		return mountError(cfg.Mountpoint, err)
	}
	go m.server.Serve()
	if err := m.server.WaitMount(); err != nil {
		m.server.Unmount()
		return mountError(cfg.Mountpoint, err)
	}
	m.Passthrough = m.probePassthrough()
	m.root.passthrough.Store(m.Passthrough.On)
	if cfg.ReadAhead >= 0 {
		ra := cfg.ReadAhead
		if ra == 0 {
			ra = defaultReadAhead
		}
		if err := setReadAhead(cfg.Mountpoint, ra); err != nil {
			cfg.Log.Warn("cannot set the mount's readahead; the kernel's default (128 KiB) stays", "err", err)
		}
	}
	return nil
}

// defaultReadAhead is the kernel readahead of a mount unless configured:
// files served by FUSE reads (tiered segments) are read sequentially, and
// each readahead window is one FUSE request at most.
const defaultReadAhead = maxWrite

// setReadAhead sets the kernel's readahead for the mount at mountpoint.
// FUSE's init reply can only lower it (max_readahead is a cap); the
// window itself is the mount's backing device info, read_ahead_kb.
func setReadAhead(mountpoint string, bytes int64) error {
	var st unix.Stat_t
	if err := unix.Stat(mountpoint, &st); err != nil {
		return err
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	return os.WriteFile(p, []byte(fmt.Sprint(bytes>>10)), 0)
}

// probePassthrough registers one backing file with the kernel and
// unregisters it again: the only sure way to know that passthrough works on
// this kernel, for this process and this backing filesystem.
func (m *Mounted) probePassthrough() PassthroughState {
	if !m.Config.Passthrough {
		return PassthroughState{Reason: "disabled by --passthrough=false"}
	}
	if m.server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		return PassthroughState{Reason: "the kernel does not offer FUSE passthrough (needs Linux 6.9 or later)"}
	}
	probe := filepath.Join(m.StateDir, "passthrough-probe")
	f, err := os.OpenFile(probe, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return PassthroughState{Reason: "cannot create probe file: " + err.Error()}
	}
	defer os.Remove(probe)
	defer f.Close()
	id, errno := m.server.RegisterBackingFd(&fuse.BackingMap{Fd: int32(f.Fd())})
	if errno != 0 {
		return PassthroughState{Reason: fmt.Sprintf("the kernel refused a backing file (%v): tierfs must run as root, and the backing directory must not be on FUSE or overlayfs", errno)}
	}
	m.server.UnregisterBackingFd(id)
	return PassthroughState{On: true}
}

// Wait blocks until the file system is unmounted.
func (m *Mounted) Wait() {
	m.server.Wait()
}

// Unmount unmounts and releases everything. It fails with EBUSY while
// files are open, unless lazy is set (then the kernel detaches the mount
// at once and finishes when the last file is closed).
func (m *Mounted) Unmount(lazy bool) error {
	var err error
	if lazy {
		err = unix.Unmount(m.Config.Mountpoint, unix.MNT_DETACH)
		if err == nil {
			m.server.Wait()
		}
	} else {
		err = m.server.Unmount()
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", m.Config.Mountpoint, err)
	}
	m.cleanup()
	return nil
}

// PassthroughLost reports whether passthrough was lost after the mount.
func (m *Mounted) PassthroughLost() bool { return m.root.passthroughLost.Load() }

func (m *Mounted) cleanup() {
	if m.lock != nil {
		m.lock.Close()
		m.lock = nil
	}
	if m.root != nil {
		m.root.close()
		m.root = nil
	}
}

// lockStateDir takes an exclusive lock so that one backing directory is
// served by one tierfs process at a time. The lock dies with the process.
func lockStateDir(stateDir, backing string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(stateDir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock in state directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(f.Name())
		f.Close()
		return nil, fmt.Errorf("%w: %s is already served by tierfs (pid %s)", ErrAlreadyMounted, backing, strings.TrimSpace(string(pid)))
	}
	f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return f, nil
}

// checkCanMount gives clear errors for the usual mistakes before the kernel
// gives an unclear one.
func checkCanMount(mountpoint string) error {
	// A dead mount may still answer a stat from cached attributes; asked
	// with statfs (Dead), it cannot.
	var st os.FileInfo
	var err error = syscall.ENOTCONN
	fstype, mounted := MountedAt(mountpoint)
	if !mounted || !Dead(mountpoint) {
		st, err = os.Stat(mountpoint)
	}
	if errors.Is(err, syscall.ENOTCONN) {
		return fmt.Errorf("mount point %s: %w (a FUSE file system's process ended without unmounting it; detach it with umount -l %s)", mountpoint, err, mountpoint)
	}
	if err != nil {
		return fmt.Errorf("mount point: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("mount point %s is not a directory", mountpoint)
	}
	if mounted && fstype == "fuse.tierfs" {
		return fmt.Errorf("%w: %s is already a tierfs mount (unmount it first: tierfs umount %s)", ErrAlreadyMounted, mountpoint, mountpoint)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("FUSE is not available: /dev/fuse is missing (load the fuse module: modprobe fuse)")
	}
	return nil
}

// maxDeadMounts bounds the dead mounts detachDeadMounts takes away from
// one mount point (each crash without a detach leaves one more).
const maxDeadMounts = 16

// detachDeadMounts detaches the tierfs mounts at mountpoint whose process
// is gone (kill -9, a crash, the OOM killer): the kernel still holds them
// and answers every access with ENOTCONN, so without this a restart by
// systemd (Restart=on-failure) would fail the same way until someone ran
// umount -l. Only a mount whose type is tierfs's and whose connection is
// dead is detached; a live one is refused later (checkCanMount), and
// another file system's dead mount is left to its owner. A detached
// mount is lazy (MNT_DETACH): a process that still holds a file of it
// keeps getting ENOTCONN there, as it did. The backing directory and the
// state below it are untouched; the new mount starts as after any stop.
func detachDeadMounts(mountpoint string, log *slog.Logger) error {
	for range maxDeadMounts {
		if fstype, ok := MountedAt(mountpoint); !ok || fstype != "fuse.tierfs" {
			return nil // not tierfs's: checkCanMount says what to do
		}
		if !Dead(mountpoint) {
			return nil // a live one: checkCanMount refuses it
		}
		if err := unix.Unmount(mountpoint, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach the dead tierfs mount at %s (its process ended without unmounting it): %w", mountpoint, err)
		}
		log.Warn("detached a dead tierfs mount: the process that served it ended without unmounting (a crash or kill -9)", "mountpoint", mountpoint)
	}
	return fmt.Errorf("mount point %s: still not connected after detaching %d dead tierfs mounts", mountpoint, maxDeadMounts)
}

// Dead says whether the file system mounted at mountpoint has lost the
// process that served it: a FUSE mount whose process ended without
// unmounting answers ENOTCONN. It asks with statfs, not stat: the kernel
// answers a stat of a mount's root from its cached attributes for a
// while after the process died, a statfs it must ask the process.
//
// A mount that does not answer within deadWait is not dead (its process
// is alive, busy or hung): the statfs is left to finish on its own.
func Dead(mountpoint string) bool {
	answer := make(chan error, 1)
	go func() {
		var sfs unix.Statfs_t
		answer <- unix.Statfs(mountpoint, &sfs)
	}()
	select {
	case err := <-answer:
		return errors.Is(err, syscall.ENOTCONN)
	case <-time.After(deadWait):
		return false
	}
}

// deadWait is how long Dead waits for a mount's statfs.
const deadWait = 2 * time.Second

func mountError(mountpoint string, err error) error {
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("mount %s: permission denied: tierfs must run as root (or with CAP_SYS_ADMIN): %w", mountpoint, err)
	}
	return fmt.Errorf("mount %s: %w", mountpoint, err)
}

// MountedAt returns the file system type of the topmost mount at path, if
// path is a mount point.
func MountedAt(path string) (string, bool) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false
	}
	defer f.Close()
	var fstype string
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options... - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || unescapeMountinfo(fields[4]) != path {
			continue
		}
		for i := 5; i < len(fields)-1; i++ {
			if fields[i] == "-" {
				fstype, found = fields[i+1], true // later lines are stacked on top
				break
			}
		}
	}
	return fstype, found
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of
// /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%3o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// raiseFileLimit lifts the limit of open files as far as the kernel allows
// (fs.nr_open; root may raise the hard limit too). tierfs holds one
// descriptor per inode the kernel knows and one per open file.
func raiseFileLimit(log *slog.Logger) uint64 {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return 1024
	}
	want := lim.Max
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && v > want {
			want = v
		}
	}
	if unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: want, Max: want}) != nil {
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: lim.Max, Max: lim.Max})
	}
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	log.Debug("open file limit", "limit", lim.Cur)
	return lim.Cur
}

// OpObserver is told of FUSE requests (see Config.Ops).
type OpObserver interface {
	ObserveOp(op string, d time.Duration, st fuse.Status)
}
