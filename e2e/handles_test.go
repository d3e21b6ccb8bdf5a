package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// TestHandlesOpenAcrossEviction: Kafka creates each segment through the
// mount and reads it through that same descriptor for the segment's whole
// life, long after it rolled, shipped and was evicted. Such a descriptor
// must read the original bytes, not the freed local blocks. A file opened
// under another name and renamed into a segment's name while open is not
// freed until it is closed.
func TestHandlesOpenAcrossEviction(t *testing.T) {
	requireRoot(t)
	for _, r := range remotes(t) {
		t.Run(r.name, func(t *testing.T) {
			_, backing, mnt := mountDirs(t)
			bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 5, Batches: 30, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
			if err != nil {
				t.Fatal(err)
			}
			name := func(i int) string { return fmt.Sprintf("%020d.log", bases["orders-0"][i]) }
			// Segments 0 and 1 are written again through the mount.
			var data [2][]byte
			for i := range data {
				p := filepath.Join(backing, "orders-0", name(i))
				if data[i], err = os.ReadFile(p); err != nil {
					t.Fatal(err)
				}
				os.Remove(p)
			}
			startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", mnt)
			part := filepath.Join(mnt, "orders-0")

			// As Kafka: created with O_CREAT|O_EXCL, kept open.
			created, err := os.OpenFile(filepath.Join(part, name(0)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer created.Close()
			// Opened as something else, renamed into a segment's name.
			renamed, err := os.OpenFile(filepath.Join(part, "incoming.tmp"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer renamed.Close()
			for i, f := range []*os.File{created, renamed} {
				if _, err := f.Write(data[i]); err != nil {
					t.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Rename(filepath.Join(part, "incoming.tmp"), filepath.Join(part, name(1))); err != nil {
				t.Fatal(err)
			}

			out, code := tierfs(t, nil, "evict", filepath.Join(part, name(0)))
			if code != 0 || !strings.Contains(out, ": remote") {
				t.Fatalf("evict of the created segment: %d %s", code, out)
			}
			if a := allocated(t, filepath.Join(backing, "orders-0", name(0))); a > 8192 {
				t.Fatalf("evicted, but %d bytes still allocated", a)
			}
			checkReads(t, "the creating descriptor after eviction", created, data[0])
			// That descriptor wrote the file while it was local; a write
			// through it now finds it evicted (the mount must not trust
			// what it saw before the eviction) and moves it back.
			tail := bytes.Repeat([]byte("appended after eviction;"), 100)
			if _, err := created.WriteAt(tail, int64(len(data[0]))); err != nil {
				t.Fatalf("write through the creating descriptor after eviction: %v", err)
			}
			if got, err := os.ReadFile(filepath.Join(part, name(0))); err != nil || !bytes.Equal(got, append(append([]byte(nil), data[0]...), tail...)) {
				t.Fatalf("after a write through the descriptor that created it: %d bytes, %v", len(got), err)
			}

			out, code = tierfs(t, nil, "evict", filepath.Join(part, name(1)))
			if code == 0 || !strings.Contains(out, "reads it directly") {
				t.Fatalf("evict of a file held open by a direct reader: %d %s", code, out)
			}
			if s := state(filepath.Join(part, name(1))); s != "shipped" {
				t.Fatalf("state %s after the refused evict", s)
			}
			checkReads(t, "the direct descriptor", renamed, data[1])
			renamed.Close()
			out, code = tierfs(t, nil, "evict", filepath.Join(part, name(1)))
			if code != 0 || !strings.Contains(out, ": remote") {
				t.Fatalf("evict once closed: %d %s", code, out)
			}
			got, err := os.ReadFile(filepath.Join(part, name(1)))
			if err != nil || !bytes.Equal(got, data[1]) {
				t.Fatalf("renamed segment after eviction: %v, equal %v", err, bytes.Equal(got, data[1]))
			}
		})
	}
}

// checkReads reads f from the start and compares it with want.
func checkReads(t *testing.T, what string, f *os.File, want []byte) {
	t.Helper()
	got, err := io.ReadAll(io.NewSectionReader(f, 0, int64(len(want))+1))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !bytes.Equal(got, want) {
		zeros := bytes.Count(got, []byte{0})
		t.Fatalf("%s reads other bytes (%d of %d, %d NUL)", what, len(got), len(want), zeros)
	}
}
