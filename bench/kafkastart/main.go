// Command kafkastart measures a real Kafka broker's start-up with many
// segments (make bench-kafka): the same log dir, made by the broker
// itself and stopped cleanly, on a plain directory, on a tierfs mount
// without a remote, and on a tierfs mount with a remote (dir store) where
// every rolled segment is evicted. One broker (its KRaft metadata off
// the log dirs) is pointed at each copy in turn, in an order that
// rotates from run to run, with the page cache dropped before each
// start; a start is timed from the process's start to its log line
// "Kafka Server started", and followed by a clean stop. What each start
// on the tiered mount cost is read from the mount's metrics (moves,
// hydrated bytes, bytes fetched) and from the backing directory's
// allocated bytes. Medians of -runs, with ratios to the plain directory
// and to the mount without a remote of the same run. Not a test.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"github.com/tierfs/tierfs/e2e/kafka"
)

func main() {
	bin := flag.String("tierfs", "bin/tierfs", "tierfs binary")
	partitions := flag.Int("partitions", 200, "partitions of the topic")
	perPartition := flag.Int("segments", 50, "segments per partition (rolled by time: segment.ms)")
	perSegment := flag.Int("records", 20, "records per segment")
	valueSize := flag.Int("value-size", 3000, "bytes of each record's value")
	runs := flag.Int("runs", 3, "starts per configuration")
	warm := flag.Bool("warm", false, "keep the page cache between starts (a restart on a running machine) instead of dropping it (a start after a reboot)")
	perfDir := flag.String("perf", "", "if set, record each start system-wide with perf record -a -g into this directory (run-N-CONFIG.data)")
	recovery := flag.Int("recovery-threads", 2, "the broker's num.recovery.threads.per.data.dir, the same in every configuration (2 is Kafka's default): the threads that load the logs at a start")
	wakeHere := flag.String("wake-here", "", "if set, the FUSE module's wake_here values to start each tiered configuration with, comma-separated (e.g. N,Y: each tiered mount twice, once with each); the plain directory is not a FUSE mount")
	fsType := flag.String("fs", "ext4", "run on a fresh file system of this type (mkfs.TYPE on a loop device, as root); \"\" for a directory in $TMPDIR")
	flag.Parse()

	u := benchutil.NewUndo("bench-kafka-start")
	check := u.Check
	if why := kafka.Available(); why != "" {
		u.Fail(fmt.Errorf("%s", why))
	}
	tierfsBin, err := filepath.Abs(*bin)
	check(err)
	parent := os.TempDir()
	if *fsType != "" {
		parent = "/var/tmp" // the image: not in a tmpfs
	}
	dir, where := benchutil.WorkDir(u, parent, *fsType, 32<<30)

	// The data: a broker on a plain directory writes it, rolling a
	// segment every perSegment records of each partition (record j of a
	// partition is stamped j ms after the first: segment.ms rolls by
	// record time), and stops cleanly.
	plain := filepath.Join(dir, "plain")
	work := filepath.Join(dir, "broker")
	br, err := kafka.Start(kafka.Options{LogDir: plain, MetadataDir: filepath.Join(work, "metadata"), WorkDir: work,
		Props: map[string]string{"log.flush.interval.ms": kafka.NoTimedFlush, "num.recovery.threads.per.data.dir": strconv.Itoa(*recovery)}})
	check(err)
	u.Push(func() { br.Stop() })
	const topic = "history"
	check(createTopic(br, topic, *partitions, map[string]*string{
		"retention.ms": kadm.StringPtr("-1"), "segment.ms": kadm.StringPtr(strconv.Itoa(*perSegment - 1)), "segment.bytes": kadm.StringPtr("1073741824")}))
	t0 := time.Now()
	check(produce(br, topic, *partitions, *perPartition**perSegment, *valueSize))
	check(br.Stop())
	segs, bytes := countSegments(plain)
	fmt.Fprintf(os.Stderr, "made %d segments (%.0f MB of .log) in %v\n", segs, float64(bytes)/1e6, time.Since(t0).Round(time.Second))

	type config struct {
		name  string
		short string // in file names
		// wake is the FUSE module's wake_here for this configuration's
		// starts ("": as the machine has it).
		wake    string
		logDir  string
		backing string
		metrics string // the tiered mount's metrics address
		starts  []float64
		// loads: the broker's own measure of its log loading in each
		// start ("Loaded N logs in Xms"), in seconds.
		loads []float64
		// On the tiered mount: what each start cost.
		moves, hydrated, fetched float64
		localGrew                int64
		// FUSE requests by op over all starts: how many, and tierfs's
		// seconds answering them.
		ops, opSeconds map[string]float64
	}
	configs := []*config{{name: "plain directory", short: "plain", logDir: plain}}
	// withWake is cfg once for each -wake-here value: the same mount,
	// started with the FUSE module's wake_here set to it.
	withWake := func(cfg *config, values string) []*config {
		if values == "" {
			return []*config{cfg}
		}
		var out []*config
		for _, v := range strings.Split(values, ",") {
			c := *cfg
			c.name, c.short, c.wake = fmt.Sprintf("%s, wake_here=%s", cfg.name, v), cfg.short+"-wake"+v, v
			c.ops, c.opSeconds = map[string]float64{}, map[string]float64{}
			out = append(out, &c)
		}
		return out
	}
	if *wakeHere != "" {
		_, err := benchutil.KeepFUSEParam(u, "wake_here")
		check(err)
	}
	for i, c := range []struct {
		name, short string
		remote      bool
	}{{"tierfs, no remote", "mount", false}, {"tierfs --remote (dir store), rolled segments evicted", "remote", true}} {
		base := filepath.Join(dir, fmt.Sprint(i+1))
		backing, mnt := filepath.Join(base, "backing"), filepath.Join(base, "logs")
		check(os.MkdirAll(base, 0o755))
		check(os.MkdirAll(mnt, 0o755))
		check(benchutil.CopyTree(plain, backing))
		cfg := &config{name: c.name, short: c.short, logDir: mnt, backing: backing, ops: map[string]float64{}, opSeconds: map[string]float64{}}
		cfg.metrics, err = benchutil.FreeAddr()
		check(err)
		args := []string{"--backing", backing, "--metrics-listen", cfg.metrics}
		if c.remote {
			args = append(args, "--remote", "file://"+filepath.Join(base, "remote"), "--ship-after", "0s",
				"--local-retention-bytes", "1", "--tier-interval", "2s")
		}
		stop, err := benchutil.Mount(tierfsBin, filepath.Join(base, "tierfs.log"), nil, append(args, mnt)...)
		check(err)
		u.Push(stop)
		configs = append(configs, withWake(cfg, *wakeHere)...)
		if c.remote {
			fmt.Fprintln(os.Stderr, "waiting for every rolled segment to be evicted")
			t0 := time.Now()
			check(benchutil.WaitFor(func() bool { return evictedAll(mnt, *partitions) }, 60*time.Minute, "evicted"))
			fmt.Fprintf(os.Stderr, "evicted in %v\n", time.Since(t0).Round(time.Second))
		}
	}

	otherProblems := 0
	for r := range *runs {
		for k := range configs {
			c := configs[(k+r)%len(configs)]
			check(br.SetLogDir(c.logDir))
			var before cost
			var opsBefore, secsBefore map[string]float64
			if c.metrics != "" {
				before = costOf(c.metrics, c.backing)
				opsBefore, secsBefore = fuseOps(c.metrics)
			}
			if c.wake != "" {
				check(benchutil.SetFUSEParam("wake_here", c.wake))
			}
			if !*warm {
				benchutil.DropCaches()
			}
			var serr error
			logFrom := len(br.Log())
			stopPerf := startPerf(*perfDir, fmt.Sprintf("run-%d-%s.data", r+1, c.short))
			d := benchutil.Time(func() { serr = br.Restart() })
			stopPerf()
			check(serr)
			load, lerr := loadSeconds(br.Log()[logFrom:])
			check(lerr)
			c.loads = append(c.loads, load)
			if c.metrics != "" {
				ops, secs := fuseOps(c.metrics)
				for op, n := range ops {
					c.ops[op] += n - opsBefore[op]
					c.opSeconds[op] += secs[op] - secsBefore[op]
				}
				time.Sleep(3 * time.Second) // a move or a fetch the start began shows by now
				after := costOf(c.metrics, c.backing)
				c.moves += after.moves - before.moves
				c.hydrated += after.hydrated - before.hydrated
				c.fetched += after.fetched - before.fetched
				c.localGrew = max(c.localGrew, after.local-before.local)
			}
			// A problem with the log dir ends the benchmark; others (the
			// controller's own, on a quick restart) are counted.
			for _, p := range br.Problems() {
				if storageProblem(p) {
					u.Fail(fmt.Errorf("%s: the broker logged:\n%s", c.name, p))
				}
				otherProblems++
				fmt.Fprintf(os.Stderr, "%s: the broker logged (not about its log dir): %.300s\n", c.name, p)
			}
			check(br.Stop())
			c.starts = append(c.starts, d.Seconds())
			fmt.Fprintf(os.Stderr, "run %d, %s: start %.1f s, of which loading the logs %.1f s\n", r+1, c.name, d.Seconds(), load)
		}
	}
	u.Run()

	cacheNote := "the page cache dropped before each start"
	if *warm {
		cacheNote = "the page cache kept between starts (-warm)"
	}
	rep := benchutil.Report{
		Name:  "kafkastart",
		Title: "A Kafka broker's start-up with many segments",
		Notes: []string{fmt.Sprintf("Kafka %s broker (KRaft, one node), one topic of %d partitions with %d segments (%.0f MB of .log) that the broker wrote itself (segments rolled by segment.ms) and then stopped cleanly; the same log dir copied to each configuration. One broker is pointed at each in turn, in an order that rotates, %s; a start is timed from the process's start to \"Kafka Server started\", then the broker stops cleanly; num.recovery.threads.per.data.dir=%d in every configuration. Medians of %d starts; × plain and × mount: median of per-run ratios to the plain directory and to tierfs without a remote (the first such row). On %s; %s.%s",
			kafka.Version(), *partitions, segs, float64(bytes)/1e6, cacheNote, *recovery, *runs, where, benchutil.Machine(), wakeNote(*wakeHere))},
		Header:   []string{"configuration", "start-up, s", "× plain", "× mount", "loading the logs, s", "× plain", "the rest, s", "moves", "bytes hydrated", "bytes fetched", "local bytes grew by"},
		Versions: map[string]string{"Kafka": kafka.Version()},
	}
	chart := benchutil.Chart{Title: fmt.Sprintf("Kafka start-up, %d segments", segs), Unit: "s", LowerIsBetter: true}
	for _, c := range configs {
		vsMount := "–"
		if c != configs[0] {
			vsMount = fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(c.starts, configs[1].starts)))
		}
		costs := []string{"–", "–", "–", "–"}
		if c.metrics != "" {
			costs = []string{fmt.Sprintf("%.0f", c.moves), fmt.Sprintf("%.0f", c.hydrated), fmt.Sprintf("%.0f", c.fetched), fmt.Sprint(c.localGrew)}
		}
		rest := make([]float64, len(c.starts))
		for i := range rest {
			rest[i] = c.starts[i] - c.loads[i]
		}
		rep.Rows = append(rep.Rows, append([]string{c.name, fmt.Sprintf("%.1f", benchutil.Median(c.starts)),
			fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(c.starts, configs[0].starts))), vsMount,
			fmt.Sprintf("%.2f", benchutil.Median(c.loads)), fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(c.loads, configs[0].loads))),
			fmt.Sprintf("%.1f", benchutil.Median(rest))}, costs...))
		chart.Bars = append(chart.Bars, benchutil.Bar{Label: c.name, Value: benchutil.Median(c.starts)})
	}
	for _, c := range configs[1:] {
		type opCost struct {
			op      string
			n, secs float64
		}
		var all []opCost
		for op, n := range c.ops {
			all = append(all, opCost{op, n / float64(len(c.starts)), c.opSeconds[op] / float64(len(c.starts))})
		}
		sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n })
		var parts []string
		for _, o := range all {
			if o.n >= 1 {
				parts = append(parts, fmt.Sprintf("%s %.0f (%.2f s)", o.op, o.n, o.secs))
			}
		}
		rep.After = append(rep.After, fmt.Sprintf("FUSE requests per start (from the process's start to \"Kafka Server started\"), %s: %s; in parentheses, tierfs's time answering them, summed over concurrent requests.", c.name, strings.Join(parts, ", ")))
	}
	rep.After = append(rep.After, "loading the logs: the broker's own measure of it in each start (its log line \"Loaded N logs in X ms\"); the rest: the start-up less that (the JVM, the controller, the broker's other start-up work).")
	rep.After = append(rep.After, "moves, bytes hydrated and bytes fetched are summed over all starts of the tiered mount (each measured from just before the start to 3 s after \"Kafka Server started\"); local bytes grew by: the largest growth of the backing directory's allocated bytes over one start.")
	if otherProblems > 0 {
		rep.After = append(rep.After, fmt.Sprintf("The broker logged %d error lines in all starts, none about its log dir (they are in the benchmark's output).", otherProblems))
	}
	rep.Charts = []benchutil.Chart{chart}
	if err := rep.Emit(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-kafka-start:", err)
		os.Exit(1)
	}
}

