package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMemFaults(t *testing.T) {
	ctx := context.Background()
	m := NewMem(nil)
	body := []byte("0123456789abcdef")
	if _, err := m.Put(ctx, "k", bytes.NewReader(body), 16); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("503 slow down")
	m.Inject(Fault{Op: OpGet, Skip: 1, Times: 2, Err: boom})
	for i, want := range []error{nil, boom, boom, nil} {
		_, err := ReadAll(m.Get(ctx, "k", 0, -1, GetOptions{}))
		if !errors.Is(err, want) {
			t.Fatalf("get %d: %v, want %v", i, err, want)
		}
	}
	m.ClearFaults()
	m.Inject(Fault{Op: OpGet, Times: 1, FlipAt: 3})
	if b, _ := ReadAll(m.Get(ctx, "k", 0, -1, GetOptions{})); b[2] == body[2] || string(b[3:]) != string(body[3:]) {
		t.Fatalf("flip: %q", b)
	}
	m.Inject(Fault{Op: OpGet, Times: 1, Truncate: 5})
	if b, err := ReadAll(m.Get(ctx, "k", 0, -1, GetOptions{})); err != nil || string(b) != "01234" {
		t.Fatalf("truncate: %q %v", b, err)
	}
	m.Inject(Fault{Op: OpGet, Times: 1, DieAfter: 7})
	if b, err := ReadAll(m.Get(ctx, "k", 0, -1, GetOptions{})); !errors.Is(err, ErrConnReset) || string(b) != "0123456" {
		t.Fatalf("die: %q %v", b, err)
	}
	m.Inject(Fault{Op: OpPut, KeyPrefix: "slow/", Times: 1, Latency: time.Hour})
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := m.Put(cctx, "slow/x", bytes.NewReader(body), 16); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("latency: %v", err)
	}
	gate := make(chan struct{})
	m.Inject(Fault{Op: OpPut, KeyPrefix: "gated/", Times: 1, Gate: gate})
	put := make(chan error, 1)
	go func() {
		_, err := m.Put(ctx, "gated/x", bytes.NewReader(body), 16)
		put <- err
	}()
	select {
	case err := <-put:
		t.Fatalf("a gated put went on before its gate opened: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(gate)
	if err := <-put; err != nil {
		t.Fatalf("gated put: %v", err)
	}
	if _, err := m.Head(ctx, "gated/x"); err != nil {
		t.Fatalf("gated put not stored: %v", err)
	}
	m.Inject(Fault{Op: OpUploadPart, Times: 1, DieAfter: 3})
	id, _ := m.CreateMultipart(ctx, "u")
	if _, err := m.UploadPart(ctx, "u", id, 1, bytes.NewReader(body), 16); !errors.Is(err, ErrConnReset) {
		t.Fatalf("part body: %v", err)
	}
	if ps, _ := m.ListParts(ctx, "u", id); len(ps) != 0 {
		t.Fatalf("failed part stored: %v", ps)
	}
	if m.Calls(OpGet) != 7 || m.Calls(OpUploadPart) != 1 {
		t.Fatalf("calls: get %d part %d", m.Calls(OpGet), m.Calls(OpUploadPart))
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, "file://"+dir+"/remote", S3Options{})
	if _, ok := s.(*Dir); err != nil || !ok {
		t.Fatalf("file URL: %T %v", s, err)
	}
	s, err = Open(ctx, "s3://bucket/pre?endpoint=http://127.0.0.1:1&region=eu-west-1", S3Options{AccessKey: "AK", SecretKey: "SECRET"})
	if _, ok := s.(*S3); err != nil || !ok || s.(*S3).prefix != "pre/" {
		t.Fatalf("s3 URL: %T %v", s, err)
	}
	for url, msg := range map[string]string{
		"file://host/x":           "absolute path",
		"s3://b/p?secret=x":       "unknown parameter",
		"s3://ak:sk@b/p":          "credentials do not belong",
		"ftp://x":                 "scheme",
		"s3://b?path-style=maybe": "path-style",
		"file://relative":         "absolute path",
	} {
		if _, err := Open(ctx, url, S3Options{}); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want %q", url, err, msg)
		}
	}
	if str := (S3Options{Bucket: "b", AccessKey: "AKIAEXAMPLE", SecretKey: "TOPSECRET"}).String(); strings.Contains(str, "TOPSECRET") || strings.Contains(str, "AKIAEXAMPLE") {
		t.Fatalf("options print a credential: %s", str)
	}
}

func TestDirRemovesStaleTemps(t *testing.T) {
	root := t.TempDir() + "/remote"
	if _, err := NewDir(root); err != nil {
		t.Fatal(err)
	}
	old := root + "/" + dirReserved + "/tmp-upload-old"
	fresh := root + "/" + dirReserved + "/tmp-fresh"
	os.MkdirAll(old, 0o755)
	os.WriteFile(fresh, nil, 0o644)
	then := time.Now().Add(-2 * time.Hour)
	os.Chtimes(old, then, then)
	if _, err := NewDir(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err == nil {
		t.Error("a crashed writer's temporary upload dir was kept")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Error("a fresh temporary file was removed")
	}
}
