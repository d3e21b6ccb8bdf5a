package cm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/testenv"
)

// sim makes changes to a tree the way fs does through a mount: each
// between Enter and leave, the ones that lose data through the Manager.
// It keeps a model of the tree (path → content, "/" suffix for dirs).
type sim struct {
	t     *testing.T
	m     *Manager
	root  string
	model map[string]string
}

func newSim(t *testing.T, cfg Config) *sim {
	t.Helper()
	root := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	m := New(cfg)
	if err := m.Attach(root, filepath.Join(t.TempDir(), "cmroot")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &sim{t: t, m: m, root: root, model: map[string]string{}}
}

// do runs fn with a descriptor of rel's parent directory and its name.
func (s *sim) do(rel string, fn func(dfd int, name string) error) error {
	s.t.Helper()
	leave, err := s.m.Enter()
	if err != nil {
		s.t.Fatal(err)
	}
	defer leave()
	dfd, err := unix.Open(filepath.Join(s.root, path.Dir(rel)), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return fn(dfd, path.Base(rel))
}

func (s *sim) must(err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatal(err)
	}
}

func (s *sim) mkdir(rel string) {
	s.must(s.do(rel, func(dfd int, name string) error {
		if err := unix.Mkdirat(dfd, name, 0o755); err != nil {
			return err
		}
		s.m.Created(rel, KindDir, "")
		return nil
	}))
	s.model[rel+"/"] = ""
}

// write writes data at off into rel (creating it), as one open: a write
// into existing bytes retains the original first.
func (s *sim) write(rel string, off int64, data []byte) {
	s.must(s.do(rel, func(dfd int, name string) error {
		fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o644)
		created := err == nil
		if err != nil {
			if fd, err = unix.Openat(dfd, name, unix.O_RDWR, 0); err != nil {
				return err
			}
		}
		defer unix.Close(fd)
		if created {
			s.m.Created(rel, KindFile, "")
		}
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		overwrote := off < st.Size
		if overwrote {
			if err := s.m.Overwrite("/proc/self/fd/"+strconv.Itoa(fd), rel); err != nil {
				return err
			}
		}
		if _, err := unix.Pwrite(fd, data, off); err != nil {
			return err
		}
		var after unix.Stat_t
		unix.Fstat(fd, &after)
		s.m.Written(rel, st.Size, after.Size, overwrote)
		return nil
	}))
	old := []byte(s.model[rel])
	if int64(len(old)) < off+int64(len(data)) {
		old = append(old, make([]byte, off+int64(len(data))-int64(len(old)))...)
	}
	copy(old[off:], data)
	s.model[rel] = string(old)
}

func (s *sim) truncate(rel string, size int64) {
	s.must(s.do(rel, func(dfd int, name string) error {
		fd, err := unix.Openat(dfd, name, unix.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		if size < st.Size {
			if err := s.m.Truncate("/proc/self/fd/"+strconv.Itoa(fd), rel, size); err != nil {
				return err
			}
		}
		if err := unix.Ftruncate(fd, size); err != nil {
			return err
		}
		if size > st.Size {
			s.m.Written(rel, st.Size, size, false)
		}
		return nil
	}))
	old := []byte(s.model[rel])
	if int64(len(old)) > size {
		old = old[:size]
	} else {
		old = append(old, make([]byte, size-int64(len(old)))...)
	}
	s.model[rel] = string(old)
}

func (s *sim) unlink(rel string) {
	s.must(s.do(rel, func(dfd int, name string) error { return s.m.Unlink(dfd, name, rel) }))
	delete(s.model, rel)
}

func (s *sim) rmdir(rel string) {
	s.must(s.do(rel, func(dfd int, name string) error { return s.m.Rmdir(dfd, name, rel) }))
	delete(s.model, rel+"/")
}

func (s *sim) rename(from, to string) {
	s.must(s.do(from, func(odfd int, oname string) error {
		ndfd, err := unix.Open(filepath.Join(s.root, path.Dir(to)), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(ndfd)
		return s.m.Rename(odfd, oname, from, ndfd, path.Base(to), to, 0)
	}))
	moved := map[string]string{}
	for k, v := range s.model {
		if k == from || k == from+"/" || strings.HasPrefix(k, from+"/") {
			moved[to+k[len(from):]] = v
			delete(s.model, k)
		}
	}
	for k, v := range moved {
		s.model[k] = v
	}
}

// snapshot copies the model.
func (s *sim) snapshot() map[string]string {
	c := make(map[string]string, len(s.model))
	for k, v := range s.model {
		c[k] = v
	}
	return c
}

// readTree reads a directory into the model's form.
func readTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		if d.IsDir() {
			out[rel+"/"] = ""
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffTrees(want, got map[string]string) string {
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		w, wok := want[k]
		g, gok := got[k]
		switch {
		case !wok:
			fmt.Fprintf(&b, "  extra %s\n", k)
		case !gok:
			fmt.Fprintf(&b, "  missing %s\n", k)
		case w != g:
			fmt.Fprintf(&b, "  %s: %d bytes sha %s, want %d bytes sha %s\n", k, len(g), short(g), len(w), short(w))
		}
	}
	return b.String()
}

func short(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:4])
}

