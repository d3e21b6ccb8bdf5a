package peer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierfs/tierfs/peer/peertest"
)

const testChunk = 64 << 10

// writeTree makes a tree of files of awkward sizes, a symlink, an empty
// dir, modes and times.
func writeTree(t *testing.T, root string, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "orders-0", "sub"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "orders-0", "empty"), 0o700))
	for i, size := range []int{0, 1, testChunk - 1, testChunk, testChunk + 1, 3*testChunk + 12345} {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		p := filepath.Join(root, "orders-0", fmt.Sprintf("%020d.log", i))
		if i%2 == 1 {
			p = filepath.Join(root, "orders-0", "sub", fmt.Sprintf("f%d", i))
		}
		must(os.WriteFile(p, b, 0o640))
		mt := time.Unix(1_700_000_000+int64(i), 123456789)
		must(os.Chtimes(p, mt, mt))
	}
	must(os.Symlink("00000000000000000000.log", filepath.Join(root, "orders-0", "link")))
	must(os.Chmod(filepath.Join(root, "orders-0", "sub"), 0o750))
}

// sameTree fails unless b holds exactly what a does: kinds, bytes, modes,
// file mtimes, symlink targets.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	seen := 0
	err := filepath.Walk(a, func(p string, ai os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		q := filepath.Join(b, rel)
		bi, err := os.Lstat(q)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		seen++
		if ai.Mode() != bi.Mode() {
			t.Errorf("%s: mode %v, want %v", rel, bi.Mode(), ai.Mode())
		}
		switch {
		case ai.Mode().IsRegular():
			x, _ := os.ReadFile(p)
			y, _ := os.ReadFile(q)
			if !bytes.Equal(x, y) {
				t.Errorf("%s: %d bytes differ from the %d sent", rel, len(y), len(x))
			}
			if !ai.ModTime().Equal(bi.ModTime()) {
				t.Errorf("%s: mtime %v, want %v", rel, bi.ModTime(), ai.ModTime())
			}
		case ai.Mode()&os.ModeSymlink != 0:
			x, _ := os.Readlink(p)
			y, _ := os.Readlink(q)
			if x != y {
				t.Errorf("%s: -> %q, want %q", rel, y, x)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	filepath.Walk(b, func(p string, bi os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, PartSuffix) {
			t.Errorf("%s left behind", p)
		}
		return nil
	})
	if seen < 5 {
		t.Fatalf("compared only %d entries", seen)
	}
}

type served struct {
	srv  *Server
	addr string
}

func serve(t *testing.T, root string, tlsCfg *tls.Config) served {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Root: root, TLS: tlsCfg}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return served{s, ln.Addr().String()}
}

func pki(t *testing.T) (server, client *tls.Config, p peertest.PKI) {
	t.Helper()
	p, err := peertest.WritePKI(t.TempDir(), "test")
	if err != nil {
		t.Fatal(err)
	}
	server, err = ServerTLS(p.ServerCert, p.ServerKey, p.CA)
	if err != nil {
		t.Fatal(err)
	}
	client, err = ClientTLS(p.ClientCert, p.ClientKey, p.CA, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return server, client, p
}

func TestPullTree(t *testing.T) {
	for _, mode := range []string{"sendfile", "tls"} {
		t.Run(mode, func(t *testing.T) {
			src, dst := t.TempDir(), t.TempDir()
			writeTree(t, src, 1)
			var sc, cc *tls.Config
			if mode == "tls" {
				sc, cc, _ = pki(t)
			}
			s := serve(t, src, sc)
			c := &Client{Addr: s.addr, TLS: cc, ChunkSize: testChunk}
			defer c.Close()
			st, err := c.Pull(context.Background(), "orders-0", dst)
			if err != nil {
				t.Fatal(err)
			}
			sameTree(t, filepath.Join(src, "orders-0"), filepath.Join(dst, "orders-0"))
			if st.Files != 6 || st.Dirs != 3 || st.Symlinks != 1 || st.Received != st.Bytes || st.Resent != 0 {
				t.Errorf("stats %+v", st)
			}
			if s.srv.BytesSent() != st.Bytes {
				t.Errorf("server sent %d, want %d", s.srv.BytesSent(), st.Bytes)
			}
			// Pulled again over what is there: nothing is sent, and the
			// tree is the same.
			st, err = c.Pull(context.Background(), "orders-0", dst)
			if err != nil {
				t.Fatal(err)
			}
			sameTree(t, filepath.Join(src, "orders-0"), filepath.Join(dst, "orders-0"))
			// A file of the tree alone, and the whole shared root.
			if _, err := c.Pull(context.Background(), "orders-0/sub/f1", t.TempDir()); err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			if _, err := c.Pull(context.Background(), "", root); err != nil {
				t.Fatal(err)
			}
			sameTree(t, filepath.Join(src, "orders-0"), filepath.Join(root, "orders-0"))
		})
	}
}

// cutter is a TCP proxy that cuts every connection after it has carried
// every bytes from the server, and counts what it carried.
type cutter struct {
	ln      net.Listener
	every   int64
	carried atomic.Int64
	cuts    atomic.Int64
}

func newCutter(t *testing.T, target string, every int64) *cutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln, every: every}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			go func() {
				defer in.Close()
				defer out.Close()
				go io.Copy(out, in)
				n, _ := io.Copy(in, io.LimitReader(out, c.every))
				c.carried.Add(n)
				if n == c.every {
					c.cuts.Add(1)
				}
			}()
		}
	}()
	return c
}

