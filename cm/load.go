package cm

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/beneath"
)

// LoadOptions say where a load reads from.
type LoadOptions struct {
	// Source and CMRoot override the dump header's (e.g. when the
	// mount's own process loads, through its descriptors).
	Source string
	CMRoot string
	Remote Remote
	Now    func() time.Time
}

// LoadReport says what a load did.
type LoadReport struct {
	Copied    int   `json:"copied"`    // files written
	Unchanged int   `json:"unchanged"` // files already right
	Removed   int   `json:"removed"`   // entries removed
	Made      int   `json:"made"`      // directories and symlinks made
	Bytes     int64 `json:"bytes"`     // bytes written
}

// tempPrefix names the files a load writes before renaming them into
// place; cm does not track them.
const tempPrefix = ".tierfs-load-"

// Load brings target to the state of the dump at dir: every path the
// dump's events touched ends up exactly as it was at the dump's last
// event; nothing else is changed. Loading the same dump again changes
// nothing. Nothing is written outside target.
func Load(dir, target string, opt LoadOptions) (LoadReport, error) {
	h, events, lines, err := ReadDump(dir)
	if err != nil {
		return LoadReport{}, err
	}
	p := plan{lines: lines, source: h.Source, cmroot: h.CMRoot, remote: opt.Remote, now: opt.Now}
	if opt.Source != "" {
		p.source = opt.Source
	}
	if opt.CMRoot != "" {
		p.cmroot = opt.CMRoot
	}
	if h.Bootstrap {
		p.roots = []string{""}
	} else {
		seen := map[string]bool{}
		for _, ev := range events {
			for _, r := range []string{ev.Path, ev.To} {
				if r != "" && !seen[r] {
					seen[r] = true
					p.roots = append(p.roots, r)
				}
			}
		}
	}
	for _, l := range lines {
		if !inRoots(l.Path, p.roots) {
			return LoadReport{}, fmt.Errorf("%s/_files: %s is not under any path the dump's events touched", dir, l.Path)
		}
	}
	return p.apply(target)
}

// Restore brings rel (a file or a tree) back to its state at event at,
// written under target (a mount point, for a restore in place, or any
// directory). What target has at rel is replaced.
func (m *Manager) Restore(rel string, at uint64, target string) (LoadReport, error) {
	if rel != "" {
		if err := checkRel(rel); err != nil {
			return LoadReport{}, err
		}
	}
	s, err := m.stateAt(at, []string{rel})
	if err != nil {
		return LoadReport{}, err
	}
	if _, ok := s.tree[rel]; !ok && rel != "" {
		return LoadReport{}, fmt.Errorf("%s did not exist at event %d", rel, s.at)
	}
	p := plan{roots: []string{rel}, source: m.root, cmroot: m.dir, remote: m.cfg.Remote, now: m.cfg.Now}
	for _, q := range s.paths() {
		p.lines = append(p.lines, lineOf(q, s.tree[q]))
	}
	return p.apply(target)
}

// plan is a target state for some subtrees: after apply, each root's
// subtree in the target holds exactly lines (those under it).
type plan struct {
	roots          []string
	lines          []FileLine
	source, cmroot string
	remote         Remote
	now            func() time.Time
}

