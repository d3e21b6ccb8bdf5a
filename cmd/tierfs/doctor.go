package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/tiering"
)

func cmdDoctor() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check that this machine, LOG_DIR's file system and the store can run a tierfs mount",
		Description: "Checks root, /dev/fuse, the kernel's FUSE passthrough, that LOG_DIR's file system keeps trusted.* xattrs,\n" +
			"frees punched holes and gives file handles, its free space, and with --remote the store: a test object is\n" +
			"put, read back, checked and deleted, and the server's clock compared with this one. Exits 1 if a check fails.",
		ArgsUsage: "LOG_DIR",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "remote", Usage: "the store the mount will use (as tierfs mount --remote)", EnvVars: []string{"TIERFS_REMOTE"}},
		}, s3KeyFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return &exitError{code: 2, err: errors.New("doctor takes one argument: the log directory to mount")}
			}
			d := &doctor{w: c.App.Writer}
			d.machine()
			d.logDir(c.Args().First())
			if url := c.String("remote"); url != "" {
				st, err := openStore(c, url)
				if err != nil {
					d.fail("store", "%s: %v", redactURL(url), err)
				} else {
					d.store(c.Context, st, redactURL(url))
				}
			} else {
				d.warn("store", "no --remote given: the store is not checked")
			}
			if d.failed > 0 {
				return &exitError{code: 1, err: fmt.Errorf("%d of the checks failed", d.failed)}
			}
			return nil
		},
	}
}

// doctor prints one line per check and counts the failures.
type doctor struct {
	w      io.Writer
	failed int
}

func (d *doctor) say(level, check, format string, args ...any) {
	fmt.Fprintf(d.w, "%-5s %-18s %s\n", level, check, fmt.Sprintf(format, args...))
}
func (d *doctor) ok(check, format string, args ...any)   { d.say("ok", check, format, args...) }
func (d *doctor) warn(check, format string, args ...any) { d.say("warn", check, format, args...) }
func (d *doctor) fail(check, format string, args ...any) {
	d.failed++
	d.say("FAIL", check, format, args...)
}

// machine checks what the mount needs of this process and kernel.
func (d *doctor) machine() {
	if os.Geteuid() == 0 {
		d.ok("root", "running as root")
	} else {
		d.fail("root", "tierfs mount must run as root (allow_other, passthrough, file handles)")
	}
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		d.fail("/dev/fuse", "%v (modprobe fuse; in a container, pass the device)", err)
	} else {
		f.Close()
		d.ok("/dev/fuse", "opens")
	}
	var u unix.Utsname
	unix.Uname(&u)
	release := unix.ByteSliceToString(u.Release[:])
	if kernelAtLeast(release, 6, 9) {
		d.ok("passthrough", "kernel %s has FUSE passthrough (the mount verifies it and logs the result)", release)
	} else {
		d.warn("passthrough", "kernel %s predates FUSE passthrough (6.9): local files are served by FUSE reads and writes, slower", release)
	}
}

// kernelAtLeast compares a uname release such as 6.18.0-1-amd64.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	digits := parts[1]
	if i := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		digits = digits[:i]
	}
	mi, err2 := strconv.Atoi(digits)
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// logDir checks the file system the log directory lives on, with a
// scratch file that it removes again.
func (d *doctor) logDir(dir string) {
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		d.fail("log dir", "%s is not a directory (%v)", dir, err)
		return
	}
	if isTierfsMount(dir) {
		d.warn("log dir", "%s is a tierfs mount already: the file system checks need the directory below it (run doctor before mounting, or on --backing)", dir)
		return
	}
	if parts, err := tiering.Scan(dir); err != nil {
		d.warn("log dir", "%s: %v", dir, err)
	} else if _, err := os.Stat(filepath.Join(dir, "meta.properties")); err != nil {
		d.warn("log dir", "%s has no meta.properties: not a Kafka log dir yet (%d partitions)", dir, len(parts))
	} else {
		d.ok("log dir", "%s: a Kafka log dir with %d partitions", dir, len(parts))
	}
	d.fileLimit(dir)
	f, err := os.CreateTemp(dir, ".tierfs-doctor-*")
	if err != nil {
		d.fail("scratch file", "cannot create one in %s: %v", dir, err)
		return
	}
	defer os.Remove(f.Name())
	defer f.Close()
	fd := int(f.Fd())

	// The tiering state of each segment lives in a trusted.* xattr.
	if err := unix.Fsetxattr(fd, "trusted.tierfs.doctor", []byte("1"), 0); err != nil {
		d.fail("xattrs", "the file system does not keep trusted.* xattrs (%v): tierfs records segment states there", err)
	} else {
		d.ok("xattrs", "trusted.* xattrs work")
	}

	// Eviction punches a file's bytes out and keeps its size.
	const n = 1 << 20
	buf := make([]byte, n)
	rand.Read(buf)
	var before, after unix.Stat_t
	if _, err := f.Write(buf); err == nil {
		f.Sync()
	}
	unix.Fstat(fd, &before)
	err = unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, n)
	unix.Fstat(fd, &after)
	switch {
	case err != nil:
		d.fail("punch hole", "fallocate(PUNCH_HOLE) fails (%v): evicted segments could not free their bytes", err)
	case after.Size != n || after.Blocks >= before.Blocks:
		d.fail("punch hole", "punching 1 MiB freed nothing (%d blocks before, %d after)", before.Blocks, after.Blocks)
	default:
		d.ok("punch hole", "frees blocks and keeps the size")
	}

	// Deletions are followed by file handle.
	if _, _, err := unix.NameToHandleAt(unix.AT_FDCWD, f.Name(), 0); err != nil {
		d.warn("file handles", "none on this file system (%v): copies of segments the broker deletes are kept", err)
	} else {
		d.ok("file handles", "available")
	}

	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err == nil {
		free := float64(sfs.Bavail) / float64(sfs.Blocks)
		msg := fmt.Sprintf("%s free of %s (%.0f %%)", bytesHuman(int64(sfs.Bavail)*sfs.Bsize), bytesHuman(int64(sfs.Blocks)*sfs.Bsize), free*100)
		if free < 0.10 {
			d.warn("free space", "%s: ship and evict sooner (--local-retention-*)", msg)
		} else {
			d.ok("free space", "%s", msg)
		}
	}
}

