package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
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

// TestMountHelper: mount -t tierfs runs /sbin/mount.tierfs SOURCE DIR -o
// OPTIONS, as for an /etc/fstab line. The helper (this binary under that
// name) starts the mount in the background with the options as flags and
// returns once it serves; a bad option fails the mount with the log's
// words; tierfs umount stops it.
func TestMountHelper(t *testing.T) {
	requireRoot(t)
	dir, backing, mnt := mountDirs(t)
	helper := filepath.Join(dir, "mount.tierfs")
	if err := os.Symlink(tierfsBin, helper); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "tierfs.log")
	opts := fmt.Sprintf("rw,nofail,remote=file://%s,ship-after=1h,cm,log-file=%s,x-systemd.after=network.target", filepath.Join(dir, "remote"), logFile)
	out, err := exec.Command(helper, backing, mnt, "-o", opts).CombinedOutput()
	if err != nil {
		t.Fatalf("mount.tierfs: %v %s", err, out)
	}
	if !isMount(mnt) {
		t.Fatal("mount.tierfs returned before the mount was there")
	}
	defer exec.Command("umount", "-l", mnt).Run()
	os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o644)
	os.Remove(filepath.Join(mnt, "f"))
	// The options reached the mount: it has change management.
	if out, code := tierfs(t, nil, "cm", "ls", mnt); code != 0 || !strings.Contains(out, "delete") {
		t.Fatalf("cm ls on the helper's mount: %d %s", code, out)
	}
	if out, code := tierfs(t, nil, "umount", mnt); code != 0 {
		t.Fatalf("umount: %s", out)
	}
	if b, _ := os.ReadFile(logFile); !strings.Contains(string(b), "msg=mounted") {
		t.Errorf("the mount's log is not in %s:\n%s", logFile, b)
	}
	// A bad option: the helper fails with mount's failure code and says why.
	cmd := exec.Command(helper, backing, mnt, "-o", "ship-after=soon,log-file="+logFile)
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 32 || !strings.Contains(string(out), "ship-after") {
		t.Fatalf("a bad option: %v %s", err, out)
	}
	if isMount(mnt) {
		t.Fatal("mounted with a bad option")
	}
}
