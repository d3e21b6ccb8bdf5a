package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/tiered"
	"github.com/tierfs/tierfs/tiering"
)

func TestStatus(t *testing.T) {
	root := filepath.Join(t.TempDir(), "logs")
	if _, err := (kafkatest.LogDir{Topic: "t", Partitions: 2, Segments: 4, Batches: 8, Records: 4, ValueSize: 500, Unflushed: 1, Age: time.Hour}).Write(root); err != nil {
		t.Fatal(err)
	}
	tr, err := tiering.New(tiering.Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: store.NewMem(nil),
		Policy: tiering.Policy{ShipAfter: time.Minute}, LocalRetentionBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if rep := tr.RunOnce(context.Background()); rep.Evicted != 4 {
		t.Fatalf("%+v", rep)
	}
	var out bytes.Buffer
	lastErr := map[string]tiering.PartitionError{"t-1": {Time: time.Now().Add(-time.Minute), Err: "ship t-1/x.log: store\n down", Kept: "hidden by the error"}, "t-0": {Kept: "00000000000000000100.log: not in the store yet"}}
	if err := status(&out, root, time.Now(), lastErr); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("status:\n%s", out.String())
	}
	// t-0: no role (no mount answered), 4 segments, 2 local (the
	// unflushed one and the active one), 0 shipped, 2 remote.
	if f := strings.Fields(lines[1]); f[0] != "t-0" || f[1] != "-" || f[2] != "4" || f[3] != "2" || f[4] != "0" || f[5] != "2" {
		t.Fatalf("status line %q", lines[1])
	}
	if !strings.HasSuffix(lines[1], " kept local: 00000000000000000100.log: not in the store yet") || !strings.HasSuffix(lines[2], "1m0s ago: ship t-1/x.log: store down") {
		t.Fatalf("last error column:\n%s", out.String())
	}
	if f := strings.Fields(lines[3]); f[0] != "total" || f[4] != "4" {
		t.Fatalf("total line %q", lines[3])
	}
}

// TestStatusSaysWhatBroughtSegmentsBack: the line under the table names
// each cause that brought segments back, with segments and bytes, and
// says none when nothing did.
func TestStatusSaysWhatBroughtSegmentsBack(t *testing.T) {
	var c tiering.Counters
	var out bytes.Buffer
	printReturns(&out, returnCounts(&c))
	if !strings.Contains(out.String(), "since the mount started: none") {
		t.Errorf("nothing brought back: %q", out.String())
	}
	c.Moves[tiered.CauseWrite].Add(2)
	c.HydratedSegments[tiered.CauseWrite].Add(2)
	c.HydratedBytes[tiered.CauseWrite].Add(3 << 20)
	c.HydratedSegments[tiered.CauseHydrate].Add(1)
	c.HydratedBytes[tiered.CauseHydrate].Add(1024)
	out.Reset()
	printReturns(&out, returnCounts(&c))
	if got := out.String(); !strings.Contains(got, "write 2 (3.0 MiB), hydrate 1 (1.0 KiB)") || strings.Contains(got, "truncate") {
		t.Errorf("status line: %q", got)
	}
	out.Reset()
	printReturns(&out, nil) // the mount did not answer
	if out.Len() != 0 {
		t.Errorf("printed %q for a mount that did not answer", out.String())
	}
}

func TestRoleCell(t *testing.T) {
	infos := map[string]partitionInfo{
		"a-0": {Role: tiering.PartitionRole{Role: tiering.RoleLeader, Lead: &tiering.Lead{Leader: 3, Epoch: 7, Self: true}}},
		"a-1": {Role: tiering.PartitionRole{Role: tiering.RoleFollower, Lead: &tiering.Lead{Leader: 2, Epoch: 5}}},
		"a-2": {Role: tiering.PartitionRole{Role: tiering.RoleAuto}},
		"a-3": {Role: tiering.PartitionRole{Role: tiering.RoleFollower}},
	}
	for name, want := range map[string]string{"a-0": "leader e7", "a-1": "follower 2 e5", "a-2": "auto", "a-3": "follower", "b-0": "-"} {
		if got := roleCell(infos, name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
}
