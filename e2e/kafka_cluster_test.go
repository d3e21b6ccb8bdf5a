package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/e2e/kafka"
	"github.com/tierfs/tierfs/idx"
)

// clusterNode is one broker of the cluster test with its tierfs mount.
type clusterNode struct {
	id      int32
	br      *kafka.Broker
	m       *mount
	mnt     string
	metrics string
}

// statusPartition is the part of tierfs status --json the test reads.
type statusPartition struct {
	Name      string `json:"partition"`
	LastError *struct {
		Err string `json:"error"`
	} `json:"last_error"`
	Role struct {
		Role string `json:"role"`
		Why  string `json:"why"`
		Lead *struct {
			Leader int32 `json:"leader"`
			Epoch  int32 `json:"leader_epoch"`
			Self   bool  `json:"self"`
		} `json:"lead"`
	} `json:"role"`
	Uploaded int `json:"uploaded_segments"`
	Mapped   int `json:"mapped_segments"`
	Origins  []struct {
		Base     int64    `json:"base"`
		Uploaded bool     `json:"uploaded"`
		By       []string `json:"shipped_by"`
	} `json:"origins"`
}

func (n *clusterNode) status(t *testing.T) map[string]statusPartition {
	t.Helper()
	return statusOf(t, n.mnt)
}

// statusOf is tierfs status --json --segments of a mount, by partition.
func statusOf(t *testing.T, mnt string) map[string]statusPartition {
	t.Helper()
	out, code := tierfs(t, nil, "status", "--json", "--segments", mnt)
	if code != 0 {
		t.Fatalf("status of %s: %s", mnt, out)
	}
	var ps []statusPartition
	if err := json.Unmarshal([]byte(out), &ps); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	m := map[string]statusPartition{}
	for _, p := range ps {
		m[p.Name] = p
	}
	return m
}

