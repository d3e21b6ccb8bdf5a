package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/e2e/kafka"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// lastEvent is the id of the newest event of the mount at mnt.
func lastEvent(t *testing.T, mnt string) uint64 {
	t.Helper()
	out, code := tierfs(t, nil, "cm", "ls", "--json", "--limit", "1", mnt)
	if code != 0 {
		t.Fatalf("cm ls: %s", out)
	}
	var ev struct {
		ID uint64 `json:"id"`
	}
	if strings.TrimSpace(out) == "" {
		return 0
	}
	if err := json.Unmarshal([]byte(out), &ev); err != nil {
		t.Fatalf("cm ls: %v: %s", err, out)
	}
	return ev.ID
}

// tree reads a directory as path → sha256 of the content ("/" after
// directories).
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		if d.IsDir() {
			out[rel+"/"] = ""
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = fmt.Sprintf("%x", sha256.Sum256(b))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func treeDiff(want, got map[string]string) string {
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		if want[k] != got[k] {
			fmt.Fprintf(&b, "  %s: got %.12q want %.12q\n", k, got[k], want[k])
		}
	}
	return b.String()
}

// TestCMDumpsThroughMount is the property of change management through a
// real mount: random writes, overwrites, truncates, renames and deletes,
// with the newest event noted after some; once the tree has moved on,
// every noted event is dumped (a bootstrap onto an empty dir, and a chain
// of incremental dumps onto one replica) and loads to exactly the tree
// the mount had then.
func TestCMDumpsThroughMount(t *testing.T) {
	requireRoot(t)
	dir, backing, mnt := mountDirs(t)
	startMount(t, nil, "--backing", backing, "--cm", mnt)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed) // rand.NewPCG(42, seed) replays a failure
	rng := rand.New(rand.NewPCG(42, seed))
	model := func() map[string]string { return tree(t, mnt) }
	type point struct {
		id   uint64
		tree map[string]string
	}
	var points []point
	names := []string{"a", "b", "orders-0/0.log", "orders-0/0.index", "orders-1/5.log", "orders-1/sub/x"}
	exists := func(p string) bool { _, err := os.Lstat(filepath.Join(mnt, p)); return err == nil }
	for i := 0; i < 150; i++ {
		p, q := names[rng.IntN(len(names))], names[rng.IntN(len(names))]
		full := filepath.Join(mnt, p)
		var err error
		switch op := rng.IntN(11); {
		case !exists(path.Dir(p)):
			err = os.MkdirAll(filepath.Dir(full), 0o755)
		case op < 3 || !exists(p):
			data := make([]byte, 1+rng.IntN(20000))
			for j := range data {
				data[j] = byte(rng.IntN(256))
			}
			if exists(p) && rng.IntN(2) == 0 {
				var f *os.File
				if f, err = os.OpenFile(full, os.O_RDWR, 0); err == nil {
					fi, _ := f.Stat()
					_, err = f.WriteAt(data, rng.Int64N(fi.Size()+1))
					f.Close()
				}
			} else {
				err = os.WriteFile(full, data, 0o644)
			}
		case op < 5:
			fi, _ := os.Stat(full)
			if rng.IntN(3) == 0 {
				// Preallocate, as Kafka does an index; a later cut in
				// the hole is a trim that copies nothing.
				err = os.Truncate(full, fi.Size()+1+rng.Int64N(1<<20))
			} else {
				err = os.Truncate(full, rng.Int64N(fi.Size()+1))
			}
		case op < 7 && p != q && exists(path.Dir(q)):
			err = os.Rename(full, filepath.Join(mnt, q))
		case op < 9:
			err = os.Remove(full)
		case op < 10:
			// Append, as Kafka writes a segment.
			var f *os.File
			if f, err = os.OpenFile(full, os.O_WRONLY|os.O_APPEND, 0); err == nil {
				_, err = f.Write([]byte(strings.Repeat("batch", 1+rng.IntN(500))))
				f.Close()
			}
		default:
			// A whole partition dir goes, as when a topic is deleted.
			err = os.RemoveAll(filepath.Join(mnt, strings.Split(p, "/")[0]))
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if rng.IntN(10) == 0 {
			points = append(points, point{lastEvent(t, mnt), model()})
		}
	}
	points = append(points, point{lastEvent(t, mnt), model()})
	replica := filepath.Join(dir, "replica")
	var from uint64 = 1
	for k, pt := range points {
		boot := filepath.Join(dir, fmt.Sprintf("boot-%d", k))
		if out, code := tierfs(t, nil, "repl", "dump", "--bootstrap", "--to", fmt.Sprint(pt.id), mnt, boot); code != 0 {
			t.Fatalf("bootstrap dump at %d: %s", pt.id, out)
		}
		empty := filepath.Join(dir, fmt.Sprintf("empty-%d", k))
		if out, code := tierfs(t, nil, "repl", "load", boot, empty); code != 0 {
			t.Fatalf("load bootstrap at %d: %s", pt.id, out)
		}
		if d := treeDiff(pt.tree, tree(t, empty)); d != "" {
			t.Fatalf("bootstrap at event %d differs from the mount then:\n%s", pt.id, d)
		}
		if pt.id < from {
			continue
		}
		inc := filepath.Join(dir, fmt.Sprintf("inc-%d", k))
		if out, code := tierfs(t, nil, "repl", "dump", "--from", fmt.Sprint(from), "--to", fmt.Sprint(pt.id), mnt, inc); code != 0 {
			t.Fatalf("dump %d..%d: %s", from, pt.id, out)
		}
		for again := 0; again < 2; again++ {
			out, code := tierfs(t, nil, "repl", "load", inc, replica)
			if code != 0 {
				t.Fatalf("load %d..%d: %s", from, pt.id, out)
			}
			if again == 1 && !strings.Contains(out, "0 files copied") {
				t.Fatalf("loading %d..%d twice changed something: %s", from, pt.id, out)
			}
		}
		if d := treeDiff(pt.tree, tree(t, replica)); d != "" {
			t.Fatalf("replica after %d..%d differs from the mount then:\n%s", from, pt.id, d)
		}
		from = pt.id + 1
	}
	t.Logf("%d dumps loaded, %d events", len(points), points[len(points)-1].id)
}

