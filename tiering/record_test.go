package tiering

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/tiered"
)

// TestLargeRecordsAreRead: a record larger than the buffer it is first
// read into (a file of many extents) is read whole, by path and by
// descriptor, and `tierfs status` finds its state (RecordState). ext4 takes xattr values of up to about 4 KiB, XFS and
// tmpfs of up to 64 KiB: the test writes to /dev/shm (tmpfs) when it
// can, and is skipped where no file system here takes such a value.
func TestLargeRecordsAreRead(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "tierfs-record-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := dir + "/00000000000000000000.log"
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := Record{Version: 1, State: tiered.StateRemote, Key: "t/p-0/00000000000000000000.log", ETag: "e", Size: 1 << 30, Freed: true}
	for i := range 100 {
		want.Extents = append(want.Extents, Extent{Pos: int64(i) << 20, Len: 1 << 20, Key: fmt.Sprintf("t/p-0/%020d.log", i), Off: 0, ETag: fmt.Sprintf("etag-%d", i)})
	}
	if err := writeRecord(path, want); errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) || errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("/dev/shm takes no xattr this large: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Getxattr(path, recordXattr, nil); err != nil || n <= recordMax {
		t.Fatalf("record of %d bytes (%v), want more than %d", n, err, recordMax)
	}
	got, ok, err := readRecord(path)
	if err != nil || !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("readRecord: %v, %v, %d extents, want %d", ok, err, len(got.Extents), len(want.Extents))
	}
	if st, ok, err := RecordState(path); err != nil || !ok || st != want.State {
		t.Fatalf("RecordState: %v, %v, %v, want %v", st, ok, err, want.State)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, ok, err = readRecordFd(int(f.Fd()), path)
	if err != nil || !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("readRecordFd: %v, %v, %d extents, want %d", ok, err, len(got.Extents), len(want.Extents))
	}
}
