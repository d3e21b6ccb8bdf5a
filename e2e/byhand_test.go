package e2e

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// tierfs runs the binary and returns its combined output and exit code.
func tierfs(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(tierfsBin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("tierfs %v: %v", args, err)
	}
	return string(out), code
}

// TestByHandAndDeletions: tierfs ship and evict reach the running mount;
// what the broker deletes through the mount (rename to .deleted, then
// unlink) goes from the store too.
func TestByHandAndDeletions(t *testing.T) {
	requireRoot(t)
	for _, r := range remotes(t) {
		t.Run(r.name, func(t *testing.T) {
			dir, backing, mnt := mountDirs(t)
			bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 5, Batches: 30, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
			if err != nil {
				t.Fatal(err)
			}
			before := sums(t, backing)
			// Nothing ships by itself: only by hand.
			m := startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", mnt)
			seg := func(i int) string {
				return filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][i]))
			}
			storeEnv := append([]string{"TIERFS_STORE=" + r.url}, r.env...)
			objects := func() string {
				out, code := tierfs(t, storeEnv, "store", "ls", "orders-0/")
				if code != 0 {
					t.Fatalf("store ls: %s", out)
				}
				return out
			}
			if strings.Contains(objects(), ".log") {
				t.Fatal("shipped before it was asked")
			}

			out, code := tierfs(t, nil, "ship", seg(0), seg(1))
			if code != 0 || !strings.Contains(out, seg(0)+": shipped") || !strings.Contains(out, seg(1)+": shipped") {
				t.Fatalf("ship: %d %s", code, out)
			}
			if state(seg(0)) != "shipped" {
				t.Fatalf("state %s", state(seg(0)))
			}
			out, code = tierfs(t, nil, "evict", seg(1))
			if code != 0 || !strings.Contains(out, seg(1)+": remote") {
				t.Fatalf("evict: %d %s", code, out)
			}
			var st syscall.Stat_t
			syscall.Stat(filepath.Join(backing, "orders-0", filepath.Base(seg(1))), &st)
			if st.Blocks*512 > 8192 {
				t.Errorf("evicted by hand but %d bytes still allocated", st.Blocks*512)
			}
			// Unsafe segments are refused, naming the reason; other paths too.
			out, code = tierfs(t, nil, "ship", seg(4))
			if code != 1 || !strings.Contains(out, "active segment") {
				t.Errorf("ship of the active segment: %d %s", code, out)
			}
			out, code = tierfs(t, nil, "ship", filepath.Join(dir, "elsewhere.log"))
			if code != 2 || !strings.Contains(out, "not on a tierfs mount") {
				t.Errorf("ship off the mount: %d %s", code, out)
			}
			out, code = tierfs(t, nil, "status", mnt)
			if code != 0 || !strings.Contains(out, "LAST_ERROR") || !strings.Contains(out, "orders-0") {
				t.Errorf("status: %d %s", code, out)
			}

			// The broker deletes segment 1: renamed, still readable, then
			// unlinked; its objects go, segment 0's stay.
			objs := objects()
			key1 := fmt.Sprintf("%020d-", bases["orders-0"][1])
			if !strings.Contains(objs, key1) {
				t.Fatalf("segment 1 not in the store:\n%s", objs)
			}
			gone := seg(1) + ".deleted"
			if err := os.Rename(seg(1), gone); err != nil {
				t.Fatal(err)
			}
			rel1, _ := filepath.Rel(mnt, seg(1))
			if got := sums(t, filepath.Join(mnt, "orders-0"))[filepath.Base(gone)]; got != before[rel1] {
				t.Error("renamed evicted segment reads other bytes")
			}
			time.Sleep(time.Second) // a few passes: nothing may go yet
			if !strings.Contains(objects(), key1) {
				t.Fatal("objects deleted while the segment still exists")
			}
			if err := os.Remove(gone); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for strings.Contains(objects(), key1) {
				if time.Now().After(deadline) {
					t.Fatalf("objects of the deleted segment still there:\n%s\n%s", objects(), m.Log())
				}
				time.Sleep(200 * time.Millisecond)
			}
			if !strings.Contains(objects(), fmt.Sprintf("%020d-", bases["orders-0"][0])) {
				t.Error("segment 0's objects went too")
			}
			rel0, _ := filepath.Rel(mnt, seg(0))
			if sums(t, mnt)[rel0] != before[rel0] {
				t.Error("segment 0 no longer reads back")
			}
		})
	}
}

