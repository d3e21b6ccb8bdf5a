// Command kafkacatchup measures a consumer catching up from offset 0 on
// a topic of many partitions whose rolled segments are all evicted: a
// real Kafka broker on a tierfs mount with a dir store, one mount per
// chunk memory budget (--cache-bytes), a broker on a plain directory with
// the same records (-plain), and one with Kafka's own tiered storage
// (KIP-405, -kip405) on a plain directory with its local copies deleted,
// all running at once and measured in turn, the others paused while one
// is measured (-pause-others), after a consume of everything on each that
// is not measured (-warmup). For each budget:
// consume MB/s and its ratio to the plain directory's and to KIP-405's in
// the same run, the mount's peak resident memory during the consume, and
// bytes fetched per byte consumed. With -tierfs-b, each budget also gets
// a mount of a second build, measured in the same runs: its × A column is
// the median of per-run ratios to the first build's.
//
//	go run ./bench/kafkacatchup -tierfs bin/tierfs -partitions 40 -mib 40 -budgets 64MiB,256MiB -runs 3
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"github.com/tierfs/tierfs/chunkxfer/store/s3test"
	"github.com/tierfs/tierfs/e2e/kafka"
	"github.com/tierfs/tierfs/internal/procmem"
)

const topic = "catchup"

type setup struct {
	plain  bool // a broker on a plain directory: no mount
	kip405 bool // Kafka's own tiered storage on a plain directory: no mount
	budget string
	build  string // "A" (-tierfs) or "B" (-tierfs-b); "" without -tierfs-b
	bin    string
	a      *setup // for a build B, the build A of its budget
	// wake is the FUSE module's wake_here for this setup's consumes
	// ("": as the machine has it; see -wake-here-b).
	wake    string
	budgetB int64
	logDir  string
	pid     int
	metrics string
	br      *kafka.Broker
	mbps    []float64
	rss     []float64
	amp     []float64 // bytes fetched from the store per byte consumed
	xPlain  []float64 // consume MB/s over the plain directory's, per run
	xA      []float64 // for a build B: consume MB/s over build A's, per run
	xKIP    []float64 // consume MB/s over KIP-405's, per run
}

// name is the setup's name in the output.
func (su *setup) name() string {
	switch {
	case su.plain:
		return "plain directory"
	case su.kip405:
		return kip405Name
	}
	if su.build != "" {
		return "--cache-bytes " + su.budget + ", build " + su.build
	}
	return "--cache-bytes " + su.budget
}

// mounted says whether the setup's broker runs on a tierfs mount.
func (su *setup) mounted() bool { return !su.plain && !su.kip405 }

// key names the setup in file names.
func (su *setup) key() string {
	switch {
	case su.plain:
		return "plain"
	case su.kip405:
		return "kip405"
	}
	return su.budget + su.build
}

const kip405Name = "Kafka tiered storage (KIP-405)"

// row is the setup's name in the table.
func (su *setup) row() string {
	if su.build != "" {
		return su.budget + ", " + su.build + " (" + filepath.Base(su.bin) + ")"
	}
	return su.budget
}