func TestDeleteIsRetainedAndRestored(t *testing.T) {
	s := newSim(t, Config{})
	s.mkdir("orders-0")
	s.write("orders-0/00000000000000000000.log", 0, bytes.Repeat([]byte("segment "), 10000))
	s.write("orders-0/00000000000000000000.index", 0, []byte("index"))
	before := s.snapshot()
	// rm -rf orders-0
	s.unlink("orders-0/00000000000000000000.log")
	s.unlink("orders-0/00000000000000000000.index")
	s.rmdir("orders-0")
	if _, err := os.Stat(filepath.Join(s.root, "orders-0")); !os.IsNotExist(err) {
		t.Fatal("not deleted")
	}
	s.m.flushFiler()
	sum := sha256.Sum256([]byte(before["orders-0/00000000000000000000.log"]))
	kept := filepath.Join(s.m.Dir(), "files", "orders-0", "00000000000000000000.log_"+hex.EncodeToString(sum[:]))
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("original not retained by path and checksum: %v", err)
	}
	at, err := s.m.RestorePoint("orders-0")
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := s.m.Events("", 0, time.Time{}, 0)
	if at != evs[len(evs)-4].ID {
		t.Fatalf("restore point %d: want just before the rm -rf (events %v)", at, evs)
	}
	// Elsewhere, then in place.
	other := t.TempDir()
	if _, err := s.m.Restore("orders-0", at, other); err != nil {
		t.Fatal(err)
	}
	if d := diffTrees(before, readTree(t, other)); d != "" {
		t.Fatalf("restored elsewhere:\n%s", d)
	}
	rep, err := s.m.Restore("orders-0", at, s.root)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffTrees(before, readTree(t, s.root)); d != "" || rep.Copied != 2 {
		t.Fatalf("restored in place (%+v):\n%s", rep, d)
	}
}

func TestSameContentIsKeptOnce(t *testing.T) {
	s := newSim(t, Config{})
	for i := range 5 {
		s.write(fmt.Sprintf("f%d", i), 0, []byte("same bytes"))
		s.unlink(fmt.Sprintf("f%d", i))
	}
	s.m.flushFiler()
	ents, _ := os.ReadDir(filepath.Join(s.m.Dir(), "by-sum"))
	if len(ents) != 1 || s.m.Stats().Deduplicated.Load() != 4 {
		t.Fatalf("%d retained, %d deduplicated; want 1 and 4", len(ents), s.m.Stats().Deduplicated.Load())
	}
	left, _ := os.ReadDir(filepath.Join(s.m.Dir(), "tmp"))
	if len(left) != 0 {
		t.Fatalf("tmp not empty: %v", left)
	}
}