// isTierfsMount says whether dir is the mount point of a tierfs mount.
func isTierfsMount(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == abs && strings.Contains(line, " - fuse.tierfs ") {
			return true
		}
	}
	return false
}

// store puts a test object, reads it back, deletes it, and compares the
// server's time of the object with this machine's clock.
func (d *doctor) store(ctx context.Context, st store.Store, name string) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	host, _ := os.Hostname()
	var id [8]byte
	rand.Read(id[:])
	key := fmt.Sprintf(".tierfs-doctor/%s-%x", host, id)
	body := make([]byte, 64<<10)
	rand.Read(body)

	t0 := time.Now()
	info, err := st.Put(ctx, key, bytes.NewReader(body), int64(len(body)))
	if err != nil {
		d.fail("store", "%s: put %s: %v", name, key, err)
		return
	}
	defer st.Delete(context.Background(), key)
	putTook := time.Since(t0)
	t1 := time.Now()
	rc, err := st.Get(ctx, key, 0, -1, store.GetOptions{IfMatch: info.ETag})
	var got []byte
	if err == nil {
		got, err = io.ReadAll(rc)
		rc.Close()
	}
	switch {
	case err != nil:
		d.fail("store", "%s: get %s back: %v", name, key, err)
		return
	case !bytes.Equal(got, body):
		d.fail("store", "%s: %s reads back other bytes (%d of %d)", name, key, len(got), len(body))
		return
	}
	getTook := time.Since(t1)
	head, err := st.Head(ctx, key)
	if err != nil {
		d.fail("store", "%s: head %s: %v", name, key, err)
		return
	}
	if err := st.Delete(ctx, key); err != nil {
		d.fail("store", "%s: delete %s: %v", name, key, err)
		return
	}
	if _, err := st.Head(ctx, key); !errors.Is(err, store.ErrNotFound) {
		d.fail("store", "%s: %s still there after delete (%v)", name, key, err)
		return
	}
	d.ok("store", "%s: put %v, get %v, head, delete (64 KiB)", name, putTook.Round(10*time.Microsecond), getTook.Round(10*time.Microsecond))

	// The server stamps the object; S3 keeps whole seconds.
	skew := head.ModTime.Sub(t0.Add(putTook / 2)).Round(time.Second)
	switch abs := max(skew, -skew); {
	case head.ModTime.IsZero():
		d.warn("clock", "the store gives no object times: skew not checked")
	case abs > 15*time.Minute:
		d.fail("clock", "the store's clock is %v from this one: S3 refuses signed requests past 15 minutes", skew)
	case abs > 2*time.Second:
		d.warn("clock", "the store's clock is %v from this one", skew)
	default:
		d.ok("clock", "within 2 s of the store's")
	}
}

// fileLimit checks that the open-file limit fits the log dir's segments
// (tierfs raises its soft limit to the hard one, and past it as root
// where the kernel lets it).
func (d *doctor) fileLimit(dir string) {
	segs, err := countSegments(dir)
	if err != nil {
		d.warn("open files", "cannot count the segments of %s: %v", dir, err)
		return
	}
	_, hard := fileLimit()
	if advice := fileLimitAdvice("this shell", hard, segs); advice != "" {
		d.warn("open files", "%s", advice)
		return
	}
	d.ok("open files", "limit %d (hard) for %d segments", hard, segs)
}
