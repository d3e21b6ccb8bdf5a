package cm

import (
	"errors"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// The methods below are what the file system asks of cm. Each runs inside
// Enter/leave. dfd arguments are descriptors of directories of the tree,
// name an entry in it and rel the same entry's path from the tree's root.

// Unlink removes the entry name of dfd, retaining the original: the file
// is moved into the cmroot's tmp dir (one rename) and its event recorded;
// the filer names it by checksum afterwards, off the request's path.
func (m *Manager) Unlink(dfd int, name, rel string) error {
	if m.Excluded(rel) {
		return unix.Unlinkat(dfd, name, 0)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	ev := Event{Type: EvDelete, Path: rel, Kind: kindOf(st.Mode)}
	switch {
	case ev.Kind == KindSymlink:
		ev.Target, _ = readlinkat(dfd, name)
		if err := unix.Unlinkat(dfd, name, 0); err != nil {
			return err
		}
	case ev.Kind != KindFile:
		// Device nodes, fifos, sockets: nothing to keep but the event.
		if err := unix.Unlinkat(dfd, name, 0); err != nil {
			return err
		}
	case st.Nlink > 1:
		// Another name keeps the inode: retain a copy of the bytes, as
		// those may still change through that name.
		if err := m.retainCopy(dfd, name, rel, &ev); err != nil {
			return err
		}
		if err := unix.Unlinkat(dfd, name, 0); err != nil {
			m.dropTmp(ev.Pending)
			return err
		}
	default:
		tmp, err := m.takeAway(dfd, name, rel, tmpMove)
		if err != nil {
			return err
		}
		ev.Pending, ev.Size = tmp, st.Size
	}
	m.captured(ev)
	return nil
}

// Rmdir removes the empty directory name of dfd.
func (m *Manager) Rmdir(dfd int, name, rel string) error {
	if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil {
		return err
	}
	if !m.Excluded(rel) {
		m.record(Event{Type: EvDelete, Kind: KindDir, Path: rel})
	}
	return nil
}

// Rename moves oname of odfd to nname of ndfd (renameat2 flags). A file it
// replaces is retained: linked into the cmroot before the rename, so the
// rename itself stays one atomic step for everyone reading the name.
func (m *Manager) Rename(odfd int, oname, orel string, ndfd int, nname, nrel string, flags uint32) error {
	fromEx, toEx := m.Excluded(orel), m.Excluded(nrel)
	if fromEx && toEx {
		return unix.Renameat2(odfd, oname, ndfd, nname, uint(flags))
	}
	var src unix.Stat_t
	if err := unix.Fstatat(odfd, oname, &src, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if toEx {
		// Moving a tracked entry out of sight is, to cm, its deletion.
		ev := Event{Type: EvDelete, Path: orel, Kind: kindOf(src.Mode)}
		return m.renameRetaining(odfd, oname, orel, ndfd, nname, flags, ev, odfd, oname, &src)
	}
	ev := Event{Type: EvRename, Path: orel, To: nrel, Flags: flags, FromUntracked: fromEx, Kind: kindOf(src.Mode)}
	var victim unix.Stat_t
	if flags&(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 ||
		unix.Fstatat(ndfd, nname, &victim, unix.AT_SYMLINK_NOFOLLOW) != nil || sameInode(&src, &victim) {
		return m.renameRetaining(odfd, oname, orel, ndfd, nname, flags, ev, -1, "", nil)
	}
	ev.Over = kindOf(victim.Mode)
	if ev.Over == KindSymlink {
		ev.Target, _ = readlinkat(ndfd, nname)
	}
	return m.renameRetaining(odfd, oname, orel, ndfd, nname, flags, ev, ndfd, nname, &victim)
}

// renameRetaining renames, first retaining the file name of kdfd (stat
// st) when it is a regular file: linked into tmp (or copied, when it has
// other links), so it survives the rename.
func (m *Manager) renameRetaining(odfd int, oname, orel string, ndfd int, nname string, flags uint32, ev Event, kdfd int, kname string, st *unix.Stat_t) error {
	if st != nil && kindOf(st.Mode) == KindFile {
		krel := ev.Path
		if ev.Type == EvRename {
			krel = ev.To
		}
		if st.Nlink > 1 {
			if err := m.retainCopy(kdfd, kname, krel, &ev); err != nil {
				return err
			}
		} else {
			tmp, err := m.takeAway(kdfd, kname, krel, tmpLink)
			if err != nil {
				return err
			}
			ev.Pending, ev.Size = tmp, st.Size
		}
	}
	if err := unix.Renameat2(odfd, oname, ndfd, nname, uint(flags)); err != nil {
		m.dropTmp(ev.Pending)
		return err
	}
	m.captured(ev)
	return nil
}

// Created records that rel was made (kind KindFile, KindDir or
// KindSymlink with its target).
func (m *Manager) Created(rel, kind, target string) {
	if !m.Excluded(rel) {
		m.record(Event{Type: EvCreate, Path: rel, Kind: kind, Target: target})
	}
}

// Truncate retains the original of the file at path (a path this process
// can open, e.g. a /proc/self/fd link), whose tree path is rel, before it
// is cut to size. Growing a file retains nothing: call Written after.
func (m *Manager) Truncate(path, rel string, size int64) error {
	if m.Excluded(rel) {
		return nil
	}
	ev := Event{Type: EvTruncate, Path: rel, NewSize: size}
	if old, ok := m.zeroTail(path, size); ok {
		ev.ZeroTail, ev.OldSize = true, old
		m.record(ev)
		return nil
	}
	if err := m.retainCopyPath(path, rel, &ev); err != nil {
		return err
	}
	m.captured(ev)
	return nil
}

// Overwrite retains the original of the file at path before the first
// write into its existing bytes.
func (m *Manager) Overwrite(path, rel string) error {
	if m.Excluded(rel) {
		return nil
	}
	ev := Event{Type: EvModify, Path: rel}
	if err := m.retainCopyPath(path, rel, &ev); err != nil {
		return err
	}
	m.captured(ev)
	return nil
}

// Written records that rel, oldSize bytes at the last event, was written
// and is now newSize bytes. overwrote says an Overwrite came first in the
// same open (so the earlier bytes are the modify's original, not a prefix).
func (m *Manager) Written(rel string, oldSize, newSize int64, overwrote bool) {
	if !m.Excluded(rel) {
		m.record(Event{Type: EvWrite, Path: rel, OldSize: oldSize, Size: newSize, Overwrote: overwrote})
	}
}

// maxZeroScan bounds how many data bytes past a cut zeroTail reads to
// find them all zeros; a longer tail is retained as a copy.
const maxZeroScan = 1 << 20

// zeroTail reports whether everything of the file at path past size is
// zeros, and its size: then cutting it loses nothing a restore cannot
// make again. Holes are skipped (SEEK_DATA); what is data is read, up to
// maxZeroScan bytes. Kafka trims a preallocated index to its entries,
// which end inside a block: the rest of that block is zeros, the rest of
// the file a hole. An evicted file does not qualify: its holes are bytes
// in the store.
func (m *Manager) zeroTail(path string, size int64) (int64, bool) {
	// Its own descriptor: the seeks below move the file offset. (A raw
	// one: os.File costs five more system calls for the poller.)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Size <= size {
		return 0, false
	}
	if m.cfg.Remote != nil {
		_, c, remote, err := m.cfg.Remote.OpenIfRemote(path)
		if err != nil || remote {
			if remote {
				c.Close()
			}
			return 0, false
		}
	}
	var buf []byte
	scanned := int64(0)
	err = dataExtents(fd, size, st.Size, func(data, end int64) error {
		if scanned += end - data; scanned > maxZeroScan {
			return errNotZeros
		}
		if buf == nil {
			buf = make([]byte, 64<<10)
		}
		for data < end {
			n, err := unix.Pread(fd, buf[:min(int64(len(buf)), end-data)], data)
			if err != nil || n == 0 || !allZero(buf[:n]) {
				return errNotZeros
			}
			data += int64(n)
		}
		return nil
	})
	return st.Size, err == nil
}

var errNotZeros = errors.New("not all zeros")

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// How an original got into tmp; the prefix of its tmp name, so recovery
// after a crash knows what happened.
const (
	tmpMove = "move" // renamed out of the tree: the change happened
	tmpLink = "link" // linked, then the tree's name renamed over: maybe
	tmpCopy = "copy" // copied before the change: maybe
)

// takeAway moves (or links) the entry name of dfd into the cmroot's tmp
// dir and returns its name there (relative to the cmroot). The name
// carries rel, so an original left in tmp by a crash is filed under its
// path.
func (m *Manager) takeAway(dfd int, name, rel, how string) (string, error) {
	tmp := m.tmpName(how, rel)
	var err error
	if how == tmpMove {
		err = unix.Renameat(dfd, name, m.dirFd, tmp)
	} else {
		err = unix.Linkat(dfd, name, m.dirFd, tmp, 0)
	}
	if errors.Is(err, unix.EXDEV) {
		full := filepath.Join(m.dir, tmp)
		// The cmroot is on another file system: copy, then (for a move)
		// remove. An evicted file's copy is read from the store: its
		// inode, which keeps the objects, does not come along.
		if err = m.copyAt(dfd, name, full); err == nil && how == tmpMove {
			if err = unix.Unlinkat(dfd, name, 0); err != nil {
				os.Remove(full)
			}
		}
	}
	if err != nil {
		m.stats.Errors.Add(1)
		return "", &errRetain{path: rel, err: err}
	}
	return tmp, nil
}

func (m *Manager) tmpName(how, rel string) string {
	n := how + "-" + strconv.FormatInt(m.cfg.Now().UnixNano(), 10) + "-" + strconv.FormatUint(m.tmpSeq.Add(1), 10) + "-" + url.PathEscape(rel)
	if len(n) > 255 {
		n = n[:255]
	}
	return "tmp/" + n
}

// dropTmp removes an original taken for a change that did not happen.
func (m *Manager) dropTmp(tmp string) {
	if tmp != "" {
		unix.Unlinkat(m.dirFd, tmp, 0)
	}
}

// retainCopy retains a copy of the entry name of dfd (the original stays).
func (m *Manager) retainCopy(dfd int, name, rel string, ev *Event) error {
	return atPath(dfd, name, func(path string) error { return m.retainCopyPath(path, rel, ev) })
}

// atPath runs fn with a path of the entry name of dfd that stays the same
// inode whatever renames happen meanwhile (a /proc/self/fd link of an
// O_PATH descriptor).
func atPath(dfd int, name string, fn func(path string) error) error {
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn("/proc/self/fd/" + strconv.Itoa(fd))
}

// retainCopyPath copies the file at path into tmp and sets ev's Pending
// and Size. Holes stay holes, so a preallocated index costs only its data.
func (m *Manager) retainCopyPath(path, rel string, ev *Event) error {
	tmp := m.tmpName(tmpCopy, rel)
	size, err := m.copyContent(path, filepath.Join(m.dir, tmp))
	if err != nil {
		m.dropTmp(tmp)
		m.stats.Errors.Add(1)
		return &errRetain{path: rel, err: err}
	}
	ev.Pending, ev.Size = tmp, size
	return nil
}

// copyContent copies the file at src to a new file dst, with its mode,
// owner and times, and returns its size. An evicted file's copy is read
// from the store. The copy is made durable with the event log (see
// syncPending), not here.
func (m *Manager) copyContent(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &st); err != nil {
		return 0, err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	if m.cfg.Remote != nil {
		if r, c, ok, err := m.cfg.Remote.OpenIfRemote(src); err != nil {
			return 0, err
		} else if ok {
			defer c.Close()
			if _, err := io.Copy(out, io.NewSectionReader(r, 0, st.Size)); err != nil {
				return 0, err
			}
			return st.Size, copyAttrs(out, &st)
		}
	}
	if err := copySparse(int(in.Fd()), int(out.Fd()), st.Size); err != nil {
		return 0, err
	}
	return st.Size, copyAttrs(out, &st)
}

func kindOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return KindFile
	case unix.S_IFDIR:
		return KindDir
	case unix.S_IFLNK:
		return KindSymlink
	}
	return "other"
}

func sameInode(a, b *unix.Stat_t) bool { return a.Dev == b.Dev && a.Ino == b.Ino }

func readlinkat(dfd int, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