func TestExcludedPathsAreNotTracked(t *testing.T) {
	s := newSim(t, Config{Exclude: []string{"*.tmp"}})
	s.write("recovery-point-offset-checkpoint", 0, []byte("0\n1\norders 0 100\n"))
	s.write("recovery-point-offset-checkpoint.tmp", 0, []byte("0\n1\norders 0 200\n"))
	s.rename("recovery-point-offset-checkpoint.tmp", "recovery-point-offset-checkpoint")
	evs, _ := s.m.Events("", 0, time.Time{}, 0)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type+" "+ev.Path)
	}
	want := "[create recovery-point-offset-checkpoint write recovery-point-offset-checkpoint rename recovery-point-offset-checkpoint.tmp]"
	if fmt.Sprint(types) != want {
		t.Fatalf("events %v, want %s", types, want)
	}
	if !evs[2].FromUntracked || evs[2].Over != KindFile || evs[2].Name == "" {
		t.Fatalf("rename over from an excluded path: %+v", evs[2])
	}
	// The tree before the rename has the old checkpoint and no .tmp.
	other := t.TempDir()
	if _, err := s.m.Restore("recovery-point-offset-checkpoint", evs[1].ID, other); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(other, "recovery-point-offset-checkpoint")); string(b) != "0\n1\norders 0 100\n" {
		t.Fatalf("restored %q", b)
	}
}

// TestDumpsLoadExactStates is the property: random writes, truncates,
// renames and deletes, with a dump after some of them; loading each dump
// (taken and loaded only after the tree moved on) gives exactly the tree
// at its event, both as a bootstrap onto an empty dir and as a chain of
// incremental dumps onto one replica.
func TestDumpsLoadExactStates(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomDumps(t, seed, 120) })
	}
}

func randomDumps(t *testing.T, seed uint64, steps int) {
	s := newSim(t, Config{})
	rng := rand.New(rand.NewPCG(seed, 7))
	type point struct {
		id    uint64
		model map[string]string
	}
	var points []point
	names := []string{"a", "b", "c", "d/x", "d/y", "e/z"}
	exists := func(p string) bool { _, ok := s.model[p]; return ok }
	dirOK := func(p string) bool {
		d := path.Dir(p)
		return d == "." || exists(d+"/")
	}
	for i := 0; i < steps; i++ {
		p := names[rng.IntN(len(names))]
		q := names[rng.IntN(len(names))]
		switch op := rng.IntN(10); {
		case !dirOK(p):
			s.mkdir(path.Dir(p))
		case op < 3 || !exists(p):
			data := make([]byte, 1+rng.IntN(3000))
			for j := range data {
				data[j] = byte('a' + rng.IntN(26))
			}
			off := int64(0)
			if exists(p) {
				off = int64(rng.IntN(len(s.model[p]) + 1))
			}
			s.write(p, off, data)
		case op < 4:
			s.truncate(p, int64(rng.IntN(len(s.model[p])+1)))
		case op < 5:
			// Preallocate (a sparse tail), as Kafka does an index; a
			// later cut inside the hole loses nothing but zeros.
			if n := len(s.model[p]); rng.IntN(2) == 0 {
				s.truncate(p, int64(n+1+rng.IntN(20000)))
			} else {
				s.truncate(p, int64(n-rng.IntN(n/2+1)))
			}
		case op < 7 && p != q && dirOK(q) && !exists(q+"/"):
			s.rename(p, q)
		case op < 9:
			s.unlink(p)
		default:
			// An empty directory goes, or a file is rewritten whole.
			if d := path.Dir(p); d != "." && exists(d+"/") && len(s.under(d)) == 0 {
				s.rmdir(d)
			} else {
				s.write(p, 0, []byte("rewritten"))
			}
		}
		if rng.IntN(8) == 0 {
			points = append(points, point{s.m.log.lastID(), s.snapshot()})
		}
	}
	points = append(points, point{s.m.log.lastID(), s.snapshot()})
	replica := t.TempDir()
	var from uint64 = 1
	for _, pt := range points {
		boot := t.TempDir()
		if _, err := s.m.Dump(boot, 0, pt.id, true, s.root); err != nil {
			t.Fatalf("bootstrap dump at %d: %v", pt.id, err)
		}
		empty := t.TempDir()
		if _, err := Load(boot, empty, LoadOptions{}); err != nil {
			t.Fatalf("load bootstrap %d: %v", pt.id, err)
		}
		if d := diffTrees(pt.model, readTree(t, empty)); d != "" {
			t.Fatalf("bootstrap at event %d:\n%s", pt.id, d)
		}
		if pt.id < from {
			continue // no event since the last point
		}
		inc := t.TempDir()
		if _, err := s.m.Dump(inc, from, pt.id, false, s.root); err != nil {
			t.Fatalf("dump %d..%d: %v", from, pt.id, err)
		}
		if _, err := Load(inc, replica, LoadOptions{}); err != nil {
			t.Fatalf("load %d..%d: %v", from, pt.id, err)
		}
		if d := diffTrees(pt.model, readTree(t, replica)); d != "" {
			t.Fatalf("replica after %d..%d:\n%s", from, pt.id, d)
		}
		rep, err := Load(inc, replica, LoadOptions{})
		if err != nil || rep.Copied+rep.Removed+rep.Made != 0 {
			t.Fatalf("loading %d..%d again changed something: %+v %v", from, pt.id, rep, err)
		}
		from = pt.id + 1
	}
}

