// Command scale measures what tierfs costs at the size of a broker that
// keeps months of segments: many partitions of many tiny segments,
// shipped to a directory store. It mounts the log dir afresh, ships
// everything, and then measures what must not grow with what is stored:
// the CPU of idle passes, memory, tierfs status, the state kept per
// segment, and a clean restart. Then a follower (a second mount over a
// copy of the same log dir, --role follower, sharing the store) maps its
// segments onto what the first shipped: how long that takes, its CPU,
// and its idle passes.
//
//	go run ./bench/scale -tierfs bin/tierfs -partitions 2000 -segments 50
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"github.com/tierfs/tierfs/chunkxfer/store/s3test"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/procmem"
)

type config struct {
	bin                  string
	partitions, segments int
	idle                 time.Duration
	work                 string
	cpuProfile           string
	followerCPUProfile   string
	killedCPUProfile     string
	store                string
	follower             bool
	fs                   string
}

func main() {
	var c config
	flag.StringVar(&c.bin, "tierfs", "bin/tierfs", "the tierfs binary")
	flag.IntVar(&c.partitions, "partitions", 2000, "partitions")
	flag.IntVar(&c.segments, "segments", 50, "rolled segments per partition (about 4 KiB each; one active segment more)")
	flag.DurationVar(&c.idle, "idle", 60*time.Second, "how long idle CPU is measured, at each tier interval")
	flag.StringVar(&c.work, "work", "", "work directory (default: a new one under /var/tmp, removed after)")
	flag.StringVar(&c.store, "store", "dir", "the store: dir (a directory on the same disk) or s3 (versitygw on 127.0.0.1, started here)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the first mount (the one that ships) to this file")
	flag.StringVar(&c.followerCPUProfile, "follower-cpuprofile", "", "write a CPU profile of the follower (mapping and idle) to this file")
	flag.StringVar(&c.killedCPUProfile, "killed-cpuprofile", "", "write a CPU profile of the mount after kill -9 (its first 30 s) to this file")
	flag.BoolVar(&c.follower, "follower", true, "then measure a follower over a copy of the log dir")
	flag.StringVar(&c.fs, "fs", "ext4", "run on a fresh file system of this type (mkfs.TYPE on a loop device, as root), made in the work directory; \"\" for the work directory itself")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(1)
	}
}

// result is one measurement, with its target where the issue set one.
type result struct {
	what, value, target string
	met                 string // "yes", "no" or ""
}