// wakeNote says what -wake-here did, for the report's notes.
func wakeNote(values string) string {
	if values == "" {
		return fmt.Sprintf(" The FUSE module's wake_here was %q throughout.", benchutil.FUSEParam("wake_here"))
	}
	return fmt.Sprintf(" Each tiered mount was started once per run with each of the FUSE module's wake_here values %s (/sys/module/fuse/parameters/wake_here, set just before its start; a setting of the machine, not of the mount).", values)
}

// startPerf records the whole machine with perf into dir/name until the
// returned function is called; nothing when dir is empty.
func startPerf(dir, name string) (stop func()) {
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "perf:", err)
		return func() {}
	}
	cmd := exec.Command("perf", "record", "-a", "-g", "-F", "499", "-o", filepath.Join(dir, name))
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "perf:", err)
		return func() {}
	}
	return func() {
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
	}
}

// loadedLogs is the broker's log line that ends its loading of the logs,
// with how long that took.
var loadedLogs = regexp.MustCompile(`Loaded [0-9]+ logs in ([0-9]+)ms`)

// loadSeconds is how long the broker said its loading of the logs took,
// from what it logged in one start.
func loadSeconds(log string) (float64, error) {
	m := loadedLogs.FindStringSubmatch(log)
	if m == nil {
		return 0, fmt.Errorf("the broker's start logged no line %q", loadedLogs)
	}
	ms, err := strconv.Atoi(m[1])
	return float64(ms) / 1000, err
}