func main() {
	bin := flag.String("tierfs", "bin/tierfs", "tierfs binary")
	binB := flag.String("tierfs-b", "", "a second tierfs binary (build B), mounted beside the first for each budget and measured in the same runs")
	partitions := flag.Int("partitions", 40, "partitions of the topic")
	mib := flag.Int("mib", 40, "MiB produced to each partition")
	budgets := flag.String("budgets", "64MiB,256MiB", "--cache-bytes of each mount, comma-separated")
	segmentBytes := flag.String("segment-bytes", "8MiB", "log.segment.bytes")
	runs := flag.Int("runs", 3, "consumes from offset 0 per mount")
	plain := flag.Bool("plain", true, "also a broker on a plain directory, the anchor of the × plain column")
	kip := flag.Bool("kip405", true, "also a broker with Kafka's own tiered storage (Kafka 4.3.0, LocalTieredStorage) on a plain directory, its local copies deleted, the anchor of the × KIP-405 column")
	warmup := flag.Bool("warmup", true, "consume everything once on each broker before the measured runs, not measured (the first consume after producing is slower for whichever broker goes first)")
	heap := flag.String("heap", "2g", "each broker's largest Java heap (-Xmx): Kafka's tiered storage ran out of 768m at 1,000 partitions, and a broker near its limit spends a core collecting")
	pause := flag.Bool("pause-others", true, "stop the other brokers (SIGSTOP) while one is consumed from, so that their background work (KIP-405's tasks for every partition, say) does not take the two cores from the one measured")
	storeKind := flag.String("store", "dir", "the mounts' store: dir (a directory in the work directory) or s3 (versitygw on 127.0.0.1, started here, a bucket per mount; its data in the work directory)")
	wakeB := flag.String("wake-here-b", "", "with -tierfs-b: the FUSE module's wake_here (N or Y) while build B is consumed from, the machine's own value for the others (-tierfs-b may be the same binary as -tierfs)")
	flag.Parse()
	u := benchutil.NewUndo("bench-kafkacatchup")
	defer u.Run()
	if lib := kafka.Available(); lib != "" {
		u.Fail(fmt.Errorf("no Kafka: %s", lib))
	}
	tierfsBin, err := filepath.Abs(*bin)
	u.Check(err)
	segBytes, err := benchutil.ParseSize(*segmentBytes)
	u.Check(err)
	dir, where := benchutil.WorkDir(u, os.TempDir(), "", 0)
	// remoteOf is mount i's --remote, and storeEnv its keys.
	remoteOf := func(i int) string { return "file://" + filepath.Join(dir, fmt.Sprint(i), "remote") }
	var storeEnv []string
	storeName := "a dir store"
	switch *storeKind {
	case "dir":
	case "s3":
		srv, err := s3test.Start(filepath.Join(dir, "s3"))
		u.Check(err)
		u.Push(srv.Stop)
		storeEnv = []string{"TIERFS_S3_ACCESS_KEY=" + srv.AccessKey, "TIERFS_S3_SECRET_KEY=" + srv.SecretKey}
		remoteOf = func(i int) string {
			bucket := fmt.Sprintf("catchup%d", i)
			_, err := srv.NewStore(context.Background(), bucket, "")
			u.Check(err)
			return "s3://" + bucket + "/kafka?endpoint=" + srv.Endpoint
		}
		storeName = "versitygw on 127.0.0.1 (a bucket per mount)"
	default:
		u.Fail(fmt.Errorf("-store %q: dir or s3", *storeKind))
	}
	// Kafka's default flush policy (none forced by time), as a
	// production broker runs: the test brokers' fsync of every
	// partition each second made 229,005 FSYNCs of a 1,000-partition
	// produce (2026-12-07), a cost of the test settings, not of a broker.
	props := map[string]string{"log.segment.bytes": fmt.Sprint(segBytes), "log.flush.interval.ms": kafka.NoTimedFlush}
	if *pause {
		// A broker and its controller are one process: paused for
		// minutes, the controller would find its own broker's session
		// expired when it goes on, fence it and take its partitions
		// offline while the next consume starts.
		props["broker.session.timeout.ms"] = fmt.Sprint((24 * time.Hour).Milliseconds())
	}
	records := *partitions * *mib << 20 / 1024

	var setups []*setup
	for _, b := range strings.Split(*budgets, ",") {
		if *binB == "" {
			setups = append(setups, &setup{budget: b, bin: tierfsBin})
			continue
		}
		b2, err := filepath.Abs(*binB)
		u.Check(err)
		a := &setup{budget: b, build: "A", bin: tierfsBin}
		setups = append(setups, a, &setup{budget: b, build: "B", bin: b2, a: a, wake: *wakeB})
	}
	if *wakeB != "" {
		if *binB == "" {
			u.Fail(fmt.Errorf("-wake-here-b needs -tierfs-b"))
		}
		orig, err := benchutil.KeepFUSEParam(u, "wake_here")
		u.Check(err)
		for _, su := range setups {
			if su.mounted() && su.wake == "" {
				su.wake = orig
			}
		}
	}
	if *plain {
		setups = append(setups, &setup{plain: true})
	}
	if *kip {
		if why := kafka.KIP405Available(); why != "" {
			fmt.Fprintf(os.Stderr, "%s: measuring without it\n", why)
		} else {
			setups = append(setups, &setup{kip405: true})
		}
	}
	for i, su := range setups {
		b := su.budget
		su.logDir = filepath.Join(dir, fmt.Sprint(i), "logs")
		u.Check(os.MkdirAll(su.logDir, 0o755))
		if su.mounted() {
			su.budgetB, err = benchutil.ParseSize(b)
			u.Check(err)
			backing := filepath.Join(dir, fmt.Sprint(i), "backing")
			u.Check(os.MkdirAll(backing, 0o755))
			su.metrics, err = benchutil.FreeAddr()
			u.Check(err)
			stop, pid, err := benchutil.MountProc(su.bin, filepath.Join(dir, fmt.Sprint(i), "tierfs.log"), storeEnv,
				"--backing", backing, "--remote", remoteOf(i), "--ship-after", "1s",
				"--local-retention-bytes", "1", "--tier-interval", "500ms", "--cache-bytes", b, "--metrics-listen", su.metrics, su.logDir)
			u.Check(err)
			u.Push(stop)
			su.pid = pid
		}
		work := filepath.Join(dir, fmt.Sprint(i), "broker")
		opts := kafka.Options{LogDir: su.logDir, MetadataDir: filepath.Join(work, "metadata"), WorkDir: work, Props: props, Heap: *heap}
		var configs map[string]*string
		if su.kip405 {
			opts.Lib, opts.Props = kafka.KIP405LibDir(), kafka.KIP405Props(props, filepath.Join(dir, fmt.Sprint(i), "remote-storage"))
			configs = kafka.KIP405TopicConfigs()
		}
		su.br, err = kafka.Start(opts)
		u.Check(err)
		br := su.br
		u.Push(func() { br.Stop() })

		fmt.Fprintf(os.Stderr, "%s: producing %d MiB to each of %d partitions\n", su.name(), *mib, *partitions)
		u.Check(produce(br, *partitions, records, configs))
	}
	for _, su := range setups {
		switch {
		case su.kip405:
			fmt.Fprintf(os.Stderr, "%s: waiting for Kafka to copy the rolled segments to its remote storage and delete them locally\n", su.name())
			for p := range *partitions {
				pdir := filepath.Join(su.logDir, fmt.Sprintf("%s-%d", topic, p))
				u.Check(benchutil.WaitFor(func() bool { return benchutil.LocalSegments(pdir) == 1 }, 20*time.Minute, "local copies deleted"))
			}
		case su.mounted():
			fmt.Fprintf(os.Stderr, "%s: waiting for the rolled segments to be evicted\n", su.name())
			for p := range *partitions {
				u.Check(benchutil.WaitFor(func() bool { return benchutil.AllEvicted(filepath.Join(su.logDir, fmt.Sprintf("%s-%d", topic, p))) }, 20*time.Minute, "eviction"))
			}
		}
	}
	var anchor, kipAnchor *setup
	for _, su := range setups {
		switch {
		case su.plain:
			anchor = su
		case su.kip405:
			kipAnchor = su
		}
	}
	if *warmup {
		unix.Sync()
		for _, su := range setups {
			benchutil.DropCaches()
			_, mbps, others, err := consumeAlone(setups, su, *pause, records)
			u.Check(err)
			fmt.Fprintf(os.Stderr, "warm-up, %s: consume %.0f MB/s (not measured), the others used %.1f CPU s\n", su.name(), mbps, others)
		}
	}
	for r := range *runs {
		for k := range setups {
			su := setups[(k+r)%len(setups)]
			if !su.mounted() {
				benchutil.DropCaches()
				_, mbps, others, err := consumeAlone(setups, su, *pause, records)
				u.Check(err)
				su.mbps = append(su.mbps, mbps)
				fmt.Fprintf(os.Stderr, "run %d, %s: consume %.0f MB/s, the others used %.1f CPU s\n", r+1, su.name(), su.mbps[r], others)
				continue
			}
			before, err := benchutil.Metric(su.metrics, "tierfs_remote_fetch_requests_total")
			u.Check(err)
			bytesBefore, err := benchutil.Metric(su.metrics, "tierfs_remote_fetch_bytes_total")
			u.Check(err)
			// Where the memory went, for the log: pieces fetched, blocks
			// fetched alone (GETs too, not in the GETs column), read-ahead
			// evicted unread, claims taken back, reads that waited (a
			// version without one of these metrics shows none).
			diag := []string{"tierfs_remote_piece_fetch_requests_total", "tierfs_remote_block_fetch_requests_total", "tierfs_read_ahead_wasted_total", "tierfs_chunk_memory_claims_revoked_total", "tierfs_chunk_memory_waits_total"}
			diagBefore := make([]float64, len(diag))
			for i, m := range diag {
				diagBefore[i], _ = benchutil.Metric(su.metrics, m)
			}
			benchutil.DropCaches()
			u.Check(procmem.ResetPeakRSS(su.pid))
			n, mbps, others, err := consumeAlone(setups, su, *pause, records)
			u.Check(err)
			rss, err := procmem.PeakRSS(su.pid)
			u.Check(err)
			after, err := benchutil.Metric(su.metrics, "tierfs_remote_fetch_requests_total")
			u.Check(err)
			bytesAfter, err := benchutil.Metric(su.metrics, "tierfs_remote_fetch_bytes_total")
			u.Check(err)
			su.mbps = append(su.mbps, mbps)
			su.rss = append(su.rss, float64(rss>>20))
			// About 1.0 when every evicted chunk was fetched once (a
			// little less: the newest segments are local).
			su.amp = append(su.amp, (bytesAfter-bytesBefore)/float64(n))
			var counts []string
			for i, m := range diag {
				if v, err := benchutil.Metric(su.metrics, m); err == nil {
					counts = append(counts, fmt.Sprintf("%s %.0f", strings.TrimPrefix(m, "tierfs_"), v-diagBefore[i]))
				}
			}
			fmt.Fprintf(os.Stderr, "run %d, %s: consume %.0f MB/s, peak RSS %d MiB, %.0f GETs, %.0f MB fetched (%s), the others used %.1f CPU s\n",
				r+1, su.name(), su.mbps[r], rss>>20, after-before, (bytesAfter-bytesBefore)/1e6, strings.Join(counts, ", "), others)
		}
		for _, su := range setups {
			if anchor != nil && !su.plain {
				su.xPlain = append(su.xPlain, su.mbps[r]/anchor.mbps[r])
			}
			if kipAnchor != nil && !su.kip405 {
				su.xKIP = append(su.xKIP, su.mbps[r]/kipAnchor.mbps[r])
			}
			if su.a != nil {
				su.xA = append(su.xA, su.mbps[r]/su.a.mbps[r])
			}
		}
	}
	for _, su := range setups {
		if p := logProblems(su.br, *pause); len(p) > 0 {
			// The work directory goes: keep the broker's whole log
			// (the exceptions after each error line) and the mount's.
			kept := filepath.Join(os.TempDir(), fmt.Sprintf("kafkacatchup-%d-%s", os.Getpid(), su.key()))
			os.WriteFile(kept+"-broker.log", []byte(su.br.Log()), 0o644)
			if b, err := os.ReadFile(filepath.Join(filepath.Dir(su.logDir), "tierfs.log")); err == nil {
				os.WriteFile(kept+"-tierfs.log", b, 0o644)
			}
			u.Fail(fmt.Errorf("%s: the broker logged (whole logs in %s-*.log):\n%s", su.name(), kept, strings.Join(p, "\n")))
		}
	}
	kipNote := ""
	if kipAnchor != nil {
		kipNote = fmt.Sprintf(" Kafka's own tiered storage is Kafka %s (its 4.4.0 test jar is not served) with the LocalTieredStorage remote storage manager writing to a directory on the same file system, the default topic-based metadata manager, and the topic with remote.storage.enable and local.retention.bytes 1: every rolled segment is read from its remote storage; × KIP-405: the median of per-run ratios to its consume rate.", kafka.VersionIn(kafka.KIP405LibDir()))
	}
	pauseNote := "the other brokers paused (SIGSTOP) during each consume"
	if !*pause {
		pauseNote = "the other brokers running during each consume (-pause-others=false)"
	}
	rep := benchutil.Report{
		Name:  "kafkacatchup",
		Title: "Kafka consumer catching up from offset 0, every rolled segment evicted",
		Notes: []string{fmt.Sprintf("Kafka %s broker (KRaft, one node, -Xmx%s) on a tierfs mount with %s, in %s, one broker and mount per --cache-bytes (and, with -plain, a broker on a plain directory in the same file system), measured in turn in an order that rotates, %s, after one consume of everything on each that is not measured (-warmup); a topic of %d partitions, %d MiB of 1 KB records each, log.segment.bytes %s and Kafka's default flush policy (no fsync forced by time); one consumer (franz-go, a group of its own) reads every partition from offset 0 with the page cache dropped, so every rolled segment comes from the store (and, on the plain directory, from the disk); × plain: the median of per-run ratios of the consume rate to the plain directory's; × A (with -tierfs-b, a mount of a second build beside each budget's): the median of per-run ratios of build B's consume rate to build A's; peak RSS is the mount's VmHWM during the consume; medians of %d runs; %s.%s",
			kafka.Version(), *heap, storeName, where, pauseNote, *partitions, *mib, *segmentBytes, *runs, benchutil.Machine(), kipNote)},
		Header:   []string{"--cache-bytes", "consume MB/s", "× plain", "× KIP-405", "× A", "peak RSS of tierfs, MiB", "× (budget + 64 MiB)", "bytes fetched per byte consumed"},
		Versions: map[string]string{"Kafka": kafka.Version()},
	}
	ratio := func(xs []float64) string {
		if len(xs) == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", benchutil.Median(xs))
	}
	for _, su := range setups {
		switch {
		case su.plain:
			rep.Rows = append(rep.Rows, []string{"plain directory", fmt.Sprintf("%.0f", benchutil.Median(su.mbps)), "1.00", ratio(su.xKIP), "–", "–", "–", "–"})
			continue
		case su.kip405:
			rep.Rows = append(rep.Rows, []string{kip405Name, fmt.Sprintf("%.0f", benchutil.Median(su.mbps)), ratio(su.xPlain), "1.00", "–", "–", "–", "–"})
			continue
		}
		rss := benchutil.Median(su.rss)
		rep.Rows = append(rep.Rows, []string{su.row(), fmt.Sprintf("%.0f", benchutil.Median(su.mbps)), ratio(su.xPlain), ratio(su.xKIP), ratio(su.xA), fmt.Sprintf("%.0f", rss),
			fmt.Sprintf("%.2f", rss/float64((su.budgetB>>20)+64)), fmt.Sprintf("%.2f", benchutil.Median(su.amp))})
	}
	u.Run()
	if *wakeB != "" {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Build B was consumed from with the FUSE module's wake_here set to %s (/sys/module/fuse/parameters/wake_here, a setting of the machine), the other mounts with the machine's own value.", *wakeB))
	}
	if err := rep.Emit(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// produce writes records of 1 KB round-robin to the topic's partitions.
func produce(br *kafka.Broker, partitions, records int, configs map[string]*string) error {
	// Uncompressed, and every value other bytes: what is stored is what
	// was produced.
	c, err := kgo.NewClient(kgo.SeedBrokers(br.Addr), kgo.ProducerLinger(5*time.Millisecond), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		return err
	}
	defer c.Close()
	cfg := map[string]*string{"retention.ms": kadm.StringPtr("-1")}
	maps.Copy(cfg, configs)
	res, err := kadm.NewClient(c).CreateTopic(context.Background(), int32(partitions), 1, cfg, topic)
	if err == nil {
		err = res.Err
	}
	if err != nil {
		return err
	}
	ctx := context.Background()
	var mu sync.Mutex
	var first error
	x := uint64(88172645463325252)
	for i := range records {
		value := make([]byte, 1024)
		for j := 0; j < len(value); j += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			binary.LittleEndian.PutUint64(value[j:], x)
		}
		c.Produce(ctx, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Value: value}, func(_ *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
		})
	}
	if err := c.Flush(ctx); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}

