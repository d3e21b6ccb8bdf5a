package fs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestInPlaceMount mounts over a directory that already holds files:
// they are served through the mount, changes made through it land in the
// directory, the state directory stays hidden, and after unmount
// everything is there.
func TestInPlaceMount(t *testing.T) {
	requireMount(t)
	dir := filepath.Join(t.TempDir(), "kafka-logs")
	part := filepath.Join(dir, "orders-0")
	if err := os.MkdirAll(part, 0o755); err != nil {
		t.Fatal(err)
	}
	seg := bytes.Repeat([]byte("record batch bytes "), 50000)
	segPath := filepath.Join(part, "00000000000000000000.log")
	if err := os.WriteFile(segPath, seg, 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	os.Chtimes(segPath, old, old)
	var before unix.Stat_t
	unix.Stat(dir, &before)

	srv := startServer(t, dir, dir, true)
	var st unix.Statfs_t
	unix.Statfs(dir, &st)
	if st.Type != 0x65735546 { // FUSE_SUPER_MAGIC
		t.Fatalf("%s is not a FUSE mount after mounting in place (type %#x)", dir, st.Type)
	}
	got, err := os.ReadFile(segPath)
	if err != nil || !bytes.Equal(got, seg) {
		t.Fatalf("pre-existing segment through the mount: err=%v equal=%v", err, bytes.Equal(got, seg))
	}
	fi, _ := os.Stat(segPath)
	if !fi.ModTime().Equal(old) {
		t.Errorf("mtime through the mount = %v, want %v", fi.ModTime(), old)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() == StateDirName {
			t.Errorf("state directory %s is visible through the mount", StateDirName)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, StateDirName)); !os.IsNotExist(err) {
		t.Errorf("stat of the state directory through the mount: %v, want ENOENT", err)
	}
	if err := os.Mkdir(filepath.Join(dir, StateDirName), 0o755); !os.IsExist(err) {
		t.Errorf("mkdir of the state directory through the mount: %v, want EEXIST", err)
	}
	newSeg := filepath.Join(part, "00000000000000001000.log")
	if err := os.WriteFile(newSeg, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A second mount on the same directory is refused with a clear error.
	if _, err := Mount(Config{Mountpoint: dir}); err == nil {
		t.Fatal("second in-place mount succeeded")
	} else if !bytes.Contains([]byte(err.Error()), []byte("already")) {
		t.Errorf("second mount error does not say it is already mounted: %v", err)
	}
	srv.Stop(t)

	unix.Statfs(dir, &st)
	if st.Type == 0x65735546 {
		t.Fatal("still mounted after stop")
	}
	for path, want := range map[string][]byte{segPath: seg, newSeg: []byte("new")} {
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("after unmount %s: err=%v equal=%v", path, err, bytes.Equal(got, want))
		}
	}
	if _, err := os.Stat(filepath.Join(dir, StateDirName)); err != nil {
		t.Errorf("state directory missing after unmount: %v", err)
	}
}
