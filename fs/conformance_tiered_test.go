package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/control"
	"github.com/tierfs/tierfs/fs/posixtest"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/tiered"
)

// TestConformanceTiered runs the conformance suite on a mount whose every
// file is a tiered file (served through the tierer's tiered.File, as
// segments are), against a plain directory: every posixtest case, and
// the segment cases on a segment that is local, shipped and evicted.
func TestConformanceTiered(t *testing.T) {
	t.Setenv(serveTieredEnv, t.TempDir())
	backing := filepath.Join(t.TempDir(), "backing")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	segCases := posixtest.SegmentCases()
	states := []tiered.State{tiered.StateLocal, tiered.StateShipped, tiered.StateRemote}
	// One partition per segment case and state, each a copy of the
	// first: its first segment is rolled, flushed and committed, so it
	// may be shipped. About 300 KiB: several of the server's 64 KiB
	// chunks.
	ld := kafkatest.LogDir{Topic: "seg", Partitions: len(segCases) * len(states), Segments: 2, Batches: 100, Records: 10, ValueSize: 300, Age: time.Hour, Repeat: true}
	if _, err := ld.Write(backing); err != nil {
		t.Fatal(err)
	}
	fixture, err := os.ReadFile(filepath.Join(backing, "seg-0", posixtest.SegmentName))
	if err != nil {
		t.Fatal(err)
	}
	srv := mountTestWith(t, backing, false, 0)
	mnt := srv.Mountpoint
	native := t.TempDir()

	t.Run("cases", func(t *testing.T) {
		for _, c := range posixtest.Cases() {
			t.Run(c.Name, func(t *testing.T) {
				want := runCase(t, c, filepath.Join(native, c.Name))
				got := runCase(t, c, filepath.Join(mnt, c.Name))
				if d := posixtest.Diff(want, got); d != "" {
					t.Errorf("mount differs from native:\n%s", d)
				}
			})
		}
	})
	for i, state := range states {
		for j, c := range segCases {
			part := fmt.Sprintf("seg-%d", i*len(segCases)+j)
			t.Run(state.String()+"/"+c.Name, func(t *testing.T) {
				rel := part + "/" + posixtest.SegmentName
				switch state {
				case tiered.StateShipped:
					tierOp(t, mnt, "ship", rel)
				case tiered.StateRemote:
					tierOp(t, mnt, "evict", rel)
				}
				if got := stateOf(t, filepath.Join(mnt, rel)); got != state.String() {
					t.Fatalf("%s is %s, not %s", rel, got, state)
				}
				nd := filepath.Join(native, state.String(), c.Name)
				if err := os.MkdirAll(nd, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(nd, posixtest.SegmentName), fixture, 0o644); err != nil {
					t.Fatal(err)
				}
				want, got := &posixtest.Transcript{}, &posixtest.Transcript{}
				c.Run(t, nd, want)
				c.Run(t, filepath.Join(mnt, part), got)
				if d := posixtest.Diff(want, got); d != "" {
					t.Errorf("mount differs from native:\n%s", d)
				}
			})
		}
	}
}

// tierOp asks the test server to ship or evict rel.
func tierOp(t *testing.T, mnt, op, rel string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var failed error
	err := control.Call(ctx, mnt, control.Request{Op: op, Paths: []string{rel}}, func(e control.Event) {
		if e.Error != "" {
			failed = errors.New(e.Error)
		}
	})
	if err = errors.Join(err, failed); err != nil {
		t.Fatalf("%s %s: %v", op, rel, err)
	}
}

// stateOf is the state a file shows through the mount.
func stateOf(t *testing.T, path string) string {
	t.Helper()
	buf := make([]byte, 64)
	n, err := unix.Getxattr(path, tiered.XattrState, buf)
	if err != nil {
		t.Fatalf("state of %s: %v", path, err)
	}
	return string(buf[:n])
}