// timedConsume consumes n records from offset 0 (consume) and gives
// the bytes of their values and their rate in MB/s.
func timedConsume(br *kafka.Broker, n int) (bytes int64, mbps float64, err error) {
	d := benchutil.Time(func() { bytes, err = consume(br, n) })
	return bytes, float64(bytes) / 1e6 / d.Seconds(), err
}

// consumeAlone is timedConsume of su's broker with every other setup's
// broker paused (with pause), and the CPU seconds the other setups'
// brokers and mounts used meanwhile: all of them run on the same two
// cores, and an idle broker is not idle (Kafka's tiered storage runs
// tasks for every partition every 30 s).
func consumeAlone(setups []*setup, su *setup, pause bool, n int) (bytes int64, mbps, others float64, err error) {
	if su.wake != "" {
		if err := benchutil.SetFUSEParam("wake_here", su.wake); err != nil {
			return 0, 0, 0, err
		}
	}
	var rest []*setup
	for _, o := range setups {
		if o != su {
			rest = append(rest, o)
		}
	}
	cpu := func() float64 {
		var sum float64
		for _, o := range rest {
			if s, err := o.br.CPUSeconds(); err == nil {
				sum += s
			}
			if o.pid != 0 {
				if s, err := procmem.CPUSeconds(o.pid); err == nil {
					sum += s
				}
			}
		}
		return sum
	}
	if pause {
		for _, o := range rest {
			if err := o.br.Pause(); err != nil {
				return 0, 0, 0, err
			}
			defer o.br.Resume()
		}
	}
	before := cpu()
	bytes, mbps, err = timedConsume(su.br, n)
	return bytes, mbps, cpu() - before, err
}

