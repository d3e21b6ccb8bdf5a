// Command kafka measures a real Kafka broker on tierfs (make bench-kafka):
// produce throughput on a plain directory, on a mount without a remote and
// on a mount that tiers to a dir store while it takes the writes; and
// consumer throughput from offset 0 with every segment local (plain
// directory, mount) and with every rolled segment evicted (mount with a
// remote). Each run produces and consumes a topic of its own; the page
// cache is dropped before each consumer starts. Medians of -runs, with
// ratios to the plain directory of the same run. Not a test.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	records := flag.Int("records", 100_000, "records per topic (1 KB values)")
	runs := flag.Int("runs", 3, "runs (topics) per configuration")
	flag.Parse()
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
		{name: "tierfs --remote (dir store), evicted", remote: true, mount: []string{
			"--remote", "file://" + filepath.Join(dir, "remote"), "--ship-after", "1s",
			"--local-retention-bytes", "1", "--tier-interval", "500ms"}},
	}
	type result struct{ produceMBs, consumeMBs, consumeRecs []float64 }
	results := map[string]*result{}
	for ci, cfg := range configs {
		fmt.Fprintf(os.Stderr, "%s\n", cfg.name)
		logDir := filepath.Join(dir, fmt.Sprint(ci), "logs")
		check(os.MkdirAll(logDir, 0o755))
		stop := func() {}
		if cfg.mount != nil {
			backing := filepath.Join(dir, fmt.Sprint(ci), "backing")
			check(os.MkdirAll(backing, 0o755))
			stop = mount(tierfsBin, filepath.Join(dir, fmt.Sprint(ci), "tierfs.log"), append(append([]string{"--backing", backing}, cfg.mount...), logDir))
		}
		work := filepath.Join(dir, fmt.Sprint(ci), "broker")
		br, err := kafka.Start(kafka.Options{LogDir: logDir, MetadataDir: filepath.Join(work, "metadata"), WorkDir: work})
		check(err)
		res := &result{}
		results[cfg.name] = res
		var streams []kafka.Stream
		for r := range *runs {
			s := kafka.Stream{Topic: fmt.Sprintf("bench-%d", r), Size: 1000}
			streams = append(streams, s)
			createTopic(br, s.Topic)
			c := newClient(br, kafka.ProducerOpts()...)
			var perr error
			d := benchutil.Time(func() { perr = kafka.Produce(context.Background(), c, s, 0, *records) })
			c.Close()
			check(perr)
			res.produceMBs = append(res.produceMBs, float64(*records)*float64(1000+11)/1e6/d.Seconds())
		}
		if cfg.remote {
			fmt.Fprintln(os.Stderr, "  waiting for the rolled segments to be evicted")
			for _, s := range streams {
				check(benchutil.WaitFor(func() bool { return allEvicted(filepath.Join(logDir, s.Topic+"-0")) }, 10*time.Minute, s.Topic+" evicted"))
			}
		}
		for _, s := range streams {
			benchutil.DropCaches()
			c := newClient(br, kafka.ConsumerOpts(s)...)
			var got kafka.Consumed
			var cerr error
			d := benchutil.Time(func() {
				got, cerr = kafka.Consume(context.Background(), c, s, *records, kafka.ConsumeOptions{Unchecked: true})
			})
			c.Close()
			check(cerr)
			res.consumeMBs = append(res.consumeMBs, float64(got.Bytes)/1e6/d.Seconds())
			res.consumeRecs = append(res.consumeRecs, float64(got.Records)/d.Seconds())
		}
		if p := br.Problems(); len(p) > 0 {
			check(fmt.Errorf("the broker logged:\n%s", strings.Join(p, "\n")))
		}
		check(br.Stop())
		stop()
	}

	base := results[configs[0].name]
	fmt.Printf("Kafka %s broker, %d records of 1 KB per topic, medians of %d runs (ratios: median of per-run ratios to the plain directory)\n\n", kafkaVersion(), *records, *runs)
	fmt.Println("| configuration | produce MB/s | × plain | consume from 0, MB/s | records/s | × plain |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, cfg := range configs {
		r := results[cfg.name]
		fmt.Printf("| %s | %.0f | %.2f | %.0f | %.0f | %.2f |\n", cfg.name,
			benchutil.Median(r.produceMBs), benchutil.Median(ratios(r.produceMBs, base.produceMBs)),
			benchutil.Median(r.consumeMBs), benchutil.Median(r.consumeRecs), benchutil.Median(ratios(r.consumeMBs, base.consumeMBs)))
	}
}

func ratios(a, b []float64) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]/b[i])
	}
	return out
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

// mount runs tierfs mount with args until the returned func stops it.
func mount(bin, logPath string, args []string) func() {
	mnt := args[len(args)-1]
	cmd := exec.Command(bin, append([]string{"mount"}, args...)...)
	logf, err := os.Create(logPath)
	check(err)
	cmd.Stdout, cmd.Stderr = logf, logf
	check(cmd.Start())
	check(benchutil.WaitFor(func() bool { return benchutil.IsMount(mnt) }, 20*time.Second, "tierfs mount"))
	return func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		logf.Close()
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-kafka:", err)
		os.Exit(1)
	}
}
