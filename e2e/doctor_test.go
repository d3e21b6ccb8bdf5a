package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// TestDoctor: tierfs doctor passes on this machine with a dir store and
// with versitygw, fails (exit 1, naming the store) with a wrong secret
// key, and on a live mount says the file system checks need the
// directory below it.
func TestDoctor(t *testing.T) {
	requireRoot(t)
	_, backing, mnt := mountDirs(t)
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 2, Batches: 4, Records: 4, ValueSize: 100}).Write(backing); err != nil {
		t.Fatal(err)
	}
	for _, r := range remotes(t) {
		out, code := tierfs(t, r.env, "doctor", "--remote", r.url, backing)
		if code != 0 {
			t.Errorf("%s: doctor exited %d:\n%s", r.name, code, out)
		}
		for _, want := range []string{"ok    root", "ok    xattrs", "ok    punch hole", "ok    file handles", "ok    store", "ok    clock"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %q in:\n%s", r.name, want, out)
			}
		}
		if strings.Contains(out, "secret") || (r.srv != nil && strings.Contains(out, r.srv.SecretKey)) {
			t.Errorf("%s: doctor printed a secret:\n%s", r.name, out)
		}
		if r.srv == nil {
			continue
		}
		// Explicit keys always: without them the AWS chain would ask the
		// EC2 metadata service, off this machine.
		bad := []string{"TIERFS_S3_ACCESS_KEY=" + r.srv.AccessKey, "TIERFS_S3_SECRET_KEY=wrong-" + r.srv.SecretKey}
		out, code = tierfs(t, bad, "doctor", "--remote", r.url, backing)
		if code != 1 || !strings.Contains(out, "FAIL  store") {
			t.Errorf("doctor with a wrong secret key: %d\n%s", code, out)
		}
	}
	startMount(t, nil, "--backing", backing, "--ship-after", "1000h", mnt)
	time.Sleep(100 * time.Millisecond)
	out, code := tierfs(t, nil, "doctor", mnt)
	if !strings.Contains(out, "is a tierfs mount already") || code != 0 {
		t.Errorf("doctor on a mount: %d\n%s", code, out)
	}
}
