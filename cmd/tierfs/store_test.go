package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
)

func TestStoreCommands(t *testing.T) {
	dir := t.TempDir()
	url := "file://" + filepath.Join(dir, "remote")
	src := filepath.Join(dir, "seg.log")
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	os.WriteFile(src, data, 0o644)
	run := func(args ...string) error {
		return Main(append([]string{"tierfs", "store", "--store", url}, args...))
	}
	if err := run("put", "--journal-dir", filepath.Join(dir, "j"), "--chunk-size", "1048576", src, "t-0/seg.log"); err != nil {
		t.Fatal(err)
	}
	if err := run("verify", "t-0/seg.log"); err != nil {
		t.Fatal(err)
	}
	back := filepath.Join(dir, "back")
	if err := run("get", "--journal-dir", filepath.Join(dir, "j"), "t-0/seg.log", back); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatal("get returned other bytes")
	}
	// Corrupt the stored object behind the store's back: verify exits 1.
	obj := filepath.Join(dir, "remote", "t-0", "seg.log")
	f, _ := os.OpenFile(obj, os.O_WRONLY, 0)
	f.WriteAt([]byte{^data[2<<20]}, 2<<20)
	f.Close()
	if err := run("verify", "t-0/seg.log"); err == nil || exitCode(err) != 1 {
		t.Fatalf("verify of a corrupt object: %v", err)
	}
	if err := run("put", src); exitCode(err) != 2 {
		t.Fatalf("put with one argument: %v", err)
	}
	if err := Main([]string{"tierfs", "store", "--store", url, "--s3-access-key", "x", "ls"}); err == nil || !strings.Contains(err.Error(), "both") {
		t.Fatalf("half the credentials: %v", err)
	}
}

// TestStoreCatHeldFile: store cat of a small segment's index file, which
// its .log's manifest holds under no key of its own, writes that file
// (a range of it too); a key the manifest does not hold is not found.
func TestStoreCatHeldFile(t *testing.T) {
	dir := t.TempDir()
	s, err := store.NewDir(filepath.Join(dir, "remote"))
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "seg.log")
	os.WriteFile(src, []byte("records"), 0o644)
	index := []byte("0123456789abcdef")
	up := &chunkxfer.Uploader{Store: s, JournalDir: filepath.Join(dir, "j")}
	key := "t-0/00000000000000000000-0a1b2c3d.log"
	if _, err := up.UploadWith(context.Background(), src, key, chunkxfer.UploadOptions{Files: []chunkxfer.File{chunkxfer.NewFile(".index", index)}}); err != nil {
		t.Fatal(err)
	}
	cat := func(args ...string) (string, error) {
		t.Helper()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout := os.Stdout
		os.Stdout = w
		err = Main(append([]string{"tierfs", "store", "--store", "file://" + filepath.Join(dir, "remote"), "cat"}, args...))
		os.Stdout = stdout
		w.Close()
		out, _ := io.ReadAll(r)
		return string(out), err
	}
	if out, err := cat("t-0/00000000000000000000-0a1b2c3d.index"); err != nil || out != string(index) {
		t.Fatalf("cat of a held file: %q, %v", out, err)
	}
	if out, err := cat("--offset", "4", "--length", "3", "t-0/00000000000000000000-0a1b2c3d.index"); err != nil || out != "456" {
		t.Fatalf("cat of a range of a held file: %q, %v", out, err)
	}
	if _, err := cat("t-0/00000000000000000000-0a1b2c3d.timeindex"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("cat of a file not held: %v", err)
	}
}
