package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunAsAService: tierfs as systemd runs it. The settings come from a
// config file (TIERFS_CONFIG); with NOTIFY_SOCKET set, the mount says
// READY=1 once it serves (units ordered after it, the broker, start
// then) and STOPPING=1 when it is asked to stop.
func TestRunAsAService(t *testing.T) {
	requireRoot(t)
	dir, backing, mnt := mountDirs(t)
	metricsAddr := freeAddr(t)
	cfg := filepath.Join(dir, "tierfs.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("backing: %s\nremote: file://%s\nship-after: 1h\nmetrics-listen: %s\n",
		backing, filepath.Join(dir, "remote"), metricsAddr)), 0o644)
	sock := filepath.Join(dir, "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	m := startMount(t, []string{"TIERFS_CONFIG=" + cfg, "NOTIFY_SOCKET=" + sock}, mnt)
	buf := make([]byte, 512)
	notify.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := notify.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "READY=1\n") {
		t.Fatalf("notify: %q %v", buf[:n], err)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); !strings.Contains(string(mi), " "+mnt+" ") {
		t.Fatal("READY=1 before the mount was there")
	}
	// The config file's settings are in force: the backing dir is served
	// and the metrics address answers.
	os.WriteFile(filepath.Join(mnt, "probe"), []byte("x"), 0o644)
	if _, err := os.Stat(filepath.Join(backing, "probe")); err != nil {
		t.Errorf("the backing dir of the config file is not the one served: %v", err)
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("metrics-listen of the config file: %v", err)
	}
	resp.Body.Close()

	m.cmd.Process.Signal(syscall.SIGTERM)
	notify.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err = notify.Read(buf)
	if err != nil || string(buf[:n]) != "STOPPING=1" {
		t.Fatalf("notify on stop: %q %v", buf[:n], err)
	}
	<-m.done
}