// TestUmountWaitsForTransfers: tierfs umount lets a transfer under way
// finish (and starts no new one), refuses when it does not finish in
// --wait, and --force unmounts at once.
func TestUmountWaitsForTransfers(t *testing.T) {
	requireRoot(t)
	r := remotes(t)[0]
	_, backing, mnt := mountDirs(t)
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 4, Batches: 200, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
	if err != nil {
		t.Fatal(err)
	}
	// About 3 MB at 1 MiB/s: a ship takes ~3 s.
	m := startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--ship-rate", "1MiB", mnt)
	seg := filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][0]))
	shipped := make(chan string, 1)
	go func() {
		out, _ := exec.Command(tierfsBin, "ship", seg).CombinedOutput()
		shipped <- string(out)
	}()
	waitFor(t, 20*time.Second, "the ship under way", func() bool { return state(seg) == "shipping" }, m.Log)
	out, code := tierfs(t, nil, "umount", "--wait", "200ms", mnt)
	if code != 1 || !strings.Contains(out, "transfers still under way") || !strings.Contains(out, "--force") {
		t.Fatalf("umount during a transfer with --wait 200ms: %d %s", code, out)
	}
	if !isMount(mnt) {
		t.Fatal("unmounted although it refused")
	}
	out, code = tierfs(t, nil, "umount", "--wait", "1m", mnt)
	if code != 0 {
		t.Fatalf("umount --wait 1m: %d %s\n%s", code, out, m.Log())
	}
	if got := <-shipped; !strings.Contains(got, ": shipped") {
		t.Fatalf("the transfer under way did not finish: %s", got)
	}
	select {
	case <-m.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the mount process did not exit")
	}
	// --force does not wait.
	m = startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--ship-rate", "1MiB", mnt)
	seg1 := filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][1]))
	go exec.Command(tierfsBin, "ship", seg1).Run()
	waitFor(t, 20*time.Second, "the second ship under way", func() bool { return state(seg1) == "shipping" }, m.Log)
	start := time.Now()
	if out, code := tierfs(t, nil, "umount", "--force", mnt); code != 0 {
		t.Fatalf("umount --force: %d %s", code, out)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("umount --force took %v", d)
	}
}

func isMount(p string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	return strings.Contains(string(b), " "+p+" ")
}

// TestHydrateByHand: tierfs hydrate brings an evicted segment back
// through the running mount: same bytes, size and mtime, state shipped;
// it can then be changed, and a handle that read it from the store
// before sees the change.
func TestHydrateByHand(t *testing.T) {
	requireRoot(t)
	for _, r := range remotes(t) {
		t.Run(r.name, func(t *testing.T) {
			_, backing, mnt := mountDirs(t)
			bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 4, Batches: 60, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
			if err != nil {
				t.Fatal(err)
			}
			before := sums(t, backing)
			startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", mnt)
			seg := filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][1]))
			rel, _ := filepath.Rel(mnt, seg)
			fiBefore, _ := os.Stat(seg)
			if out, code := tierfs(t, nil, "evict", seg); code != 0 {
				t.Fatalf("evict: %s", out)
			}
			// A reader that found it remote.
			old, err := os.Open(seg)
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			buf := make([]byte, 16)
			if _, err := old.ReadAt(buf, 0); err != nil {
				t.Fatal(err)
			}
			out, code := tierfs(t, nil, "hydrate", seg)
			if code != 0 || !strings.Contains(out, seg+": shipped") {
				t.Fatalf("hydrate: %d %s", code, out)
			}
			if state(seg) != "shipped" {
				t.Fatalf("state %s", state(seg))
			}
			var st syscall.Stat_t
			syscall.Stat(filepath.Join(backing, rel), &st)
			if st.Blocks*512 < fiBefore.Size() {
				t.Errorf("hydrated, but only %d bytes allocated", st.Blocks*512)
			}
			fi, _ := os.Stat(seg)
			if got := sums(t, mnt)[rel]; got != before[rel] || fi.Size() != fiBefore.Size() || !fi.ModTime().Equal(fiBefore.ModTime()) {
				t.Fatalf("hydrated segment: sum ok %v, size %d (%d), mtime %v (%v)", got == before[rel], fi.Size(), fiBefore.Size(), fi.ModTime(), fiBefore.ModTime())
			}
			// Now local, it can change; the old handle reads the change
			// (not the store's copy), after its page cache is dropped.
			f, err := os.OpenFile(seg, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte("changed!"), 0); err != nil {
				t.Fatalf("write to a hydrated file: %v", err)
			}
			f.Close()
			os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0)
			if _, err := old.ReadAt(buf, 0); err != nil || string(buf[:8]) != "changed!" {
				t.Fatalf("the handle opened while evicted reads %q, %v", buf[:8], err)
			}
			if out, code := tierfs(t, nil, "hydrate", filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][0]))); code != 0 || !strings.Contains(out, ": local") {
				t.Errorf("hydrate of a local segment: %d %s", code, out)
			}
		})
	}
}

