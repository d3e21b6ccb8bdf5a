// Package s3test starts a real S3-compatible server (versitygw, posix
// backend) on a loopback port for tests and benchmarks.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

// Server is a running versitygw.
type Server struct {
	Endpoint  string // http://127.0.0.1:PORT
	AccessKey string
	SecretKey string
	cmd       *exec.Cmd
	dir       string
}

// Binary finds versitygw: $VERSITYGW, PATH, then $GOPATH/bin.
func Binary() (string, error) {
	if p := os.Getenv("VERSITYGW"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			gopath = strings.TrimSpace(string(out))
		}
	}
	for _, dir := range filepath.SplitList(gopath) {
		p := filepath.Join(dir, "bin", "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("versitygw not found (run scripts/install-deps, or go install github.com/versity/versitygw/cmd/versitygw@v1.8.0)")
}

// Start runs versitygw over dir (created if needed) on a free loopback
// port and waits until it answers.
func Start(dir string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	var b [12]byte
	rand.Read(b[:])
	s := &Server{Endpoint: "http://" + addr, AccessKey: "tierfs-test", SecretKey: hex.EncodeToString(b[:]), dir: dir}
	s.cmd = exec.Command(bin, "--port", addr, "--access", s.AccessKey, "--secret", s.SecretKey, "posix", dir)
	logf, err := os.Create(filepath.Join(filepath.Dir(dir), filepath.Base(dir)+".versitygw.log"))
	if err != nil {
		return nil, err
	}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("versitygw on %s did not answer in 30s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the server.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		s.cmd.Process.Kill()
	}
}

// Options are S3 store options for bucket on this server.
func (s *Server) Options(bucket, prefix string) store.S3Options {
	return store.S3Options{Bucket: bucket, Prefix: prefix, Endpoint: s.Endpoint, PathStyle: true, AccessKey: s.AccessKey, SecretKey: s.SecretKey, Timeout: 30 * time.Second}
}

// NewStore creates bucket and returns a store on it.
func (s *Server) NewStore(ctx context.Context, bucket, prefix string) (*store.S3, error) {
	st, err := store.NewS3(ctx, s.Options(bucket, prefix))
	if err != nil {
		return nil, err
	}
	return st, st.CreateBucket(ctx)
}

// StartT starts a server for a test and stops it at the end.
func StartT(t testing.TB) *Server {
	t.Helper()
	s, err := Start(filepath.Join(t.TempDir(), "s3"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}
