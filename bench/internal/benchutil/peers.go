package benchutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store/s3test"
)

// The peer mounts of a bucket, by name.
const (
	PeerS3fs   = "s3fs"
	PeerRclone = "rclone"
)

// Peer is a peer's mount of a bucket: its mount point and its process.
type Peer struct {
	Root string
	Pid  int
}

// MountPeers mounts bucket of srv with s3fs and rclone (--vfs-cache-mode
// off), each in the foreground of a process of its own under dir, and
// returns those that came up, by name; the others are reported on
// stderr. UnmountPeers undoes it.
func MountPeers(dir string, srv *s3test.Server, bucket string) (map[string]Peer, error) {
	out := map[string]Peer{}
	passwd := filepath.Join(dir, "passwd-s3fs")
	if err := os.WriteFile(passwd, []byte(srv.AccessKey+":"+srv.SecretKey), 0o600); err != nil {
		return nil, err
	}
	start := func(name string, cmd *exec.Cmd) error {
		mnt := filepath.Join(dir, name)
		if err := os.MkdirAll(mnt, 0o755); err != nil {
			return err
		}
		cmd.Args = append(cmd.Args, mnt)
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		// Pdeathsig: the peer goes with the benchmark.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, name+":", err)
			return nil
		}
		go cmd.Wait()
		if !TryWait(func() bool { return IsMount(mnt) }, 20*time.Second) {
			b, _ := os.ReadFile(logf.Name())
			fmt.Fprintf(os.Stderr, "%s did not mount:\n%s\n", name, b)
			cmd.Process.Kill()
			return nil
		}
		out[name] = Peer{Root: mnt, Pid: cmd.Process.Pid}
		return nil
	}
	if err := start(PeerS3fs, exec.Command("s3fs", bucket, "-f", "-o", "url="+srv.Endpoint, "-o", "use_path_request_style", "-o", "passwd_file="+passwd)); err != nil {
		return nil, err
	}
	rc := exec.Command("rclone", "mount", "vgw:"+bucket, "--read-only", "--vfs-cache-mode", "off")
	// rclone 1.60 cannot load AWS_CA_BUNDLE with its own transport ("unsupported
	// transport"), and the endpoint is plain HTTP anyway.
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "AWS_CA_BUNDLE=") {
			rc.Env = append(rc.Env, e)
		}
	}
	rc.Env = append(rc.Env, "RCLONE_CONFIG_VGW_TYPE=s3", "RCLONE_CONFIG_VGW_PROVIDER=Other",
		"RCLONE_CONFIG_VGW_ACCESS_KEY_ID="+srv.AccessKey, "RCLONE_CONFIG_VGW_SECRET_ACCESS_KEY="+srv.SecretKey,
		"RCLONE_CONFIG_VGW_ENDPOINT="+srv.Endpoint, "RCLONE_CONFIG_VGW_FORCE_PATH_STYLE=true")
	if err := start(PeerRclone, rc); err != nil {
		return nil, err
	}
	return out, nil
}

// UnmountPeers unmounts what MountPeers mounted under dir (the peers exit
// on it).
func UnmountPeers(dir string) {
	for _, name := range []string{PeerS3fs, PeerRclone} {
		if p := filepath.Join(dir, name); IsMount(p) {
			exec.Command("umount", p).Run()
		}
	}
}
