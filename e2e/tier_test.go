// Package e2e tests tierfs as a user runs it: the tierfs binary mounting
// a log directory, a real object store, real tools reading the mount.
package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/chunkxfer/store/s3test"
	"github.com/tierfs/tierfs/fs/posixtest"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/testenv"
)

var tierfsBin string

func TestMain(m *testing.M) {
	posixtest.RunHelperIfAsked() // a step of an access case, as another user
	dir, err := os.MkdirTemp("", "tierfs-e2e-bin-")
	if err != nil {
		panic(err)
	}
	tierfsBin = filepath.Join(dir, "tierfs")
	if out, err := exec.Command("go", "build", "-o", tierfsBin, "github.com/tierfs/tierfs/cmd/tierfs").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build tierfs: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	posixtest.RemoveRunner()
	os.Exit(code)
}

// mountDirs makes a test's directory with an empty backing dir and a
// mount point in it.
func mountDirs(t *testing.T) (dir, backing, mnt string) {
	dir = t.TempDir()
	backing, mnt = filepath.Join(dir, "backing"), filepath.Join(dir, "mnt")
	for _, d := range []string{backing, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir, backing, mnt
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func requireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Missing(t, "needs /dev/fuse")
	}
}

// mount runs tierfs mount in the background until the test ends.
type mount struct {
	cmd  *exec.Cmd
	log  *bytes.Buffer
	mu   *sync.Mutex
	mnt  string
	done chan struct{}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func startMount(t *testing.T, env []string, args ...string) *mount {
	t.Helper()
	return launchMount(t, 0, env, args...)
}

// launchMount is startMount with an open-file limit for the mount
// (soft and hard, with prlimit; 0: this process's).
func launchMount(t *testing.T, fileLimit int, env []string, args ...string) *mount {
	t.Helper()
	m := &mount{log: &bytes.Buffer{}, mu: &sync.Mutex{}, mnt: args[len(args)-1], done: make(chan struct{})}
	m.cmd = exec.Command(tierfsBin, append([]string{"--log-level", "debug", "mount"}, args...)...)
	if fileLimit > 0 {
		m.cmd = exec.Command("prlimit", append([]string{fmt.Sprintf("--nofile=%d:%d", fileLimit, fileLimit), tierfsBin, "--log-level", "debug", "mount"}, args...)...)
	}
	m.cmd.Env = append(os.Environ(), env...)
	m.cmd.Stdout = lockedWriter{m.mu, m.log}
	m.cmd.Stderr = lockedWriter{m.mu, m.log}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { m.cmd.Wait(); close(m.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(m.Log(), "msg=mounted") {
		select {
		case <-m.done:
			t.Fatalf("tierfs mount exited:\n%s", m.Log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not mounted after 20s:\n%s", m.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { m.stop(t) })
	return m
}

func (m *mount) Log() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.log.String()
}

func (m *mount) stop(t *testing.T) {
	select {
	case <-m.done:
		return
	default:
	}
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(20 * time.Second):
		exec.Command("umount", "-l", m.mnt).Run()
		m.cmd.Process.Kill()
		<-m.done
	}
	if t.Failed() {
		t.Logf("tierfs log:\n%s", m.Log())
	}
}

func sums(t *testing.T, root string) map[string][32]byte {
	return sumsSkipping(t, root, "")
}

// sumsSkipping is sums without reading the file at skip (a path under
// root), which is left out.
func sumsSkipping(t *testing.T, root, skip string) map[string][32]byte {
	out := map[string][32]byte{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() && p != skip {
			b, err := os.ReadFile(p)
			if err != nil {
				return fmt.Errorf("read %s: %w", p, err)
			}
			rel, _ := filepath.Rel(root, p)
			out[rel] = sha256.Sum256(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func state(path string) string {
	buf := make([]byte, 64)
	n, err := unix.Getxattr(path, "user.tierfs.state", buf)
	if err != nil {
		return "error: " + err.Error()
	}
	return string(buf[:n])
}

func allocated(t *testing.T, root string) int64 {
	var total int64
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && strings.HasSuffix(p, ".log") {
			total += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	return total
}

type remote struct {
	name string
	url  string
	env  []string
	srv  *s3test.Server
}

func remotes(t *testing.T) []remote {
	srv := s3test.StartT(t)
	ctx := context.Background()
	if _, err := srv.NewStore(ctx, "tier", ""); err != nil {
		t.Fatal(err)
	}
	return []remote{
		{name: "dir", url: "file://" + filepath.Join(t.TempDir(), "remote")},
		{name: "s3", url: "s3://tier/kafka?endpoint=" + srv.Endpoint, srv: srv,
			env: []string{"TIERFS_S3_ACCESS_KEY=" + srv.AccessKey, "TIERFS_S3_SECRET_KEY=" + srv.SecretKey}},
	}
}

// TestTierThroughMount: a synthetic Kafka log dir mounted with a remote:
// rolled, flushed segments ship and their local bytes are freed; every
// file still reads byte-exact through the mount, with its size and mtime;
// the active and the unflushed segments stay local.
func TestTierThroughMount(t *testing.T) {
	requireRoot(t)
	for _, r := range remotes(t) {
		t.Run(r.name, func(t *testing.T) {
			_, backing, mnt := mountDirs(t)
			bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 2, Segments: 5, Batches: 40, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
			if err != nil {
				t.Fatal(err)
			}
			before := sums(t, backing)
			stats := map[string]os.FileInfo{}
			for rel := range before {
				fi, _ := os.Stat(filepath.Join(backing, rel))
				stats[rel] = fi
			}
			allocBefore := allocated(t, backing)
			// The smallest chunk memory (one chunk).
			m := startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1m",
				"--local-retention-bytes", "1", "--tier-interval", "200ms", "--cache-bytes", "8MiB", "--passthrough", mnt)

			seg := func(p string, i int) string {
				return filepath.Join(mnt, p, fmt.Sprintf("%020d.log", bases[p][i]))
			}
			deadline := time.Now().Add(60 * time.Second)
			for state(seg("orders-0", 2)) != "remote" || state(seg("orders-1", 2)) != "remote" {
				if time.Now().After(deadline) {
					t.Fatalf("segments not evicted after 60s: %s %s\n%s", state(seg("orders-0", 2)), state(seg("orders-1", 2)), m.Log())
				}
				time.Sleep(100 * time.Millisecond)
			}
			for _, p := range []string{"orders-0", "orders-1"} {
				for i, want := range []string{"remote", "remote", "remote", "local", "local"} {
					if got := state(seg(p, i)); got != want {
						t.Errorf("%s segment %d: %s, want %s", p, i, got, want)
					}
				}
			}
			if a := allocated(t, backing); a > allocBefore/2 {
				t.Errorf("local .log bytes %d of %d before: not freed", a, allocBefore)
			}
			// Every file reads back exactly, with its size and mtime, and
			// the state dir is invisible. The store-down check reads one
			// evicted file for the first time (a chunk read before may
			// still be in memory, and served without the store); it
			// checks that file's bytes once the store is back.
			unread := ""
			if r.srv != nil {
				unread = seg("orders-1", 1)
			}
			after := sumsSkipping(t, mnt, unread)
			for rel, sum := range before {
				if filepath.Join(mnt, rel) == unread {
					continue
				}
				if after[rel] != sum {
					t.Errorf("%s reads other bytes through the mount", rel)
				}
				fi, err := os.Stat(filepath.Join(mnt, rel))
				if err != nil || fi.Size() != stats[rel].Size() || !fi.ModTime().Equal(stats[rel].ModTime()) {
					t.Errorf("%s: stat %v %v, want size %d mtime %v", rel, fi, err, stats[rel].Size(), stats[rel].ModTime())
				}
			}
			if unread != "" {
				after[unread] = [32]byte{} // counted, checked later
			}
			if len(after) != len(before) {
				t.Errorf("%d files through the mount, %d before", len(after), len(before))
			}
			// Tools: sha256sum and tar read evicted files like any other.
			first := seg("orders-0", 0)
			out, err := exec.Command("sha256sum", first).Output()
			rel, _ := filepath.Rel(mnt, first)
			if want := before[rel]; err != nil || !strings.HasPrefix(string(out), fmt.Sprintf("%x", want[:])) {
				t.Errorf("sha256sum: %s %v", out, err)
			}
			tarCmd := exec.Command("tar", "-C", mnt, "-cf", "-", "orders-0")
			var tarErr bytes.Buffer
			tarCmd.Stderr = &tarErr
			tarOut, err := tarCmd.Output()
			if err != nil || len(tarOut) < int(stats[rel].Size()) {
				t.Errorf("tar: %d bytes, %v: %s", len(tarOut), err, tarErr.String())
			}
			// The state cannot be forged or read through the mount.
			if err := unix.Setxattr(first, "trusted.tierfs", []byte("{}"), 0); !errors.Is(err, syscall.EPERM) {
				t.Errorf("set trusted.tierfs: %v", err)
			}
			if _, err := unix.Getxattr(first, "trusted.tierfs", make([]byte, 100)); !errors.Is(err, unix.ENODATA) {
				t.Errorf("get trusted.tierfs: %v", err)
			}
			// A write to an evicted file brings it back (see
			// TestWriteToEvictedFile): it reads as a plain file would.
			orig, _ := os.ReadFile(first)
			f, err := os.OpenFile(first, os.O_WRONLY, 0)
			if err != nil {
				t.Fatalf("open for write: %v", err)
			}
			if _, err := f.WriteAt([]byte("x"), 0); err != nil {
				t.Errorf("write to an evicted file: %v", err)
			}
			f.Close()
			if err := os.Truncate(first, 10); err != nil {
				t.Errorf("truncate of an evicted file: %v", err)
			}
			if b, _ := os.ReadFile(first); string(b) != "x"+string(orig[1:10]) {
				t.Errorf("after a write and a truncate: %q", b)
			}
			delete(before, rel) // changed on purpose

			if r.srv != nil {
				storeDown(t, r.srv, mnt, seg("orders-1", 1), seg("orders-1", 4), before)
			}
		})
	}
}

// storeDown: with the store gone, a local file still reads and an
// evicted one fails with EIO in bounded time; once the store is back,
// the evicted one reads again.
func storeDown(t *testing.T, srv *s3test.Server, mnt, evicted, local string, before map[string][32]byte) {
	srv.Stop()
	if _, err := os.ReadFile(local); err != nil {
		t.Errorf("local file with the store down: %v", err)
	}
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
	t0 := time.Now()
	_, err := os.ReadFile(evicted)
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("evicted file with the store down: %v", err)
	}
	t.Logf("evicted read failed after %v with the store down", time.Since(t0).Round(time.Millisecond))
	if time.Since(t0) > 60*time.Second {
		t.Errorf("a read waited %v for a dead store", time.Since(t0))
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(mnt, evicted)
	b, err := os.ReadFile(evicted)
	if err != nil || sha256.Sum256(b) != before[rel] {
		t.Errorf("evicted file after the store came back: %v", err)
	}
}
