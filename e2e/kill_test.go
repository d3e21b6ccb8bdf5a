package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/fs"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/keylog"
	"golang.org/x/sys/unix"
)

// TestKillDuringTiering kills the mount process (SIGKILL) at 20 random
// moments while it ships and evicts, restarting it each time. After
// every kill, every file whose local bytes are gone has a remote copy
// that holds exactly its bytes; at the end all eligible segments are
// remote, every file reads byte-exact through the mount, and no
// multipart upload or journal is left.
func TestKillDuringTiering(t *testing.T) {
	requireRoot(t)
	dir, backing, mnt := mountDirs(t)
	remoteDir := filepath.Join(dir, "remote")
	bases, err := kafkatest.LogDir{Topic: "events", Partitions: 2, Segments: 8, Batches: 40, Records: 16, ValueSize: 20000, Unflushed: 1, Age: time.Hour}.Write(backing)
	if err != nil {
		t.Fatal(err)
	}
	before := sums(t, backing)
	st, err := store.NewDir(remoteDir)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--backing", backing, "--remote", "file://" + remoteDir, "--ship-after", "1m",
		"--local-retention-bytes", "1", "--tier-interval", "50ms", "--cache-bytes", "8MiB", mnt}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 5))
	killedWith := map[string]int{}
	for i := range 20 {
		m := startMount(t, nil, args...)
		time.Sleep(time.Duration(r.Int64N(int64(700 * time.Millisecond))))
		log := m.Log()
		for _, w := range []string{"msg=shipped", "msg=evicted"} {
			killedWith[w] += strings.Count(log, w)
		}
		m.cmd.Process.Signal(syscall.SIGKILL)
		<-m.done
		exec.Command("umount", "-l", mnt).Run()
		if shipping(backing) {
			killedWith["mid-upload"]++
		}
		checkNothingLost(t, backing, st, before)
		checkCatalog(t, backing, st)
		if t.Failed() {
			t.Fatalf("after kill %d:\n%s", i, log)
		}
	}
	t.Logf("before the kills the mounts logged %d ships and %d evictions; %d kills left an upload half done", killedWith["msg=shipped"], killedWith["msg=evicted"], killedWith["mid-upload"])
	m := startMount(t, nil, args...)
	deadline := time.Now().Add(90 * time.Second)
	for {
		remote := 0
		for p, bs := range bases {
			for _, b := range bs[:len(bs)-2] {
				if state(filepath.Join(mnt, p, fmt.Sprintf("%020d.log", b))) == "remote" {
					remote++
				}
			}
		}
		if remote == 12 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 12 segments remote after 90s:\n%s", remote, m.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := sums(t, mnt)
	for rel, sum := range before {
		if after[rel] != sum {
			t.Errorf("%s differs through the mount", rel)
		}
	}
	if ups, err := st.ListMultipart(context.Background(), ""); err != nil || len(ups) != 0 {
		t.Errorf("leaked uploads: %v %v", ups, err)
	}
	m.stop(t)
	checkCatalog(t, backing, st)
	if ents, _ := os.ReadDir(filepath.Join(backing, ".tierfs", "journal")); len(ents) != 0 {
		t.Errorf("journals left: %v", ents)
	}
}

// checkNothingLost looks at the backing directory with no mount: a .log
// whose bytes were freed must be marked remote, and its object must hold
// exactly the original bytes; any other .log must still hold them.
func checkNothingLost(t *testing.T, backing string, st store.Store, before map[string][32]byte) {
	t.Helper()
	for rel, sum := range before {
		if !strings.HasSuffix(rel, ".log") {
			continue
		}
		path := filepath.Join(backing, rel)
		buf := make([]byte, 4096)
		n, err := unix.Getxattr(path, "trusted.tierfs", buf)
		var rec struct {
			State, Key, ETag string
		}
		if err == nil {
			if err := json.Unmarshal(buf[:n], &rec); err != nil {
				t.Errorf("%s: bad state %q", rel, buf[:n])
				continue
			}
		}
		if rec.State != "remote" {
			b, err := os.ReadFile(path)
			if err != nil || sha256.Sum256(b) != sum {
				t.Errorf("%s (state %q) lost local bytes", rel, rec.State)
			}
			continue
		}
		m, err := chunkxfer.LoadManifest(context.Background(), st, rec.Key)
		if err != nil {
			t.Errorf("%s is remote but its object is not usable: %v", rel, err)
			continue
		}
		cache, _ := chunkxfer.NewPool(16<<20, nil)
		rd := chunkxfer.NewReaderFor(st, m, cache, chunkxfer.ReaderOptions{})
		b := make([]byte, m.Size)
		_, err = rd.ReadAt(b, 0)
		rd.Close()
		cache.Close()
		if err != nil || sha256.Sum256(b) != sum {
			t.Errorf("%s is remote but its object differs: %v", rel, err)
		}
	}
}

// shipment is what the e2e tests read of a shipment log line.
type shipment struct {
	State   string
	Objects []string
}

// readShipments reads the live shipments of the shipment logs
// (.tierfs/shipments/*.klog) as they are on disk, by key, with whole
// object keys; a log that does not parse is an error (a torn last line
// is allowed).
func readShipments(backing string) (map[string]shipment, error) {
	logs, _ := filepath.Glob(filepath.Join(backing, ".tierfs", "shipments", "*.klog"))
	out := map[string]shipment{}
	for _, p := range logs {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var bad error
		_, err = keylog.Parse(p, b, func(key string, val []byte) {
			if val == nil {
				delete(out, key)
				return
			}
			var sh shipment
			if err := json.Unmarshal(val, &sh); err != nil {
				bad = fmt.Errorf("%s: shipment %s: %w", p, key, err)
			}
			for i, o := range sh.Objects {
				if rest, ok := strings.CutPrefix(o, "~"); ok { // the stem mark (docs/formats.md)
					sh.Objects[i] = strings.TrimSuffix(key, ".log") + rest
				}
			}
			out[key] = sh
		})
		if err != nil {
			return nil, err
		}
		if bad != nil {
			return nil, bad
		}
	}
	return out, nil
}