func run(c config) error {
	work := c.work
	if work == "" {
		var err error
		if work, err = os.MkdirTemp("/var/tmp", "tierfs-scale-"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	}
	where := "a directory in " + filepath.Dir(work)
	if c.fs != "" {
		// A fresh file system, journalled as users' are, where nothing
		// was deleted lately: ext4 skips inodes freed in the last minutes
		// when it allocates one on a file system without a journal, and
		// the removal of an earlier run's million files would slow this
		// one's every create.
		dir, done, err := benchutil.FreshFS(work, c.fs, 64<<30)
		if err != nil {
			return fmt.Errorf("-fs %s: %w (-fs \"\" measures in a plain directory instead)", c.fs, err)
		}
		defer done()
		work, where = dir, "a fresh "+c.fs+" file system (mkfs defaults, on a loop device)"
	}
	backing, storeDir, mnt := filepath.Join(work, "backing"), filepath.Join(work, "store"), filepath.Join(work, "mnt")
	fbacking, fmnt := filepath.Join(work, "follower-backing"), filepath.Join(work, "follower-mnt")
	for _, d := range []string{backing, storeDir, mnt, fmnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	remote, storeEnv, storeName := "file://"+storeDir, []string(nil), "a directory store on the same disk"
	serverPid := 0 // the S3 server's, with -store s3
	switch c.store {
	case "dir":
	case "s3":
		srv, err := s3test.Start(filepath.Join(work, "s3"))
		if err != nil {
			return err
		}
		defer srv.Stop()
		if _, err := srv.NewStore(context.Background(), "scale", ""); err != nil {
			return err
		}
		remote = "s3://scale/kafka?endpoint=" + srv.Endpoint
		storeEnv = []string{"TIERFS_S3_ACCESS_KEY=" + srv.AccessKey, "TIERFS_S3_SECRET_KEY=" + srv.SecretKey}
		storeName = "versitygw on 127.0.0.1 (`--keep-alive`; its data on the same disk)"
		serverPid = srv.Pid()
	default:
		return fmt.Errorf("-store %q: dir or s3", c.store)
	}
	total := c.partitions * c.segments
	fmt.Fprintf(os.Stderr, "writing %d partitions of %d rolled segments...\n", c.partitions, c.segments)
	// One batch of 8 records of 450 bytes: a 4 KiB segment.
	ld := kafkatest.LogDir{Topic: "scale", Partitions: c.partitions, Segments: c.segments + 1, Batches: 1, Records: 8, ValueSize: 450, Age: time.Hour, Repeat: true}
	if _, err := ld.Write(backing); err != nil {
		return err
	}
	segSize := fileSize(filepath.Join(backing, "scale-0", "00000000000000000000.log"))
	if c.follower {
		// The follower's replica: the same bytes, before any mount
		// marked a file.
		if err := benchutil.CopyTree(backing, fbacking); err != nil {
			return err
		}
	}
	addr, err := benchutil.FreeAddr()
	if err != nil {
		return err
	}
	mount := func(interval string, log string, env ...string) (func(), int, time.Duration, error) {
		t0 := time.Now()
		unmount, pid, err := benchutil.MountProc(c.bin, filepath.Join(work, log), append(env, storeEnv...),
			"--backing", backing, "--remote", remote, "--broker-id", "1", "--ship-after", "0s", "--tier-interval", interval, "--metrics-listen", addr, mnt)
		return unmount, pid, time.Since(t0), err
	}
	var rs []result
	add := func(what, value, target string, met bool) {
		m := ""
		if target != "" {
			m = map[bool]string{true: "yes", false: "no"}[met]
		}
		rs = append(rs, result{what, value, target, m})
	}

	// A first mount ships every segment.
	env, err := profileEnv(c.cpuProfile)
	if err != nil {
		return err
	}
	unmount, pid, took, err := mount("2s", "mount-1.log", env...)
	if err != nil {
		return err
	}
	add("mount, empty store (start to mounted)", took.Round(time.Millisecond).String(), "", false)
	t0 := time.Now()
	cpu0, _ := procmem.CPUSeconds(pid)
	srvCPU0, _ := procmem.CPUSeconds(serverPid)
	// The metrics are read once a second, as a scraper would (faster
	// polling would measure the scrapes).
	var shipped float64
	err = benchutil.WaitEvery(func() bool {
		shipped, _ = benchutil.Metric(addr, "tierfs_remote_copy_segments_total")
		return int(shipped) >= total
	}, 3*time.Hour, time.Second, "every segment shipped")
	if err != nil {
		unmount()
		return fmt.Errorf("%w (%d of %d shipped)", err, int(shipped), total)
	}
	shipTook := time.Since(t0)
	cpu1, _ := procmem.CPUSeconds(pid)
	// Every request of the mount so far, from its start on: it ships
	// from its first pass, maybe before a scrape here could read.
	req1, err := benchutil.ReadStoreRequests(addr)
	if err != nil {
		unmount()
		return err
	}
	rate := float64(total) / shipTook.Seconds()
	add(fmt.Sprintf("ship %d segments of %s", total, size(segSize)), fmt.Sprintf("%s (%.0f segments/s)", shipTook.Round(time.Second), rate), "≥ 500 segments/s", rate >= 500)
	add("CPU per shipped segment (user+system of tierfs)", fmt.Sprintf("%.2f ms (%.0f%% of a core)", 1000*(cpu1-cpu0)/float64(total), 100*(cpu1-cpu0)/shipTook.Seconds()), "", false)
	if serverPid != 0 {
		// On this machine the server shares tierfs's cores.
		srvCPU1, _ := procmem.CPUSeconds(serverPid)
		add("CPU per shipped segment (user+system of versitygw)", fmt.Sprintf("%.2f ms (%.0f%% of a core)", 1000*(srvCPU1-srvCPU0)/float64(total), 100*(srvCPU1-srvCPU0)/shipTook.Seconds()), "", false)
	}
	add("store requests per shipped segment, by op (from the mount on)", req1.Per(nil, float64(total)), "", false)
	// The requests at rest are read before the pause, not just before
	// the idle CPU is: a scrape of 100,000 segments' metrics allocates,
	// and the collection that follows may fall within it.
	req2, _ := benchutil.ReadStoreRequests(addr)
	t2 := time.Now()
	time.Sleep(5 * time.Second) // the pass that shipped the last ones ends
	cpu2, err := idleCPU(pid, c.idle)
	if err != nil {
		unmount()
		return err
	}
	req3, _ := benchutil.ReadStoreRequests(addr)
	add("store requests per minute, idle, --tier-interval 2s", req3.Per(req2, time.Since(t2).Minutes()), "", false)
	add("idle CPU, --tier-interval 2s", fmt.Sprintf("%.2f%% of a core", 100*cpu2), "≤ 2%", cpu2 <= 0.02)
	rss, _ := procmem.RSS(pid)
	add("RSS of tierfs, idle", size(rss), "≤ 200 MiB", rss <= 200<<20)
	peak, _ := procmem.PeakRSS(pid)
	add("peak RSS of tierfs, shipping included", size(peak), "≤ 200 MiB", peak <= 200<<20)
	add("Go heap, idle", heapLine(addr), "", false)
	st := statusTime(c.bin, mnt)
	add("tierfs status (median of 3)", st.Round(time.Millisecond).String(), "≤ 1s", st <= time.Second)
	state := dirBytes(filepath.Join(backing, ".tierfs"))
	per := state / int64(total)
	add("local state per shipped segment (.tierfs, allocated)", size(per), "≤ 2 KiB", per <= 2<<10)
	t1 := time.Now()
	unmount()
	add("clean unmount", time.Since(t1).Round(time.Millisecond).String(), "", false)

	// A clean restart over everything shipped, then idle at 30 s.
	unmount, pid, took, err = mount("30s", "mount-2.log")
	if err != nil {
		return err
	}
	add("mount again, all shipped (start to mounted)", took.Round(time.Millisecond).String(), "", false)
	t30 := time.Now()
	add("after a clean stop: CPU from the start to 30 s after mounted (the first pass included)", firstCPU(pid, t30, total), "", false)
	idle30 := max(c.idle, 60*time.Second)
	cpu30, err := idleCPU(pid, idle30)
	req31, _ := benchutil.ReadStoreRequests(addr)
	restarted := time.Since(t30)
	if err != nil {
		unmount()
		return err
	}
	add("store requests per minute after a clean restart, --tier-interval 30s (its first 30 s and the idle time)", req31.Per(nil, restarted.Minutes()), "", false)
	add("idle CPU, --tier-interval 30s", fmt.Sprintf("%.2f%% of a core", 100*cpu30), "≤ 1%", cpu30 <= 0.01)
	// Scrapes at rest, at the default interval: a 2 s pass's CPU, less
	// by its mean, would be most of the noise.
	scrape, body := scrapeCost(pid, addr, cpu30)
	add("a Prometheus scrape at rest, --tier-interval 30s (mean of 40)", fmt.Sprintf("%.1f ms of tierfs's CPU, %s of text; %.3f%% of a core at a 15 s scrape interval", 1000*scrape, size(body), 100*scrape/15), "", false)

	// kill -9 at rest (an OOM kill, say), the dead mount taken away by
	// hand as an operator or a unit's ExecStartPre would, and a mount
	// again: what the next mount costs when the last did not stop
	// cleanly.
	if err := killMount(pid, unmount, mnt); err != nil {
		return err
	}
	envK, err := profileEnv(c.killedCPUProfile)
	if err != nil {
		return err
	}
	unmount, pid, took, err = mount("30s", "mount-3.log", envK...)
	if err != nil {
		return err
	}
	add("mount after kill -9 of the last, all shipped (start to mounted)", took.Round(time.Millisecond).String(), "", false)
	add("after kill -9: CPU from the start to 30 s after mounted (the first pass included)", firstCPU(pid, time.Now(), total), "", false)
	reqK, _ := benchutil.ReadStoreRequests(addr)
	shippedK, _ := benchutil.Metric(addr, "tierfs_remote_copy_segments_total")
	unmount()
	add("after kill -9: store requests in the first 30 s, by op", reqK.Per(nil, 1), "", false)
	add("after kill -9: segments shipped again", fmt.Sprintf("%.0f", shippedK), "", false)
	if c.follower {
		if err := measureFollower(c, work, fbacking, fmnt, remote, storeEnv, total, add); err != nil {
			return err
		}
	}

	r := benchutil.Report{
		Name:  "scale" + map[bool]string{true: "-s3"}[c.store == "s3"],
		Title: "At scale: many partitions of many segments" + map[bool]string{true: ", on versitygw"}[c.store == "s3"],
		Notes: []string{fmt.Sprintf("%d partitions of %d rolled segments of %s each (%d segments; every partition a copy of the first, as written by idx/kafka/kafkatest) and one active segment, shipped by one mount (`--ship-after 0s`, `--tier-interval 2s`) to %s, on %s; then the mount is stopped cleanly and mounted again with `--tier-interval 30s`, and that mount is killed (kill -9), its dead mount detached (`umount -l`) and mounted again. One run. Idle CPU is the mount's user+system time divided by the time, over %s after everything shipped (2 s interval) and over %s after the first 30 s of the second mount (30 s interval). The targets are issue 23's; %s.",
			c.partitions, c.segments, size(segSize), total, storeName, where, c.idle, max(c.idle, 60*time.Second), benchutil.Machine())},
		Header: []string{"measurement", "value", "target", "met"},
	}
	for _, x := range rs {
		r.Rows = append(r.Rows, []string{x.what, x.value, x.target, x.met})
	}
	r.After = []string{"A Kafka broker's start-up with 10,000 segments on the mount is `bench/kafkastart` (`make bench-kafka`)."}
	if c.follower {
		r.After = append(r.After, fmt.Sprintf("The follower: a copy of the log dir made before the first mount, mounted with `--role follower --broker-id 2 --tier-interval 2s --follow-interval 10s` once the first mount (`--broker-id 1`) has shipped everything and stopped; it maps each of its segments onto the objects the first shipped (reading the segment's batches and the store's partition index and batch lists) and uploads nothing. Its idle CPU is over %s once every segment is mapped.", c.idle))
	}
	return r.Emit()
}

// measureFollower mounts a follower over fbacking, sharing the store the
// first mount shipped everything to, and measures how long it takes to
// map every segment onto the shipped objects, its CPU per segment and
// its idle CPU once done.
func measureFollower(c config, work, fbacking, fmnt, remote string, storeEnv []string, total int, add func(what, value, target string, met bool)) error {
	addr, err := benchutil.FreeAddr()
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "a follower maps its segments...")
	env, err := profileEnv(c.followerCPUProfile)
	if err != nil {
		return err
	}
	env = append(env, storeEnv...)
	t0 := time.Now()
	unmount, pid, err := benchutil.MountProc(c.bin, filepath.Join(work, "follower.log"), env,
		"--backing", fbacking, "--remote", remote, "--role", "follower", "--broker-id", "2", "--ship-after", "0s",
		"--tier-interval", "2s", "--follow-interval", "10s", "--metrics-listen", addr, fmnt)
	if err != nil {
		return err
	}
	defer unmount()
	cpu0, _ := procmem.CPUSeconds(pid)
	// Given up on when nothing more is mapped for two minutes.
	var mapped, last float64
	lastMove := time.Now()
	err = benchutil.WaitEvery(func() bool {
		mapped, _ = benchutil.Metric(addr, "tierfs_mapped_segments_total")
		if mapped > last {
			last, lastMove = mapped, time.Now()
		}
		return int(mapped) >= total || time.Since(lastMove) > 2*time.Minute
	}, 3*time.Hour, time.Second, "every segment mapped")
	if err == nil && int(mapped) < total {
		err = fmt.Errorf("the follower mapped %d of %d segments, and nothing more for two minutes (log in %s)", int(mapped), total, filepath.Join(work, "follower.log"))
	}
	if err != nil {
		return err
	}
	took := time.Since(t0)
	cpu1, _ := procmem.CPUSeconds(pid)
	req1, err := benchutil.ReadStoreRequests(addr)
	if err != nil {
		return err
	}
	add("follower: store requests per mapped segment, by op (from its mount on)", req1.Per(nil, float64(total)), "", false)
	add(fmt.Sprintf("follower: map %d segments onto the shipped objects (mount to done)", total), fmt.Sprintf("%s (%.0f segments/s)", took.Round(time.Second), float64(total)/took.Seconds()), "", false)
	add("follower: CPU per mapped segment", fmt.Sprintf("%.2f ms", 1000*(cpu1-cpu0)/float64(total)), "", false)
	// The pass after the last mapping looks once more at every partition
	// it changed: idle starts when a follow interval goes by with no
	// partition scanned (at most a minute after the last mapping).
	scans, _ := benchutil.Metric(addr, "tierfs_partition_scans_total")
	quiet := time.Now()
	benchutil.WaitEvery(func() bool {
		n, _ := benchutil.Metric(addr, "tierfs_partition_scans_total")
		if n != scans {
			scans, quiet = n, time.Now()
		}
		return time.Since(quiet) > 11*time.Second
	}, time.Minute, time.Second, "the follower's passes quiet")
	req2, _ := benchutil.ReadStoreRequests(addr)
	cpu, err := idleCPU(pid, c.idle)
	if err != nil {
		return err
	}
	req3, _ := benchutil.ReadStoreRequests(addr)
	add("follower: store requests per minute, idle", req3.Per(req2, c.idle.Minutes()), "", false)
	scansIdle, _ := benchutil.Metric(addr, "tierfs_partition_scans_total")
	add("follower: idle CPU, --tier-interval 2s, --follow-interval 10s", fmt.Sprintf("%.2f%% of a core", 100*cpu), "≤ 2%", cpu <= 0.02)
	add("follower: partitions looked at again while idle", fmt.Sprintf("%.0f in %s", scansIdle-scans, c.idle), "", false)
	rss, _ := procmem.RSS(pid)
	add("follower: RSS, idle", size(rss), "≤ 200 MiB", rss <= 200<<20)
	add("follower: Go heap, idle", heapLine(addr), "", false)
	return nil
}

// heapLine is what the Go heap of the mount serving metrics at addr
// holds: in use, the size the next collection runs at, and what it
// holds free but has not given back to the system; and its goroutines
// and their stacks.
func heapLine(addr string) string {
	var v [6]float64
	for i, m := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_next_gc_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines"} {
		var err error
		if v[i], err = benchutil.Metric(addr, m); err != nil {
			return "unknown: " + err.Error()
		}
	}
	return fmt.Sprintf("%s in use, next collection at %s, %s free and not given back; %d goroutines, %s of stacks", size(int64(v[0])), size(int64(v[1])), size(int64(v[2]-v[3])), int(v[5]), size(int64(v[4])))
}