func TestPullResumesOverACuttingProxy(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	big := make([]byte, 40*testChunk+999)
	for i := range big {
		big[i] = byte(i * 7 / 5)
	}
	os.WriteFile(filepath.Join(src, "big"), big, 0o644)
	s := serve(t, src, nil)
	// A cut every 200 KiB: the connection drops in the middle of chunks.
	px := newCutter(t, s.addr, 200<<10)
	c := &Client{Addr: px.ln.Addr().String(), ChunkSize: testChunk}
	defer c.Close()
	st, err := c.Pull(context.Background(), "big", dst)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(dst, "big"))
	if !bytes.Equal(got, big) {
		t.Fatal("pulled bytes differ")
	}
	if px.cuts.Load() < 5 || st.Reconnects < 5 {
		t.Fatalf("%d cuts, %d reconnects: the proxy did not cut", px.cuts.Load(), st.Reconnects)
	}
	// Each cut loses at most the chunk in flight: far from starting over.
	if limit := int64(len(big)) + px.cuts.Load()*(testChunk+4096); px.carried.Load() > limit {
		t.Errorf("the proxy carried %d bytes for a %d-byte file with %d cuts (limit %d)", px.carried.Load(), len(big), px.cuts.Load(), limit)
	}
	t.Logf("file %d bytes, carried %d (%.2f×), %d cuts", len(big), px.carried.Load(), float64(px.carried.Load())/float64(len(big)), px.cuts.Load())
}

