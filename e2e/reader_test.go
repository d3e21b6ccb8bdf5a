package e2e

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// TestReaderMount: `tierfs mount --role reader` shows every segment a
// leader shipped as a read-only log dir: byte-exact through the store,
// copied whole by cp and tar, changes refused, and a segment shipped
// later appears within the poll interval.
func TestReaderMount(t *testing.T) {
	requireRoot(t)
	for _, r := range remotes(t) {
		t.Run(r.name, func(t *testing.T) {
			dir, backing, mnt := mountDirs(t)
			bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 2, Segments: 4, Batches: 30, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
			if err != nil {
				t.Fatal(err)
			}
			startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", mnt)
			seg := func(p string, i int) string {
				return filepath.Join(p, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][i]))
			}
			if out, code := tierfs(t, nil, "evict", seg(mnt, 0)); code != 0 {
				t.Fatalf("evict: %s", out)
			}
			if out, code := tierfs(t, nil, "ship", filepath.Join(mnt, "orders-1", fmt.Sprintf("%020d.log", bases["orders-1"][0]))); code != 0 {
				t.Fatalf("ship: %s", out)
			}
			want := sums(t, mnt)

			rmnt := filepath.Join(dir, "reader")
			os.Mkdir(rmnt, 0o755)
			rm := startMount(t, r.env, "--role", "reader", "--remote", r.url, "--follow-interval", "300ms", rmnt)
			got := sums(t, rmnt)
			for _, rel := range []string{
				"orders-0/" + filepath.Base(seg(mnt, 0)),
				fmt.Sprintf("orders-1/%020d.log", bases["orders-1"][0]),
				fmt.Sprintf("orders-1/%020d.index", bases["orders-1"][0]),
				fmt.Sprintf("orders-1/%020d.timeindex", bases["orders-1"][0]),
			} {
				if got[rel] == ([32]byte{}) || got[rel] != want[rel] {
					t.Errorf("%s: reader %x, leader %x", rel, got[rel], want[rel])
				}
			}
			if _, ok := got["orders-0/"+filepath.Base(seg(mnt, 1))]; ok {
				t.Error("the reader shows a segment that was never shipped")
			}
			// Analytics tools copy it whole.
			cpDst := filepath.Join(dir, "copied")
			if out, err := exec.Command("cp", "-r", filepath.Join(rmnt, "orders-0"), cpDst).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
			if b, _ := os.ReadFile(filepath.Join(cpDst, filepath.Base(seg(mnt, 0)))); sha256.Sum256(b) != want["orders-0/"+filepath.Base(seg(mnt, 0))] {
				t.Error("cp -r copied other bytes")
			}
			if out, err := exec.Command("tar", "-C", rmnt, "-cf", filepath.Join(dir, "r.tar"), ".").CombinedOutput(); err != nil {
				t.Fatalf("tar: %v %s", err, out)
			}
			// Read-only.
			err = os.WriteFile(filepath.Join(rmnt, "orders-0", "x"), []byte("x"), 0o644)
			if !errors.Is(err, syscall.EROFS) {
				t.Errorf("create on a reader mount: %v", err)
			}
			if err := os.Remove(seg(rmnt, 0)); !errors.Is(err, syscall.EROFS) {
				t.Errorf("unlink on a reader mount: %v", err)
			}
			// A segment shipped now appears.
			if out, code := tierfs(t, nil, "ship", seg(mnt, 1)); code != 0 {
				t.Fatalf("ship: %s", out)
			}
			waitFor(t, 10*time.Second, "the new segment on the reader", func() bool {
				b, err := os.ReadFile(seg(rmnt, 1))
				return err == nil && sha256.Sum256(b) == want["orders-0/"+filepath.Base(seg(mnt, 1))]
			}, rm.Log)
			if strings.Contains(rm.Log(), "level=ERROR") {
				t.Errorf("the reader logged errors:\n%s", rm.Log())
			}
		})
	}
}

// TestCopyToolsReadEvictedFiles: cp, rsync and tar, which look for holes
// with SEEK_DATA, copy an evicted segment byte-exact, not as the holes
// its backing file is.
func TestCopyToolsReadEvictedFiles(t *testing.T) {
	requireRoot(t)
	r := remotes(t)[0]
	dir, backing, mnt := mountDirs(t)
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 3, Batches: 60, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
	if err != nil {
		t.Fatal(err)
	}
	startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", mnt)
	seg := filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][0]))
	want := sums(t, mnt)["orders-0/"+filepath.Base(seg)]
	if out, code := tierfs(t, nil, "evict", seg); code != 0 {
		t.Fatalf("evict: %s", out)
	}
	// What they ask: the data starts at 0, the only hole is at the end.
	f, err := os.Open(seg)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	data, derr := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA)
	hole, herr := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE)
	_, eerr := unix.Seek(int(f.Fd()), fi.Size(), unix.SEEK_DATA)
	f.Close()
	if data != 0 || derr != nil || hole != fi.Size() || herr != nil || !errors.Is(eerr, unix.ENXIO) {
		t.Errorf("SEEK_DATA 0: %d %v; SEEK_HOLE 0: %d %v (size %d); SEEK_DATA at the end: %v", data, derr, hole, herr, fi.Size(), eerr)
	}
	for name, args := range map[string][]string{
		"cp":                    {"cp", seg, filepath.Join(dir, "cp")},
		"cp --sparse=always":    {"cp", "--sparse=always", seg, filepath.Join(dir, "cp-sparse")},
		"rsync --sparse":        {"rsync", "--sparse", seg, filepath.Join(dir, "rsync")},
		"tar --sparse (create)": {"tar", "--sparse", "-C", filepath.Dir(seg), "-cf", filepath.Join(dir, "seg.tar"), filepath.Base(seg)},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", name, err, out)
		}
	}
	if out, err := exec.Command("tar", "-C", dir, "-xf", filepath.Join(dir, "seg.tar")).CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v %s", err, out)
	}
	for _, f := range []string{"cp", "cp-sparse", "rsync", filepath.Base(seg)} {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		if sha256.Sum256(b) != want {
			t.Errorf("%s: copied other bytes (%d bytes)", f, len(b))
		}
	}
}