func (p *plan) apply(target string) (LoadReport, error) {
	var rep LoadReport
	if p.now == nil {
		p.now = time.Now
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return rep, err
	}
	tfd, err := unix.Open(target, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return rep, fmt.Errorf("target %s: %w", target, err)
	}
	defer unix.Close(tfd)
	srcFd, cmFd := -1, -1
	if p.source != "" {
		if srcFd, err = unix.Open(p.source, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return rep, fmt.Errorf("source %s: %w", p.source, err)
		}
		defer unix.Close(srcFd)
	}
	if p.cmroot != "" {
		if cmFd, err = unix.Open(p.cmroot, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return rep, fmt.Errorf("cmroot %s: %w", p.cmroot, err)
		}
		defer unix.Close(cmFd)
	}
	want := map[string]FileLine{}
	for _, l := range p.lines {
		want[l.Path] = l
	}
	roots := append([]string(nil), p.roots...)
	sort.Strings(roots)
	for i, r := range roots {
		if i > 0 && inRoots(r, roots[:i]) {
			continue
		}
		have, err := listBeneath(tfd, r)
		if err != nil {
			return rep, err
		}
		// Children before parents: sorted descending.
		var gone []string
		for q, kind := range have {
			if l, ok := want[q]; !ok || l.Kind != kind {
				gone = append(gone, q)
			}
		}
		sort.Sort(sort.Reverse(sort.StringSlice(gone)))
		for _, q := range gone {
			if err := removeBeneath(tfd, q, have[q]); err != nil {
				return rep, fmt.Errorf("remove %s: %w", q, err)
			}
			rep.Removed++
		}
		var todo []string
		for q := range want {
			if under(q, r) {
				todo = append(todo, q)
			}
		}
		sort.Strings(todo)
		for _, q := range todo {
			if err := p.ensure(tfd, srcFd, cmFd, want[q], &rep); err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

// listBeneath lists the entries at and under p in the directory dfd, with
// their kinds; none when p does not exist.
func listBeneath(dfd int, p string) (map[string]string, error) {
	out := map[string]string{}
	fd, err := beneath.Open(dfd, p, unix.O_PATH|unix.O_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil {
		return nil, err
	}
	if p != "" {
		out[p] = kindOf(st.Mode)
	}
	if kindOf(st.Mode) != KindDir {
		return out, nil
	}
	dirFd, err := beneath.Open(dfd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	d := os.NewFile(uintptr(dirFd), p)
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		q := path.Join(p, e.Name())
		sub, err := listBeneath(dfd, q)
		if err != nil {
			return nil, err
		}
		for k, v := range sub {
			out[k] = v
		}
	}
	return out, nil
}

// parentBeneath opens the directory holding p, making missing parents.
func parentBeneath(dfd int, p string) (int, string, error) {
	dir, base := path.Split(p)
	dir = path.Clean(dir)
	if dir == "." {
		dir = ""
	}
	if dir != "" {
		if err := mkdirAllBeneath(dfd, dir); err != nil {
			return -1, "", err
		}
	}
	fd, err := beneath.Open(dfd, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	return fd, base, err
}

func mkdirAllBeneath(dfd int, dir string) error {
	fd, err := beneath.Open(dfd, dir, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil {
		unix.Close(fd)
		return nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s: %w", dir, err)
	}
	pfd, base, err := parentBeneath(dfd, dir)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	return nil
}

func removeBeneath(dfd int, p, kind string) error {
	pfd, base, err := parentBeneath(dfd, p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	flags := 0
	if kind == KindDir {
		flags = unix.AT_REMOVEDIR
	}
	err = unix.Unlinkat(pfd, base, flags)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// ensure makes the entry l exist in the target as the dump says.
func (p *plan) ensure(tfd, srcFd, cmFd int, l FileLine, rep *LoadReport) error {
	pfd, base, err := parentBeneath(tfd, l.Path)
	if err != nil {
		return fmt.Errorf("%s: %w", l.Path, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	exists := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	switch l.Kind {
	case KindDir:
		if exists {
			return nil
		}
		rep.Made++
		return unix.Mkdirat(pfd, base, 0o755)
	case KindSymlink:
		if exists {
			if t, _ := readlinkat(pfd, base); t == l.Target {
				return nil
			}
			unix.Unlinkat(pfd, base, 0)
		}
		rep.Made++
		return unix.Symlinkat(l.Target, pfd, base)
	}
	if exists && st.Size == l.Size+l.Zeros && kindOf(st.Mode) == KindFile {
		if same, err := hasSum(pfd, base, l.Sum, p.now()); err != nil {
			return fmt.Errorf("%s: %w", l.Path, err)
		} else if same {
			rep.Unchanged++
			return nil
		}
	}
	type from struct {
		fd  int
		rel string
	}
	var cands []from
	if l.Src != "" && srcFd >= 0 {
		cands = append(cands, from{srcFd, l.Src})
	}
	if cmFd >= 0 {
		if l.Name != "" {
			cands = append(cands, from{cmFd, l.Name})
		}
		cands = append(cands, from{cmFd, "by-sum/" + l.Sum})
	}
	for _, c := range cands {
		ok, err := p.copyVerified(c.fd, c.rel, pfd, base, l)
		if err != nil {
			return fmt.Errorf("%s: %w", l.Path, err)
		}
		if ok {
			rep.Copied++
			rep.Bytes += l.Size + l.Zeros
			return nil
		}
	}
	return fmt.Errorf("%s: the version with checksum %s is neither in the source tree (it changed since) nor in the cmroot (it expired): raise --cm-retain", l.Path, l.Sum)
}

// hasSum says whether the file base of pfd has checksum sum.
func hasSum(pfd int, base, sum string, now time.Time) (bool, error) {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	if s, ok := cachedSum(fd); ok {
		return s == sum, nil
	}
	s, err := hashReader(f, -1, nil)
	if err != nil {
		return false, err
	}
	cacheSum(fd, s, now)
	return s == sum, nil
}

// copyVerified copies the first l.Size bytes of rel (beneath dfd) to the
// file base of pfd, through a temporary file that is renamed into place
// only when the bytes have checksum l.Sum. ok is false when rel is not
// there, too short, or has other bytes.
func (p *plan) copyVerified(dfd int, rel string, pfd int, base string, l FileLine) (bool, error) {
	fd, err := beneath.Open(dfd, rel, unix.O_RDONLY|unix.O_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	if kindOf(st.Mode) != KindFile || st.Size < l.Size {
		return false, nil
	}
	r, done, err := contentAt(p.remote, "/proc/self/fd/"+strconv.Itoa(fd), fd, st.Size)
	if err != nil {
		return false, err
	}
	defer done()
	tmp := tempPrefix + strconv.FormatInt(p.now().UnixNano(), 36)
	ofd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, err
	}
	out := os.NewFile(uintptr(ofd), tmp)
	defer out.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(out, h), io.LimitReader(r, l.Size), make([]byte, 1<<20))
	if err == nil && n != l.Size {
		err = io.ErrUnexpectedEOF
	}
	if err == nil && l.Zeros > 0 {
		// The zeros stay a hole, as in the original.
		io.Copy(h, zeroReader(l.Zeros))
		err = out.Truncate(l.Size + l.Zeros)
	}
	if err != nil || hex.EncodeToString(h.Sum(nil)) != l.Sum {
		unix.Unlinkat(pfd, tmp, 0)
		return false, err
	}
	if err := finishCopy(out, &st); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return false, err
	}
	if err := unix.Renameat(pfd, tmp, pfd, base); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return false, err
	}
	return true, nil
}
