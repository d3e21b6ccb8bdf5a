package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/fs"
)

// mount.tierfs is how mount(8) and /etc/fstab start tierfs: mount -t
// tierfs SOURCE DIR -o OPTIONS runs /sbin/mount.tierfs SOURCE DIR -o
// OPTIONS (a link to this binary). SOURCE is the backing directory (the
// same as DIR for an in-place mount); each option is a `tierfs mount`
// flag without its dashes (remote=s3://...,ship-after=10m,cm), apart from
// the generic mount options, which are ignored. The helper starts
// `tierfs mount` in the background, waits until it serves, and exits: 0
// when mounted, 32 (mount's "mount failure") with the log's tail if not.
//
//	/data/kafka  /data/kafka  tierfs  remote=s3://bucket/kafka?endpoint=http://127.0.0.1:9000,config=/etc/tierfs.yaml,nofail  0 0

// mountHelperName is the name the binary answers to as the helper.
const mountHelperName = "mount.tierfs"

// genericMountOption says whether o is one of mount(8)'s own options,
// which mean nothing to tierfs.
func genericMountOption(o string) bool {
	switch o {
	case "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "exec", "noexec", "suid", "nosuid",
		"dev", "nodev", "_netdev", "nofail", "relatime", "noatime", "atime", "async":
		return true
	}
	return strings.HasPrefix(o, "x-") || strings.HasPrefix(o, "comment=")
}

// helperArgs turns a helper's command line into `tierfs mount` arguments
// and the log file for the background process.
func helperArgs(args []string) (mountArgs []string, logFile string, fake bool, err error) {
	var pos, opts []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" && i+1 < len(args):
			opts = append(opts, strings.Split(args[i+1], ",")...)
			i++
		case strings.HasPrefix(a, "-o"):
			opts = append(opts, strings.Split(a[2:], ",")...)
		case a == "-t" || a == "-N":
			i++ // the type (tierfs), a namespace: nothing to do
		case strings.HasPrefix(a, "-"):
			fake = fake || strings.Contains(a, "f") // -s sloppy, -n no mtab, -v verbose: ignored
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return nil, "", false, fmt.Errorf("usage: %s SOURCE DIR [-o options]: SOURCE is the backing directory (DIR itself for an in-place mount)", mountHelperName)
	}
	source, dir := filepath.Clean(pos[0]), filepath.Clean(pos[1])
	var global, flags []string
	for _, o := range opts {
		if o == "" || genericMountOption(o) {
			continue
		}
		k, v, hasValue := strings.Cut(o, "=")
		switch k {
		case "log-file":
			logFile = v
			continue
		case "config", "log-level", "log-format":
			global = append(global, "--"+o)
			continue
		case "backing":
			return nil, "", false, errors.New("the backing directory is the mount's source, not an option")
		}
		if hasValue {
			flags = append(flags, "--"+k+"="+v)
		} else {
			flags = append(flags, "--"+k)
		}
	}
	if source != dir {
		flags = append([]string{"--backing", source}, flags...)
	}
	if logFile == "" {
		logFile = "/var/log/tierfs" + strings.ReplaceAll(dir, "/", "-") + ".log"
	}
	return append(append(global, "mount"), append(flags, dir)...), logFile, fake, nil
}

// mountHelper runs as mount.tierfs.
func mountHelper(args []string) int {
	mountArgs, logFile, fake, err := helperArgs(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, mountHelperName+":", err)
		return 1
	}
	if fake {
		return 0
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, mountHelperName+":", err)
		return 1
	}
	logf, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		fmt.Fprintln(os.Stderr, mountHelperName+": log file:", err)
		return 1
	}
	defer logf.Close()
	start, _ := logf.Seek(0, io.SeekEnd)
	cmd := exec.Command(self, mountArgs...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: the mount outlives the helper and mount(8).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, mountHelperName+":", err)
		return 1
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	dir := mountArgs[len(mountArgs)-1]
	deadline := time.After(60 * time.Second)
	for {
		if fstype, ok := fs.MountedAt(dir); ok && fstype == "fuse.tierfs" {
			return 0
		}
		select {
		case err := <-exited:
			fmt.Fprintf(os.Stderr, "%s: tierfs mount exited (%v); its log %s says:\n%s", mountHelperName, err, logFile, logTail(logFile, start))
			return 32
		case <-deadline:
			fmt.Fprintf(os.Stderr, "%s: not mounted after 60s; see %s\n", mountHelperName, logFile)
			return 32
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logTail is what was written to the log at path since offset start (at
// most its last 4 KiB).
func logTail(path string, start int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < start {
		return ""
	}
	b = b[start:]
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}
