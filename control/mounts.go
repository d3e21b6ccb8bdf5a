package control

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FsType is what the kernel calls a tierfs mount.
const FsType = "fuse.tierfs"

// FindMount returns the tierfs mount point that holds path, and path
// relative to it.
func FindMount(path string) (mountpoint, rel string, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	mps, err := tierfsMounts(f)
	if err != nil {
		return "", "", err
	}
	return findIn(mps, abs)
}

func findIn(mps []string, abs string) (string, string, error) {
	best := ""
	for _, mp := range mps {
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best = mp
		}
	}
	if best == "" {
		return "", "", fmt.Errorf("%s is not on a tierfs mount", abs)
	}
	rel, err := filepath.Rel(best, abs)
	return best, rel, err
}

// tierfsMounts lists the mount points of tierfs mounts in a mountinfo
// file (proc(5)).
func tierfsMounts(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 || g[0] != FsType {
			continue
		}
		out = append(out, unescapeMount(f[4]))
	}
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
