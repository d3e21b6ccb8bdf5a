// Command kafka measures a real Kafka broker on tierfs (make bench-kafka):
// produce throughput on a plain directory, on a mount without a remote,
// on a mount with change management (--cm), on a mount that tiers to a
// dir store while it takes the writes, and, side by side, Kafka's own
// tiered storage (KIP-405: Kafka 4.3.0 with the LocalTieredStorage
// remote storage manager, on a plain directory); and consumer
// throughput from offset 0 with every segment local (plain directory,
// mounts) and with every rolled segment's local copy gone (evicted by
// tierfs, or deleted by Kafka after its copy to remote storage). For
// each, the broker's CPU seconds (and the mount's) and the store's
// bytes. The brokers run at
// once, on a fresh file system (-fs); each run produces a topic of its
// own on each in turn, in an order that rotates from run to run and with
// nothing left dirty before each produce, then consumes them in turn,
// with the page cache dropped before each consumer starts. Medians of
// -runs, with ratios to the plain directory of the same run (and, for
// produce, to the mount without a remote or cm). Not a test.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"github.com/tierfs/tierfs/e2e/kafka"
	"github.com/tierfs/tierfs/internal/procmem"
)

func main() {
	bin := flag.String("tierfs", "bin/tierfs", "tierfs binary")
	records := flag.Int("records", 400_000, "records per topic (1 KB values)")
	runs := flag.Int("runs", 5, "runs (topics) per configuration")
	segmentBytes := flag.String("segment-bytes", "16MiB", "log.segment.bytes (the e2e tests use 1MiB; Kafka's default is 1GiB)")
	flushMs := flag.Int64("flush-ms", 0, "log.flush.interval.ms, a forced fsync this often (0: Kafka's default, none; the e2e tests use 1000)")
	only := flag.String("only", "", "run only the configurations whose name matches this regexp (the plain directory always runs)")
	fsType := flag.String("fs", "ext4", "run the brokers on a fresh file system of this type (mkfs.TYPE on a loop device, as root); \"\" for a directory in $TMPDIR")
	mountFlags := flag.String("mount-flags", "", "more tierfs mount flags for every mount, space-separated (e.g. --debug-fuse, whose log stays in the mount's tierfs.log only while the bench runs)")
	storeDir := flag.String("store-dir", "", "put tierfs's dir store and Kafka's remote storage in a new directory under this one (a tmpfs such as /dev/shm, say) instead of on the brokers' file system: on one disk, tiering writes every byte twice to it, and the store's writes compete with the produce")
	metricsDir := flag.String("metrics", "", "write each mount's metrics (Prometheus text) to this directory after the produce runs, to see where its time went")
	flag.Parse()

	// What to undo on the way out, newest first, also when a measurement
	// fails: brokers, mounts and the file system they are on.
	u := benchutil.NewUndo("bench-kafka")
	check := u.Check
	segBytes, err := benchutil.ParseSize(*segmentBytes)
	check(err)
	props := map[string]string{"log.segment.bytes": fmt.Sprint(segBytes), "log.flush.interval.ms": kafka.NoTimedFlush}
	if *flushMs > 0 {
		props["log.flush.interval.ms"] = fmt.Sprint(*flushMs)
	}
	if why := kafka.Available(); why != "" {
		u.Fail(fmt.Errorf("%s", why))
	}
	tierfsBin, err := filepath.Abs(*bin)
	check(err)
	parent := os.TempDir()
	if *fsType != "" {
		parent = "/var/tmp" // the image: not in a tmpfs
	}
	// Sparse: it takes what the brokers write (about 10 GB with the
	// defaults: 400 MB a topic, 5 runs, 4 brokers, and the store).
	dir, where := benchutil.WorkDir(u, parent, *fsType, 64<<30)
	// Where the stores go: beside the brokers, or in a directory of
	// their own under -store-dir.
	stores, storesWhere := dir, "on the same file system"
	if *storeDir != "" {
		var err error
		stores, err = os.MkdirTemp(*storeDir, "bench-kafka-stores-")
		check(err)
		u.Push(func() { os.RemoveAll(stores) })
		storesWhere = "in " + *storeDir
	}

	type config struct {
		name   string
		remote bool // tiers to a dir store; consumers read evicted segments
		kip405 bool // Kafka's own tiered storage, on a plain directory
		mount  []string
	}
	configs := []config{
		{name: "plain directory"},
		{name: "tierfs, no remote", mount: []string{}},
		// Change management retains every checkpoint replaced, index
		// trimmed and segment deleted, and logs every create and write.
		{name: "tierfs --cm, no remote", mount: []string{"--cm"}},
		{name: "tierfs --remote (dir store), evicted", remote: true, mount: []string{
			"--remote", "file://" + filepath.Join(stores, "remote"), "--ship-after", "1s",
			"--local-retention-bytes", "1", "--tier-interval", "500ms"}},
		{name: "Kafka tiered storage (KIP-405), local copies deleted", kip405: true},
	}
	if why := kafka.KIP405Available(); why != "" {
		fmt.Fprintf(os.Stderr, "%s: measuring without it\n", why)
		configs = configs[:len(configs)-1]
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		check(err)
		kept := configs[:1]
		for _, c := range configs[1:] {
			if re.MatchString(c.name) {
				kept = append(kept, c)
			}
		}
		configs = kept
	}
	type setup struct {
		config
		logDir                              string
		store                               string // the remote store's directory, if any
		br                                  *kafka.Broker
		mountPID                            int
		metrics                             string // the mount's metrics address, with -metrics
		streams                             []kafka.Stream
		produceMBs, consumeMBs, consumeRecs []float64
		brokerCPU, mountCPU                 float64 // at the start, then used
		storeBytes                          int64
	}
	var setups []*setup
	// All brokers run at once and every run measures them in turn, in an
	// order that rotates from run to run, so the ratios compare
	// measurements taken moments apart and whatever drifts during a run
	// falls on all of them alike.
	for ci, cfg := range configs {
		su := &setup{config: cfg, logDir: filepath.Join(dir, fmt.Sprint(ci), "logs")}
		check(os.MkdirAll(su.logDir, 0o755))
		if cfg.mount != nil {
			backing := filepath.Join(dir, fmt.Sprint(ci), "backing")
			check(os.MkdirAll(backing, 0o755))
			var env []string
			if *metricsDir != "" {
				su.metrics, err = benchutil.FreeAddr()
				check(err)
				env = append(env, "TIERFS_METRICS_LISTEN="+su.metrics)
			}
			stop, pid, err := benchutil.MountProc(tierfsBin, filepath.Join(dir, fmt.Sprint(ci), "tierfs.log"), env, append(append(append([]string{"--backing", backing}, cfg.mount...), strings.Fields(*mountFlags)...), su.logDir)...)
			check(err)
			u.Push(stop)
			su.mountPID = pid
		}
		if cfg.remote {
			su.store = filepath.Join(stores, "remote")
		}
		work := filepath.Join(dir, fmt.Sprint(ci), "broker")
		opts := kafka.Options{LogDir: su.logDir, MetadataDir: filepath.Join(work, "metadata"), WorkDir: work, Props: props}
		if cfg.kip405 {
			su.store = filepath.Join(stores, fmt.Sprint(ci), "remote-storage")
			check(os.MkdirAll(filepath.Dir(su.store), 0o755))
			opts.Lib, opts.Props = kafka.KIP405LibDir(), kafka.KIP405Props(props, su.store)
		}
		su.br, err = kafka.Start(opts)
		check(err)
		br := su.br
		u.Push(func() { br.Stop() })
		setups = append(setups, su)
	}
	// turn is the setup measured k-th in run r.
	turn := func(r, k int) *setup { return setups[(k+r)%len(setups)] }
	cpu := func(su *setup) (broker, mount float64) {
		broker, err := su.br.CPUSeconds()
		check(err)
		if su.mountPID != 0 {
			mount, err = procmem.CPUSeconds(su.mountPID)
			check(err)
		}
		return broker, mount
	}
	for _, su := range setups {
		su.brokerCPU, su.mountCPU = cpu(su)
	}
	for r := range *runs {
		for k := range setups {
			su := turn(r, k)
			s := kafka.Stream{Topic: fmt.Sprintf("bench-%d", r), Size: 1000}
			su.streams = append(su.streams, s)
			check(createTopic(su.br, s.Topic, su.kip405))
			c, err := newClient(su.br, kafka.ProducerOpts()...)
			check(err)
			// Each produce starts with nothing left to write back from
			// the one before, which would otherwise fall on this one.
			unix.Sync()
			var perr error
			d := benchutil.Time(func() { perr = kafka.Produce(context.Background(), c, s, 0, *records) })
			c.Close()
			check(perr)
			// Keys and values: 11 + 1000 bytes a record.
			su.produceMBs = append(su.produceMBs, float64(*records)*1011/1e6/d.Seconds())
			fmt.Fprintf(os.Stderr, "run %d, %s: produce %.1f MB/s\n", r+1, su.name, su.produceMBs[r])
		}
	}
	if *metricsDir != "" {
		check(os.MkdirAll(*metricsDir, 0o755))
		for ci, su := range setups {
			if su.metrics != "" {
				check(saveMetrics(su.metrics, filepath.Join(*metricsDir, fmt.Sprintf("%d.prom", ci))))
				fmt.Fprintf(os.Stderr, "%s: metrics in %s\n", su.name, filepath.Join(*metricsDir, fmt.Sprintf("%d.prom", ci)))
			}
		}
	}
	for _, su := range setups {
		switch {
		case su.remote:
			fmt.Fprintln(os.Stderr, "waiting for the rolled segments to be evicted")
			for _, s := range su.streams {
				check(benchutil.WaitFor(func() bool { return benchutil.AllEvicted(filepath.Join(su.logDir, s.Topic+"-0")) }, 10*time.Minute, s.Topic+" evicted"))
			}
		case su.kip405:
			fmt.Fprintln(os.Stderr, "waiting for Kafka to copy the rolled segments to its remote storage and delete them locally")
			for _, s := range su.streams {
				check(benchutil.WaitFor(func() bool { return benchutil.LocalSegments(filepath.Join(su.logDir, s.Topic+"-0")) == 1 }, 10*time.Minute, s.Topic+" deleted locally"))
			}
		}
	}
	for r := range *runs {
		for k := range setups {
			su := turn(r, k)
			s := su.streams[r]
			benchutil.DropCaches()
			c, err := newClient(su.br, kafka.ConsumerOpts(s)...)
			check(err)
			var got kafka.Consumed
			var cerr error
			d := benchutil.Time(func() {
				got, cerr = kafka.Consume(context.Background(), c, s, *records, kafka.ConsumeOptions{Unchecked: true})
			})
			c.Close()
			check(cerr)
			su.consumeMBs = append(su.consumeMBs, float64(got.Bytes)/1e6/d.Seconds())
			su.consumeRecs = append(su.consumeRecs, float64(got.Records)/d.Seconds())
			fmt.Fprintf(os.Stderr, "run %d, %s: consume %.1f MB/s\n", r+1, su.name, su.consumeMBs[r])
		}
	}
	for _, su := range setups {
		if p := su.br.Problems(); len(p) > 0 {
			check(fmt.Errorf("%s: the broker logged:\n%s", su.name, strings.Join(p, "\n")))
		}
		b, m := cpu(su)
		su.brokerCPU, su.mountCPU = b-su.brokerCPU, m-su.mountCPU
		if su.store != "" {
			su.storeBytes = dirBytes(su.store)
		}
	}
	// Brokers stop before their mounts, and both before the file system.
	u.Run()

	base := setups[0]
	flushNote := "no forced fsync (Kafka's default)"
	if *flushMs > 0 {
		flushNote = fmt.Sprintf("log.flush.interval.ms %d", *flushMs)
	}
	rep := benchutil.Report{
		Name:  "kafka",
		Title: "A real Kafka broker on tierfs",
		Notes: []string{fmt.Sprintf("Kafka %s broker (KRaft, one node), log.segment.bytes %s, %s, %d records of 1 KB per topic, medians of %d runs (ratios: median of per-run ratios to the plain directory; × mount: to tierfs without a remote or cm); the brokers run at once on %s and take turns, in an order that rotates, each produce starting with nothing dirty; consume is from offset 0 with the page cache dropped, so evicted segments come from the store; %s.",
			kafka.Version(), *segmentBytes, flushNote, *records, *runs, where, benchutil.Machine()),
			fmt.Sprintf("Kafka's own tiered storage is Kafka %s (its 4.4.0 test jar, with LocalTieredStorage, is not served) with remote.log.storage.system.enable, the LocalTieredStorage remote storage manager of the kafka-storage test jar writing to a directory %s (as tierfs's dir store), the default topic-based metadata manager, and topics with remote.storage.enable and local.retention.bytes 1: once copied, a rolled segment's local copy is deleted, and consumers from 0 read from remote storage. CPU seconds are those of the whole measurement (every produce and consume, and what the broker and the mount did in between: shipping, copying, deleting); store MB are the bytes of every file in the remote store or remote storage directory at the end (segments, indexes, manifests).", kafka.VersionIn(kafka.KIP405LibDir()), storesWhere)},
		Header:   []string{"configuration", "produce MB/s", "× plain", "× mount", "consume from 0, MB/s", "records/s", "× plain", "× KIP-405", "broker CPU s", "tierfs CPU s", "store MB"},
		Versions: map[string]string{"Kafka": kafka.Version(), "versitygw": "v1.8.0"},
	}
	var mount, kip *setup
	for _, su := range setups {
		switch {
		case su.name == "tierfs, no remote":
			mount = su
		case su.kip405:
			kip = su
		}
	}
	produce := benchutil.Chart{Title: "Kafka produce", Unit: "MB/s"}
	consume := benchutil.Chart{Title: "Kafka consume from offset 0", Unit: "MB/s"}
	for _, su := range setups {
		vsMount := "–"
		if mount != nil && su.mount != nil {
			vsMount = fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(su.produceMBs, mount.produceMBs)))
		}
		mountCPU, store, vsKIP := "–", "–", "–"
		if kip != nil && (su.remote || su.kip405) {
			vsKIP = fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(su.consumeMBs, kip.consumeMBs)))
		}
		if su.mountPID != 0 {
			mountCPU = fmt.Sprintf("%.1f", su.mountCPU)
		}
		if su.store != "" {
			store = fmt.Sprintf("%.0f", float64(su.storeBytes)/1e6)
		}
		rep.Rows = append(rep.Rows, []string{su.name,
			fmt.Sprintf("%.0f", benchutil.Median(su.produceMBs)), fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(su.produceMBs, base.produceMBs))), vsMount,
			fmt.Sprintf("%.0f", benchutil.Median(su.consumeMBs)), fmt.Sprintf("%.0f", benchutil.Median(su.consumeRecs)), fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(su.consumeMBs, base.consumeMBs))), vsKIP,
			fmt.Sprintf("%.1f", su.brokerCPU), mountCPU, store})
		produce.Bars = append(produce.Bars, benchutil.Bar{Label: su.name, Value: benchutil.Median(su.produceMBs)})
		consume.Bars = append(consume.Bars, benchutil.Bar{Label: su.name, Value: benchutil.Median(su.consumeMBs)})
	}
	rep.Charts = []benchutil.Chart{produce, consume}
	if err := rep.Emit(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-kafka:", err)
		os.Exit(1)
	}
}

// saveMetrics writes what a mount's metrics endpoint serves to path.
func saveMetrics(addr, path string) error {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func newClient(br *kafka.Broker, opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(br.Addr)}, opts...)...)
}

// dirBytes is the size of the regular files under dir (measured before
// the undo removes the work dir).
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// createTopic makes a one-partition topic that keeps its records; with
// kip405, in Kafka's own tiered storage, with its local copies deleted
// once copied.
func createTopic(br *kafka.Broker, topic string, kip405 bool) error {
	c, err := newClient(br)
	if err != nil {
		return err
	}
	defer c.Close()
	configs := map[string]*string{"retention.ms": kadm.StringPtr("-1")}
	if kip405 {
		maps.Copy(configs, kafka.KIP405TopicConfigs())
	}
	res, err := kadm.NewClient(c).CreateTopic(context.Background(), 1, 1, configs, topic)
	if err == nil {
		err = res.Err
	}
	return err
}
