package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/e2e/kafka"
	idxkafka "github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/internal/testenv"
)

// The Kafka cases: a real broker (kafka.Start) with log.dirs on a tierfs
// mount, producing and consuming with franz-go, and with kcat as a second
// client. Records are a kafka.Stream, so every consumed record is checked
// against the one produced at its offset.

func requireKafka(t *testing.T) {
	requireRoot(t)
	if why := kafka.Available(); why != "" {
		testenv.Missing(t, "%s", why)
	}
}

func startBroker(t *testing.T, logDir string, props map[string]string) *kafka.Broker {
	t.Helper()
	return startBrokerWith(t, kafka.Options{LogDir: logDir, Props: props})
}

// startBrokerWith starts a broker with opts, its metadata and work
// directories in the test's; it stops when the test ends, and a failed
// test logs the tail of its log.
func startBrokerWith(t *testing.T, opts kafka.Options) *kafka.Broker {
	t.Helper()
	work := t.TempDir()
	opts.MetadataDir, opts.WorkDir = filepath.Join(work, "metadata"), work
	br, err := kafka.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		br.Stop()
		if t.Failed() {
			log := br.Log()
			if len(log) > 20000 {
				log = log[len(log)-20000:]
			}
			t.Logf("broker log (tail):\n%s", log)
		}
	})
	return br
}

func client(t *testing.T, br *kafka.Broker, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	c, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(br.Addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func admin(t *testing.T, br *kafka.Broker) *kadm.Client { return kadm.NewClient(client(t, br)) }

// createTopic makes a one-partition topic; its records carry 2023
// timestamps, so time retention is off unless configs say otherwise.
func createTopic(t *testing.T, br *kafka.Broker, topic string, configs map[string]string) {
	t.Helper()
	cfg := map[string]*string{"retention.ms": kadm.StringPtr("-1")}
	for k, v := range configs {
		cfg[k] = kadm.StringPtr(v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := admin(t, br).CreateTopic(ctx, 1, 1, cfg, topic)
	if err == nil {
		err = res.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

func alterTopic(t *testing.T, br *kafka.Broker, topic, name, value string) {
	t.Helper()
	ac, err := admin(t, br).AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Op: kadm.SetConfig, Name: name, Value: kadm.StringPtr(value)}}, topic)
	if err == nil {
		_, err = ac.On(topic, nil)
	}
	if err != nil {
		t.Fatalf("set %s=%s on %s: %v", name, value, topic, err)
	}
}

// produce writes records [from, to) of s and waits for them.
func produce(t *testing.T, br *kafka.Broker, s kafka.Stream, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := kafka.Produce(ctx, client(t, br, kafka.ProducerOpts()...), s, from, to); err != nil {
		t.Fatalf("produce %s [%d, %d): %v", s.Topic, from, to, err)
	}
}

// consumeAll reads s.Topic from its start with a new consumer group up to
// offset end, every record checked against s. It fails as soon as the
// broker logs a problem, rather than waiting for a fetch that will not
// come.
func consumeAll(t *testing.T, br *kafka.Broker, s kafka.Stream, end int) kafka.Consumed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	got, err := kafka.Consume(ctx, client(t, br, kafka.ConsumerOpts(s)...), s, end, kafka.ConsumeOptions{Between: func() error {
		if p := br.Problems(); len(p) > 0 {
			return fmt.Errorf("the broker logged:\n%s", strings.Join(p, "\n"))
		}
		return nil
	}})
	if err != nil {
		t.Fatalf("consume %s: %v", s.Topic, err)
	}
	return got
}

func noProblems(t *testing.T, br *kafka.Broker) {
	t.Helper()
	if p := br.Problems(); len(p) > 0 {
		t.Errorf("the broker logged:\n%s", strings.Join(p, "\n"))
	}
}

// segments counts the .log files of a partition dir, and how many are in
// the given tierfs state.
func segments(t *testing.T, dir, want string) (n, inState int) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".log") {
			n++
			if state(filepath.Join(dir, e.Name())) == want {
				inState++
			}
		}
	}
	return n, inState
}

// waitFor polls cond every 250 ms until it holds or the time is up; what
// is the condition's description, for the failure.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool, logs ...func() string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, l := range logs {
				b.WriteString(l())
			}
			t.Fatalf("not after %v: %s\n%s", limit, what, b.String())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitEvicted waits until a partition has more than min segments and all
// but the newest three are evicted (the active one, and the newest rolled
// ones, which wait for the broker's recovery point).
func waitEvicted(t *testing.T, part string, min int, m *mount) {
	t.Helper()
	waitFor(t, 3*time.Minute, fmt.Sprintf("more than %d segments, all but 3 evicted", min), func() bool {
		all, remote := segments(t, part, "remote")
		return all > min && remote >= all-3
	}, m.Log)
}