// TestWriteToEvictedFile: an evicted segment opened for writing, synced
// and truncated to its own size stays evicted; written, it starts
// coming back; with the store down its writes and truncates still
// return (they go to its catch-up log) and reads of what was written see
// it; tierfs is killed (SIGKILL) in the middle; at the next mount, with
// the store back, the move ends and the file is exactly what a plain
// file would be, local; O_TRUNC of an evicted file needs no download.
func TestWriteToEvictedFile(t *testing.T) {
	requireRoot(t)
	r := remotes(t)[1] // S3: the server can be stopped
	_, backing, mnt := mountDirs(t)
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 6, Batches: 60, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", "--cache-bytes", "8MiB", mnt}
	m := startMount(t, r.env, args...)
	seg := func(i int) string {
		return filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][i]))
	}
	model, err := os.ReadFile(seg(1))
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1} {
		if out, code := tierfs(t, nil, "evict", seg(i)); code != 0 {
			t.Fatalf("evict: %s", out)
		}
	}

	// What a broker does to its old segments at start-up and at a clean
	// shutdown changes nothing: open read-write, fsync, a truncate to the
	// size the file has, a write of nothing, close. None brings the file
	// back.
	for _, i := range []int{0, 1} {
		f, err := os.OpenFile(seg(i), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync of an evicted file: %v", err)
		}
		if err := f.Truncate(fi.Size()); err != nil {
			t.Fatalf("truncate of an evicted file to its size: %v", err)
		}
		if _, err := f.WriteAt(nil, 0); err != nil {
			t.Fatalf("empty write: %v", err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(seg(i), fi.Size()); err != nil {
			t.Fatalf("truncate(2) of an evicted file to its size: %v", err)
		}
		if fi2, _ := os.Stat(seg(i)); fi2.Size() != fi.Size() {
			t.Fatalf("size %d after, %d before", fi2.Size(), fi.Size())
		}
		if st := state(seg(i)); st != "remote" {
			t.Fatalf("segment %d is %s after changes that change nothing", i, st)
		}
	}
	noMoves(t, m, backing)

	r.srv.Stop()
	f, err := os.OpenFile(seg(1), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open an evicted file for writing with the store down: %v", err)
	}
	rnd := rand.New(rand.NewPCG(3, 9))
	for i := range 60 {
		off := rnd.Int64N(int64(len(model)) + 4096)
		b := make([]byte, 1+rnd.IntN(9000))
		for j := range b {
			b[j] = byte(rnd.Uint32())
		}
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatalf("write %d with the store down: %v", i, err)
		}
		if end := off + int64(len(b)); end > int64(len(model)) {
			model = append(model, make([]byte, end-int64(len(model)))...)
		}
		copy(model[off:], b)
		if i == 30 {
			if err := f.Truncate(int64(len(model)) - 5000); err != nil {
				t.Fatalf("truncate with the store down: %v", err)
			}
			model = model[:len(model)-5000]
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	if fi, _ := f.Stat(); fi.Size() != int64(len(model)) {
		t.Errorf("size while moving %d, want %d", fi.Size(), len(model))
	}
	if st := state(seg(1)); st != "moving" {
		t.Errorf("state while moving: %s", st)
	}
	f.Close()
	if logs, _ := filepath.Glob(filepath.Join(backing, ".tierfs", "catchup", "*.log")); len(logs) != 1 {
		t.Fatalf("catch-up logs %v, want one", logs)
	}
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.done
	exec.Command("umount", "-l", mnt).Run()
	if err := r.srv.Restart(); err != nil {
		t.Fatal(err)
	}

	m = startMount(t, r.env, args...)
	waitFor(t, 60*time.Second, "the move to end after the restart", func() bool { return state(seg(1)) == "local" }, m.Log)
	got, err := os.ReadFile(seg(1))
	if err != nil || !bytes.Equal(got, model) {
		t.Fatalf("after the move: %d bytes (%v), model %d bytes; equal %v\n%s", len(got), err, len(model), bytes.Equal(got, model), m.Log())
	}
	if ents, _ := os.ReadDir(filepath.Join(backing, ".tierfs", "catchup")); len(ents) != 0 {
		t.Errorf("catch-up logs left: %v", ents)
	}
	if !strings.Contains(m.Log(), "resumed a move a crash interrupted") {
		t.Errorf("the move was not resumed from its log:\n%s", m.Log())
	}

	// With the store up: writes, then reads at once (original bytes under
	// them), then the end.
	f, err = os.OpenFile(seg(0), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(seg(0))
	f.WriteAt([]byte("written while moving"), 100)
	copy(want[100:], "written while moving")
	buf := make([]byte, 300)
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, want[:300]) {
		t.Fatalf("read while moving: %v, equal %v", err, bytes.Equal(buf, want[:300]))
	}
	f.Close()
	waitFor(t, 30*time.Second, "segment 0 local", func() bool { return state(seg(0)) == "local" }, m.Log)
	if got, _ := os.ReadFile(seg(0)); !bytes.Equal(got, want) {
		t.Fatal("segment 0 after its move differs")
	}
	// Concurrent writers, each in its own quarter, and readers, while
	// segment 3 moves (and as the move ends under them).
	if out, code := tierfs(t, nil, "evict", seg(3)); code != 0 {
		t.Fatalf("evict: %s", out)
	}
	want3, err := os.ReadFile(seg(3))
	if err != nil {
		t.Fatal(err)
	}
	quarter := int64(len(want3)) / 4
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wr := rand.New(rand.NewPCG(uint64(w), 77))
		var writes [][2]int64 // off, len
		var datas [][]byte
		for range 150 {
			n := 1 + wr.Int64N(3000)
			off := int64(w)*quarter + wr.Int64N(quarter-n)
			b := make([]byte, n)
			for j := range b {
				b[j] = byte(wr.Uint32())
			}
			writes, datas = append(writes, [2]int64{off, n}), append(datas, b)
			copy(want3[off:], b) // each writer's writes land in order in its own quarter
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			f, err := os.OpenFile(seg(3), os.O_RDWR, 0)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			for i, wo := range writes {
				if _, err := f.WriteAt(datas[i], wo[0]); err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			f, err := os.Open(seg(3))
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			buf := make([]byte, 64<<10)
			for range 100 {
				if _, err := f.ReadAt(buf, wr.Int64N(int64(len(want3))-int64(len(buf)))); err != nil {
					errs <- fmt.Errorf("reader %d: %w", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitFor(t, 30*time.Second, "segment 3 local", func() bool { return state(seg(3)) == "local" }, m.Log)
	if got, _ := os.ReadFile(seg(3)); !bytes.Equal(got, want3) {
		t.Fatal("segment 3 after concurrent writers differs from the model")
	}
	// O_TRUNC of an evicted file: its new bytes, at once.
	if out, code := tierfs(t, nil, "evict", seg(2)); code != 0 {
		t.Fatalf("evict: %s", out)
	}
	if err := os.WriteFile(seg(2), []byte("replaced"), 0o644); err != nil {
		t.Fatalf("O_TRUNC of an evicted file: %v", err)
	}
	if b, _ := os.ReadFile(seg(2)); string(b) != "replaced" {
		t.Fatalf("after O_TRUNC: %q", b)
	}
	waitFor(t, 30*time.Second, "segment 2 local", func() bool { return state(seg(2)) == "local" }, m.Log)
}