// produce writes rounds records to every partition (kafka.ProduceRounds).
func produce(br *kafka.Broker, topic string, partitions, rounds, size int) error {
	c, err := kgo.NewClient(kgo.SeedBrokers(br.Addr), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		return err
	}
	defer c.Close()
	return kafka.ProduceRounds(context.Background(), c, topic, partitions, rounds, size)
}

// cost is what the tiered mount did so far, and its local bytes.
type cost struct {
	moves, hydrated, fetched float64
	local                    int64
}

func costOf(addr, backing string) cost {
	m := scrape(addr)
	return cost{moves: m["tierfs_moves_total"], hydrated: m["tierfs_hydrated_bytes_total"], fetched: m["tierfs_remote_fetch_bytes_total"], local: allocated(backing)}
}

// fuseOps reads the mount's FUSE request counts and seconds by op.
func fuseOps(addr string) (count, seconds map[string]float64) {
	count, seconds = map[string]float64{}, map[string]float64{}
	samples, _ := benchutil.Scrape(addr) // none if it cannot be read
	for k, v := range samples {
		op := labelValue(k, "op")
		switch {
		case strings.HasPrefix(k, "tierfs_fuse_requests_total{"):
			count[op] += v
		case strings.HasPrefix(k, "tierfs_fuse_request_duration_seconds_sum{"):
			seconds[op] += v
		}
	}
	return count, seconds
}

