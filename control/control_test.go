package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/internal/testenv"
)

// fakeMount is a Handler that "ships" in steps and fails on demand.
type fakeMount struct {
	mu      sync.Mutex
	done    []string
	blocked chan struct{} // when set, "slow" waits on it or its ctx
}

func (f *fakeMount) Do(ctx context.Context, op, rel string, progress func(done, total int64)) (string, error) {
	if strings.Contains(rel, "bad") {
		return "local", errors.New("not safe to ship: active segment")
	}
	if rel == "slow" {
		select {
		case <-f.blocked:
		case <-ctx.Done():
			f.mu.Lock()
			f.done = append(f.done, "cancelled")
			f.mu.Unlock()
			return "", ctx.Err()
		}
	}
	for i := int64(0); i <= 4; i++ {
		progress(i*25, 100)
	}
	f.mu.Lock()
	f.done = append(f.done, op+" "+rel)
	f.mu.Unlock()
	if op == "evict" {
		return "remote", nil
	}
	return "shipped", nil
}

func (f *fakeMount) Status() any { return map[string]string{"orders-0": "injected outage"} }

// Call echoes "echo" args back and knows no other op.
func (f *fakeMount) Call(ctx context.Context, op string, args json.RawMessage) (any, error) {
	if op == "echo" {
		var v any
		err := json.Unmarshal(args, &v)
		return v, err
	}
	return nil, fmt.Errorf("unknown op %q", op)
}

// serveFake serves a fakeMount at a new mount point until the test ends.
func serveFake(t *testing.T) (mountpoint string, h *fakeMount) {
	t.Helper()
	mountpoint = filepath.Join(t.TempDir(), "mnt")
	h = &fakeMount{blocked: make(chan struct{})}
	srv, err := Listen(mountpoint, h, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return mountpoint, h
}

func TestCallAndServe(t *testing.T) {
	mp, h := serveFake(t)
	if _, err := Listen(mp, h, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("a second server for the same mount point")
	}
	ctx := context.Background()
	var got []string
	err := Call(ctx, mp, Request{Op: "evict", Paths: []string{"orders-0/0.log", "orders-0/bad.log"}}, func(e Event) {
		switch {
		case e.State != "" || e.Error != "":
			got = append(got, fmt.Sprintf("%s=%s%s", e.Path, e.State, e.Error))
		default:
			got = append(got, fmt.Sprint(e.Done))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "[0 25 50 75 100 orders-0/0.log=remote orders-0/bad.log=localnot safe to ship: active segment]"; fmt.Sprint(got) != want {
		t.Fatalf("events %v", got)
	}
	var st map[string]string
	if err := Call(ctx, mp, Request{Op: "status"}, func(e Event) { json.Unmarshal(e.Status, &st) }); err != nil || st["orders-0"] != "injected outage" {
		t.Fatalf("status %v %v", st, err)
	}
	var echoed map[string]int
	if err := Call(ctx, mp, Request{Op: "echo", Args: json.RawMessage(`{"from":7}`)}, func(e Event) { json.Unmarshal(e.Status, &echoed) }); err != nil || echoed["from"] != 7 {
		t.Fatalf("echo %v %v", echoed, err)
	}
	if err := Call(ctx, mp, Request{Op: "format"}, func(Event) {}); err == nil || !strings.Contains(err.Error(), "unknown op") {
		t.Fatalf("unknown op: %v", err)
	}
	// A client that goes away stops its operation.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := Call(cctx, mp, Request{Op: "ship", Paths: []string{"slow"}}, func(Event) {}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled call: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		h.mu.Lock()
		n := len(h.done)
		last := ""
		if n > 0 {
			last = h.done[n-1]
		}
		h.mu.Unlock()
		if last == "cancelled" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation not cancelled: %v", h.done)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Nothing answers for another mount point.
	if err := Call(ctx, mp+"x", Request{Op: "status"}, func(Event) {}); !errors.Is(err, ErrNoMount) {
		t.Fatalf("no mount: %v", err)
	}
}

func TestFindMount(t *testing.T) {
	info := `22 1 0:21 / /proc rw,nosuid - proc proc rw
90 22 0:50 / /var/lib/kafka rw,nosuid,nodev,relatime shared:1 - fuse.tierfs /var/lib/kafka rw,user_id=0
91 22 0:51 / /mnt/with\040space rw - fuse.tierfs /data rw
92 90 0:52 / /var/lib/kafka/inner rw - fuse.tierfs /x rw
93 22 0:53 / /mnt/other rw - fuse.sshfs x rw
`
	mps, err := tierfsMounts(strings.NewReader(info))
	if err != nil || fmt.Sprint(mps) != "[/var/lib/kafka /mnt/with space /var/lib/kafka/inner]" {
		t.Fatalf("mounts %q %v", mps, err)
	}
	for path, want := range map[string]string{
		"/var/lib/kafka/orders-0/0.log":    "/var/lib/kafka orders-0/0.log",
		"/var/lib/kafka/inner/a-0/1.log":   "/var/lib/kafka/inner a-0/1.log",
		"/mnt/with space/t-1/5.log":        "/mnt/with space t-1/5.log",
		"/var/lib/kafkaesque/orders-0/0.l": "error",
		"/mnt/other/x-0/0.log":             "error",
	} {
		mp, rel, err := findIn(mps, path)
		got := mp + " " + rel
		if err != nil {
			got = "error"
		}
		if got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}

func TestMain(m *testing.M) {
	// The helper side of TestOtherUsersAreRefused: call as another user.
	if mp := os.Getenv("TIERFS_CONTROL_CALL"); mp != "" {
		err := Call(context.Background(), mp, Request{Op: "ship", Paths: []string{"x"}}, func(Event) {})
		fmt.Println("call:", err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestOtherUsersAreRefused(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Missing(t, "needs root to run a helper as another user")
	}
	mp, h := serveFake(t)
	// A copy of the test binary that nobody can run.
	dir, err := os.MkdirTemp("", "tierfs-control")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "control.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), "TIERFS_CONTROL_CALL="+mp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		testenv.Missing(t, "cannot run the test binary as nobody: %v %s", err, out)
	}
	if !strings.Contains(string(out), "uid 65534 may not control this mount") {
		t.Fatalf("helper said %s", out)
	}
	if len(h.done) != 0 {
		t.Fatalf("done for another user: %v", h.done)
	}
}

func TestOversizeRequestIsRefused(t *testing.T) {
	mp, h := serveFake(t)
	paths := []string{strings.Repeat("p", maxRequest)}
	err := Call(context.Background(), mp, Request{Op: "ship", Paths: paths}, func(Event) {})
	if err == nil || !strings.Contains(err.Error(), "request longer than") {
		t.Fatalf("oversize request: %v", err)
	}
	if len(h.done) != 0 {
		t.Fatalf("oversize request was served: %v", h.done)
	}
}