// TestCMUndeleteEvictedPartition: rm -rf of a partition dir through the
// mount, one of whose segments is evicted: the evicted segment is retained
// by keeping its objects (no download), and cm restore brings the whole
// dir back, elsewhere and in place, with every checksum equal.
func TestCMUndeleteEvictedPartition(t *testing.T) {
	requireRoot(t)
	r := remotes(t)[0]
	dir, backing, mnt := mountDirs(t)
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 1, Segments: 4, Batches: 30, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
	if err != nil {
		t.Fatal(err)
	}
	m := startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "1000h", "--tier-interval", "200ms", "--cm", mnt)
	before := tree(t, filepath.Join(mnt, "orders-0"))
	evicted := fmt.Sprintf("%020d.log", bases["orders-0"][1])
	if out, code := tierfs(t, nil, "evict", filepath.Join(mnt, "orders-0", evicted)); code != 0 {
		t.Fatalf("evict: %s", out)
	}
	storeEnv := append([]string{"TIERFS_STORE=" + r.url}, r.env...)
	objects := func() string {
		out, code := tierfs(t, storeEnv, "store", "ls", "orders-0/")
		if code != 0 {
			t.Fatalf("store ls: %s", out)
		}
		return out
	}
	key := fmt.Sprintf("%020d-", bases["orders-0"][1])
	if !strings.Contains(objects(), key) {
		t.Fatal("not shipped")
	}

	if out, err := exec.Command("rm", "-rf", filepath.Join(mnt, "orders-0")).CombinedOutput(); err != nil {
		t.Fatalf("rm -rf: %v %s", err, out)
	}
	time.Sleep(time.Second) // several tiering passes
	if !strings.Contains(objects(), key) {
		t.Fatalf("the evicted segment's objects were deleted although cm retains it\n%s", m.Log())
	}
	kept, _ := filepath.Glob(filepath.Join(backing, ".tierfs", "cm", "files", "orders-0", evicted+"_*"))
	if len(kept) != 1 {
		t.Fatalf("retained as %v", kept)
	}
	if a := allocated(t, kept[0]); a > 8192 {
		t.Errorf("the evicted segment was downloaded to be retained: %d bytes allocated", a)
	}
	out, code := tierfs(t, nil, "cm", "ls", filepath.Join(mnt, "orders-0"))
	if code != 0 || !strings.Contains(out, "delete dir") || !strings.Contains(out, evicted+"_") {
		t.Fatalf("cm ls: %s", out)
	}

	elsewhere := filepath.Join(dir, "restored")
	out, code = tierfs(t, nil, "cm", "restore", "--to", elsewhere, filepath.Join(mnt, "orders-0"))
	if code != 0 {
		t.Fatalf("restore elsewhere: %s\n%s", out, m.Log())
	}
	if d := treeDiff(before, tree(t, filepath.Join(elsewhere, "orders-0"))); d != "" {
		t.Fatalf("restored elsewhere:\n%s", d)
	}
	out, code = tierfs(t, nil, "cm", "restore", filepath.Join(mnt, "orders-0"))
	if code != 0 || !strings.Contains(out, "restored") {
		t.Fatalf("restore in place: %s", out)
	}
	if d := treeDiff(before, tree(t, filepath.Join(mnt, "orders-0"))); d != "" {
		t.Fatalf("restored in place:\n%s", d)
	}
	// A path never seen is a clear error.
	if out, code := tierfs(t, nil, "cm", "restore", filepath.Join(mnt, "nothing-0")); code == 0 || !strings.Contains(out, "no retained event") {
		t.Fatalf("restore of an unknown path: %d %s", code, out)
	}
}

