package cm

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// entry is one path's state at an event.
type entry struct {
	Kind   string
	Target string // of a symlink
	// Where a file's bytes at the event are: Cur, a path in the tree as
	// walked, or Name, a file in the cmroot. Size is the length of the
	// version; when shorter than its source, the version is a prefix of
	// it (the file was appended to after the event). Sum, when known, is
	// the checksum of those Size bytes.
	Cur  string
	Name string
	Sum  string
	Size int64
	// Zeros follow the Size bytes of the source (a preallocated index
	// before its trim): the version is Size+Zeros bytes long.
	Zeros int64
	// Unknown, when set, says why the bytes at the event cannot be known.
	Unknown string
}

// tree is a whole tree's state: path → entry. Paths are relative, with no
// leading slash.
type tree map[string]*entry

// under reports whether p is root or inside it ("" is everything).
func under(p, root string) bool {
	return root == "" || p == root || strings.HasPrefix(p, root+"/")
}

// removeSubtree deletes p and everything under it.
func (t tree) removeSubtree(p string) {
	for k := range t {
		if under(k, p) {
			delete(t, k)
		}
	}
}

// moveSubtree moves p and everything under it to q.
func (t tree) moveSubtree(p, q string) {
	moved := map[string]*entry{}
	for k, e := range t {
		if under(k, p) {
			moved[q+k[len(p):]] = e
			delete(t, k)
		}
	}
	for k, e := range moved {
		t[k] = e
	}
}

// retainedEntry is the file an event retained.
func retainedEntry(ev Event, what string) *entry {
	if ev.Name == "" && ev.Pending != "" {
		return &entry{Kind: KindFile, Name: ev.Pending, Size: ev.Size}
	}
	if ev.Name == "" {
		return &entry{Kind: KindFile, Unknown: fmt.Sprintf("event %d (%s of %s) retained no copy", ev.ID, what, ev.Path)}
	}
	return &entry{Kind: KindFile, Name: ev.Name, Sum: ev.Sum, Size: ev.Size}
}

// put sets p to the entry of kind that ev removed (nothing for a kind cm
// does not keep, such as a fifo, or none).
func (t tree) put(p, kind string, ev Event, what string) {
	switch kind {
	case KindFile:
		t[p] = retainedEntry(ev, what)
	case KindDir:
		t[p] = &entry{Kind: KindDir}
	case KindSymlink:
		t[p] = &entry{Kind: KindSymlink, Target: ev.Target}
	}
}

// undo turns the tree after ev into the tree before it.
func (t tree) undo(ev Event) {
	switch ev.Type {
	case EvCreate:
		t.removeSubtree(ev.Path)
	case EvDelete:
		t.put(ev.Path, ev.Kind, ev, "delete")
	case EvRename:
		if ev.Flags&unix.RENAME_EXCHANGE != 0 {
			const swap = "\x00swap"
			t.moveSubtree(ev.To, swap)
			t.moveSubtree(ev.Path, ev.To)
			t.moveSubtree(swap, ev.Path)
			return
		}
		if ev.FromUntracked {
			t.removeSubtree(ev.To)
		} else {
			t.moveSubtree(ev.To, ev.Path)
		}
		t.put(ev.To, ev.Over, ev, "rename over")
	case EvTruncate, EvModify:
		if ev.ZeroTail {
			// Before the cut: the bytes after it, then zeros.
			if e := t[ev.Path]; e != nil && e.Kind == KindFile && e.Unknown == "" {
				c := *e
				c.Zeros += ev.OldSize - ev.NewSize
				c.Sum = ""
				t[ev.Path] = &c
			} else {
				t[ev.Path] = &entry{Kind: KindFile, Unknown: fmt.Sprintf("event %d (trim of %s) follows a version that is not known", ev.ID, ev.Path)}
			}
			return
		}
		t[ev.Path] = retainedEntry(ev, ev.Type)
	case EvWrite:
		e := t[ev.Path]
		if e == nil || e.Kind != KindFile {
			return
		}
		if ev.Overwrote {
			// The event before (a modify of the same open) restores the
			// original; in between, the bytes were in flux.
			t[ev.Path] = &entry{Kind: KindFile, Unknown: fmt.Sprintf("%s was being overwritten at this event (%d); pick an event outside the write", ev.Path, ev.ID)}
			return
		}
		if ev.OldSize < e.Size+e.Zeros {
			c := *e
			if ev.OldSize <= e.Size {
				c.Size, c.Zeros = ev.OldSize, 0
			} else {
				c.Zeros = ev.OldSize - e.Size
			}
			c.Sum = ""
			t[ev.Path] = &c
		}
	}
}

// walk reads the tree under root (skipping the entry hide at its top)
// into a tree of current files.
func walk(root, hide string) (tree, error) {
	t := tree{}
	// root may be a /proc/self/fd link: "/." makes the walk follow it.
	err := filepath.WalkDir(root+"/.", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // gone while walked: its event says so
			}
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		if rel == hide {
			return filepath.SkipDir
		}
		switch {
		case d.IsDir():
			t[rel] = &entry{Kind: KindDir}
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil
			}
			t[rel] = &entry{Kind: KindSymlink, Target: target}
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return nil
			}
			t[rel] = &entry{Kind: KindFile, Cur: rel, Size: info.Size()}
		}
		return nil
	})
	return t, err
}

