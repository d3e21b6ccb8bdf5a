// Command tierload measures evicted segments read at once through a
// tierfs mount against versitygw on loopback, side by side with rclone
// and s3fs mounts of the same objects: 1, 8, 40 and 200 readers of
// distinct segments, and 8 readers of one segment, each configuration in
// each run. It reports, for each: aggregate MB/s, the ratio to one reader
// of the same mount in the same run, the mount's peak resident memory,
// the p50 and p99 of a read's wait (one read(2) of 1 MiB), and, for
// tierfs, GETs per chunk (from its metrics).
//
// The tierfs mount is started afresh for each measurement, so that its
// chunk memory starts empty and its peak memory is the measurement's;
// the page cache is dropped before each.
//
//	go run ./bench/tierload -tierfs bin/tierfs -segments 200 -size 32MiB -runs 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"github.com/tierfs/tierfs/chunkxfer/store/s3test"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/procmem"
)

const chunk = 8 << 20

// config is a load: readers reading segments at once.
type config struct {
	name    string
	readers int
	same    bool // every reader reads segment 0
}

// result is one measurement of one mount under one load.
type result struct {
	mbps       float64
	peakRSS    int64
	p50, p99   float64 // ms
	getsPerChk float64 // NaN when not known
	fetchedPer float64 // bytes fetched per byte read; NaN when not known
	err        error
}

