package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/e2e/kafka"
	"github.com/tierfs/tierfs/idx"
)

// TestKafkaFollower (issue 8): two real brokers, a topic with
// replication factor 2, each broker's log dir on its own tierfs mount,
// both mounts sharing one S3 store. The brokers roll segments at
// different sizes. Broker 2 leads the partition and its mount ships;
// broker 1 follows and its mount frees every segment whose batches the
// store holds, reading them back from broker 2's objects (tierfs index
// verify checks every batch CRC and the broker's indexes against them).
// Then broker 2 stops: broker 1 leads, its mount becomes the leader
// (tierfs role), consumers read every record from broker 1 (its evicted
// segments come from the store), and new records ship from broker 1
// without a byte that is already in the store. Each record is stored
// once.
func TestKafkaFollower(t *testing.T) {
	requireKafka(t)
	r := remotes(t)[1] // s3
	_, bkF, mF := mountDirs(t)
	_, bkL, mL := mountDirs(t)
	common := []string{"--remote", r.url, "--ship-after", "2s", "--local-retention-bytes", "1", "--tier-interval", "500ms", "--follow-interval", "500ms"}
	follower := startMount(t, r.env, append(append([]string{"--backing", bkF, "--role", "follower"}, common...), mF)...)
	leader := startMount(t, r.env, append(append([]string{"--backing", bkL, "--role", "leader"}, common...), mL)...)
	work := t.TempDir()
	// Node 1 (the controller too) on the follower mount, node 2 on the
	// leader's; segments roll at different sizes.
	brs, err := kafka.StartCluster([]kafka.Options{
		{LogDir: mF, MetadataDir: filepath.Join(work, "m1"), WorkDir: filepath.Join(work, "w1"), Props: map[string]string{"log.segment.bytes": "1400000"}},
		{LogDir: mL, MetadataDir: filepath.Join(work, "m2"), WorkDir: filepath.Join(work, "w2"), Props: map[string]string{"log.segment.bytes": "1048576"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b1, b2 := brs[0], brs[1]
	t.Cleanup(func() {
		for _, br := range brs {
			br.Stop()
			if t.Failed() {
				log := br.Log()
				if len(log) > 10000 {
					log = log[len(log)-10000:]
				}
				t.Logf("broker log (tail):\n%s", log)
			}
		}
	})
	s := kafka.Stream{Topic: "replicated", Size: 1000}
	// Replicas [2, 1]: broker 2 is the preferred leader.
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 30000
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = s.Topic, -1, -1
	ra := kmsg.NewCreateTopicsRequestTopicReplicaAssignment()
	ra.Partition, ra.Replicas = 0, []int32{2, 1}
	rt.ReplicaAssignment = append(rt.ReplicaAssignment, ra)
	retention := "-1"
	rt.Configs = append(rt.Configs, kmsg.CreateTopicsRequestTopicConfig{Name: "retention.ms", Value: &retention})
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), client(t, b2))
	if err != nil || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic: %v %+v", err, resp)
	}
	const n = 30000
	produce(t, b2, s, 0, n)
	partF, partL := filepath.Join(mF, s.Topic+"-0"), filepath.Join(mL, s.Topic+"-0")
	waitEvicted(t, partL, 15, leader)
	waitEvicted(t, partF, 10, follower)
	all, remote := segments(t, partF, "remote")
	logicalF := logBytesIn(t, partF)
	localF := allocated(t, filepath.Join(bkF, s.Topic+"-0"))
	t.Logf("follower: %d segments, %d remote; %d bytes of .log, %d allocated locally", all, remote, logicalF, localF)
	if localF > logicalF/4 {
		t.Errorf("follower's local bytes %d of %d: not freed", localF, logicalF)
	}
	verifySegments(t, partF)
	noProblems(t, b1)
	noProblems(t, b2)

	// The leader changes.
	if err := b2.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ mnt, role string }{{mF, "leader"}, {mL, "follower"}} {
		if out, code := tierfs(t, nil, "role", c.mnt, c.role); code != 0 || strings.TrimSpace(out) != c.role {
			t.Fatalf("tierfs role %s %s: %s", c.mnt, c.role, out)
		}
	}
	got := consumeAll(t, b1, s, n)
	if got.Records != n {
		t.Errorf("consumed %d records from the new leader, want %d", got.Records, n)
	}
	before := storeLogBytesURL(t, r)
	produce(t, b1, s, n, n+15000)
	waitEvicted(t, partF, all+5, follower)
	if got := consumeAll(t, b1, s, n+15000); got.Records != n+15000 {
		t.Errorf("consumed %d records, want %d", got.Records, n+15000)
	}
	noProblems(t, b1)

	// Each record once: the live entries of the store's index are the
	// segment objects' bytes exactly, without overlap.
	st, err := store.NewS3(context.Background(), r.srv.Options("tier", "kafka/"))
	if err != nil {
		t.Fatal(err)
	}
	// The new leader may still be shipping: the index and the objects
	// are compared when neither changed between two looks.
	readIndex := func() (indexed, last int64, gaps []string) {
		data, err := store.ReadAll(st.Get(context.Background(), s.Topic+"-0/"+idx.FileName, 0, -1, store.GetOptions{}))
		if err != nil {
			t.Fatal(err)
		}
		x, _, err := idx.ParseIndex("store index", data)
		if err != nil {
			t.Fatal(err)
		}
		last = -1
		for _, e := range x.All() {
			if last >= 0 && e.FirstOffset != last+1 {
				gaps = append(gaps, fmt.Sprintf("offsets %d..%d missing", last+1, e.FirstOffset-1))
			}
			indexed += int64(e.DataLength)
			last = e.LastOffset
		}
		return indexed, last, gaps
	}
	var indexed, last, stored int64
	var gaps []string
	waitFor(t, time.Minute, "the store's index and objects at rest", func() bool {
		indexed, last, gaps = readIndex()
		stored = storeLogBytesURL(t, r)
		again, _, _ := readIndex()
		return again == indexed && stored == storeLogBytesURL(t, r)
	}, follower.Log)
	for _, g := range gaps {
		t.Errorf("the store's index has a gap: %s", g)
	}
	if indexed != stored {
		t.Errorf("the store holds %d bytes of segments, its index %d: bytes stored twice, or not indexed", stored, indexed)
	}
	if last < n {
		t.Errorf("the store's index ends at offset %d, before the new leader's records", last)
	}
	full, old := logBytesIn(t, partF), logBytesIn(t, partL)
	t.Logf("REPORT kafka: store %d bytes of segments (%d before the leader change), index to offset %d; broker 1's replica (all %d records) %d bytes (store %.2f× of it), broker 2's (the first %d) %d bytes, both %d (store %.2f× of the sum); follower's local .log bytes before the change %d of %d",
		stored, before, last, n+15000, full, float64(stored)/float64(full), n, old, full+old, float64(stored)/float64(full+old), localF, logicalF)
	// Broker 2 starts again after its clean stop, on a mount whose
	// segments are all evicted or mapped: nothing comes back.
	if err := b2.Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	noMoves(t, follower, bkF)
	noMoves(t, leader, bkL)
	noProblems(t, b2)
	for _, m := range []*mount{follower, leader} {
		if strings.Contains(m.Log(), "level=ERROR") {
			t.Errorf("errors logged:\n%s", m.Log())
		}
	}
}

func logBytesIn(t *testing.T, dir string) int64 {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var n int64
	for _, p := range logs {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

func storeLogBytesURL(t *testing.T, r remote) int64 {
	t.Helper()
	return storeLogBytes(t, r.url, r.env, fmt.Sprintf("%s-0", "replicated"))
}
