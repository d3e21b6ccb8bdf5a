package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierfs/tierfs/e2e/kafka"
)

// scrape sums the values of every sample of the metric name (all its
// label sets) on the mount's metrics page.
func scrape(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+" ") && !strings.HasPrefix(l, name+"{") {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		sum += v
	}
	io.Copy(io.Discard, resp.Body)
	return sum
}

// noMoves fails the test if the mount brought an evicted segment back
// because it was changed: a move logged, or a catch-up log left.
func noMoves(t *testing.T, m *mount, backing string) {
	t.Helper()
	if log := m.Log(); strings.Contains(log, "an evicted file is changed") {
		var lines []string
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "an evicted file is changed") {
				lines = append(lines, l)
			}
		}
		t.Errorf("%d evicted segments were moved back:\n%s", len(lines), strings.Join(lines[:min(len(lines), 5)], "\n"))
	}
	if logs, _ := filepath.Glob(filepath.Join(backing, ".tierfs", "catchup", "*.log")); len(logs) > 0 {
		t.Errorf("catch-up logs: %v", logs)
	}
}

// restartCost is what a broker restart cost the mount: store reads,
// moves, hydrated bytes and local .log bytes, before and after.
type restartCost struct {
	fetched, moves, hydrated float64
	local                    int64
}

func costNow(t *testing.T, addr, backingPart string) restartCost {
	return restartCost{
		fetched:  scrape(t, addr, "tierfs_remote_fetch_bytes_total"),
		moves:    scrape(t, addr, "tierfs_moves_total"),
		hydrated: scrape(t, addr, "tierfs_hydrated_bytes_total"),
		local:    allocated(t, backingPart),
	}
}

// TestKafkaRestartCostsNothing (issue 20): a real broker whose old
// segments are evicted is stopped cleanly (SIGTERM: every segment is
// flushed and closed) and started (every segment opened read-write),
// then killed (kill -9) and started again (the log loader recovers what
// follows the recovery point). Neither restart moves a segment back,
// reads a byte from the store, or grows the local disk; then every
// record reads back byte-exact from offset 0, and only that reading
// fetches from the store.
func TestKafkaRestartCostsNothing(t *testing.T) {
	requireKafka(t)
	dir, backing, mnt := mountDirs(t)
	addr := freeAddr(t)
	m := startMount(t, nil, "--backing", backing, "--remote", "file://"+filepath.Join(dir, "remote"), "--ship-after", "1s",
		"--local-retention-bytes", "1", "--tier-interval", "200ms", "--metrics-listen", addr, mnt)
	br := startBroker(t, mnt, nil)
	const n = 20000
	s := kafka.Stream{Topic: "events", Size: 1000}
	createTopic(t, br, s.Topic, nil)
	produce(t, br, s, 0, n)
	part := filepath.Join(mnt, s.Topic+"-0")
	waitEvicted(t, part, 15, m)
	all, evicted := segments(t, part, "remote")
	backingPart := filepath.Join(backing, s.Topic+"-0")

	check := func(what string, before restartCost) {
		t.Helper()
		// What a restart might start (a move, a read) starts while the
		// broker loads its log; give the tierer a few passes besides.
		time.Sleep(2 * time.Second)
		after := costNow(t, addr, backingPart)
		t.Logf("%s: fetched %.0f bytes, %.0f moves, %.0f bytes hydrated; local .log bytes %d → %d",
			what, after.fetched-before.fetched, after.moves-before.moves, after.hydrated-before.hydrated, before.local, after.local)
		if after.fetched != before.fetched || after.moves != before.moves || after.hydrated != before.hydrated {
			t.Errorf("%s cost %.0f bytes read from the store, %.0f moves, %.0f bytes hydrated; want none",
				what, after.fetched-before.fetched, after.moves-before.moves, after.hydrated-before.hydrated)
		}
		if after.local > before.local {
			t.Errorf("%s grew the local .log bytes from %d to %d", what, before.local, after.local)
		}
		if _, remote := segments(t, part, "remote"); remote < evicted {
			t.Errorf("after %s %d segments are evicted, before %d", what, remote, evicted)
		}
		noMoves(t, m, backing)
	}

	before := costNow(t, addr, backingPart)
	t0 := time.Now()
	if err := br.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := br.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d segments, %d evicted; clean stop and start took %v", all, evicted, time.Since(t0).Round(time.Millisecond))
	check("a clean stop and start", before)

	before = costNow(t, addr, backingPart)
	t0 = time.Now()
	if err := br.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := br.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("kill -9 and start took %v", time.Since(t0).Round(time.Millisecond))
	check("a kill -9 and start", before)

	if out, code := tierfs(t, nil, "status", mnt); code != 0 || !strings.Contains(out, "brought back to local disk since the mount started: none") {
		t.Errorf("tierfs status (exit %d) does not say that nothing came back:\n%s", code, out)
	}

	before = costNow(t, addr, backingPart)
	got := consumeAll(t, br, s, n)
	if got.Records != n {
		t.Errorf("consumed %d records, want %d", got.Records, n)
	}
	after := costNow(t, addr, backingPart)
	if after.fetched == before.fetched {
		t.Error("reading the evicted segments fetched nothing from the store")
	}
	if after.moves != before.moves || after.hydrated != before.hydrated {
		t.Errorf("reading moved %.0f segments back (%.0f bytes)", after.moves-before.moves, after.hydrated-before.hydrated)
	}
	noMoves(t, m, backing)
	noProblems(t, br)
}