func TestTLSRefusesStrangers(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, 2)
	sc, _, p := pki(t)
	s := serve(t, src, sc)
	other, err := peertest.WritePKI(t.TempDir(), "other")
	if err != nil {
		t.Fatal(err)
	}
	// A client whose certificate another CA signed (it trusts the
	// server's CA), one with no certificate, and one without TLS.
	wrong, err := ClientTLS(other.ClientCert, other.ClientKey, p.CA, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	noCert, _ := ClientTLS(other.ClientCert, other.ClientKey, p.CA, "127.0.0.1")
	noCert.Certificates = nil
	for name, cfg := range map[string]*tls.Config{"wrong CA": wrong, "no certificate": noCert, "no TLS": nil} {
		t.Run(name, func(t *testing.T) {
			dst := t.TempDir()
			c := &Client{Addr: s.addr, TLS: cfg, Retries: 1}
			defer c.Close()
			_, err := c.Pull(context.Background(), "orders-0", dst)
			if err == nil {
				t.Fatal("pulled")
			}
			t.Log(err)
			if ents, _ := os.ReadDir(dst); len(ents) != 0 {
				t.Errorf("wrote %v", ents)
			}
		})
	}
	if s.srv.BytesSent() != 0 {
		t.Errorf("sent %d bytes to strangers", s.srv.BytesSent())
	}
	// A client that trusts another CA refuses the server.
	c := &Client{Addr: s.addr, Retries: 1}
	c.TLS, _ = ClientTLS(p.ClientCert, p.ClientKey, other.CA, "127.0.0.1")
	if _, err := c.Pull(context.Background(), "orders-0", t.TempDir()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a server signed by an untrusted CA: %v", err)
	}
}

// A file written while it is sent is sent again; what arrives is one
// version of it, never a mix.
func TestFileChangedWhileSentIsNotTorn(t *testing.T) {
	for _, mode := range []string{"sendfile", "tls"} {
		t.Run(mode, func(t *testing.T) {
			src, dst := t.TempDir(), t.TempDir()
			p := filepath.Join(src, "seg")
			v1 := bytes.Repeat([]byte{1}, 5*testChunk)
			os.WriteFile(p, v1, 0o644)
			var sc, cc *tls.Config
			if mode == "tls" {
				sc, cc, _ = pki(t)
			}
			s := serve(t, src, sc)
			var once sync.Once
			v2 := append(bytes.Repeat([]byte{2}, 2*testChunk), bytes.Repeat([]byte{3}, 4*testChunk)...)
			s.srv.beforeChunk = func(path string, off int64) {
				if off == 3*testChunk {
					// Overwrite the start (already sent) and grow it.
					once.Do(func() { os.WriteFile(p, v2, 0o644) })
				}
			}
			c := &Client{Addr: s.addr, TLS: cc, ChunkSize: testChunk}
			defer c.Close()
			st, err := c.Pull(context.Background(), "seg", dst)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(filepath.Join(dst, "seg"))
			if !bytes.Equal(got, v2) {
				t.Fatalf("got %d bytes, not the second version", len(got))
			}
			if st.Resent == 0 {
				t.Errorf("stats %+v: not resent", st)
			}
			// Only what changed came again: the chunks of the first
			// version past the overwrite were all 1s and are now 3s,
			// so at most both versions in full.
			if st.Received > int64(len(v1)+len(v2)) {
				t.Errorf("received %d", st.Received)
			}
		})
	}
}

func TestFileThatKeepsChangingFails(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	p := filepath.Join(src, "active.log")
	os.WriteFile(p, make([]byte, 3*testChunk), 0o644)
	s := serve(t, src, nil)
	var n atomic.Int64
	s.srv.beforeChunk = func(string, int64) {
		f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		fmt.Fprintf(f, "record %d\n", n.Add(1))
		f.Close()
	}
	c := &Client{Addr: s.addr, ChunkSize: testChunk, MaxPasses: 3}
	defer c.Close()
	_, err := c.Pull(context.Background(), "active.log", dst)
	if err == nil || !strings.Contains(err.Error(), "active.log: it changed while it was sent, 3 times") {
		t.Fatalf("err %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "active.log")); !os.IsNotExist(err) {
		t.Errorf("a torn file was put in place: %v", err)
	}
}

// A pull that died leaves its part file; the next one sends only the
// chunks it lacks or holds wrong.
func TestPullResumesFromPartFile(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	data := make([]byte, 10*testChunk)
	for i := range data {
		data[i] = byte(i % 251)
	}
	os.WriteFile(filepath.Join(src, "seg"), data, 0o644)
	part := append([]byte(nil), data[:6*testChunk]...)
	part[2*testChunk+5] ^= 0xff // a chunk torn by the crash
	os.WriteFile(filepath.Join(dst, "seg"+PartSuffix), part, 0o600)
	s := serve(t, src, nil)
	c := &Client{Addr: s.addr, ChunkSize: testChunk}
	defer c.Close()
	st, err := c.Pull(context.Background(), "seg", dst)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(dst, "seg"))
	if !bytes.Equal(got, data) {
		t.Fatal("bytes differ")
	}
	if st.Kept != 5*testChunk || st.Received != 5*testChunk {
		t.Errorf("kept %d, received %d; want 5 chunks each", st.Kept, st.Received)
	}
}

