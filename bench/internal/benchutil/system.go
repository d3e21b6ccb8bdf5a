package benchutil

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Xattr is the value of extended attribute name of path, "" if none.
func Xattr(path, name string) string {
	buf := make([]byte, 1024)
	n, err := unix.Getxattr(path, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// IsMount says whether p is a mount point of this process's namespace.
func IsMount(p string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	return strings.Contains(string(b), " "+p+" ")
}

// DropCaches writes back and drops the page cache, so the next read of
// anything comes from its disk (root only; a no-op otherwise).
func DropCaches() {
	unix.Sync()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

// TryWait polls cond every 50 ms for up to d; it reports whether cond held.
func TryWait(cond func() bool, d time.Duration) bool {
	return tryWaitEvery(cond, d, 50*time.Millisecond)
}

func tryWaitEvery(cond func() bool, d, every time.Duration) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
	}
	return true
}

// WaitFor is TryWait with an error naming what did not become ready.
func WaitFor(cond func() bool, d time.Duration, what string) error {
	return WaitEvery(cond, d, 50*time.Millisecond, what)
}

// WaitEvery is WaitFor polling every interval: where polling costs the
// process measured (a scrape of its metrics), as seldom as a scraper.
func WaitEvery(cond func() bool, d, every time.Duration, what string) error {
	if !tryWaitEvery(cond, d, every) {
		return fmt.Errorf("%s: not ready after %v", what, d)
	}
	return nil
}

// Mount runs `tierfs mount args...` (the mount point last) with env added
// to this process's environment and its output in logPath, and waits until
// it is mounted. unmount stops it (SIGTERM) and waits for it to exit.
func Mount(bin, logPath string, env []string, args ...string) (unmount func(), err error) {
	unmount, _, err = MountProc(bin, logPath, env, args...)
	return unmount, err
}

// MountProc is Mount that also gives the mount's process id.
func MountProc(bin, logPath string, env []string, args ...string) (unmount func(), pid int, err error) {
	mnt := args[len(args)-1]
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, 0, err
	}
	cmd := exec.Command(bin, append([]string{"mount"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, 0, err
	}
	unmount = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		logf.Close()
	}
	if err := WaitFor(func() bool { return IsMount(mnt) }, 20*time.Second, "tierfs mount"); err != nil {
		unmount()
		return nil, 0, fmt.Errorf("%w (log in %s)", err, logPath)
	}
	return unmount, cmd.Process.Pid, nil
}

// Machine describes this machine for a benchmark's header: cores, memory
// and kernel.
func Machine() string {
	var u unix.Utsname
	unix.Uname(&u)
	var si unix.Sysinfo_t
	unix.Sysinfo(&si)
	return fmt.Sprintf("%d cores, %.0f GiB, Linux %s, %s", runtime.NumCPU(), float64(si.Totalram)*float64(si.Unit)/(1<<30), unix.ByteSliceToString(u.Release[:]), runtime.Version())
}

// FreshFS makes a file system of type typ (mkfs defaults) in a sparse
// image file of size bytes in work and loop-mounts it; done unmounts it.
// Measurements run there, as a broker's log dir is on a disk of its own.
// On a shared file system the results depend on what else it did
// lately: ext4 without a journal, as the root file system of this
// project's test machines is, skips every inode freed in the last few
// minutes when it allocates one, so one configuration's creates paid for
// another's (and an earlier program's) deletes. Root only.
func FreshFS(work, typ string, size int64) (dir string, done func(), err error) {
	img, dir := filepath.Join(work, "fs.img"), filepath.Join(work, "fs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", nil, err
	}
	// Sparse: it takes what the measurements write.
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return "", nil, err
	}
	if err := os.Truncate(img, size); err != nil {
		return "", nil, err
	}
	for _, cmd := range [][]string{{"mkfs." + typ, "-q", img}, {"mount", "-o", "loop", img, dir}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("%s: %v: %s", strings.Join(cmd, " "), err, bytes.TrimSpace(out))
		}
	}
	return dir, func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "umount %s: %v: %s\n", dir, err, out)
		}
	}, nil
}

// ToolVersion is the first line that `name args...` prints, or "unknown".
func ToolVersion(name string, args ...string) string {
	out, _ := exec.Command(name, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if line == "" {
		return "unknown"
	}
	return line
}

// Scrape reads every sample the Prometheus endpoint of a mount (its
// --metrics-listen address) serves, by its name and labels as written
// (`name{label="v"}`).
func Scrape(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			out[l[:i]] += v
		}
	}
	return out, sc.Err()
}

