package fs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// The kernel keeps that a file has no security.capability attribute
// (FUSE_HANDLE_KILLPRIV_V2): 200 writes to one file ask the mount for it
// once or so, not before each write, with passthrough and through FUSE.
// Before, each write(2) cost a GETXATTR round trip.
func TestWritesDoNotAskForCapabilities(t *testing.T) {
	requireMount(t)
	for _, passthrough := range []bool{true, false} {
		t.Run(map[bool]string{true: "passthrough", false: "fuse-io"}[passthrough], func(t *testing.T) {
			backing := t.TempDir()
			t.Setenv(serveObserveEnv, "1")
			srv := mountTest(t, backing, passthrough)
			f, err := os.OpenFile(filepath.Join(srv.Mountpoint, "f"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			for range 200 {
				if _, err := f.Write(make([]byte, 4096)); err != nil {
					t.Fatal(err)
				}
			}
			f.Close()
			srv.Stop(t)
			line := lastLine(srv.Log(), "OBSERVED")
			n := 0
			for _, m := range regexp.MustCompile(`\bgetxattr(:\w+)?:(\d+)`).FindAllStringSubmatch(line, -1) {
				k, _ := strconv.Atoi(m[2])
				n += k
			}
			if n > 5 {
				t.Errorf("200 writes took %d GETXATTRs: the kernel asks for security.capability before each write (%s)", n, line)
			}
		})
	}
}

func TestStatusHasGroup(t *testing.T) {
	status := []byte("Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\nGroups:\t4 24 100 1001 \nNgid:\t0\n")
	for gid, want := range map[uint32]bool{4: true, 24: true, 1001: true, 100: true, 1000: false, 2: false, 0: false} {
		if got := statusHasGroup(status, gid); got != want {
			t.Errorf("gid %d: %v, want %v", gid, got, want)
		}
	}
	if statusHasGroup([]byte("Name:\tsh\nGroups:\t\n"), 0) {
		t.Error("no supplementary groups: found 0")
	}
}