// consume reads every partition from offset 0 until it has n records,
// and returns the bytes of their values.
func consume(br *kafka.Broker, n int) (int64, error) {
	c, err := kgo.NewClient(kgo.SeedBrokers(br.Addr), kgo.ConsumerGroup(fmt.Sprintf("catchup-%d", time.Now().UnixNano())),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(50<<20))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var got int
	var bytes int64
	for got < n {
		fs := c.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return bytes, fmt.Errorf("consumed %d of %d records: %w", got, n, err)
		}
		for _, e := range fs.Errors() {
			return bytes, fmt.Errorf("fetch %s/%d: %w", e.Topic, e.Partition, e.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			got++
			bytes += int64(len(r.Value))
		})
	}
	return bytes, nil
}

// logProblems are the broker's problems (Broker.Problems) but, if it
// was paused (-pause-others), a controller event that took as long as a
// pause, and the appends it refused for a sequence number out of order:
// with a thousand partitions the producer's idempotent batches reach the
// broker out of order (tens of thousands of such lines in a minute of
// producing, with a produce request timeout of 10 s or of 2 minutes
// alike, the cause not found), and the client sends them again; they say
// nothing about the log.
func logProblems(br *kafka.Broker, paused bool) []string {
	lines := strings.Split(br.Log(), "\n")
	skip := map[string]bool{}
	for i := 0; i+1 < len(lines); i++ {
		if strings.Contains(lines[i], "Error processing append operation") && strings.Contains(lines[i+1], "OutOfOrderSequenceException") {
			skip[lines[i]] = true
		}
	}
	if paused {
		// The event under way when the broker was paused took as long
		// as the pause.
		for _, l := range lines {
			if strings.Contains(l, "Exceptionally slow controller event") {
				skip[l] = true
			}
		}
	}
	var out []string
	for _, l := range br.Problems() {
		if !skip[l] {
			out = append(out, l)
		}
	}
	return out
}