func TestServerStaysBeneathItsRoot(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644)
	src := t.TempDir()
	os.Mkdir(filepath.Join(src, "p"), 0o755)
	os.Symlink(outside, filepath.Join(src, "p", "escape"))
	s := serve(t, src, nil)
	c := &Client{Addr: s.addr, Retries: 1}
	defer c.Close()
	for _, p := range []string{"../" + filepath.Base(outside) + "/secret", "/etc/passwd", "p/escape/secret", "p/../../x"} {
		if _, err := c.Pull(context.Background(), p, t.TempDir()); err == nil {
			t.Errorf("%s: pulled", p)
		}
	}
	// The symlink itself is copied as a symlink, not followed.
	dst := t.TempDir()
	if _, err := c.Pull(context.Background(), "p", dst); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "p", "escape")); err != nil || target != outside {
		t.Errorf("escape: %q, %v", target, err)
	}
	if s.srv.BytesSent() != 0 {
		t.Errorf("sent %d bytes", s.srv.BytesSent())
	}
}

// A hostile server cannot make the client write outside its directory:
// not by a path, nor through a symlink it sent first.
func TestClientStaysBeneathItsDir(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	outside := t.TempDir()
	listings := [][]Entry{
		{{Path: "p", Kind: KindDir, Mode: 0o755}, {Path: "p/../../x", Kind: KindFile, Size: 1, Version: "v"}},
		{{Path: "p", Kind: KindDir, Mode: 0o755}, {Path: "/x", Kind: KindFile, Size: 1, Version: "v"}},
		{{Path: "p", Kind: KindDir, Mode: 0o755}, {Path: "p/l", Kind: KindSymlink, Target: outside}, {Path: "p/l/x", Kind: KindFile, Size: 1, Version: "v"}},
		{{Path: "q/x", Kind: KindFile, Size: 1, Version: "v"}},
	}
	go func() {
		for i := 0; ; i++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func(conn net.Conn, l []Entry) {
				defer conn.Close()
				w := newWriter(conn)
				readJSON(newReader(conn), &request{})
				for _, e := range l {
					writeJSON(w, e)
				}
				writeJSON(w, Entry{End: true})
				w.Flush()
				// Reads get one byte of "x".
				r := newReader(conn)
				for {
					var req request
					if readJSON(r, &req) != nil {
						return
					}
					writeJSON(w, header{Len: 1, CRC: crcOf([]byte("x")), Version: "v"})
					w.WriteString("x")
					writeJSON(w, trailer{Version: "v"})
					w.Flush()
				}
			}(conn, listings[i%len(listings)])
		}
	}()
	for i := range listings {
		dst := t.TempDir()
		c := &Client{Addr: ln.Addr().String(), Retries: 1}
		_, err := c.Pull(context.Background(), "p", dst)
		c.Close()
		if err == nil {
			t.Errorf("listing %d: pulled", i)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("listing %d wrote outside: %v", i, ents)
		}
	}
}

func newWriter(c net.Conn) *bufio.Writer { return bufio.NewWriter(c) }
func newReader(c net.Conn) *bufio.Reader { return bufio.NewReader(c) }
func crcOf(b []byte) uint32              { return crc32.Checksum(b, castagnoli) }
