// Command kafka measures a real Kafka broker on tierfs (make bench-kafka):
// produce throughput on a plain directory, on a mount without a remote and
// on a mount that tiers to a dir store while it takes the writes; and
// consumer throughput from offset 0 with every segment local (plain
// directory, mount) and with every rolled segment evicted (mount with a
// remote). The three brokers run at once; each run produces a topic of
// its own on each in turn, then consumes them in turn, with the page
// cache dropped before each consumer starts. Medians of -runs, with
// ratios to the plain directory of the same run. Not a test.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"github.com/tierfs/tierfs/e2e/kafka"
)

func main() {
	bin := flag.String("tierfs", "bin/tierfs", "tierfs binary")
	records := flag.Int("records", 100_000, "records per topic (1 KB values)")
	runs := flag.Int("runs", 3, "runs (topics) per configuration")
	segmentBytes := flag.String("segment-bytes", "16MiB", "log.segment.bytes (the e2e tests use 1MiB; Kafka's default is 1GiB)")
	flushMs := flag.Int64("flush-ms", 0, "log.flush.interval.ms, a forced fsync this often (0: Kafka's default, none; the e2e tests use 1000)")
	only := flag.String("only", "", "run only the configurations whose name matches this regexp (the plain directory always runs)")
	flag.Parse()
	segBytes, err := benchutil.ParseSize(*segmentBytes)
	check(err)
	props := map[string]string{"log.segment.bytes": fmt.Sprint(segBytes), "log.flush.interval.ms": "9223372036854775807"}
	if *flushMs > 0 {
		props["log.flush.interval.ms"] = fmt.Sprint(*flushMs)
	}
	if why := kafka.Available(); why != "" {
		check(fmt.Errorf("%s", why))
	}
	tierfsBin, err := filepath.Abs(*bin)
	check(err)
	dir, err := os.MkdirTemp("", "bench-kafka-")
	check(err)
	defer os.RemoveAll(dir)

	type config struct {
		name   string
		remote bool // tiers to a dir store; consumers read evicted segments
		mount  []string
	}
	configs := []config{
		{name: "plain directory"},
		{name: "tierfs, no remote", mount: []string{}},
		// Change management retains every checkpoint replaced, index
		// trimmed and segment deleted, and logs every create and write.
		{name: "tierfs --cm, no remote", mount: []string{"--cm"}},
		{name: "tierfs --remote (dir store), evicted", remote: true, mount: []string{
			"--remote", "file://" + filepath.Join(dir, "remote"), "--ship-after", "1s",
			"--local-retention-bytes", "1", "--tier-interval", "500ms"}},
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
		br                                  *kafka.Broker
		stop                                func()
		streams                             []kafka.Stream
		produceMBs, consumeMBs, consumeRecs []float64
	}
	var setups []*setup
	// All brokers run at once and every run measures them in turn, so
	// the ratios compare measurements taken moments apart.
	for ci, cfg := range configs {
		su := &setup{config: cfg, logDir: filepath.Join(dir, fmt.Sprint(ci), "logs"), stop: func() {}}
		check(os.MkdirAll(su.logDir, 0o755))
		if cfg.mount != nil {
			backing := filepath.Join(dir, fmt.Sprint(ci), "backing")
			check(os.MkdirAll(backing, 0o755))
			su.stop, err = benchutil.Mount(tierfsBin, filepath.Join(dir, fmt.Sprint(ci), "tierfs.log"), nil, append(append([]string{"--backing", backing}, cfg.mount...), su.logDir)...)
			check(err)
		}
		work := filepath.Join(dir, fmt.Sprint(ci), "broker")
		su.br, err = kafka.Start(kafka.Options{LogDir: su.logDir, MetadataDir: filepath.Join(work, "metadata"), WorkDir: work, Props: props})
		check(err)
		setups = append(setups, su)
	}
	for r := range *runs {
		for _, su := range setups {
			s := kafka.Stream{Topic: fmt.Sprintf("bench-%d", r), Size: 1000}
			su.streams = append(su.streams, s)
			createTopic(su.br, s.Topic)
			c := newClient(su.br, kafka.ProducerOpts()...)
			var perr error
			d := benchutil.Time(func() { perr = kafka.Produce(context.Background(), c, s, 0, *records) })
			c.Close()
			check(perr)
			// Keys and values: 11 + 1000 bytes a record.
			su.produceMBs = append(su.produceMBs, float64(*records)*1011/1e6/d.Seconds())
			fmt.Fprintf(os.Stderr, "run %d, %s: produce %.1f MB/s\n", r+1, su.name, su.produceMBs[r])
		}
	}
	for _, su := range setups {
		if su.remote {
			fmt.Fprintln(os.Stderr, "waiting for the rolled segments to be evicted")
			for _, s := range su.streams {
				check(benchutil.WaitFor(func() bool { return allEvicted(filepath.Join(su.logDir, s.Topic+"-0")) }, 10*time.Minute, s.Topic+" evicted"))
			}
		}
	}
	for r := range *runs {
		for _, su := range setups {
			s := su.streams[r]
			benchutil.DropCaches()
			c := newClient(su.br, kafka.ConsumerOpts(s)...)
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
		check(su.br.Stop())
		su.stop()
	}

	base := setups[0]
	flushNote := "no forced fsync (Kafka's default)"
	if *flushMs > 0 {
		flushNote = fmt.Sprintf("log.flush.interval.ms %d", *flushMs)
	}
	rep := benchutil.Report{
		Name:  "kafka",
		Title: "A real Kafka broker on tierfs",
		Notes: []string{fmt.Sprintf("Kafka %s broker (KRaft, one node), log.segment.bytes %s, %s, %d records of 1 KB per topic, medians of %d runs (ratios: median of per-run ratios to the plain directory); consume is from offset 0 with the page cache dropped, so evicted segments come from the store; %s.",
			kafkaVersion(), *segmentBytes, flushNote, *records, *runs, benchutil.Machine())},
		Header:   []string{"configuration", "produce MB/s", "× plain", "consume from 0, MB/s", "records/s", "× plain"},
		Versions: map[string]string{"Kafka": kafkaVersion(), "versitygw": "v1.8.0"},
	}
	produce := benchutil.Chart{Title: "Kafka produce", Unit: "MB/s"}
	consume := benchutil.Chart{Title: "Kafka consume from offset 0", Unit: "MB/s"}
	for _, su := range setups {
		rep.Rows = append(rep.Rows, []string{su.name,
			fmt.Sprintf("%.0f", benchutil.Median(su.produceMBs)), fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(su.produceMBs, base.produceMBs))),
			fmt.Sprintf("%.0f", benchutil.Median(su.consumeMBs)), fmt.Sprintf("%.0f", benchutil.Median(su.consumeRecs)), fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(su.consumeMBs, base.consumeMBs)))})
		produce.Bars = append(produce.Bars, benchutil.Bar{Label: su.name, Value: benchutil.Median(su.produceMBs)})
		consume.Bars = append(consume.Bars, benchutil.Bar{Label: su.name, Value: benchutil.Median(su.consumeMBs)})
	}
	rep.Charts = []benchutil.Chart{produce, consume}
	check(rep.Emit())
}

// allEvicted says whether every segment of a partition dir but the last
// two (the active one, and the newest rolled one that may not be flushed
// yet) is remote.
func allEvicted(dir string) bool {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) < 3 {
		return false
	}
	for _, l := range logs[:len(logs)-2] {
		if benchutil.Xattr(l, "user.tierfs.state") != "remote" {
			return false
		}
	}
	return true
}

func kafkaVersion() string {
	m, _ := filepath.Glob(filepath.Join(kafka.LibDir(), "kafka_2.13-*.jar"))
	if len(m) == 0 {
		return "?"
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m[0]), "kafka_2.13-"), ".jar")
}

func newClient(br *kafka.Broker, opts ...kgo.Opt) *kgo.Client {
	c, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(br.Addr)}, opts...)...)
	check(err)
	return c
}

func createTopic(br *kafka.Broker, topic string) {
	c := newClient(br)
	defer c.Close()
	res, err := kadm.NewClient(c).CreateTopic(context.Background(), 1, 1, map[string]*string{"retention.ms": kadm.StringPtr("-1")}, topic)
	if err == nil {
		err = res.Err
	}
	check(err)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-kafka:", err)
		os.Exit(1)
	}
}
