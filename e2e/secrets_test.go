package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// TestNoSecretInAnyOutput: a mount of an S3 store, logging at debug
// level, ships, evicts and reads back segments; its secret key appears
// nowhere a user or another process can see: the mount's log, tierfs
// status (table and JSON), the metrics page, the process's arguments,
// and the output of doctor and store ls with the same credentials.
func TestNoSecretInAnyOutput(t *testing.T) {
	requireRoot(t)
	r := remotes(t)[1] // s3
	secret := r.srv.SecretKey
	if len(secret) < 8 {
		t.Fatalf("a secret key of %d characters would match by chance", len(secret))
	}
	_, backing, mnt := mountDirs(t)
	if _, err := (kafkatest.LogDir{Topic: "orders", Partitions: 2, Segments: 4, Batches: 20, Records: 8, ValueSize: 500, Unflushed: 1, Age: time.Hour}).Write(backing); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	m := startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1m",
		"--local-retention-bytes", "1", "--tier-interval", "200ms", "--metrics-listen", addr, mnt)
	waitFor(t, time.Minute, "segments evicted", func() bool {
		_, a := segments(t, filepath.Join(mnt, "orders-0"), "remote")
		return a > 0
	}, m.Log)
	sums(t, mnt) // reads the evicted segments from the store

	outputs := map[string]string{"the mount's log": m.Log()}
	for _, args := range [][]string{{"status", mnt}, {"status", "--json", mnt}, {"doctor", "--remote", r.url, backing}, {"store", "ls", "orders-0/"}} {
		out, _ := tierfs(t, append([]string{"TIERFS_STORE=" + r.url}, r.env...), args...)
		outputs["tierfs "+strings.Join(args, " ")] = out
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	outputs["the metrics page"] = string(body)
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(m.cmd.Process.Pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	outputs["the mount's arguments"] = strings.ReplaceAll(string(cmdline), "\x00", " ")
	for where, text := range outputs {
		if strings.Contains(text, secret) {
			i := strings.Index(text, secret)
			t.Errorf("the secret key is in %s: …%s…", where, text[max(0, i-80):i])
		}
	}
	if !strings.Contains(outputs["the mount's log"], "level=DEBUG") {
		t.Error("the mount did not log at debug level: the test saw less than it should")
	}
	t.Logf("searched %d outputs (%d bytes of the mount's log)", len(outputs), len(outputs["the mount's log"]))
}
