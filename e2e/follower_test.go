package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// broker writes one replica of partition orders-0 through its mount, as
// a broker does: the stream's batches appended to the active segment,
// rolled at this replica's own points, checkpoints replaced by rename.
type broker struct {
	id      string
	backing string
	mnt     string
	every   int
	n       int
	bases   []int // batch numbers that start segments
	stream  [][]byte
	offs    []int64
}

func (b *broker) seg(i int) string {
	return filepath.Join(b.mnt, "orders-0", fmt.Sprintf("%020d.log", b.offs[b.bases[i]]))
}

func (b *broker) grow(t *testing.T, n int) {
	t.Helper()
	os.MkdirAll(filepath.Join(b.mnt, "orders-0"), 0o755)
	for ; b.n < n; b.n++ {
		if b.n%b.every == 0 {
			if len(b.bases) > 0 {
				old := time.Now().Add(-time.Hour)
				os.Chtimes(b.seg(len(b.bases)-1), old, old)
			}
			b.bases = append(b.bases, b.n)
		}
		f, err := os.OpenFile(b.seg(len(b.bases)-1), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(b.stream[b.n]); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	active := b.offs[b.bases[len(b.bases)-1]]
	end := b.offs[len(b.offs)-1] + 1
	if b.n < len(b.offs) {
		end = b.offs[b.n]
	}
	for name, body := range map[string]string{
		"recovery-point-offset-checkpoint": fmt.Sprintf("0\n1\norders 0 %d\n", active),
		"replication-offset-checkpoint":    fmt.Sprintf("0\n1\norders 0 %d\n", end),
		"log-start-offset-checkpoint":      "0\n0\n",
	} {
		p := filepath.Join(b.mnt, name)
		if err := os.WriteFile(p+".tmp", []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
	}
}

// want is the bytes of segment i: the stream from its first batch to
// the next segment's.
func (b *broker) want(i int) [32]byte {
	end := b.n
	if i+1 < len(b.bases) {
		end = b.bases[i+1]
	}
	h := sha256.New()
	for j := b.bases[i]; j < end; j++ {
		h.Write(b.stream[j])
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// check reads every segment through the mount and counts the evicted.
func (b *broker) check(t *testing.T) (remote int) {
	t.Helper()
	for i := range b.bases {
		got, err := os.ReadFile(b.seg(i))
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != b.want(i) {
			t.Errorf("broker %s: %s (%s) does not read back", b.id, filepath.Base(b.seg(i)), state(b.seg(i)))
		}
		if state(b.seg(i)) == "remote" {
			remote++
		}
	}
	return remote
}

func (b *broker) countRemote() int {
	n := 0
	for i := range b.bases {
		if state(b.seg(i)) == "remote" {
			n++
		}
	}
	return n
}

// storeLogBytes sums the sizes of a partition's segment objects.
func storeLogBytes(t *testing.T, url string, env []string, partition string) int64 {
	t.Helper()
	out, code := tierfs(t, append([]string{"TIERFS_STORE=" + url}, env...), "store", "ls", partition+"/")
	if code != 0 {
		t.Fatalf("store ls: %s", out)
	}
	var n int64
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && strings.HasSuffix(f[2], ".log") {
			size, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				t.Fatalf("store ls line %q", line)
			}
			n += size
		}
	}
	return n
}

// TestFollowerMount: two brokers' mounts share one store, each fed the
// same batches through its mount but rolling at different points. The
// leader ships; the follower frees every segment whose batches the store
// holds, and reads it back byte-exact from the leader's objects. Then
// the leader changes (each is remounted in the other role): the new
// leader ships only what the store lacks, starting inside a segment that
// the old leader had shipped the head of; the new follower frees its
// segments. Each batch is stored once.
func TestFollowerMount(t *testing.T) {
	requireRoot(t)
	var stream [][]byte
	var offs []int64
	var prefix []int64 // stream bytes before batch i
	var off, sum int64
	ts := time.Now().Add(-2 * time.Hour).UnixMilli()
	for i := range 120 {
		recs := 4 + i%3
		batch := kafkatest.Encode(kafkatest.Batch{Base: off, Records: recs, ValueSize: 4000, TS: ts + off, Epoch: 3, Attrs: int16(i % 2)})
		stream, offs, prefix = append(stream, batch), append(offs, off), append(prefix, sum)
		off += int64(recs)
		sum += int64(len(batch))
	}
	prefix = append(prefix, sum)
	for _, r := range remotes(t) {
		t.Run(r.name, func(t *testing.T) {
			_, bk1, m1 := mountDirs(t)
			_, bk2, m2 := mountDirs(t)
			b1 := &broker{id: "1", backing: bk1, mnt: m1, every: 10, stream: stream, offs: offs}
			b2 := &broker{id: "2", backing: bk2, mnt: m2, every: 6, stream: stream, offs: offs}
			for _, b := range []*broker{b1, b2} {
				os.WriteFile(filepath.Join(b.backing, "meta.properties"), []byte("version=1\nnode.id="+b.id+"\n"), 0o644)
			}
			common := []string{"--remote", r.url, "--ship-after", "1s", "--local-retention-bytes", "1", "--tier-interval", "200ms", "--follow-interval", "200ms"}
			mountAs := func(b *broker, role string) *mount {
				return startMount(t, r.env, append(append([]string{"--backing", b.backing, "--role", role}, common...), b.mnt)...)
			}
			f2 := mountAs(b2, "follower")
			b2.grow(t, 80)
			before := allocated(t, bk2)
			// Nothing is shipped yet: the follower keeps everything, and
			// says why.
			time.Sleep(time.Second)
			if n := b2.countRemote(); n != 0 {
				t.Fatalf("the follower freed %d segments with nothing in the store", n)
			}
			out, _ := tierfs(t, nil, "status", m2)
			if !strings.Contains(out, "kept local") || !strings.Contains(out, "not in the store yet") {
				t.Errorf("follower status:\n%s", out)
			}
			l1 := mountAs(b1, "leader")
			b1.grow(t, 80)
			// The leader ships [0, 70) (70.. is its active segment); the
			// follower's segments [0,6) .. [60,66) lie in it, [66,72)
			// does not.
			waitFor(t, 30*time.Second, "the follower to free 11 segments", func() bool { return b2.countRemote() == 11 }, f2.Log, l1.Log)
			if got := b2.check(t); got != 11 {
				t.Errorf("follower: %d segments remote", got)
			}
			b1.check(t)
			after := allocated(t, bk2)
			if after > before/3 {
				t.Errorf("follower's local segment bytes: %d before, %d after", before, after)
			}
			stored := storeLogBytes(t, r.url, r.env, "orders-0")
			if stored != prefix[70] {
				t.Errorf("store holds %d bytes of segments, want %d (batches 0..69 once)", stored, prefix[70])
			}
			both := logBytesIn(t, filepath.Join(bk1, "orders-0")) + logBytesIn(t, filepath.Join(bk2, "orders-0"))
			t.Logf("REPORT %s phase 1: store %d bytes of segments; the two brokers' segments %d bytes (%.2f×); follower's local segment bytes %d → %d",
				r.name, stored, both, float64(stored)/float64(both), before, after)

			// The leader changes.
			l1.stop(t)
			f2.stop(t)
			l2 := mountAs(b2, "leader")
			f1 := mountAs(b1, "follower")
			b1.grow(t, 120)
			b2.grow(t, 120)
			// b2 ships [66,72) from batch 70 on, and everything after up
			// to its active segment (114..); b1 follows up to its (110..).
			waitFor(t, 30*time.Second, "the new follower to free 11 segments", func() bool { return b1.countRemote() == 11 }, f1.Log, l2.Log)
			waitFor(t, 30*time.Second, "the new leader to free 19 segments", func() bool { return b2.countRemote() == 19 }, f1.Log, l2.Log)
			b1.check(t)
			b2.check(t)
			stored = storeLogBytes(t, r.url, r.env, "orders-0")
			if stored != prefix[114] {
				t.Errorf("store holds %d bytes of segments, want %d (batches 0..113 once)", stored, prefix[114])
			}
			// The straddling segment: its head is in broker 1's object,
			// its tail in one broker 2 shipped.
			buf := make([]byte, 8192)
			n, err := unix.Getxattr(filepath.Join(bk2, "orders-0", filepath.Base(b2.seg(11))), "trusted.tierfs", buf)
			if err != nil {
				t.Fatal(err)
			}
			var rec struct {
				Extents []struct {
					Pos, Len int64
					Key      string
				}
			}
			json.Unmarshal(buf[:n], &rec)
			if len(rec.Extents) != 2 || rec.Extents[1].Pos != prefix[70]-prefix[66] {
				t.Errorf("extents of the segment across the leader change: %+v", rec.Extents)
			}
			both = logBytesIn(t, filepath.Join(bk1, "orders-0")) + logBytesIn(t, filepath.Join(bk2, "orders-0"))
			t.Logf("REPORT %s after the leader change: store %d bytes of segments; the two brokers' segments %d bytes (%.2f×); local segment bytes: broker 1 %d, broker 2 %d",
				r.name, stored, both, float64(stored)/float64(both), allocated(t, bk1), allocated(t, bk2))
			// A reader mount of the store shows one log dir of both
			// brokers' objects: in offset order they are the stream up to
			// what was shipped, each batch once.
			_, _, rm := mountDirs(t)
			reader := startMount(t, r.env, "--role", "reader", "--remote", r.url, rm)
			logs, _ := filepath.Glob(filepath.Join(rm, "orders-0", "*.log"))
			h := sha256.New()
			for _, p := range logs { // names sort by base offset
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				h.Write(b)
			}
			w := sha256.New()
			for _, b := range stream[:114] {
				w.Write(b)
			}
			if string(h.Sum(nil)) != string(w.Sum(nil)) {
				t.Errorf("the reader's %d segments are not the stream's batches 0..113", len(logs))
			}
			reader.stop(t)
			for _, m := range []*mount{l2, f1} {
				if strings.Contains(m.Log(), "level=ERROR") {
					t.Errorf("errors logged:\n%s", m.Log())
				}
			}
		})
	}
}
