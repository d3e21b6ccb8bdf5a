package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/tiering"
)

// TestKillAtCrashPoints: the mount is killed (SIGKILL, by itself, at a
// crash point) between an eviction's record and its hole punch, and
// during a tierfs hydrate: after it recorded the file unfreed, and after
// the bytes were in but before the file was recorded local. At the
// crash no local byte is gone without a verified copy in the store; once
// the mount is started again every file reads byte-exact through it, the
// interrupted eviction is finished, and the file hydrates again.
func TestKillAtCrashPoints(t *testing.T) {
	requireRoot(t)
	for _, point := range []tiering.CrashPoint{tiering.CrashEvictMarked, tiering.CrashHydrateMarked, tiering.CrashHydrateFetched} {
		t.Run(string(point), func(t *testing.T) {
			dir, backing, mnt := mountDirs(t)
			bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 4, Batches: 60, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
			if err != nil {
				t.Fatal(err)
			}
			before := sums(t, backing)
			args := []string{"--backing", backing, "--remote", "file://" + filepath.Join(dir, "remote"), "--ship-after", "1000h", "--tier-interval", "200ms", mnt}
			seg := filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][1]))
			rel, _ := filepath.Rel(mnt, seg)
			crashEnv := []string{"TIERFS_TEST_CRASH_AT=" + string(point)}

			var m *mount
			op := "evict"
			if point == tiering.CrashEvictMarked {
				m = startMount(t, crashEnv, args...)
			} else {
				m = startMount(t, nil, args...)
				if out, code := tierfs(t, nil, "evict", seg); code != 0 {
					t.Fatalf("evict: %s", out)
				}
				m.stop(t)
				m = startMount(t, crashEnv, args...)
				op = "hydrate"
			}
			out, code := tierfs(t, nil, op, seg)
			select {
			case <-m.done:
			case <-time.After(30 * time.Second):
				t.Fatalf("tierfs %s (exit %d: %s) did not reach the crash point:\n%s", op, code, out, m.Log())
			}
			if !strings.Contains(m.Log(), "crash point reached") {
				t.Fatalf("the mount died elsewhere:\n%s", m.Log())
			}
			killMount(t, m)
			// At the crash: the backing file holds every byte, or the
			// store holds a verified copy of it (the file is recorded
			// remote, and its object is there).
			if point == tiering.CrashEvictMarked {
				if got := sums(t, backing)[rel]; got != before[rel] {
					t.Fatal("the eviction freed bytes before it recorded them remote")
				}
			}
			if n := logObjects(t, "file://"+filepath.Join(dir, "remote"), nil, "orders-0"); n == 0 {
				t.Fatal("no object in the store at the crash")
			}

			m = startMount(t, nil, args...)
			waitFor(t, 30*time.Second, "the interrupted step finished by the next pass", func() bool { return state(seg) == "remote" }, m.Log)
			if got := sums(t, mnt); fmt.Sprint(got) != fmt.Sprint(before) {
				for p := range before {
					if got[p] != before[p] {
						t.Errorf("%s reads differently after the crash", p)
					}
				}
			}
			if out, code := tierfs(t, nil, "hydrate", seg); code != 0 || !strings.Contains(out, ": shipped") {
				t.Fatalf("hydrate after the crash: %d %s", code, out)
			}
			if got := sums(t, backing)[rel]; got != before[rel] {
				t.Error("the hydrated file differs from the original")
			}
		})
	}
}
