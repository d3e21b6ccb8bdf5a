package cm

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The methods below are what the file system asks of cm. Each runs inside
// Enter/leave. dfd arguments are descriptors of directories of the tree,
// name an entry in it and rel the same entry's path from the tree's root.

// Unlink removes the entry name of dfd, retaining the original first: the
// file is moved into the cmroot (one rename), then filed by checksum.
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
			return err
		}
	default:
		tmp, err := m.takeAway(dfd, name, rel, true)
		if err != nil {
			return err
		}
		if err := m.file(tmp, rel, &ev); err != nil {
			// The file is out of the tree already; it stays in tmp and
			// is filed at the next start.
			m.cfg.Log.Error("cm: retained original left unfiled", "path", rel, "tmp", tmp, "err", err)
		}
	}
	m.record(ev)
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
	if toEx {
		// Moving a tracked entry out of sight is, to cm, its deletion.
		return m.renameAway(odfd, oname, orel, ndfd, nname, flags)
	}
	ev := Event{Type: EvRename, Path: orel, To: nrel, Flags: flags, FromUntracked: fromEx}
	var src unix.Stat_t
	if err := unix.Fstatat(odfd, oname, &src, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	ev.Kind = kindOf(src.Mode)
	var victim unix.Stat_t
	hasVictim := flags&unix.RENAME_NOREPLACE == 0 && flags&unix.RENAME_EXCHANGE == 0 &&
		unix.Fstatat(ndfd, nname, &victim, unix.AT_SYMLINK_NOFOLLOW) == nil && !sameInode(&src, &victim)
	tmp := ""
	if hasVictim {
		ev.Over = kindOf(victim.Mode)
		switch ev.Over {
		case KindFile:
			var err error
			if victim.Nlink > 1 {
				err = m.retainCopy(ndfd, nname, nrel, &ev)
			} else {
				tmp, err = m.takeAway(ndfd, nname, nrel, false)
			}
			if err != nil {
				return err
			}
		case KindSymlink:
			ev.Target, _ = readlinkat(ndfd, nname)
		}
	}
	if err := unix.Renameat2(odfd, oname, ndfd, nname, uint(flags)); err != nil {
		if tmp != "" {
			os.Remove(tmp)
		}
		return err
	}
	if tmp != "" {
		if err := m.file(tmp, nrel, &ev); err != nil {
			m.cfg.Log.Error("cm: retained original left unfiled", "path", nrel, "tmp", tmp, "err", err)
		}
	}
	m.record(ev)
	return nil
}