// scrapeCost is what one read of a mount's metrics page costs it at
// rest, and the page's size: the CPU of 40 scrapes 250 ms apart, from
// just before the first until 500 ms after the last (the collections they
// bring on included), less the idle share of a core the mount uses anyway,
// divided by 40. One by one, a scrape would be below the resolution of
// the kernel's CPU times (10 ms).
func scrapeCost(pid int, addr string, idle float64) (cpu float64, body int64) {
	const n = 40
	t0 := time.Now()
	a, err := procmem.CPUSeconds(pid)
	if err != nil {
		return 0, 0
	}
	for i := range n {
		if i > 0 {
			time.Sleep(250 * time.Millisecond)
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return 0, 0
		}
		body, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	time.Sleep(500 * time.Millisecond)
	b, _ := procmem.CPUSeconds(pid)
	return max(0, b-a-idle*time.Since(t0).Seconds()) / n, body
}

// firstCPU is the CPU the mount process pid used from its start until 30
// s after it mounted (at mounted): its first pass, which reads every
// partition (a new process knows none), included. Nothing here reads
// its metrics meanwhile: a first scrape scans every partition too.
func firstCPU(pid int, mounted time.Time, segments int) string {
	time.Sleep(time.Until(mounted.Add(30 * time.Second)))
	cpu, err := procmem.CPUSeconds(pid)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%.2f s (%.0f µs a segment)", cpu, 1e6*cpu/float64(segments))
}

// profileEnv is the environment that has a mount write a CPU profile to
// path ("": none).
func profileEnv(path string) ([]string, error) {
	if path == "" {
		return nil, nil
	}
	p, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	return []string{"TIERFS_CPUPROFILE=" + p}, nil
}

// killMount kills the mount process pid with SIGKILL, reaps it (unmount
// waits for it) and detaches its dead mount from mnt.
func killMount(pid int, unmount func(), mnt string) error {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	unmount()
	if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
		return fmt.Errorf("umount -l %s after kill -9: %v: %s", mnt, err, out)
	}
	return nil
}

// idleCPU is the share of a core process pid used over d.
func idleCPU(pid int, d time.Duration) (float64, error) {
	a, err := procmem.CPUSeconds(pid)
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	b, err := procmem.CPUSeconds(pid)
	if err != nil {
		return 0, err
	}
	return (b - a) / d.Seconds(), nil
}

func statusTime(bin, mnt string) time.Duration {
	var ds []float64
	for range 3 {
		t0 := time.Now()
		exec.Command(bin, "status", mnt).Run()
		ds = append(ds, float64(time.Since(t0)))
	}
	sort.Float64s(ds)
	return time.Duration(ds[1])
}

// dirBytes is the disk space the files under dir take.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func size(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