// shipping says whether an upload is under way in the backing dir: a
// transfer journal (a multipart upload), or a shipment still shipping
// (a small object goes in one request, with no journal).
func shipping(backing string) bool {
	if ents, _ := os.ReadDir(filepath.Join(backing, ".tierfs", "journal")); len(ents) > 0 {
		return true
	}
	ships, _ := readShipments(backing)
	for _, sh := range ships {
		if sh.State == "shipping" {
			return true
		}
	}
	return false
}

// checkCatalog reads the shipment logs as a crash left them, with no
// mount: each must parse, every file with a record must have its
// shipment there, and every segment object in the store must be named by
// a shipment (the shipment is written before the first byte is sent).
func checkCatalog(t *testing.T, backing string, st store.Store) {
	t.Helper()
	shipments, err := readShipments(backing)
	if err != nil {
		t.Errorf("shipment log after a kill: %v", err)
		return
	}
	named := map[string]bool{}
	for _, sh := range shipments {
		for _, o := range sh.Objects {
			named[o] = true
		}
	}
	filepath.Walk(backing, func(path string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() || strings.Contains(path, "/.tierfs/") {
			return nil
		}
		buf := make([]byte, 4096)
		n, err := unix.Getxattr(path, "trusted.tierfs", buf)
		if err != nil {
			return nil
		}
		var rec struct{ Key string }
		if json.Unmarshal(buf[:n], &rec) == nil {
			if _, ok := shipments[rec.Key]; !ok {
				t.Errorf("%s has a record of %s but no shipment", path, rec.Key)
			}
		}
		return nil
	})
	objs, err := st.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if strings.HasSuffix(o.Key, "/remote-log-segment-index") || strings.HasSuffix(o.Key, "/remote-log-segment-index.tierfs-manifest") {
			continue
		}
		if !named[o.Key] {
			t.Errorf("object %s is named by no shipment", o.Key)
		}
	}
}

// TestMountOverADeadMount: tierfs mounted in place is killed (kill -9)
// and started again at once, as systemd's Restart=on-failure does, with
// no umount -l in between. The new process detaches its predecessor's
// dead mount, mounts, and serves every file byte-exact, the evicted ones
// included; one tierfs mount is left at the mount point. Killed again,
// tierfs umount detaches the dead mount.
func TestMountOverADeadMount(t *testing.T) {
	requireRoot(t)
	dir, logDir, _ := mountDirs(t)
	remoteDir := filepath.Join(dir, "remote")
	bases, err := kafkatest.LogDir{Topic: "events", Partitions: 1, Segments: 4, Batches: 10, Records: 8, ValueSize: 5000, Unflushed: 1, Age: time.Hour}.Write(logDir)
	if err != nil {
		t.Fatal(err)
	}
	before := sums(t, logDir)
	args := []string{"--remote", "file://" + remoteDir, "--ship-after", "0s", "--local-retention-bytes", "1", "--tier-interval", "50ms", logDir}
	m := startMount(t, nil, args...)
	first := filepath.Join(logDir, "events-0", fmt.Sprintf("%020d.log", bases["events-0"][0]))
	deadline := time.Now().Add(30 * time.Second)
	for state(first) != "remote" {
		if time.Now().After(deadline) {
			t.Fatalf("%s not evicted after 30 s: %s\n%s", first, state(first), m.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", logDir).Run() }) // if the test fails before the new mount
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.done
	var sfs unix.Statfs_t
	if err := unix.Statfs(logDir, &sfs); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("after kill -9 the mount point answers statfs with %v, want ENOTCONN", err)
	}
	m = startMount(t, nil, args...)
	if !strings.Contains(m.Log(), "detached a dead tierfs mount") {
		t.Errorf("the new mount did not say it detached the dead one:\n%s", m.Log())
	}
	after := sums(t, logDir)
	for rel, sum := range before {
		if after[rel] != sum {
			t.Errorf("%s differs through the new mount", rel)
		}
	}
	if got := state(first); got != "remote" {
		t.Errorf("%s is %s through the new mount, want remote", first, got)
	}
	if n := tierfsMountsAt(t, logDir); n != 1 {
		t.Errorf("%d tierfs mounts at %s, want 1", n, logDir)
	}
	// Killed again, the dead mount goes with tierfs umount, which has
	// nothing to drain from a process that is gone.
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.done
	if out, err := exec.Command(tierfsBin, "umount", logDir).CombinedOutput(); err != nil || !strings.Contains(string(out), "detached a dead tierfs mount") {
		t.Errorf("tierfs umount of the dead mount: %v: %s", err, out)
	}
	if n := tierfsMountsAt(t, logDir); n != 0 {
		t.Errorf("%d tierfs mounts at %s after tierfs umount, want 0", n, logDir)
	}
	if fs.Dead(logDir) {
		t.Errorf("%s is still dead after tierfs umount", logDir)
	}
	if _, err := os.Stat(first); err != nil {
		t.Errorf("the backing directory after tierfs umount: %v", err)
	}
}

// tierfsMountsAt counts the tierfs mounts at path in this process's
// mount table.
func tierfsMountsAt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == path && strings.Contains(line, " - fuse.tierfs ") {
			n++
		}
	}
	return n
}