// labelValue is the value of label name in a sample's name and labels.
func labelValue(sample, name string) string {
	i := strings.Index(sample, name+"=\"")
	if i < 0 {
		return ""
	}
	v := sample[i+len(name)+2:]
	return v[:strings.IndexByte(v, '"')]
}

// scrape sums each metric over its label sets.
func scrape(addr string) map[string]float64 {
	out := map[string]float64{}
	samples, _ := benchutil.Scrape(addr) // none if it cannot be read
	for k, v := range samples {
		out[k[:strings.IndexAny(k+" ", "{ ")]] += v
	}
	return out
}

func allocated(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	return n
}

// countSegments counts the .log files under dir and their bytes.
func countSegments(dir string) (n int, bytes int64) {
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && strings.HasSuffix(p, ".log") {
			n++
			bytes += fi.Size()
		}
		return nil
	})
	return n, bytes
}

// evictedAll says whether every partition has all its segments but the
// active one evicted.
func evictedAll(mnt string, partitions int) bool {
	parts, _ := filepath.Glob(filepath.Join(mnt, "*-*"))
	if len(parts) < partitions {
		return false
	}
	for _, p := range parts {
		logs, _ := filepath.Glob(filepath.Join(p, "*.log"))
		if strings.Contains(p, "__") {
			continue
		}
		if !benchutil.AllRemote(logs[:max(len(logs)-1, 0)]) {
			return false
		}
	}
	return true
}

func createTopic(br *kafka.Broker, topic string, partitions int, configs map[string]*string) error {
	c, err := kgo.NewClient(kgo.SeedBrokers(br.Addr))
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := kadm.NewClient(c).CreateTopic(context.Background(), int32(partitions), 1, configs, topic)
	if err == nil {
		err = res.Err
	}
	return err
}

// storageProblem says whether a problem the broker logged is about its
// log dir (segments, indexes, recovery), not about its controller or its
// clients.
func storageProblem(line string) bool {
	low := strings.ToLower(line)
	for _, w := range []string{"corrupt", "index", "segment", "log dir", "logdir", "recover", ".log", "checkpoint", "storage"} {
		if strings.Contains(low, w) {
			return true
		}
	}
	return false
}