// under lists the model's entries inside dir.
func (s *sim) under(dir string) []string {
	var out []string
	for k := range s.model {
		if strings.HasPrefix(k, dir+"/") {
			out = append(out, k)
		}
	}
	return out
}

// TestTrimOfAPreallocatedFileCopiesNothing: Kafka preallocates each index
// (10 MiB of hole) and trims it at the roll to its entries, which mostly
// end inside a block. The trim retains no copy and hashes nothing; the
// version before it is still restored exactly (its zeros as a hole).
func TestTrimOfAPreallocatedFileCopiesNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries int // bytes of entries in the second block
	}{
		{"at a block's end", 4096},
		{"inside a block", 184},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, Config{})
			s.write("00.index", 0, bytes.Repeat([]byte{7}, 4096))
			s.truncate("00.index", 10<<20)
			s.write("00.index", 4096, bytes.Repeat([]byte{8}, tc.entries))
			before := s.snapshot()
			at := s.m.log.lastID()
			cut := int64(4096 + tc.entries)
			s.truncate("00.index", cut)
			evs, _ := s.m.Events("00.index", at+1, time.Time{}, 0)
			if len(evs) != 1 || !evs[0].ZeroTail || evs[0].Retains() || evs[0].OldSize != 10<<20 {
				t.Fatalf("trim event %+v", evs)
			}
			if ents, _ := os.ReadDir(filepath.Join(s.m.Dir(), "tmp")); len(ents) != 0 {
				t.Fatalf("something was copied: %v", ents)
			}
			dump, out := t.TempDir(), t.TempDir()
			if _, err := s.m.Dump(dump, 0, at, true, s.root); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(filepath.Join(dump, "_files")); !strings.Contains(string(b), fmt.Sprintf("#%d+%d#", cut, 10<<20-cut)) {
				t.Fatalf("_files: %s", b)
			}
			if _, err := Load(dump, out, LoadOptions{}); err != nil {
				t.Fatal(err)
			}
			if d := diffTrees(before, readTree(t, out)); d != "" {
				t.Fatalf("the version before the trim:\n%s", d)
			}
			var st unix.Stat_t
			unix.Stat(filepath.Join(out, "00.index"), &st)
			if st.Blocks*512 > 64<<10 {
				t.Errorf("the loaded file's zeros were written out: %d bytes allocated", st.Blocks*512)
			}
		})
	}
}

// TestTrimThatCutsBytesRetainsThem: a cut whose tail has a byte that is
// not zero, in the cut block, in a later block, or past the scan limit,
// retains a copy of the original.
func TestTrimThatCutsBytesRetainsThem(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int64 // where the last non-zero byte is
		size int64 // the file's size before the cut
	}{
		{"in the cut block", 300, 10 << 20},
		{"in a later block", 5 << 20, 10 << 20},
		{"at the end", 10<<20 - 1, 10 << 20},
		{"past the scan limit", 200 + maxZeroScan + 8192, 200 + maxZeroScan + 8193},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, Config{})
			s.write("00.index", 0, bytes.Repeat([]byte{7}, 200))
			s.truncate("00.index", tc.size)
			if tc.name == "past the scan limit" {
				// Zeros written out, not a hole: data all the way.
				s.write("00.index", 200, make([]byte, maxZeroScan+8192))
			}
			s.write("00.index", tc.at, []byte{9})
			before := s.snapshot()
			at := s.m.log.lastID()
			s.truncate("00.index", 200)
			evs, _ := s.m.Events("00.index", at+1, time.Time{}, 0)
			if len(evs) != 1 || evs[0].ZeroTail || !evs[0].Retains() {
				t.Fatalf("trim event %+v", evs)
			}
			s.m.Flush()
			dump, out := t.TempDir(), t.TempDir()
			if _, err := s.m.Dump(dump, 0, at, true, s.root); err != nil {
				t.Fatal(err)
			}
			if _, err := Load(dump, out, LoadOptions{}); err != nil {
				t.Fatal(err)
			}
			if d := diffTrees(before, readTree(t, out)); d != "" {
				t.Fatalf("the version before the trim:\n%s", d)
			}
		})
	}
}

