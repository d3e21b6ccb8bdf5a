package fs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/cm"
	"github.com/tierfs/tierfs/control"
	"github.com/tierfs/tierfs/fs/posixtest"
	"github.com/tierfs/tierfs/tiering"
	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/testenv"
	"github.com/tierfs/tierfs/internal/tiered"
)

// Environment of the server helper (see serveForTest).
const (
	serveBackingEnv     = "TIERFS_TEST_SERVE_BACKING"
	serveMountpointEnv  = "TIERFS_TEST_SERVE_MOUNTPOINT"
	servePassthroughEnv = "TIERFS_TEST_SERVE_PASSTHROUGH"
	serveMaxFdsEnv      = "TIERFS_TEST_SERVE_MAX_NODE_FDS"
	// With it set, the server observes every request (Config.Ops) and
	// prints the counts when it exits.
	serveObserveEnv = "TIERFS_TEST_SERVE_OBSERVE"
	// With it set, the server runs change management (cmroot in the
	// state dir; the value, when not "1", is a glob to exclude).
	serveCMEnv = "TIERFS_TEST_SERVE_CM"
	// With it set, the server's open-file limit (soft and hard) is
	// lowered to this before it mounts.
	serveFileLimitEnv = "TIERFS_TEST_SERVE_FILE_LIMIT"
	// With it set (to a directory, the store), the server tiers: a real
	// tierer over a directory store serves every file as a tiered file,
	// and ships or evicts a segment when the control socket asks.
	serveTieredEnv = "TIERFS_TEST_SERVE_TIERED"
)

// allTiered serves every file as a tiered file: its handle reads and
// writes through the tierer, whatever its name.
type allTiered struct{ *tiering.Tierer }

func (allTiered) Tiered(string) bool { return true }

// tierControl ships and evicts segments for the test (the control
// socket's ops ship and evict).
type tierControl struct{ t *tiering.Tierer }

func (c tierControl) Do(ctx context.Context, op, rel string, progress func(done, total int64)) (string, error) {
	var st tiered.State
	var err error
	switch op {
	case "ship":
		st, err = c.t.ShipNow(ctx, rel, nil)
	case "evict":
		st, err = c.t.EvictNow(ctx, rel, nil)
	default:
		return "", fmt.Errorf("unknown op %q", op)
	}
	return st.String(), err
}

func (tierControl) Status() any { return nil }

func (tierControl) Call(ctx context.Context, op string, args json.RawMessage) (any, error) {
	return nil, fmt.Errorf("unknown op %q", op)
}

// countingOps is an OpObserver that counts requests by op and result.
type countingOps struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countingOps) ObserveOp(op string, d time.Duration, st fuse.Status) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !st.Ok() {
		op += ":" + unix.ErrnoName(syscall.Errno(st))
	}
	c.n[op]++
}

func TestMain(m *testing.M) {
	posixtest.RunHelperIfAsked()
	if os.Getenv(serveMountpointEnv) != "" {
		os.Exit(serveForTest())
	}
	code := m.Run()
	posixtest.RemoveRunner()
	os.Exit(code)
}

// serveForTest is the body of the server process: it mounts, says READY on
// stdout, and serves until unmounted or signalled.
//
// Tests never serve a mount from their own process: a page fault on a
// mapped FUSE file (the mmap cases without passthrough) blocks its thread
// outside any system call, the Go runtime cannot stop that thread for a
// garbage collection, and the collection then waits forever for a server
// that it has itself stopped.
func serveForTest() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	maxFds, _ := strconv.Atoi(os.Getenv(serveMaxFdsEnv))
	if v, err := strconv.ParseUint(os.Getenv(serveFileLimitEnv), 10, 64); err == nil {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: v, Max: v}); err != nil {
			fmt.Fprintln(os.Stderr, "setrlimit:", err)
			return 1
		}
	}
	var ops OpObserver
	counts := &countingOps{n: map[string]int{}}
	if os.Getenv(serveObserveEnv) != "" {
		ops = counts
	}
	var changes Changes
	var mgr *cm.Manager
	if v := os.Getenv(serveCMEnv); v != "" {
		var exclude []string
		if v != "1" {
			exclude = []string{v}
		}
		mgr = cm.New(cm.Config{Exclude: exclude, Hide: StateDirName, Log: log})
		changes = mgr
	}
	var tier Tiering
	var tierer *tiering.Tierer
	if dir := os.Getenv(serveTieredEnv); dir != "" {
		st, err := store.NewDir(dir)
		if err == nil {
			tierer, err = tiering.New(tiering.Config{Store: st, Log: log, ChunkSize: 64 << 10, BlockSize: 16 << 10})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "tiering:", err)
			return 1
		}
		defer tierer.Close()
		tier = allTiered{tierer}
	}
	m, err := Mount(Config{
		Tiering:      tier,
		Changes:      changes,
		Ops:          ops,
		Backing:      os.Getenv(serveBackingEnv),
		Mountpoint:   os.Getenv(serveMountpointEnv),
		Passthrough:  os.Getenv(servePassthroughEnv) == "1",
		MaxNodeFds:   maxFds,
		EntryTimeout: time.Second,
		AttrTimeout:  time.Second,
		Log:          log,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mount:", err)
		return 1
	}
	if mgr != nil {
		if err := mgr.Attach(filepath.Dir(m.StateDir), filepath.Join(m.StateDir, "cm")); err != nil {
			fmt.Fprintln(os.Stderr, "cm:", err)
			return 1
		}
		defer mgr.Close()
	}
	if tierer != nil {
		tierer.SetRoot(filepath.Dir(m.StateDir), m.StateDir)
		srv, err := control.Listen(os.Getenv(serveMountpointEnv), tierControl{tierer}, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "control:", err)
			return 1
		}
		defer srv.Close()
	}
	fmt.Printf("READY passthrough=%v reason=%q\n", m.Passthrough.On, m.Passthrough.Reason)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		<-sigs
		if m.Unmount(false) != nil {
			m.Unmount(true)
		}
	}()
	m.Wait()
	if ops != nil {
		counts.mu.Lock()
		fmt.Fprintf(os.Stderr, "OBSERVED %v\n", counts.n)
		counts.mu.Unlock()
	}
	return 0
}