// renameAway renames a tracked file to an excluded name: recorded as its
// deletion, with the bytes retained.
func (m *Manager) renameAway(odfd int, oname, orel string, ndfd int, nname string, flags uint32) error {
	var st unix.Stat_t
	if err := unix.Fstatat(odfd, oname, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	ev := Event{Type: EvDelete, Path: orel, Kind: kindOf(st.Mode)}
	tmp := ""
	if ev.Kind == KindFile {
		var err error
		if tmp, err = m.takeAway(odfd, oname, orel, false); err != nil {
			return err
		}
	}
	if err := unix.Renameat2(odfd, oname, ndfd, nname, uint(flags)); err != nil {
		if tmp != "" {
			os.Remove(tmp)
		}
		return err
	}
	if tmp != "" {
		if err := m.file(tmp, orel, &ev); err != nil {
			m.cfg.Log.Error("cm: retained original left unfiled", "path", orel, "tmp", tmp, "err", err)
		}
	}
	m.record(ev)
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
	if err := m.retainCopyPath(path, rel, &ev); err != nil {
		return err
	}
	m.record(ev)
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
	m.record(ev)
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

// takeAway moves (or, with move false, links) the entry name of dfd into
// the cmroot's tmp dir and returns its path there. The tmp name carries
// rel, so an original left in tmp by a crash is filed under its path.
func (m *Manager) takeAway(dfd int, name, rel string, move bool) (string, error) {
	tmpName := strconv.FormatInt(m.cfg.Now().UnixNano(), 10) + "-" + strconv.FormatUint(m.tmpSeq.Add(1), 10) + "-" + url.PathEscape(rel)
	if len(tmpName) > 255 {
		tmpName = tmpName[:255]
	}
	tmp := filepath.Join(m.dir, "tmp", tmpName)
	var err error
	if move {
		err = unix.Renameat(dfd, name, unix.AT_FDCWD, tmp)
	} else {
		err = unix.Linkat(dfd, name, unix.AT_FDCWD, tmp, 0)
	}
	if errors.Is(err, unix.EXDEV) {
		// The cmroot is on another file system: copy, then (for a move)
		// remove.
		if err = copyAt(dfd, name, tmp); err == nil && move {
			if err = unix.Unlinkat(dfd, name, 0); err != nil {
				os.Remove(tmp)
			}
		}
	}
	if err != nil {
		m.stats.Errors.Add(1)
		return "", &errRetain{path: rel, err: err}
	}
	return tmp, nil
}

// file gives the original at tmp its name by checksum and sets ev's Sum,
// Name and Size. Content already retained is kept once.
func (m *Manager) file(tmp, rel string, ev *Event) error {
	sum, size, err := m.sumFile(tmp)
	if err != nil {
		return err
	}
	ev.Sum, ev.Size = sum, size
	name, err := m.keep(tmp, rel, sum)
	if err != nil {
		return err
	}
	ev.Name = name
	return nil
}

// keep files the original at tmp (whose checksum is sum) under rel and
// removes tmp; it returns the cmroot name the content is kept under.
func (m *Manager) keep(tmp, rel, sum string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rc, ok := m.retained[sum]; ok {
		if _, err := os.Lstat(filepath.Join(m.dir, "by-sum", sum)); err == nil {
			os.Remove(tmp)
			rc.last = m.cfg.Now()
			m.stats.Deduplicated.Add(1)
			return rc.name, nil
		}
	}
	name := "files/" + rel + "_" + sum
	full := filepath.Join(m.dir, name)
	if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
		return "", err
	}
	// by-sum first: it is what says the content is retained.
	if err := os.Link(tmp, filepath.Join(m.dir, "by-sum", sum)); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	if err := os.Link(tmp, full); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	// The file system hides these two links from a process that still
	// has the deleted file open (natively its link count is 0).
	_ = unix.Setxattr(full, linksXattr, []byte("2"), 0)
	var st unix.Stat_t
	unix.Lstat(full, &st)
	os.Remove(tmp)
	rc := &retainedCopy{name: name, bytes: st.Blocks * 512, last: m.cfg.Now()}
	m.retained[sum] = rc
	m.bytes += rc.bytes
	m.stats.RetainedFiles.Add(1)
	m.stats.RetainedBytes.Add(st.Size)
	return name, nil
}

// retainCopy retains a copy of the entry name of dfd (the original stays).
func (m *Manager) retainCopy(dfd int, name, rel string, ev *Event) error {
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return m.retainCopyPath("/proc/self/fd/"+strconv.Itoa(fd), rel, ev)
}

// retainCopyPath retains a copy of the file at path. When its content is
// already retained no copy is made.
func (m *Manager) retainCopyPath(path, rel string, ev *Event) error {
	fail := func(err error) error {
		m.stats.Errors.Add(1)
		return &errRetain{path: rel, err: err}
	}
	sum, size, err := m.sumFile(path)
	if err != nil {
		return fail(err)
	}
	ev.Sum, ev.Size = sum, size
	m.mu.Lock()
	rc, dup := m.retained[sum]
	if dup {
		rc.last = m.cfg.Now()
		ev.Name = rc.name
	}
	m.mu.Unlock()
	if dup {
		if _, err := os.Lstat(filepath.Join(m.dir, "by-sum", sum)); err == nil {
			m.stats.Deduplicated.Add(1)
			return nil
		}
	}
	tmp := filepath.Join(m.dir, "tmp", fmt.Sprintf("%d-%d-%s", m.cfg.Now().UnixNano(), m.tmpSeq.Add(1), url.PathEscape(rel)))
	if len(filepath.Base(tmp)) > 255 {
		tmp = tmp[:len(tmp)-(len(filepath.Base(tmp))-255)]
	}
	if err := m.copyContent(path, tmp); err != nil {
		os.Remove(tmp)
		return fail(err)
	}
	name, err := m.keep(tmp, rel, sum)
	if err != nil {
		os.Remove(tmp)
		return fail(err)
	}
	ev.Name = name
	return nil
}

// copyContent copies the file at src to a new file dst, with its mode,
// owner and times. An evicted file's copy is read from the store.
func (m *Manager) copyContent(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &st); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if m.cfg.Remote != nil {
		if r, c, ok, err := m.cfg.Remote.OpenIfRemote(src); err != nil {
			return err
		} else if ok {
			defer c.Close()
			if _, err := io.Copy(out, io.NewSectionReader(r, 0, st.Size)); err != nil {
				return err
			}
			return finishCopy(out, &st)
		}
	}
	if err := copySparse(int(in.Fd()), int(out.Fd()), st.Size); err != nil {
		return err
	}
	return finishCopy(out, &st)
}

// recoverTmp files the originals a crash left in tmp, each with an event
// marked recovered (the event the crash cut off).
func (m *Manager) recoverTmp() error {
	ents, err := os.ReadDir(filepath.Join(m.dir, "tmp"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		tmp := filepath.Join(m.dir, "tmp", e.Name())
		parts := strings.SplitN(e.Name(), "-", 3)
		rel := ""
		if len(parts) == 3 {
			rel, _ = url.PathUnescape(parts[2])
		}
		if rel == "" || !e.Type().IsRegular() {
			os.RemoveAll(tmp)
			continue
		}
		ev := Event{Type: EvDelete, Kind: KindFile, Path: rel, Recovered: true}
		if err := m.file(tmp, rel, &ev); err != nil {
			return fmt.Errorf("cm: recover %s: %w", tmp, err)
		}
		m.record(ev)
		m.cfg.Log.Warn("cm: an original retained just before a crash was filed; its event is marked recovered", "path", rel, "name", ev.Name)
	}
	return nil
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
