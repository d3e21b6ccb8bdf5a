// Package s3test starts a real S3-compatible server (versitygw, posix
// backend) on a loopback port for tests and benchmarks.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"maps"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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
	exited    chan struct{}
	dir       string
	bin       string
	addr      string
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
	s := &Server{Endpoint: "http://" + addr, AccessKey: "tierfs-test", SecretKey: hex.EncodeToString(b[:]), dir: dir, bin: bin, addr: addr}
	return s, s.run()
}

// run starts the server process and waits until it answers.
func (s *Server) run() error {
	// --keep-alive: versitygw closes the connection after each response
	// unless told not to; S3 keeps it, and a client that dials again for
	// every request spends as much CPU on that as on the request.
	s.cmd = exec.Command(s.bin, "--port", s.addr, "--access", s.AccessKey, "--secret", s.SecretKey, "--keep-alive", "posix", s.dir)
	// The server dies with the process that started it, even when that
	// one exits without Stop (a failed benchmark, a crashed test).
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.OpenFile(filepath.Join(filepath.Dir(s.dir), filepath.Base(s.dir)+".versitygw.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exited = make(chan struct{})
	go func() { s.cmd.Wait(); logf.Close(); close(s.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("versitygw on %s did not answer in 30s: %v", s.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the server and waits for it to exit.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// Pid is the server process's id (0 when it is not running), for
// benchmarks that measure its CPU.
func (s *Server) Pid() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Restart starts a stopped server again on the same address and data.
func (s *Server) Restart() error { return s.run() }

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

// FaultProxy is an HTTP proxy in front of a server that breaks a share
// of requests: 503 Slow Down answers, connections reset before a reply,
// slow replies, and reply bodies cut short.
type FaultProxy struct {
	URL  string
	srv  *http.Server
	mu   sync.Mutex
	rnd  *mrand.Rand
	Rate float64       // share of requests that get a fault
	Slow time.Duration // delay of a slow reply
	// Counts of faults injected, by kind.
	Faults map[string]int
}

// StartFaultProxy proxies to target on a free loopback port.
func StartFaultProxy(target string, rate float64, seed uint64) (*FaultProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &FaultProxy{URL: "http://" + l.Addr().String(), rnd: mrand.New(mrand.NewPCG(seed, 7)), Rate: rate, Slow: 300 * time.Millisecond, Faults: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	// The client signed the request for the proxy's host; keep it.
	rp.Director = func(r *http.Request) {
		r.URL.Scheme, r.URL.Host = u.Scheme, u.Host
	}
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p.pick() {
		case "503":
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>injected</Message></Error>`)
		case "reset":
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					if tc, ok := c.(*net.TCPConn); ok {
						tc.SetLinger(0) // RST, not FIN
					}
					c.Close()
					return
				}
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		case "slow":
			time.Sleep(p.Slow)
			rp.ServeHTTP(w, r)
		case "cut":
			rp.ServeHTTP(&cutWriter{ResponseWriter: w, left: 1000}, r)
		default:
			rp.ServeHTTP(w, r)
		}
	})}
	go p.srv.Serve(l)
	return p, nil
}

func (p *FaultProxy) pick() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rnd.Float64() >= p.Rate {
		return ""
	}
	kind := []string{"503", "reset", "slow", "cut"}[p.rnd.IntN(4)]
	p.Faults[kind]++
	return kind
}

// Counts returns the faults injected so far.
func (p *FaultProxy) Counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.Faults)
}

// Close stops the proxy.
func (p *FaultProxy) Close() { p.srv.Close() }

// cutWriter passes the headers and the first left bytes of a body, then
// kills the connection: the client sees a body shorter than its length.
type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(b []byte) (int, error) {
	if c.left <= 0 {
		panic(http.ErrAbortHandler)
	}
	if len(b) > c.left {
		n, _ := c.ResponseWriter.Write(b[:c.left])
		c.left = 0
		if f, ok := c.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		_ = n
		panic(http.ErrAbortHandler)
	}
	c.left -= len(b)
	return c.ResponseWriter.Write(b)
}
