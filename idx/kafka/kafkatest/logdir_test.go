package kafkatest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRepeatCopiesTheFirstPartition: with Repeat, every partition has the
// first one's segments, times and checkpoint offsets.
func TestRepeatCopiesTheFirstPartition(t *testing.T) {
	plain, rep := t.TempDir(), t.TempDir()
	d := LogDir{Topic: "t", Partitions: 3, Segments: 3, Batches: 5, Records: 4, ValueSize: 100, Unflushed: 1, Age: time.Hour}
	want, err := d.Write(plain)
	if err != nil {
		t.Fatal(err)
	}
	d.Repeat = true
	got, err := d.Write(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"t-1", "t-2"} {
		if len(got[p]) != len(want[p]) || got[p][2] != want[p][2] {
			t.Fatalf("%s: bases %v, want %v", p, got[p], want[p])
		}
		ents, _ := os.ReadDir(filepath.Join(rep, "t-0"))
		for _, e := range ents {
			a, _ := os.ReadFile(filepath.Join(rep, "t-0", e.Name()))
			b, err := os.ReadFile(filepath.Join(rep, p, e.Name()))
			fa, _ := os.Stat(filepath.Join(rep, "t-0", e.Name()))
			fb, _ := os.Stat(filepath.Join(rep, p, e.Name()))
			if err != nil || !bytes.Equal(a, b) || !fa.ModTime().Equal(fb.ModTime()) {
				t.Fatalf("%s/%s is not a copy of t-0's: %v", p, e.Name(), err)
			}
		}
	}
	for _, cp := range []string{"recovery-point-offset-checkpoint", "replication-offset-checkpoint"} {
		a, _ := os.ReadFile(filepath.Join(plain, cp))
		b, _ := os.ReadFile(filepath.Join(rep, cp))
		if !bytes.Equal(a, b) || strings.Count(string(b), "\n") != 5 {
			t.Fatalf("%s: %q, want %q", cp, b, a)
		}
	}
}
