package tiering

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx/kafka"
)

// TestCheckpointFilesKeptByStamp: the checkpoint files are parsed again
// whenever one changed (rewritten and renamed over, as Kafka does, or
// written in place), taken as kept otherwise, and not kept while their
// ctime is young; what is read always equals ReadCheckpoints.
func TestCheckpointFilesKeptByStamp(t *testing.T) {
	root := t.TempDir()
	write := func(name string, lines ...string) {
		t.Helper()
		body := fmt.Sprintf("0\n%d\n", len(lines))
		for _, l := range lines {
			body += l + "\n"
		}
		tmp := filepath.Join(root, name+".tmp")
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	var c checkpointFiles
	later := func() time.Time { return time.Now().Add(time.Minute) }
	check := func(at string, now time.Time, want map[int32]int64) {
		t.Helper()
		got, err := c.read(root, now)
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := ReadCheckpoints(root)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(fresh) {
			t.Errorf("%s: read %v, afresh %v", at, got, fresh)
		}
		for p, off := range want {
			if tp := (kafka.TopicPartition{Topic: "orders", Partition: p}); got.Recovery[tp] != off {
				t.Errorf("%s: recovery point of orders-%d %d, want %d", at, p, got.Recovery[tp], off)
			}
		}
	}
	// No files: empty checkpoints, nothing kept.
	check("none", later(), nil)
	write("recovery-point-offset-checkpoint", "orders 0 100", "orders 1 200")
	write("replication-offset-checkpoint", "orders 0 90")
	check("young", time.Now(), map[int32]int64{0: 100})
	if len(c.files) != 0 {
		t.Errorf("kept files with young ctimes: %v", c.files)
	}
	check("settled", later(), map[int32]int64{0: 100, 1: 200})
	if len(c.files) != 2 {
		t.Errorf("kept %d files, want 2", len(c.files))
	}
	kept := c.files["recovery-point-offset-checkpoint"].cp
	check("again", later(), map[int32]int64{0: 100})
	if got, _ := c.read(root, later()); fmt.Sprintf("%p", got.Recovery) != fmt.Sprintf("%p", kept) {
		t.Error("an unchanged file was parsed again")
	}
	// Rewritten and renamed over, as Kafka does: the same size.
	write("recovery-point-offset-checkpoint", "orders 0 101", "orders 1 201")
	check("renamed over", later(), map[int32]int64{0: 101, 1: 201})
	// Written in place, the same size again.
	path := filepath.Join(root, "recovery-point-offset-checkpoint")
	b, _ := os.ReadFile(path)
	copy(b[len(b)-4:], "202\n")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	check("in place", later(), map[int32]int64{0: 101, 1: 202})
	// Removed: empty again.
	os.Remove(path)
	check("removed", later(), map[int32]int64{0: 0})
}
