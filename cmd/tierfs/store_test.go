package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