// TestKafkaOpensEverySegmentWithinItsFileLimit (issue 20): a broker and
// its mount each have an open-file limit of 2,048, as a systemd unit
// would give them, and the log dir has 1,500 segments (30 partitions of
// 50). At start-up the broker opens every segment, and the mount holds
// one descriptor for each; the descriptors the mount keeps for the
// inodes the broker looked up (three files a segment) give way, so the
// broker starts and works as it does on a plain directory with the same
// limit. Before, they took half of the mount's limit and the broker got
// "Too many open files".
func TestKafkaOpensEverySegmentWithinItsFileLimit(t *testing.T) {
	requireKafka(t)
	const limit, partitions, perPartition = 2048, 30, 50
	_, backing, mnt := mountDirs(t)
	m := launchMount(t, limit, nil, "--backing", backing, mnt)
	br := startBrokerWith(t, kafka.Options{LogDir: mnt, FileLimit: limit})
	// A broker short of descriptors takes its log dir offline, and its
	// producers wait: give up in time, with its log.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := admin(t, br).CreateTopic(ctx, partitions, 1, map[string]*string{
		"retention.ms": kadm.StringPtr("-1"), "segment.ms": kadm.StringPtr("9"), "segment.bytes": kadm.StringPtr("1073741824")}, "history")
	if err == nil {
		err = res.Err
	}
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, br, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err := kafka.ProduceRounds(ctx, c, "history", partitions, perPartition*10, 100); err != nil {
		t.Fatal(err)
	}
	segs := 0
	for p := range partitions {
		n, _ := segments(t, filepath.Join(mnt, fmt.Sprintf("history-%d", p)), "")
		segs += n
	}
	if segs < partitions*perPartition {
		t.Fatalf("%d segments, want at least %d", segs, partitions*perPartition)
	}
	// A clean stop and a start: the broker opens every segment.
	if err := br.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := br.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := kafka.ProduceRounds(ctx, c, "history", partitions, 10, 100); err != nil {
		t.Fatalf("produce after the restart: %v", err)
	}
	noProblems(t, br)
	if log := m.Log(); strings.Contains(log, "too many open files") {
		t.Errorf("the mount ran out of descriptors:\n%s", log[max(0, len(log)-5000):])
	}
	t.Logf("%d segments open through a mount with an open-file limit of %d", segs, limit)
}