// requireMount skips tests that need a kernel mount where one cannot be
// made. CI runs as root with /dev/fuse, so there they always run.
func requireMount(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to mount FUSE")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Missing(t, "needs /dev/fuse")
	}
}

// testServer is a mount served by a child process.
type testServer struct {
	Mountpoint  string
	Passthrough bool
	cmd         *exec.Cmd
	mu          sync.Mutex
	log         bytes.Buffer
	done        chan struct{}
}

// Log returns what the server logged so far.
func (s *testServer) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// PassthroughLost reports whether the server logged that passthrough
// stopped.
func (s *testServer) PassthroughLost() bool {
	return strings.Contains(s.Log(), "kernel passthrough stopped")
}

// Stop unmounts and waits for the server to exit.
func (s *testServer) Stop(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := unix.Unmount(s.Mountpoint, 0)
		if err == nil || err == unix.EINVAL {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("unmount %s: %v; detaching", s.Mountpoint, err)
			unix.Unmount(s.Mountpoint, unix.MNT_DETACH)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Errorf("server did not exit; killing it")
		s.cmd.Process.Kill()
		<-s.done
	}
}

// mountTest serves backing at a new mount point from a child process and
// unmounts it when the test ends. An empty backing mounts a new empty
// directory.
func mountTest(t testing.TB, backing string, passthrough bool) *testServer {
	return mountTestWith(t, backing, passthrough, 0)
}

// mountTestWith is mountTest with a cap on node descriptors (0: none).
func mountTestWith(t testing.TB, backing string, passthrough bool, maxNodeFds int) *testServer {
	t.Helper()
	requireMount(t)
	if backing == "" {
		backing = filepath.Join(t.TempDir(), "backing")
		if err := os.Mkdir(backing, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	return startServerWith(t, backing, mnt, passthrough, maxNodeFds)
}

// startServer starts the server process for backing at mnt.
func startServer(t testing.TB, backing, mnt string, passthrough bool) *testServer {
	t.Helper()
	return startServerWith(t, backing, mnt, passthrough, 0)
}

func startServerWith(t testing.TB, backing, mnt string, passthrough bool, maxNodeFds int) *testServer {
	t.Helper()
	pt := "0"
	if passthrough {
		pt = "1"
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveBackingEnv+"="+backing, serveMountpointEnv+"="+mnt, servePassthroughEnv+"="+pt, serveMaxFdsEnv+"="+strconv.Itoa(maxNodeFds))
	s := &testServer{Mountpoint: mnt, cmd: cmd, done: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.mu.Lock()
			s.log.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
		}
	}()
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY") {
				ready <- sc.Text()
			}
		}
		cmd.Wait()
		close(s.done)
	}()
	select {
	case line := <-ready:
		s.Passthrough = strings.Contains(line, "passthrough=true")
	case <-s.done:
		t.Fatalf("server exited before mounting:\n%s", s.Log())
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("server did not mount in time:\n%s", s.Log())
	}
	t.Cleanup(func() {
		s.Stop(t)
		if t.Failed() {
			t.Logf("server log:\n%s", s.Log())
		}
	})
	return s
}
