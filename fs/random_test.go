package fs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/tierfs/tierfs/fs/posixtest"
)

// TestRandomOpsLockstep applies one long random sequence of file operations
// to a mount and, in lockstep, to a plain directory, and requires identical
// results after every step: each operation's outcome (errno, bytes read)
// and the whole listing with contents.
func TestRandomOpsLockstep(t *testing.T) {
	for _, passthrough := range []bool{true, false} {
		t.Run(fmt.Sprintf("passthrough=%v", passthrough), func(t *testing.T) {
			srv := mountTest(t, "", passthrough)
			native := t.TempDir()
			seed := uint64(os.Getpid())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 42))
			w := newWorld(rng)
			steps := 1500
			if testing.Short() {
				steps = 300
			}
			for i := range steps {
				op := w.next()
				want := op.apply(native)
				got := op.apply(srv.Mountpoint)
				if want != got {
					t.Fatalf("step %d %s:\n  native: %s\n  mount:  %s", i, op, want, got)
				}
				if wl, gl := listing(native), listing(srv.Mountpoint); wl != gl {
					t.Fatalf("step %d %s: listings differ:\n  native: %s\n  mount:  %s", i, op, wl, gl)
				}
			}
		})
	}
}

// world picks operations over a small set of names, so that they collide
// often (renames over existing files, unlinks of open names, and so on).
type world struct {
	rng   *rand.Rand
	names []string
}

func newWorld(rng *rand.Rand) *world {
	return &world{rng: rng, names: []string{"a", "b", "c", "d/a", "d/b", "d/e/f", "e", "d/e"}}
}

type op struct {
	kind      string
	path, to  string
	off, size int64
	data      []byte
}

func (o op) String() string {
	return fmt.Sprintf("%s(%s %s off=%d size=%d data=%d)", o.kind, o.path, o.to, o.off, o.size, len(o.data))
}

func (w *world) next() op {
	kinds := []string{"create", "write", "write", "append", "truncate", "rename", "unlink", "read", "read", "mkdir", "rmdir", "link", "otrunc"}
	o := op{kind: kinds[w.rng.IntN(len(kinds))], path: w.names[w.rng.IntN(len(w.names))]}
	o.to = w.names[w.rng.IntN(len(w.names))]
	o.off = int64(w.rng.IntN(200000))
	o.size = int64(w.rng.IntN(300000))
	n := w.rng.IntN(70000)
	o.data = make([]byte, n)
	for i := range o.data {
		o.data[i] = byte(w.rng.Uint32())
	}
	return o
}

// apply runs the operation under root and describes the outcome.
func (o op) apply(root string) string {
	p := filepath.Join(root, o.path)
	switch o.kind {
	case "create":
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err == nil {
			f.Close()
		}
		return outcome(err)
	case "otrunc":
		f, err := os.OpenFile(p, os.O_TRUNC|os.O_WRONLY, 0)
		if err == nil {
			_, err = f.Write(o.data[:len(o.data)/4])
			f.Close()
		}
		return outcome(err)
	case "write":
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			return outcome(err)
		}
		defer f.Close()
		_, err = f.WriteAt(o.data, o.off)
		return outcome(err)
	case "append":
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return outcome(err)
		}
		defer f.Close()
		_, err = f.Write(o.data)
		return outcome(err)
	case "truncate":
		return outcome(os.Truncate(p, o.size))
	case "rename":
		return outcome(syscall.Rename(p, filepath.Join(root, o.to)))
	case "unlink":
		return outcome(syscall.Unlink(p))
	case "rmdir":
		return outcome(syscall.Rmdir(p))
	case "mkdir":
		return outcome(syscall.Mkdir(p, 0o755))
	case "link":
		return outcome(os.Link(p, filepath.Join(root, o.to)))
	case "read":
		f, err := os.Open(p)
		if err != nil {
			return outcome(err)
		}
		defer f.Close()
		buf := make([]byte, 50000)
		n, err := f.ReadAt(buf, o.off)
		if err != nil && n == 0 {
			return outcome(err)
		}
		return "read " + posixtest.Sum(buf[:n])
	}
	panic(o.kind)
}

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// listing describes every entry below root with its kind, size, link count
// and content digest.
func listing(root string) string {
	var out []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(root, p)
		if err != nil {
			out = append(out, rel+":"+outcome(err))
			return nil
		}
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			out = append(out, rel+":"+outcome(err))
			return nil
		}
		if d.IsDir() {
			out = append(out, rel+"/")
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			out = append(out, rel+":"+outcome(err))
			return nil
		}
		nlink := info.Sys().(*syscall.Stat_t).Nlink
		out = append(out, fmt.Sprintf("%s:%d:%d:%s:%v", rel, info.Size(), nlink, posixtest.Sum(data), bytes.Count(data, []byte{0}) == len(data)))
		return nil
	})
	sort.Strings(out)
	return strings.Join(out, " ")
}