// TestKafkaChangeManagement: a broker on a mount with --cm and tiering.
// Its rolls, index trims, checkpoint renames and deletions are captured
// without the broker noticing; then the topic is deleted (the broker
// renames the partition dir to *-delete and removes it), and cm restore
// brings the partition back, evicted segments included, read from the
// store: every segment as produced, and valid by tierfs index verify.
func TestKafkaChangeManagement(t *testing.T) {
	requireKafka(t)
	r := remotes(t)[0]
	dir, backing, mnt := mountDirs(t)
	m := startMount(t, r.env, "--backing", backing, "--remote", r.url, "--ship-after", "2s",
		"--local-retention-bytes", "1", "--tier-interval", "500ms", "--cm", "--cm-exclude", "*.tmp", mnt)
	br := startBroker(t, mnt, map[string]string{"file.delete.delay.ms": "1000"})
	const n = 20000
	s := kafka.Stream{Topic: "events", Size: 1000}
	createTopic(t, br, s.Topic, nil)
	produce(t, br, s, 0, n)
	part := filepath.Join(mnt, s.Topic+"-0")
	waitEvicted(t, part, 10, m)
	if got := consumeAll(t, br, s, n); got.Records != n {
		t.Fatalf("consumed %d records, want %d", got.Records, n)
	}
	logs := map[string]string{}
	for p, sum := range tree(t, part) {
		if strings.HasSuffix(p, ".log") {
			logs[p] = sum
		}
	}
	evs, code := tierfs(t, nil, "cm", "ls", "--limit", "0", mnt)
	if code != 0 {
		t.Fatalf("cm ls: %s", evs)
	}
	for _, want := range []string{"create", "write", "truncate", "rename"} {
		if !strings.Contains(evs, " "+want+" ") {
			t.Errorf("no %s event from the broker:\n%s", want, evs)
		}
	}
	counts := map[string]int{}
	for _, line := range strings.Split(evs, "\n")[1:] {
		if f := strings.Fields(line); len(f) > 2 {
			counts[f[2]]++
		}
	}
	t.Logf("events from the broker by type: %v", counts)
	for _, line := range strings.Split(evs, "\n") {
		// A .tmp file renamed over a checkpoint is the rename's source;
		// nothing else may name an excluded path.
		if strings.Contains(line, ".tmp") && !strings.Contains(line, ".tmp -> ") {
			t.Errorf("an excluded .tmp path has an event: %s", line)
		}
	}

	// At each roll the broker trims the rolled segment's preallocated
	// indexes to their entries, which end inside a block: only zeros
	// go, so nothing is copied or hashed.
	js, code := tierfs(t, nil, "cm", "ls", "--json", "--limit", "0", mnt)
	if code != 0 {
		t.Fatalf("cm ls --json: %s", js)
	}
	trims := 0
	for _, line := range strings.Split(strings.TrimSpace(js), "\n") {
		var ev struct{ Type, Path, Name, Pending string }
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("cm ls --json: %q: %v", line, err)
		}
		if ev.Type != "truncate" || !strings.HasSuffix(ev.Path, "index") {
			continue
		}
		trims++
		if ev.Name != "" || ev.Pending != "" {
			t.Errorf("the trim of %s retained a copy (%s%s)", ev.Path, ev.Name, ev.Pending)
		}
	}
	if trims == 0 {
		t.Errorf("no index trim among the broker's events")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin(t, br).DeleteTopics(ctx, s.Topic); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "partition dir deleted", func() bool {
		ents, _ := os.ReadDir(mnt)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), s.Topic+"-0") {
				return false
			}
		}
		return true
	}, m.Log)
	time.Sleep(2 * time.Second) // tiering passes that would delete objects
	if objs := logObjects(t, r.url, r.env, s.Topic+"-0"); objs == 0 {
		t.Fatalf("the deleted topic's objects left the store although cm retains its segments\n%s", m.Log())
	}

	out := filepath.Join(dir, "restored")
	if o, code := tierfs(t, nil, "cm", "restore", "--to", out, part); code != 0 {
		t.Fatalf("cm restore: %s\n%s", o, m.Log())
	}
	got := tree(t, filepath.Join(out, s.Topic+"-0"))
	for p, sum := range logs {
		if got[p] != sum {
			t.Errorf("restored %s differs from the segment before the delete", p)
		}
	}
	t.Logf("restored %d segments of the deleted topic; %d verify", len(logs), verifySegments(t, filepath.Join(out, s.Topic+"-0")))
	noProblems(t, br)
}