// Metric reads an unlabelled metric from the Prometheus endpoint of a
// mount (its --metrics-listen address).
func Metric(addr, name string) (float64, error) {
	samples, err := Scrape(addr)
	if err != nil {
		return 0, err
	}
	v, ok := samples[name]
	if !ok {
		return 0, fmt.Errorf("no %s in the metrics of %s", name, addr)
	}
	return v, nil
}

// StoreRequests are a mount's requests to its store by op, as its
// metrics at addr count them (tierfs_store_requests_total).
type StoreRequests map[string]float64

// ReadStoreRequests scrapes the store requests of the mount serving
// metrics at addr.
func ReadStoreRequests(addr string) (StoreRequests, error) {
	samples, err := Scrape(addr)
	if err != nil {
		return nil, err
	}
	r := StoreRequests{}
	for name, v := range samples {
		if op, ok := strings.CutPrefix(name, `tierfs_store_requests_total{op="`); ok {
			r[strings.TrimSuffix(op, `"}`)] = v
		}
	}
	if len(r) == 0 {
		return nil, fmt.Errorf("no tierfs_store_requests_total in the metrics of %s", addr)
	}
	return r, nil
}

// Per is what was made from r0 (nil: from the start) to r, per n (say,
// per segment shipped): the total, and the ops made, most first, as
// "put 6.0, head 2.0".
func (r StoreRequests) Per(r0 StoreRequests, n float64) string {
	type opN struct {
		op string
		n  float64
	}
	var ops []opN
	var total float64
	for op, v := range r {
		if d := v - r0[op]; d > 0 {
			ops = append(ops, opN{op, d / n})
			total += d / n
		}
	}
	slices.SortFunc(ops, func(a, b opN) int {
		if a.n != b.n {
			return cmp.Compare(b.n, a.n)
		}
		return strings.Compare(a.op, b.op)
	})
	parts := make([]string, len(ops))
	for i, o := range ops {
		parts[i] = fmt.Sprintf("%s %.2f", o.op, o.n)
	}
	if len(parts) == 0 {
		return "0"
	}
	return fmt.Sprintf("%.2f (%s)", total, strings.Join(parts, ", "))
}

// AllEvicted says whether every segment of a partition dir but the last
// two (the active one, and the newest rolled one that may not be flushed
// yet) is remote.
func AllEvicted(dir string) bool {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) < 3 {
		return false
	}
	return AllRemote(logs[:len(logs)-2])
}

// AllRemote says whether every one of files is remote (evicted) on its
// tierfs mount.
func AllRemote(files []string) bool {
	for _, f := range files {
		if Xattr(f, "user.tierfs.state") != "remote" {
			return false
		}
	}
	return true
}

// CopyTree copies the directory src to dst with cp -a (its files'
// extended attributes and times too).
func CopyTree(src, dst string) error {
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %v %s", err, out)
	}
	return nil
}

// LocalSegments counts the .log files of a partition dir: 1 once Kafka's
// own tiered storage has deleted every rolled segment's local copy.
func LocalSegments(dir string) int {
	m, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	return len(m)
}

// fuseParams is where the kernel's FUSE module shows its parameters.
const fuseParams = "/sys/module/fuse/parameters"

// FUSEParam is the value of the FUSE module's parameter name (such as
// wake_here), "" when this kernel has none by that name.
func FUSEParam(name string) string {
	b, err := os.ReadFile(filepath.Join(fuseParams, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// KeepFUSEParam returns the FUSE module's parameter name as it is now,
// and pushes to u setting it back to that on the way out; an error when
// this kernel has no such parameter.
func KeepFUSEParam(u *Undo, name string) (string, error) {
	orig := FUSEParam(name)
	if orig == "" {
		return "", fmt.Errorf("this kernel's FUSE module has no parameter %s", name)
	}
	u.Push(func() { SetFUSEParam(name, orig) })
	return orig, nil
}

// SetFUSEParam sets the FUSE module's parameter name for every FUSE
// mount of the machine (root only).
func SetFUSEParam(name, value string) error {
	return os.WriteFile(filepath.Join(fuseParams, name), []byte(value), 0)
}