// fakeRemote serves the bytes of "evicted" files (here: any file with
// the user.evicted xattr) from memory.
type fakeRemote struct{ bytes map[string][]byte }

func (f fakeRemote) OpenIfRemote(path string) (io.ReaderAt, io.Closer, bool, error) {
	buf := make([]byte, 256)
	n, err := unix.Getxattr(path, "user.evicted", buf)
	if err != nil {
		return nil, nil, false, nil
	}
	return bytes.NewReader(f.bytes[string(buf[:n])]), io.NopCloser(nil), true, nil
}

// TestCMRootOnAnotherFileSystem: with the cmroot elsewhere (tmpfs here),
// a deleted file is copied there; an evicted one is copied from the store,
// not as the hole its local file is.
func TestCMRootOnAnotherFileSystem(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		testenv.Missing(t, "no /dev/shm")
	}
	content := bytes.Repeat([]byte("remote bytes "), 1000)
	root := filepath.Join(t.TempDir(), "tree")
	os.MkdirAll(root, 0o755)
	cmroot, err := os.MkdirTemp("/dev/shm", "cmroot-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(cmroot)
	m := New(Config{Remote: fakeRemote{map[string][]byte{"seg": content}}})
	if err := m.Attach(root, cmroot); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seg := filepath.Join(root, "0.log")
	os.WriteFile(seg, nil, 0o644)
	os.Truncate(seg, int64(len(content))) // the evicted file: all hole
	if err := unix.Setxattr(seg, "user.evicted", []byte("seg"), 0); err != nil {
		testenv.Missing(t, "no user xattrs here: %v", err)
	}
	os.WriteFile(filepath.Join(root, "local"), []byte("local bytes"), 0o644)
	dfd, _ := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	defer unix.Close(dfd)
	leave, _ := m.Enter()
	for _, name := range []string{"0.log", "local"} {
		if err := m.Unlink(dfd, name, name); err != nil {
			t.Fatal(err)
		}
	}
	leave()
	evs, _ := m.Events("", 0, time.Time{}, 0)
	for _, ev := range evs {
		b, err := os.ReadFile(filepath.Join(cmroot, ev.Name))
		want := map[string][]byte{"0.log": content, "local": []byte("local bytes")}[ev.Path]
		if err != nil || !bytes.Equal(b, want) {
			t.Errorf("%s retained as %q (%v), want %d bytes of its content", ev.Path, b[:min(len(b), 20)], err, len(want))
		}
	}
}

// TestFilingAfterItsDirWasRemoved: the filer makes each directory of
// files/ once; one the cleaner removed since is made again.
func TestFilingAfterItsDirWasRemoved(t *testing.T) {
	s := newSim(t, Config{})
	s.mkdir("orders-0")
	s.write("orders-0/a.log", 0, []byte("first"))
	s.unlink("orders-0/a.log")
	s.m.flushFiler()
	dir := filepath.Join(s.m.Dir(), "files", "orders-0")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	s.write("orders-0/b.log", 0, []byte("second"))
	s.unlink("orders-0/b.log")
	s.m.flushFiler()
	if n := s.m.Stats().Errors.Load(); n != 0 {
		t.Fatalf("%d errors", n)
	}
	sum := sha256.Sum256([]byte("second"))
	if _, err := os.Stat(filepath.Join(dir, "b.log_"+hex.EncodeToString(sum[:]))); err != nil {
		t.Fatalf("not filed: %v", err)
	}
}
