package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/peer/peertest"
)

// startServe runs `tierfs serve` on a free loopback port and returns its
// address.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(tierfsBin, append([]string{"serve", "--listen", addr}, args...)...)
	logf, _ := os.Create(filepath.Join(t.TempDir(), "serve.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		logf.Close()
	})
	waitFor(t, 10*time.Second, "tierfs serve", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, func() string { b, _ := os.ReadFile(logf.Name()); return string(b) })
	return addr
}

// TestPeerPullOfAMountedPartition: `tierfs serve` shares a tierfs mount
// whose partition has an evicted segment; `tierfs pull` copies the
// partition byte-exact, in plain TCP and with mutual TLS, and a client
// with another CA's certificate is refused.
func TestPeerPullOfAMountedPartition(t *testing.T) {
	requireRoot(t)
	r := remotes(t)[0]
	dir, backing, mnt := mountDirs(t)
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 4, Batches: 30, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
	if err != nil {
		t.Fatal(err)
	}
	startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", mnt)
	evicted := filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][1]))
	if out, code := tierfs(t, nil, "evict", evicted); code != 0 {
		t.Fatalf("evict: %s", out)
	}
	want := tree(t, filepath.Join(mnt, "orders-0"))

	pki, err := peertest.WritePKI(dir, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	other, err := peertest.WritePKI(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	plain := startServe(t, mnt)
	secure := startServe(t, "--tls-cert", pki.ServerCert, "--tls-key", pki.ServerKey, "--tls-ca", pki.CA, mnt)
	for _, c := range []struct {
		name string
		addr string
		args []string
	}{
		{"sendfile", plain, nil},
		{"tls", secure, []string{"--tls-cert", pki.ClientCert, "--tls-key", pki.ClientKey, "--tls-ca", pki.CA}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := filepath.Join(dir, "pulled-"+c.name)
			out, code := tierfs(t, nil, append(append([]string{"pull"}, c.args...), c.addr, "orders-0", dst)...)
			if code != 0 {
				t.Fatalf("pull: %s", out)
			}
			if !strings.Contains(out, "0 reconnects") || !strings.Contains(out, "files") {
				t.Errorf("pull said: %s", out)
			}
			if d := treeDiff(want, tree(t, filepath.Join(dst, "orders-0"))); d != "" {
				t.Fatalf("pulled tree differs:\n%s", d)
			}
			t.Log(strings.TrimSpace(out))
		})
	}
	// Another CA's client, and a client without TLS, get nothing.
	dst := filepath.Join(dir, "stranger")
	out, code := tierfs(t, nil, "pull", "--retries", "1", "--tls-cert", other.ClientCert, "--tls-key", other.ClientKey, "--tls-ca", pki.CA, secure, "orders-0", dst)
	if code == 0 || !strings.Contains(out, "refused this client's TLS certificate") {
		t.Errorf("a client of another CA: %d %s", code, out)
	}
	out, code = tierfs(t, nil, "pull", "--retries", "1", secure, "orders-0", dst)
	if code == 0 || !strings.Contains(out, "does the server want TLS?") {
		t.Errorf("a client without TLS: %d %s", code, out)
	}
	if ents, _ := os.ReadDir(dst); len(ents) != 0 {
		t.Errorf("strangers got %v", ents)
	}
	// Plain TCP beyond loopback needs --insecure.
	out, code = tierfs(t, nil, "serve", "--listen", "0.0.0.0:0", mnt)
	if code == 0 || !strings.Contains(out, "--insecure") {
		t.Errorf("plain serve on 0.0.0.0: %d %s", code, out)
	}
}
