package fsutil

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteFileAtomic: the file holds exactly the new data with the mode
// asked for, replaces what was there, and leaves no temporary file; a
// write that cannot happen leaves the old file as it was.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := os.WriteFile(p, []byte("old content, longer than the new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("new"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if err != nil || string(b) != "new" || fi.Mode().Perm() != 0o640 {
		t.Fatalf("%q %v mode %v", b, err, fi.Mode())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("left in the directory: %v", ents)
	}
	if err := WriteFileAtomic(filepath.Join(dir, "missing", "x"), []byte("x"), 0o644); err == nil {
		t.Fatal("wrote into a directory that does not exist")
	}
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	if os.Geteuid() != 0 { // root writes anyway
		if err := WriteFileAtomic(p, []byte("newer"), 0o644); err == nil {
			t.Fatal("wrote into a read-only directory")
		}
		if b, _ := os.ReadFile(p); string(b) != "new" {
			t.Fatalf("a failed write changed the file: %q", b)
		}
	}
}