// TestKafkaClusterLeadership (issue 26): three real brokers, each a
// broker and a KRaft voter, each on its own tierfs mount with
// --kafka-bootstrap of its own broker and no role set, all sharing one
// S3 bucket and prefix. A topic of 6 partitions with replication factor
// 3 has its leaders spread 2/2/2. Each mount ships the partitions its
// broker leads and maps the others onto those uploads; after kill -9 of
// a leader, the new leaders continue shipping; after its restart and a
// preferred-leader election, it ships again. The store holds every batch
// once with no gap, no race is lost, no upload is wasted, no mount warns,
// and every record reads back byte-exact from every broker's mount.
func TestKafkaClusterLeadership(t *testing.T) {
	requireKafka(t)
	r := remotes(t)[1] // s3
	const parts = 6
	const topic = "clustered"
	work := t.TempDir()
	var nodes []*clusterNode
	var opts []kafka.Options
	for i := range 3 {
		_, bk, mnt := mountDirs(t)
		// The broker's port, known before it starts (the mount is told
		// it), taken below the ephemeral range: the mount dials it
		// before the broker listens.
		port, err := kafka.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		n := &clusterNode{id: int32(i + 1), mnt: mnt, metrics: freeAddr(t)}
		n.m = startMount(t, r.env, "--backing", bk, "--remote", r.url, "--ship-after", "2s", "--local-retention-bytes", "1",
			"--tier-interval", "500ms", "--kafka-bootstrap", addr, "--kafka-poll-interval", "1s", "--metrics-listen", n.metrics, mnt)
		nodes = append(nodes, n)
		opts = append(opts, kafka.Options{LogDir: mnt, Port: port,
			MetadataDir: filepath.Join(work, fmt.Sprint("m", i+1)), WorkDir: filepath.Join(work, fmt.Sprint("w", i+1)),
			Props: map[string]string{
				"log.segment.bytes":                strconv.Itoa(1<<20 + i*200<<10), // each broker rolls at its own points
				"offsets.topic.replication.factor": "3",
				"broker.session.timeout.ms":        "4000",
				"broker.heartbeat.interval.ms":     "500",
				"auto.leader.rebalance.enable":     "false",
			}})
	}
	brs, err := kafka.StartQuorum(opts)
	if err != nil {
		t.Fatal(err)
	}
	for i, br := range brs {
		nodes[i].br = br
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Add(1)
			go func() { defer wg.Done(); n.br.Stop() }()
		}
		wg.Wait()
		for _, n := range nodes {
			if t.Failed() {
				log := n.br.Log()
				if len(log) > 8000 {
					log = log[len(log)-8000:]
				}
				t.Logf("broker %d log (tail):\n%s", n.id, log)
			}
		}
	})
	// Preferred leaders 1, 2, 3, 1, 2, 3.
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 30000
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, -1, -1
	for p := range int32(parts) {
		ra := kmsg.NewCreateTopicsRequestTopicReplicaAssignment()
		first := p%3 + 1
		ra.Partition, ra.Replicas = p, []int32{first, first%3 + 1, (first+1)%3 + 1}
		rt.ReplicaAssignment = append(rt.ReplicaAssignment, ra)
	}
	retention := "-1"
	rt.Configs = append(rt.Configs, kmsg.CreateTopicsRequestTopicConfig{Name: "retention.ms", Value: &retention})
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), client(t, nodes[0].br))
	if err != nil || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic: %v %+v", err, resp)
	}
	stream := func(p int) kafka.Stream { return kafka.Stream{Topic: topic, Size: 1000, Partition: int32(p)} }
	name := func(p int) string { return fmt.Sprintf("%s-%d", topic, p) }
	admins := map[int32]*kadm.Client{}
	leaders := func() map[string]int32 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, n := range nodes {
			if !n.br.Running() {
				continue
			}
			if admins[n.id] == nil {
				admins[n.id] = admin(t, n.br)
			}
			md, err := admins[n.id].Metadata(ctx, topic)
			if err != nil {
				continue
			}
			out := map[string]int32{}
			for _, p := range md.Topics[topic].Partitions {
				out[name(int(p.Partition))] = p.Leader
			}
			return out
		}
		t.Fatal("no broker answers")
		return nil
	}
	produceAll := func(via *clusterNode, from, to int) {
		t.Helper()
		for p := range parts {
			produce(t, via.br, stream(p), from, to)
		}
	}
	uploaded := func() map[int32]map[string]int {
		t.Helper()
		out := map[int32]map[string]int{}
		for _, n := range nodes {
			out[n.id] = map[string]int{}
			for pn, p := range n.status(t) {
				out[n.id][pn] = p.Uploaded
			}
		}
		return out
	}
	// onlyLeadersUploaded checks that, between two counts of the
	// segments each mount uploaded, each partition's leader (lead)
	// uploaded some and no other mount any.
	onlyLeadersUploaded := func(when string, before, after map[int32]map[string]int, lead map[string]int32) {
		t.Helper()
		for p := range parts {
			for _, n := range nodes {
				grew := after[n.id][name(p)] > before[n.id][name(p)]
				if grew && lead[name(p)] != n.id {
					t.Errorf("%s: broker %d's mount uploaded %s (led by %d)", when, n.id, name(p), lead[name(p)])
				}
				if !grew && lead[name(p)] == n.id {
					t.Errorf("%s: broker %d's mount, %s's leader, uploaded none of it", when, n.id, name(p))
				}
			}
		}
	}
	// waitShipped waits until every partition's store index reaches
	// offset end-1 lag (the leaders shipped what rolled) and every live
	// mount's copy of each partition is evicted or mapped but for its
	// newest few segments.
	st, err := store.NewS3(context.Background(), r.srv.Options("tier", "kafka/"))
	if err != nil {
		t.Fatal(err)
	}
	indexEnd := func(p int) (last int64, indexed int64, gaps []string) {
		data, err := store.ReadAll(st.Get(context.Background(), name(p)+"/"+idx.FileName, 0, -1, store.GetOptions{}))
		if err != nil {
			return -1, 0, nil
		}
		x, _, err := idx.ParseIndex("store index", data)
		if err != nil {
			t.Fatal(err)
		}
		last = -1
		for _, e := range x.All() {
			if e.FirstOffset != last+1 {
				gaps = append(gaps, fmt.Sprintf("offsets %d..%d missing", last+1, e.FirstOffset-1))
			}
			indexed += int64(e.DataLength)
			last = e.LastOffset
		}
		return last, indexed, gaps
	}
	logs := func() string {
		var b strings.Builder
		for _, n := range nodes {
			l := n.m.Log()
			if len(l) > 6000 {
				l = l[len(l)-6000:]
			}
			fmt.Fprintf(&b, "--- mount of broker %d:\n%s\n", n.id, l)
		}
		return b.String()
	}
	waitShipped := func(minLast int64) {
		t.Helper()
		waitFor(t, 3*time.Minute, fmt.Sprintf("every partition's store index past offset %d, every live replica evicted but its newest 4 segments", minLast), func() bool {
			for p := range parts {
				if last, _, _ := indexEnd(p); last < minLast {
					return false
				}
				for _, n := range nodes {
					if !n.br.Running() {
						continue
					}
					all, remote := segments(t, filepath.Join(n.mnt, name(p)), "remote")
					if remote < all-4 {
						return false
					}
				}
			}
			return true
		}, logs)
	}

	t0 := time.Now()
	phase := func(what string) { t.Logf("%5.1fs %s", time.Since(t0).Seconds(), what) }
	phase("cluster up")
	// 1. Leadership as created: each mount ships what its broker leads.
	const n1 = 6000
	produceAll(nodes[0], 0, n1)
	waitShipped(n1 * 5 / 10)
	lead1 := leaders()
	for p := range parts {
		if want := int32(p%3 + 1); lead1[name(p)] != want {
			t.Fatalf("%s is led by %d, not its preferred leader %d", name(p), lead1[name(p)], want)
		}
	}
	phase("phase 1 shipped")
	up1 := uploaded()
	for _, n := range nodes {
		sts := n.status(t)
		for p := range parts {
			s := sts[name(p)]
			leads := lead1[name(p)] == n.id
			if leads != (s.Role.Role == "leader") || s.Role.Lead == nil || s.Role.Lead.Leader != lead1[name(p)] {
				t.Errorf("broker %d's mount says of %s: %+v (led by %d)", n.id, name(p), s.Role, lead1[name(p)])
			}
			if leads != (s.Uploaded > 0) {
				t.Errorf("broker %d's mount uploaded %d segments of %s (led by %d)", n.id, s.Uploaded, name(p), lead1[name(p)])
			}
			if !leads && s.Mapped == 0 {
				t.Errorf("broker %d's mount mapped nothing of %s", n.id, name(p))
			}
			if len(s.Origins) != s.Uploaded+s.Mapped || len(s.Origins) == 0 {
				t.Errorf("broker %d: %s: %d segments with an origin, %d uploaded and %d mapped", n.id, name(p), len(s.Origins), s.Uploaded, s.Mapped)
			}
			for _, seg := range s.Origins {
				if want := fmt.Sprint(lead1[name(p)]); len(seg.By) != 1 || seg.By[0] != want {
					t.Errorf("broker %d: segment %d of %s shipped by %v, want [%s]", n.id, seg.Base, name(p), seg.By, want)
				}
			}
		}
	}

	// 2. kill -9 of broker 1 (leader of partitions 0 and 3): brokers 2
	// and 3 take them over, and their mounts continue shipping them.
	if err := nodes[0].br.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "new leaders of broker 1's partitions", func() bool {
		l := leaders()
		return l[name(0)] != 1 && l[name(0)] > 0 && l[name(3)] != 1 && l[name(3)] > 0
	})
	lead2 := leaders()
	phase("new leaders after the kill")
	// Each new leader's mount takes its partitions over within a poll
	// (1s here) of the cluster saying so.
	moved := time.Now()
	waitFor(t, 30*time.Second, "the new leaders' mounts leading broker 1's partitions", func() bool {
		for _, p := range []int{0, 3} {
			if s := nodes[lead2[name(p)]-1].status(t)[name(p)]; s.Role.Role != "leader" {
				return false
			}
		}
		return true
	})
	takeover := time.Since(moved)
	const n2 = 10000
	produceAll(nodes[1], n1, n2)
	waitShipped(n2 * 7 / 10)
	phase("phase 2 shipped")
	up2 := uploaded()
	onlyLeadersUploaded("after the kill", up1, up2, lead2)

	// 3. Broker 1 starts again, catches up, and a preferred-leader
	// election gives it its partitions back.
	if err := nodes[0].br.Restart(); err != nil {
		t.Fatal(err)
	}
	adm := admin(t, nodes[1].br)
	waitFor(t, 2*time.Minute, "broker 1 back in sync and its partitions led by it again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		adm.ElectLeaders(ctx, kadm.ElectPreferredReplica, kadm.TopicsSet{topic: {0: {}, 3: {}}})
		l := leaders()
		return l[name(0)] == 1 && l[name(3)] == 1
	})
	phase("broker 1 leads again")
	const n3 = 14000
	produceAll(nodes[1], n2, n3)
	waitShipped(n3 * 7 / 10)
	phase("phase 3 shipped")
	onlyLeadersUploaded("after the election", up2, uploaded(), leaders())

	// The store: each batch once, no gap, and the store's index holds
	// exactly the segment objects' bytes (no object twice).
	var storeTotal, replicaTotal int64
	for p := range parts {
		var last, indexed, stored int64
		var gaps []string
		waitFor(t, time.Minute, "the store's index and objects at rest", func() bool {
			last, indexed, gaps = indexEnd(p)
			stored = storeLogBytes(t, r.url, r.env, name(p))
			again, idx2, _ := indexEnd(p)
			return again == last && idx2 == indexed && stored == storeLogBytes(t, r.url, r.env, name(p))
		}, logs)
		for _, g := range gaps {
			t.Errorf("%s: the store's index has a gap: %s", name(p), g)
		}
		if indexed != stored {
			t.Errorf("%s: the store holds %d bytes of segments, its index %d: bytes stored twice, or not indexed", name(p), stored, indexed)
		}
		storeTotal += stored
		replicaTotal += logBytesIn(t, filepath.Join(nodes[1].mnt, name(p)))
	}

	phase("store checked")
	// Every record, from every broker: each partition consumed through
	// each broker, checked record by record; and each broker's
	// replica, read through its mount (evicted segments from the store),
	// is byte for byte the same log as every other's.
	for _, n := range nodes {
		for p := range parts {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			got, err := kafka.Consume(ctx, client(t, n.br, kafka.PartitionConsumerOpts(stream(p))...), stream(p), n3, kafka.ConsumeOptions{})
			cancel()
			if err != nil || got.Records != n3 {
				t.Fatalf("consume %s via broker %d: %d records, %v", name(p), n.id, got.Records, err)
			}
		}
	}
	for p := range parts {
		var first []byte
		for _, n := range nodes {
			b := replicaBytes(t, filepath.Join(n.mnt, name(p)))
			if first == nil {
				first = b
				continue
			}
			m := min(len(first), len(b))
			if m < len(first)*9/10 || !bytes.Equal(first[:m], b[:m]) {
				t.Errorf("%s: broker %d's replica (%d bytes) is not broker 1's (%d bytes)", name(p), n.id, len(b), len(first))
			}
		}
	}

	phase("every record read")
	// Nothing raced, nothing was uploaded twice, nothing warned.
	for _, n := range nodes {
		for _, m := range []string{"tierfs_index_races_total", "tierfs_uploads_wasted_segments_total", "tierfs_uploads_overlap_bytes_total", "tierfs_tiering_errors_total"} {
			if v := scrape(t, n.metrics, m); v != 0 {
				t.Errorf("broker %d's mount: %s %v", n.id, m, v)
			}
		}
		for _, l := range strings.Split(n.m.Log(), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				t.Errorf("broker %d's mount: %s", n.id, l)
			}
		}
		for pn, p := range n.status(t) {
			if p.LastError != nil && p.LastError.Err != "" {
				t.Errorf("broker %d's mount: %s's last error: %s", n.id, pn, p.LastError.Err)
			}
		}
	}
	var report []string
	var upTotal, wasted float64
	for _, n := range nodes {
		b := scrape(t, n.metrics, "tierfs_remote_copy_bytes_total")
		upTotal += b
		wasted += scrape(t, n.metrics, "tierfs_uploads_wasted_bytes_total") + scrape(t, n.metrics, "tierfs_uploads_overlap_bytes_total")
		report = append(report, fmt.Sprintf("broker %d's mount uploaded %.0f bytes (%d segments), mapped %.0f bytes", n.id, b,
			int(scrape(t, n.metrics, "tierfs_remote_copy_segments_total")), scrape(t, n.metrics, "tierfs_mapped_bytes_total")))
	}
	sort.Strings(report)
	t.Logf("REPORT cluster: mounts took over broker 1's partitions %v after the cluster named new leaders; %s; all kept uploads %.0f bytes = %.3f× the store's %d bytes of segments, %.0f bytes uploaded in vain; one replica holds %d bytes (store %.3f× of it, its active segments not shipped)",
		takeover.Round(10*time.Millisecond), strings.Join(report, "; "), upTotal, upTotal/float64(storeTotal), storeTotal, wasted, replicaTotal, float64(storeTotal)/float64(replicaTotal))
}

// replicaBytes is a partition's log as one replica holds it: its .log
// files in offset order, read through the mount.
func replicaBytes(t *testing.T, dir string) []byte {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	sort.Strings(logs)
	var out bytes.Buffer
	for _, l := range logs {
		f, err := os.Open(l)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(&out, f)
		f.Close()
		if err != nil {
			t.Fatalf("read %s: %v", l, err)
		}
	}
	return out.Bytes()
}
