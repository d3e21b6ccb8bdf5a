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

// TestPullTakesOverEvictedFiles (issue 9): pulling a partition from one
// tierfs mount into another of the same store sends the local files'
// bytes only; each evicted file arrives as an evicted file that reads
// from the sender's objects and references them, so they are not deleted
// when the sender's broker deletes its copy, and go once the receiver's
// does too. Into a mount of another store the bytes come over instead.
func TestPullTakesOverEvictedFiles(t *testing.T) {
	requireRoot(t)
	for _, r := range remotes(t) {
		t.Run(r.name, func(t *testing.T) {
			_, bkA, mA := mountDirs(t)
			_, bkB, mB := mountDirs(t)
			bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 5, Batches: 30, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(bkA)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(bkB, "meta.properties"), []byte("version=1\nnode.id=2\n"), 0o644)
			a := startMount(t, r.env, "--backing", bkA, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", mA)
			b := startMount(t, r.env, "--backing", bkB, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", mB)
			seg := func(mnt string, i int) string {
				return filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][i]))
			}
			for _, i := range []int{0, 1} {
				if out, code := tierfs(t, nil, "evict", seg(mA, i)); code != 0 {
					t.Fatalf("evict: %s", out)
				}
			}
			want := tree(t, filepath.Join(mA, "orders-0"))
			objsBefore := logObjects(t, r.url, r.env, "orders-0")
			addr := startServe(t, mA)
			out, code := tierfs(t, nil, "pull", addr, "orders-0", mB)
			if code != 0 {
				t.Fatalf("pull: %s", out)
			}
			t.Log(strings.TrimSpace(out))
			if !strings.Contains(out, "2 evicted files taken over from the store") {
				t.Errorf("pull said: %s", out)
			}
			if d := treeDiff(want, tree(t, filepath.Join(mB, "orders-0"))); d != "" {
				t.Fatalf("pulled tree differs:\n%s", d)
			}
			for _, i := range []int{0, 1} {
				if st := state(seg(mB, i)); st != "remote" {
					t.Errorf("%s on the receiver: %s", filepath.Base(seg(mB, i)), st)
				}
				fa, _ := os.Stat(seg(mA, i))
				fb, _ := os.Stat(seg(mB, i))
				if !fa.ModTime().Equal(fb.ModTime()) || fa.Size() != fb.Size() {
					t.Errorf("%s: size or mtime differ: %v %v", filepath.Base(seg(mB, i)), fa, fb)
				}
			}
			if alloc := allocated(t, filepath.Join(bkB, "orders-0")); alloc > allocated(t, filepath.Join(bkA, "orders-0"))+64<<10 {
				t.Errorf("the receiver holds %d bytes of segments locally, the sender %d", alloc, allocated(t, filepath.Join(bkA, "orders-0")))
			}
			if n := logObjects(t, r.url, r.env, "orders-0"); n != objsBefore {
				t.Errorf("%d .log objects after the pull, %d before: something was uploaded", n, objsBefore)
			}
			// The sender's broker deletes its copy of the partition: the
			// objects stay, the receiver still reads them.
			if err := os.RemoveAll(filepath.Join(mA, "orders-0")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond)
			if got := tree(t, filepath.Join(mB, "orders-0")); treeDiff(want, got) != "" {
				t.Fatalf("after the sender deleted its copy:\n%s", treeDiff(want, got))
			}
			if n := logObjects(t, r.url, r.env, "orders-0"); n != objsBefore {
				t.Errorf("%d .log objects after the sender deleted its segments, %d before", n, objsBefore)
			}
			// The receiver deletes them too: then they go.
			for _, i := range []int{0, 1} {
				os.Remove(seg(mB, i))
			}
			waitFor(t, 15*time.Second, "the objects to go", func() bool { return logObjects(t, r.url, r.env, "orders-0") == 0 }, a.Log, b.Log)

			// Into a mount of another store, the bytes come over.
			_, bkC, mC := mountDirs(t)
			startMount(t, nil, "--backing", bkC, "--remote", "file://"+filepath.Join(t.TempDir(), "other"), mC)
			_, bkD, mD := mountDirs(t)
			bases, err = kafkatest.LogDir{Topic: "pay", Partitions: 1, Segments: 3, Batches: 30, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(bkD)
			if err != nil {
				t.Fatal(err)
			}
			startMount(t, r.env, "--backing", bkD, "--remote", r.url, "--ship-after", "1000h", mD)
			ev := filepath.Join(mD, "pay-0", fmt.Sprintf("%020d.log", bases["pay-0"][0]))
			if out, code := tierfs(t, nil, "evict", ev); code != 0 {
				t.Fatalf("evict: %s", out)
			}
			want = tree(t, filepath.Join(mD, "pay-0"))
			out, code = tierfs(t, nil, "pull", startServe(t, mD), "pay-0", mC)
			if code != 0 || !strings.Contains(out, "0 evicted files taken over") {
				t.Fatalf("pull into another store's mount: %d %s", code, out)
			}
			if d := treeDiff(want, tree(t, filepath.Join(mC, "pay-0"))); d != "" {
				t.Fatalf("pulled tree differs:\n%s", d)
			}
			if st := state(filepath.Join(mC, "pay-0", filepath.Base(ev))); st != "local" {
				t.Errorf("a file pulled into another store's mount is %s", st)
			}
		})
	}
}