func main() {
	bin := flag.String("tierfs", "bin/tierfs", "tierfs binary")
	nseg := flag.Int("segments", 200, "evicted segments (one per partition); the most readers")
	sizeFlag := flag.String("size", "32MiB", "size of each segment")
	runs := flag.Int("runs", 3, "runs of each measurement")
	budget := flag.String("cache-bytes", "256MiB", "tierfs's chunk memory (--cache-bytes)")
	levels := flag.String("readers", "1,8,40,200", "numbers of readers of distinct segments")
	peers := flag.Bool("peers", true, "measure s3fs and rclone too")
	flag.Parse()
	size, err := benchutil.ParseSize(*sizeFlag)
	check(err)
	budgetBytes, err := benchutil.ParseSize(*budget)
	check(err)
	tierfsBin, err := filepath.Abs(*bin)
	check(err)
	var configs []config
	for _, l := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(l)
		check(err)
		if n > *nseg {
			check(fmt.Errorf("%d readers of distinct segments, %d segments", n, *nseg))
		}
		configs = append(configs, config{name: fmt.Sprintf("%d readers, distinct segments", n), readers: n})
	}
	configs = append(configs, config{name: "8 readers, one segment", readers: 8, same: true})

	dir, err := os.MkdirTemp("", "bench-tierload-")
	check(err)
	defer os.RemoveAll(dir)
	srv, err := s3test.Start(filepath.Join(dir, "s3"))
	check(err)
	defer srv.Stop()
	_, err = srv.NewStore(context.Background(), "bench", "")
	check(err)

	backing, mnt := filepath.Join(dir, "backing"), filepath.Join(dir, "mnt")
	check(os.MkdirAll(mnt, 0o755))
	fmt.Fprintf(os.Stderr, "writing %d segments of %s\n", *nseg, *sizeFlag)
	bases, err := kafkatest.LogDir{Topic: "load", Partitions: *nseg, Segments: 2, Batches: int(size / 8400), Records: 16, ValueSize: 1024, Age: time.Hour, Repeat: true}.Write(backing)
	check(err)
	segs := make([]string, *nseg)
	var segSize int64
	for p := range *nseg {
		rel := filepath.Join(fmt.Sprintf("load-%d", p), fmt.Sprintf("%020d.log", bases[fmt.Sprintf("load-%d", p)][0]))
		segs[p] = rel
		fi, err := os.Stat(filepath.Join(backing, rel))
		check(err)
		segSize = fi.Size()
	}
	chunks := (segSize + chunk - 1) / chunk

	env := []string{"TIERFS_S3_ACCESS_KEY=" + srv.AccessKey, "TIERFS_S3_SECRET_KEY=" + srv.SecretKey}
	remote := "s3://bench/kafka?endpoint=" + srv.Endpoint
	metricsAddr, err := benchutil.FreeAddr()
	check(err)
	mount := func() (func(), int) {
		unmount, pid, err := benchutil.MountProc(tierfsBin, filepath.Join(dir, "tierfs.log"), env, "--backing", backing, "--remote", remote,
			"--ship-after", "1m", "--local-retention-bytes", "1", "--tier-interval", "500ms", "--ship-concurrency", "4",
			"--cache-bytes", *budget, "--metrics-listen", metricsAddr, mnt)
		check(err)
		return unmount, pid
	}
	unmount, _ := mount()
	fmt.Fprintln(os.Stderr, "waiting for every segment to ship and be evicted")
	segPaths := make([]string, len(segs))
	for i, s := range segs {
		segPaths[i] = filepath.Join(mnt, s)
	}
	check(benchutil.WaitFor(func() bool { return benchutil.AllRemote(segPaths) }, 30*time.Minute, "eviction"))
	keys := make([]string, len(segs))
	for i, s := range segs {
		keys[i] = "kafka/" + benchutil.Xattr(filepath.Join(mnt, s), "user.tierfs.rdi")
	}
	unmount()

	type peer struct {
		name string
		pid  int
		path func(i int) string
	}
	var ps []peer
	if *peers {
		mounted, err := benchutil.MountPeers(dir, srv, "bench")
		check(err)
		for name, m := range mounted {
			ps = append(ps, peer{name: name, pid: m.Pid, path: func(i int) string { return filepath.Join(m.Root, keys[i]) }})
		}
		sort.Slice(ps, func(i, j int) bool { return ps[i].name > ps[j].name })
		defer benchutil.UnmountPeers(dir)
	}

	const tierfsName = "tierfs"
	res := map[string]map[string][]result{} // mount -> config -> runs
	add := func(mount string, c config, r result) {
		if res[mount] == nil {
			res[mount] = map[string][]result{}
		}
		res[mount][c.name] = append(res[mount][c.name], r)
		status := "ok"
		if r.err != nil {
			status = r.err.Error()
		}
		fmt.Fprintf(os.Stderr, "  %-8s %-32s %7.0f MB/s  peak RSS %5d MiB  p99 %6.1f ms  fetched %.2f× read  %s\n", mount, c.name, r.mbps, r.peakRSS>>20, r.p99, r.fetchedPer, status)
	}
	for run := range *runs {
		fmt.Fprintf(os.Stderr, "run %d/%d\n", run+1, *runs)
		for _, c := range configs {
			// tierfs, started afresh: empty chunk memory, its own peak.
			unmount, pid := mount()
			before, err := fetchRequests(metricsAddr)
			check(err)
			beforeB, err := benchutil.Metric(metricsAddr, "tierfs_remote_fetch_bytes_total")
			check(err)
			benchutil.DropCaches()
			r := load(c, func(i int) string { return filepath.Join(mnt, segs[i]) }, segSize)
			r.peakRSS, _ = procmem.PeakRSS(pid)
			after, err := fetchRequests(metricsAddr)
			check(err)
			afterB, err := benchutil.Metric(metricsAddr, "tierfs_remote_fetch_bytes_total")
			check(err)
			read := chunks * int64(c.readers)
			if c.same {
				read = chunks
			}
			r.getsPerChk = (after - before) / float64(read)
			readBytes := segSize * int64(c.readers)
			if c.same {
				readBytes = segSize
			}
			r.fetchedPer = (afterB - beforeB) / float64(readBytes)
			if os.Getenv("BENCH_TIERLOAD_METRICS") != "" {
				for _, m := range []string{"tierfs_chunk_memory_waits_total", "tierfs_chunk_memory_wait_seconds_total", "tierfs_chunk_memory_claims_revoked_total", "tierfs_read_ahead_skipped_total", "tierfs_read_ahead_wasted_total", "tierfs_cache_hits_total"} {
					v, _ := benchutil.Metric(metricsAddr, m)
					fmt.Fprintf(os.Stderr, "    %s %v\n", m, v)
				}
			}
			unmount()
			add(tierfsName, c, r)
			for _, p := range ps {
				check(procmem.ResetPeakRSS(p.pid))
				benchutil.DropCaches()
				r := load(c, p.path, segSize)
				r.peakRSS, _ = procmem.PeakRSS(p.pid)
				r.getsPerChk, r.fetchedPer = math.NaN(), math.NaN()
				add(p.name, c, r)
			}
		}
	}

	rep := benchutil.Report{
		Name:  "tierload",
		Title: "Evicted segments read at once",
		Notes: []string{fmt.Sprintf("versitygw v1.8.0 on 127.0.0.1; %d evicted segments of %.1f MB (%d chunks of 8 MiB), read whole with 1 MiB read(2)s, the page cache dropped before each measurement; tierfs with --cache-bytes %s, mounted afresh for each measurement; rclone (--vfs-cache-mode off) and s3fs mounts of the same objects; medians of %d runs; \"× 1 reader\" is the median of the per-run ratios to one reader of the same mount; a read's wait is one read(2); GETs per chunk from tierfs's tierfs_remote_fetch_requests_total, bytes fetched from tierfs_remote_fetch_bytes_total; %s.",
			*nseg, float64(segSize)/1e6, chunks, *budget, *runs, benchutil.Machine())},
		Header:   []string{"mount", "load", "MB/s", "× 1 reader", "peak RSS MiB", "read wait p50 ms", "p99 ms", "GETs per chunk", "bytes fetched per byte read"},
		Versions: map[string]string{"versitygw": "v1.8.0", "rclone": benchutil.ToolVersion("rclone", "version"), "s3fs": benchutil.ToolVersion("s3fs", "--version")},
	}
	mounts := []string{tierfsName}
	for _, p := range ps {
		mounts = append(mounts, p.name)
	}
	one := configs[0]
	var worstRSS int64
	for _, m := range mounts {
		for _, c := range configs {
			rs := res[m][c.name]
			var mbps, ones, rss, p50, p99, gets, per []float64
			failed := 0
			for i, r := range rs {
				if r.err != nil {
					failed++
					continue
				}
				mbps = append(mbps, r.mbps)
				if o := res[m][one.name][i]; o.err == nil && o.mbps > 0 {
					ones = append(ones, r.mbps/o.mbps)
				}
				rss = append(rss, float64(r.peakRSS>>20))
				p50, p99 = append(p50, r.p50), append(p99, r.p99)
				gets, per = append(gets, r.getsPerChk), append(per, r.fetchedPer)
				if m == tierfsName {
					worstRSS = max(worstRSS, r.peakRSS)
				}
			}
			row := []string{m, c.name}
			if len(mbps) == 0 {
				row = append(row, "failed", "", "", "", "", "", "")
			} else {
				g, f := "n/a", "n/a"
				if !math.IsNaN(gets[0]) {
					g, f = fmt.Sprintf("%.2f", benchutil.Median(gets)), fmt.Sprintf("%.2f", benchutil.Median(per))
				}
				row = append(row, fmt.Sprintf("%.0f", benchutil.Median(mbps)), fmt.Sprintf("%.2f", benchutil.Median(ones)),
					fmt.Sprintf("%.0f", benchutil.Median(rss)), fmt.Sprintf("%.1f", benchutil.Median(p50)), fmt.Sprintf("%.1f", benchutil.Median(p99)), g, f)
			}
			if failed > 0 {
				row[2] += fmt.Sprintf(" (%d of %d runs failed: %v)", failed, len(rs), firstErr(rs))
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	rep.After = []string{fmt.Sprintf("tierfs's highest peak RSS in any measurement: %d MiB, with --cache-bytes %d MiB (target: at most the budget plus 64 MiB, %d MiB).",
		worstRSS>>20, budgetBytes>>20, (budgetBytes>>20)+64)}
	check(rep.Emit())
}

func firstErr(rs []result) error {
	for _, r := range rs {
		if r.err != nil {
			return r.err
		}
	}
	return nil
}

// load runs c's readers at once, each reading its whole segment, and
// times every read(2).
func load(c config, path func(i int) string, size int64) result {
	var (
		mu    sync.Mutex
		waits []float64
		total int64
		first error
		wg    sync.WaitGroup
	)
	t0 := time.Now()
	for r := range c.readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			i := r
			if c.same {
				i = 0
			}
			n, ws, err := readAll(path(i))
			mu.Lock()
			defer mu.Unlock()
			total += n
			waits = append(waits, ws...)
			if err == nil && n != size {
				err = fmt.Errorf("%s: %d bytes, want %d", path(i), n, size)
			}
			if err != nil && first == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0)
	sort.Float64s(waits)
	r := result{mbps: float64(total) / 1e6 / el.Seconds(), err: first}
	if len(waits) > 0 {
		r.p50 = waits[len(waits)/2]
		r.p99 = waits[min(len(waits)-1, len(waits)*99/100)]
	}
	return r
}

func readAll(path string) (int64, []float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	var waits []float64
	for {
		t := time.Now()
		k, err := f.Read(buf)
		waits = append(waits, float64(time.Since(t).Microseconds())/1000)
		n += int64(k)
		if errors.Is(err, io.EOF) {
			return n, waits, nil
		}
		if err != nil {
			return n, waits, err
		}
	}
}

// fetchRequests reads tierfs_remote_fetch_requests_total from the mount.
func fetchRequests(addr string) (float64, error) {
	return benchutil.Metric(addr, "tierfs_remote_fetch_requests_total")
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-tierload:", err)
		os.Exit(1)
	}
}