// snapshot is the tree at one event, with the checksum of every file
// under the wanted roots.
type snapshot struct {
	at    uint64
	tree  tree
	roots []string
}

// ErrBusy is returned when the tree kept changing the files a snapshot
// needed while it was being taken.
var ErrBusy = errors.New("the files kept changing while their state was read; try again")

// stateAt returns the tree at event at (0: before the first event), with checksums for every
// file under roots ("" for all). The tree is walked while changes wait
// (briefly: names only), then the events after at are undone. Files read
// from the tree after the walk may have changed again; when one did, the
// snapshot is taken again.
func (m *Manager) stateAt(at uint64, roots []string) (*snapshot, error) {
	if err := m.wait(); err != nil {
		return nil, err
	}
	// Originals still waiting in tmp are filed first, so every event
	// names its original by checksum.
	m.flushFiler()
	for attempt := 0; attempt < 5; attempt++ {
		m.tree.Lock()
		now := m.log.lastID()
		t, err := walk(m.root, m.cfg.Hide)
		m.tree.Unlock()
		if err != nil {
			return nil, fmt.Errorf("read the tree: %w", err)
		}
		if at > now {
			return nil, fmt.Errorf("event %d has not happened yet (the newest is %d)", at, now)
		}
		first, err := firstID(m.log.dir)
		if err != nil {
			return nil, err
		}
		if at+1 < first {
			return nil, fmt.Errorf("events before %d have expired (--cm-retain): the tree at %d is no longer known", first, at)
		}
		later, err := readResolved(m.log.dir, at+1, now)
		if err != nil {
			return nil, err
		}
		for i := len(later) - 1; i >= 0; i-- {
			t.undo(later[i])
		}
		for p, e := range t {
			if m.Excluded(p) {
				delete(t, p)
				continue
			}
			if e.Kind == KindFile && inRoots(p, roots) && e.Unknown != "" {
				return nil, fmt.Errorf("%s at event %d: %s", p, at, e.Unknown)
			}
		}
		s := &snapshot{at: at, tree: t, roots: roots}
		if err := m.sumAll(s); err != nil {
			return nil, err
		}
		changed, err := m.changedSince(now, s)
		if err != nil {
			return nil, err
		}
		if !changed {
			return s, nil
		}
	}
	return nil, ErrBusy
}

func inRoots(p string, roots []string) bool {
	for _, r := range roots {
		if under(p, r) {
			return true
		}
	}
	return false
}

// sumAll computes the checksum of every file under the snapshot's roots
// whose checksum is not known.
func (m *Manager) sumAll(s *snapshot) error {
	for _, p := range s.paths() {
		e := s.tree[p]
		if e.Kind != KindFile || e.Sum != "" {
			continue
		}
		src := filepath.Join(m.root, e.Cur)
		if e.Cur == "" {
			src = filepath.Join(m.dir, e.Name)
		}
		full := false
		var st unix.Stat_t
		if err := unix.Stat(src, &st); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		full = st.Size == e.Size && e.Zeros == 0
		var err error
		if full {
			e.Sum, _, err = m.sumFile(src)
		} else {
			e.Sum, err = m.sumPrefix(src, e.Size, e.Zeros)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// sumPrefix is the checksum of the first n bytes of the file at path,
// followed by zeros zero bytes.
func (m *Manager) sumPrefix(path string, n, zeros int64) (string, error) {
	fd, st, err := openRegular(unix.AT_FDCWD, path)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	r, done, err := contentAt(m.cfg.Remote, path, fd, st.Size)
	if err != nil {
		return "", err
	}
	defer done()
	return m.hash(io.MultiReader(io.LimitReader(r, n), zeroReader(zeros)), n+zeros)
}

// zeroReader reads n zero bytes.
func zeroReader(n int64) io.Reader { return io.LimitReader(zeroes{}, n) }

type zeroes struct{}

func (zeroes) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// paths lists the snapshot's paths under its roots, sorted (parents
// before children).
func (s *snapshot) paths() []string {
	var ps []string
	for p := range s.tree {
		if inRoots(p, s.roots) {
			ps = append(ps, p)
		}
	}
	sort.Strings(ps)
	return ps
}

// changedSince says whether an event after since may have changed the
// bytes of a file the snapshot read from the tree. Appends do not: only
// the first Size bytes were read.
func (m *Manager) changedSince(since uint64, s *snapshot) (bool, error) {
	cur := map[string]bool{}
	for _, p := range s.paths() {
		if e := s.tree[p]; e.Kind == KindFile && e.Cur != "" {
			cur[e.Cur] = true
		}
	}
	if len(cur) == 0 {
		return false, nil
	}
	changed := false
	err := readEvents(m.log.dir, since+1, ^uint64(0), func(ev Event) error {
		if ev.Type == EvWrite || ev.Type == EvCreate {
			return nil
		}
		for c := range cur {
			if under(c, ev.Path) || (ev.To != "" && under(c, ev.To)) {
				changed = true
			}
		}
		return nil
	})
	return changed, err
}