// logObjects counts the .log versions of a partition in the store at
// url: its .log objects, and the manifests of empty ones (an empty file
// is its manifest alone, as a compacted segment the cleaner emptied).
func logObjects(t *testing.T, url string, env []string, partition string) int {
	t.Helper()
	out, code := tierfs(t, append([]string{"TIERFS_STORE=" + url}, env...), "store", "ls", partition+"/")
	if code != 0 {
		t.Fatalf("store ls: %s", out)
	}
	logs := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		k := f[len(f)-1]
		if strings.HasSuffix(k, ".log") {
			logs[k] = true
		} else if o, ok := chunkxfer.ManifestOf(k); ok && strings.HasSuffix(o, ".log") {
			logs[o] = true
		}
	}
	return len(logs)
}

// verifySegments runs tierfs index verify on every .log of a partition
// dir (through the mount): batch CRCs, offset order, and the segment's
// .index and .timeindex against it.
func verifySegments(t *testing.T, dir string) int {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) == 0 {
		t.Fatalf("no segments in %s", dir)
	}
	for _, l := range logs {
		if out, code := tierfs(t, nil, "index", "verify", l); code != 0 {
			t.Errorf("index verify %s: %s", l, out)
		}
	}
	return len(logs)
}

// TestKafkaPlainMount (case 1): a broker on a tierfs mount without a
// remote does what it does on a plain directory: two topics, 200 MB of
// records with keys and headers, all consumed byte-exact, again after a
// broker restart, with the same records and offsets as the same run on a
// plain directory, and segments that tierfs's own verifier accepts.
func TestKafkaPlainMount(t *testing.T) {
	requireKafka(t)
	const n, size = 100_000, 1000
	streams := []kafka.Stream{{Topic: "orders", Size: size}, {Topic: "payments", Size: size}}
	run := func(t *testing.T, logDir string) []string {
		br := startBroker(t, logDir, nil)
		for _, s := range streams {
			createTopic(t, br, s.Topic, nil)
		}
		for _, s := range streams {
			produce(t, br, s, 0, n)
		}
		var digests []string
		for _, s := range streams {
			digests = append(digests, consumeAll(t, br, s, n).Digest)
		}
		if err := br.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := br.Restart(); err != nil {
			t.Fatal(err)
		}
		for i, s := range streams {
			if d := consumeAll(t, br, s, n).Digest; d != digests[i] {
				t.Errorf("%s reads differently after the restart", s.Topic)
			}
		}
		noProblems(t, br)
		return digests
	}
	var plain, mounted []string
	t.Run("plain", func(t *testing.T) { plain = run(t, t.TempDir()) })
	t.Run("mount", func(t *testing.T) {
		_, backing, mnt := mountDirs(t)
		startMount(t, nil, "--backing", backing, mnt)
		mounted = run(t, mnt)
		segs := 0
		for _, s := range streams {
			segs += verifySegments(t, filepath.Join(mnt, s.Topic+"-0"))
		}
		t.Logf("%d segments verified", segs)
	})
	if fmt.Sprint(plain) != fmt.Sprint(mounted) {
		t.Errorf("the mount's records differ from the plain directory's: %v vs %v", mounted, plain)
	}
}

// kcatOffsets reads topic from the beginning with kcat (librdkafka, an
// independent client) and returns each record's offset and key.
func kcatOffsets(t *testing.T, br *kafka.Broker, topic string) []string {
	t.Helper()
	if _, err := exec.LookPath("kcat"); err != nil {
		if testenv.InCI() {
			t.Fatal("CI=true, and there is no kcat on PATH (scripts/install-deps installs it)")
		}
		t.Log("no kcat: the second client is skipped")
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "kcat", "-C", "-b", br.Addr, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%o %k\n").Output()
	if err != nil {
		t.Fatalf("kcat: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestKafkaTiering (cases 2 and 4): with a dir store and with versitygw,
// segments roll, ship and are evicted until the local disk holds a
// fraction of the data; a new consumer group (and kcat) reads everything
// from offset 0 byte-exact; ListOffsets by time finds records in evicted
// segments. Then the broker's retention deletes old segments and their
// objects leave the store. The broker logs no problem.
func TestKafkaTiering(t *testing.T) {
	requireKafka(t)
	for _, r := range remotes(t) {
		t.Run(r.name, func(t *testing.T) {
			_, backing, mnt := mountDirs(t)
			m := startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "2s",
				"--local-retention-bytes", "1", "--tier-interval", "500ms", mnt)
			br := startBroker(t, mnt, nil)
			const n = 40000
			s := kafka.Stream{Topic: "events", Size: 1000}
			createTopic(t, br, s.Topic, nil)
			produce(t, br, s, 0, n)
			part := filepath.Join(mnt, s.Topic+"-0")
			waitEvicted(t, part, 20, m)
			all, _ := segments(t, part, "remote")
			logical := int64(0)
			logs, _ := filepath.Glob(filepath.Join(part, "*.log"))
			for _, l := range logs {
				fi, _ := os.Stat(l)
				logical += fi.Size()
			}
			local := allocated(t, filepath.Join(backing, s.Topic+"-0"))
			t.Logf("%d segments, %d bytes of .log, %d bytes allocated locally in the partition dir", all, logical, local)
			if local > logical/5 {
				t.Errorf("local bytes %d of %d: not freed", local, logical)
			}
			got := consumeAll(t, br, s, n)
			if got.Records != n {
				t.Errorf("consumed %d records, want %d", got.Records, n)
			}
			if lines := kcatOffsets(t, br, s.Topic); lines != nil {
				if len(lines) != n || lines[0] != "0 key-0000000" || lines[n-1] != fmt.Sprintf("%d key-%07d", n-1, n-1) {
					t.Errorf("kcat read %d records (first %q)", len(lines), lines[0])
				}
			}

			// ListOffsets by time lands on the right record in evicted segments.
			adm := admin(t, br)
			for _, i := range []int{0, 1234, 20000, n - 10} {
				lo, err := adm.ListOffsetsAfterMilli(context.Background(), kafka.TSBase+int64(i), s.Topic)
				if err != nil {
					t.Fatal(err)
				}
				o, ok := lo.Lookup(s.Topic, 0)
				if !ok || o.Err != nil || o.Offset != int64(i) {
					t.Errorf("offset for the time of record %d: %+v", i, o)
				}
			}

			// Retention: the broker deletes all but the newest segments
			// (rename to .deleted, unlink a second later); their objects go.
			countObjects := func() int { return logObjects(t, r.url, r.env, s.Topic+"-0") }
			before := countObjects()
			if before < all-4 {
				t.Fatalf("%d .log objects in the store for %d segments", before, all)
			}
			alterTopic(t, br, s.Topic, "retention.bytes", "3000000")
			var left, objs int
			waitFor(t, 2*time.Minute, "old segments and their objects deleted", func() bool {
				left, _ = segments(t, part, "")
				objs = countObjects()
				return left <= 5 && objs <= left
			}, m.Log)
			t.Logf("retention: %d segments left, %d .log objects in the store (from %d)", left, objs, before)
			noProblems(t, br)
			// Reads and retention's deletions brought nothing back.
			noMoves(t, m, backing)
		})
	}
}

// killMount kills the tierfs process (kill -9) and detaches its dead
// mount, as an operator would before starting it again.
func killMount(t *testing.T, m *mount) {
	t.Helper()
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.done
	if out, err := exec.Command("umount", "-l", m.mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount -l %s: %v %s", m.mnt, err, out)
	}
}

// TestKafkaRestarts (case 3): kill -9 the broker, then tierfs under the
// running broker, each while segments are shipping; start them again
// and go on producing. Everything reads from offset 0 byte-exact, and the
// broker, once restarted on the restarted mount, logs no problem with
// its segments or indexes.
func TestKafkaRestarts(t *testing.T) {
	requireKafka(t)
	dir, backing, mnt := mountDirs(t)
	// Shipping is slowed down so that the kills land in the middle of it.
	args := []string{"--backing", backing, "--remote", "file://" + filepath.Join(dir, "remote"), "--ship-after", "1s",
		"--ship-rate", "1MiB", "--local-retention-bytes", "1", "--tier-interval", "200ms", mnt}
	m := startMount(t, nil, args...)
	br := startBroker(t, mnt, nil)
	s := kafka.Stream{Topic: "events", Size: 1000}
	createTopic(t, br, s.Topic, nil)
	part := filepath.Join(mnt, s.Topic+"-0")

	// An upload is under way while its journal exists, or its shipment
	// is still shipping.
	uploading := func() bool { return shipping(backing) }

	produce(t, br, s, 0, 20000)
	waitFor(t, time.Minute, "an upload under way", uploading, m.Log)
	if err := br.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := br.Restart(); err != nil {
		t.Fatal(err)
	}
	produce(t, br, s, 20000, 30000)
	waitFor(t, time.Minute, "an upload under way", uploading, m.Log)

	// tierfs dies under the running broker: its log dir fails, and the
	// broker (a single log dir) stops. Both start again.
	killMount(t, m)
	first := m
	if br.Running() {
		// It may hang on the dead mount rather than exit.
		waitForExit := time.Now().Add(30 * time.Second)
		for br.Running() && time.Now().Before(waitForExit) {
			time.Sleep(250 * time.Millisecond)
		}
		br.Kill()
	}
	// (Logged, not asserted: the upload may end between the wait and
	// the kill. TestKillDuringTiering checks resumes.)
	t.Logf("tierfs killed with an upload to resume: %v", uploading())
	m = startMount(t, nil, args...)
	if err := br.Restart(); err != nil {
		t.Fatal(err)
	}
	produce(t, br, s, 30000, 40000)
	waitEvicted(t, part, 20, m)
	got := consumeAll(t, br, s, 40000)
	if got.Records != 40000 {
		t.Errorf("consumed %d records, want 40000", got.Records)
	}
	t.Logf("%d segments verified", verifySegments(t, part))
	noProblems(t, br)
	// The broker's restarts (it opens every segment read-write, and
	// recovers after kill -9) brought no evicted segment back.
	noMoves(t, first, backing)
	noMoves(t, m, backing)
}

// TestKafkaCompaction (case 5): a topic tiered while its policy is
// delete becomes compacted: the cleaner reads the evicted segments
// through the mount, writes .cleaned files, renames them to .swap and
// over the old segments, whose objects then leave the store. The result
// reads correctly: every record is the one produced at its offset, the
// latest record of every key is there, and older ones were removed.
func TestKafkaCompaction(t *testing.T) {
	requireKafka(t)
	dir, backing, mnt := mountDirs(t)
	remote := "file://" + filepath.Join(dir, "remote")
	m := startMount(t, nil, "--backing", backing, "--remote", remote, "--ship-after", "1s",
		"--local-retention-bytes", "1", "--tier-interval", "200ms", mnt)
	br := startBroker(t, mnt, nil)
	const n, keys = 30000, 500
	s := kafka.Stream{Topic: "accounts", Size: 1000, Keys: keys}
	createTopic(t, br, s.Topic, map[string]string{"min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"})
	produce(t, br, s, 0, n)
	part := filepath.Join(mnt, s.Topic+"-0")
	waitEvicted(t, part, 15, m)
	all, evicted := segments(t, part, "remote")
	t.Logf("%d segments, %d evicted before compaction", all, evicted)

	alterTopic(t, br, s.Topic, "cleanup.policy", "compact")
	cleaned := func() int64 {
		b, err := os.ReadFile(filepath.Join(backing, "cleaner-offset-checkpoint"))
		if err != nil {
			return 0
		}
		cp, err := idxkafka.ParseOffsetCheckpoint("cleaner-offset-checkpoint", b)
		if err != nil {
			t.Fatal(err)
		}
		return cp[idxkafka.TopicPartition{Topic: s.Topic, Partition: 0}]
	}
	objects := func() int { return logObjects(t, remote, nil, s.Topic+"-0") }
	// The cleaner went through the evicted segments, the old versions were
	// deleted, and only objects of segments still shipped are left.
	waitFor(t, 3*time.Minute, "compacted, old versions and their objects gone", func() bool {
		if cleaned() < int64(n/2) {
			return false
		}
		_, shipped := segments(t, part, "shipped")
		_, remote := segments(t, part, "remote")
		return objects() == shipped+remote
	}, func() string {
		n, shipped := segments(t, part, "shipped")
		_, remote := segments(t, part, "remote")
		return fmt.Sprintf("cleaned to %d; %d segments, %d shipped, %d remote; %d .log objects in the store\n", cleaned(), n, shipped, remote, objects())
	}, m.Log)
	segs, _ := segments(t, part, "")
	t.Logf("cleaned up to offset %d; %d segments now, %d .log objects in the store", cleaned(), segs, objects())

	got := consumeAll(t, br, s, n)
	if got.Records >= n/2 {
		t.Errorf("%d of %d records left: not compacted", got.Records, n)
	}
	present := map[int]bool{}
	for _, o := range got.Offsets {
		present[o] = true
	}
	for k := 0; k < keys; k++ {
		if last := n - keys + k; !present[last] {
			t.Errorf("the latest record of key %d (offset %d) is gone", k, last)
			break
		}
	}
	t.Logf("%d records after compaction; %d segments verified", got.Records, verifySegments(t, part))
	noProblems(t, br)
	// The cleaner read the evicted segments and replaced them by
	// renames: none was changed in place, so none came back.
	noMoves(t, m, backing)
}
