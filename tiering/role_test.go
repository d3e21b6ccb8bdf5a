package tiering

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx"
)

// fakeLeadership is a cluster's answer, set by the test.
type fakeLeadership struct {
	mu        sync.Mutex
	self      int32
	leaders   map[string]Lead // by partition
	refreshes int
}

func (f *fakeLeadership) Lead(partition string) (Lead, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leaders[partition]
	l.Self = ok && l.Leader == f.self
	return l, ok
}

func (f *fakeLeadership) Refresh() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refreshes++
}

// cluster is the leadership every broker's fake reports: one leader per
// partition at a time.
type cluster struct {
	mu      sync.Mutex
	leaders map[string]Lead
	views   []*fakeLeadership
}

func (c *cluster) view(self int32) *fakeLeadership {
	v := &fakeLeadership{self: self, leaders: map[string]Lead{}}
	c.views = append(c.views, v)
	return v
}

func (c *cluster) elect(partition string, leader, epoch int32) {
	for _, v := range c.views {
		v.mu.Lock()
		v.leaders[partition] = Lead{Leader: leader, Epoch: epoch}
		v.mu.Unlock()
	}
}

func leadTierer(t *testing.T, r *replica, s store.Store, l Leadership) *Tierer {
	return replicaTierer(t, r, s, func(c *Config) { c.Leadership = l })
}

// TestLeadershipPerPartition: three brokers share a store, each with
// the leadership its cluster reports. Only the leader of the moment
// uploads; the others map onto its objects. Leadership moves twice (a
// new leader takes over from what the store holds), and each batch is
// stored once, with no race lost and no upload made needless.
func TestLeadershipPerPartition(t *testing.T) {
	s := store.NewMem(nil)
	stream, offs, size := fourRecordBatches(90, 0, 3000)
	var c cluster
	reps := []*replica{newReplica(t, "1", stream, offs, 10), newReplica(t, "2", stream, offs, 7), newReplica(t, "3", stream, offs, 13)}
	var trs []*Tierer
	for i, r := range reps {
		trs = append(trs, leadTierer(t, r, s, c.view(int32(i+1))))
	}
	pass := func() {
		t.Helper()
		for _, tr := range trs {
			mustPass(t, tr)
		}
	}
	uploads := func() (n [3]int64) {
		for i, tr := range trs {
			n[i] = tr.Counters().ShippedSegments.Load()
		}
		return n
	}
	for _, r := range reps {
		r.grow(t, 30)
	}
	// Nobody knows the leader yet: nothing goes up, and each says why.
	pass()
	if got := logBytes(t, s); got != 0 {
		t.Fatalf("%d bytes uploaded before any leader was known", got)
	}
	if why := trs[0].LastErrors()["orders-0"].Kept; !strings.Contains(why, "leader is not known") {
		t.Fatalf("why kept: %q", why)
	}
	if r := trs[0].PartitionRole("orders-0"); r.Role != RoleFollower || r.Lead != nil {
		t.Fatalf("role with no leader known: %+v", r)
	}

	c.elect("orders-0", 2, 1)
	pass()
	pass()
	if u := uploads(); u[0] != 0 || u[1] == 0 || u[2] != 0 {
		t.Fatalf("uploads per broker with broker 2 leading: %v", u)
	}
	if r := trs[1].PartitionRole("orders-0"); r.Role != RoleLeader || r.Lead == nil || r.Lead.Epoch != 1 {
		t.Fatalf("broker 2's role: %+v", r)
	}
	if r := trs[0].PartitionRole("orders-0"); r.Role != RoleFollower || !strings.Contains(r.Why, "broker 2 leads") {
		t.Fatalf("broker 1's role: %+v", r)
	}
	// Broker 2 rolls at 7, 14, 21, 28: batches 0..27 are in the store.
	if got, want := logBytes(t, s), size[28]; got != want {
		t.Fatalf("store holds %d bytes, want %d", got, want)
	}

	// Broker 1 takes over; then broker 3.
	before := uploads()
	c.elect("orders-0", 1, 2)
	for _, r := range reps {
		r.grow(t, 60)
	}
	pass()
	pass()
	if u := uploads(); u[0] == before[0] || u[1] != before[1] || u[2] != before[2] {
		t.Fatalf("uploads per broker with broker 1 leading: %v (before %v)", u, before)
	}
	before = uploads()
	c.elect("orders-0", 3, 3)
	for _, r := range reps {
		r.grow(t, 90)
	}
	pass()
	pass()
	if u := uploads(); u[2] == before[2] || u[0] != before[0] || u[1] != before[1] {
		t.Fatalf("uploads per broker with broker 3 leading: %v (before %v)", u, before)
	}
	// Broker 3 rolls at 78: 0..77 stored, each batch once; every other
	// broker's shipped segments are mapped, and each reads back.
	if got, want := logBytes(t, s), size[78]; got != want {
		t.Fatalf("store holds %d bytes, want %d (each batch once)", got, want)
	}
	checkIndexOnce(t, s, "orders-0", offs[0], offs[78])
	for i, tr := range trs {
		c := tr.Counters()
		if c.IndexRaces.Load() != 0 || c.WastedSegments.Load() != 0 || c.OverlapBytes.Load() != 0 {
			t.Errorf("broker %d: %d races, %d needless uploads, %d bytes twice", i+1, c.IndexRaces.Load(), c.WastedSegments.Load(), c.OverlapBytes.Load())
		}
		if local, _, _ := checkReplica(t, tr, reps[i]); local > 2 {
			t.Errorf("broker %d: %d segments local", i+1, local)
		}
	}

	// A manual role overrides the leadership.
	if err := trs[0].SetRole(RoleLeader); err != nil {
		t.Fatal(err)
	}
	if r := trs[0].PartitionRole("orders-0"); r.Role != RoleLeader || !strings.Contains(r.Why, "by hand") {
		t.Fatalf("overridden role: %+v", r)
	}
	if err := trs[0].SetRole("boss"); err == nil {
		t.Fatal("a role that is none was taken")
	}
}

// TestNewerLocalEpochRefreshesLeadership: a partition whose
// leader-epoch-checkpoint holds an epoch newer than the cluster's last
// answer makes the mount ask again; an unchanged file is not read again.
func TestNewerLocalEpochRefreshesLeadership(t *testing.T) {
	s := store.NewMem(nil)
	stream, offs, _ := fourRecordBatches(12, 0, 3000)
	r := newReplica(t, "1", stream, offs, 10)
	r.grow(t, 12)
	var c cluster
	l := c.view(1)
	tr := leadTierer(t, r, s, l)
	c.elect("orders-0", 1, 4)
	cp := filepath.Join(r.root, "orders-0", "leader-epoch-checkpoint")
	write := func(epoch int) {
		if err := os.WriteFile(cp, fmt.Appendf(nil, "0\n1\n%d 0\n", epoch), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(4)
	mustPass(t, tr)
	if l.refreshes != 0 {
		t.Fatalf("%d refreshes with the epoch known", l.refreshes)
	}
	write(5)
	future := time.Now().Add(time.Minute)
	os.Chtimes(cp, future, future)
	mustPass(t, tr)
	if l.refreshes != 1 {
		t.Fatalf("%d refreshes after the local epoch moved to 5 (known: 4)", l.refreshes)
	}
	c.elect("orders-0", 2, 5)
	mustPass(t, tr)
	if l.refreshes != 1 {
		t.Fatalf("%d refreshes once the cluster said epoch 5", l.refreshes)
	}
}

// TestSharedPartitionWaitsForTheLeader: with no leadership to go by, a
// mount uploads at once what only it ships; in a partition another
// broker shipped to, it waits the grace (and its stagger) past
// ship-after for that broker's upload, and then uploads.
func TestSharedPartitionWaitsForTheLeader(t *testing.T) {
	s := store.NewMem(nil)
	stream, offs, _ := fourRecordBatches(40, 0, 3000)
	b1 := newReplica(t, "1", stream, offs, 10)
	b2 := newReplica(t, "2", stream, offs, 10)
	now := time.Now()
	mk := func(r *replica) *Tierer {
		return replicaTierer(t, r, s, func(c *Config) {
			c.ShareGrace, c.LocalRetentionBytes, c.Now = time.Hour, 0, func() time.Time { return now }
		})
	}
	t1, t2 := mk(b1), mk(b2)
	b1.grow(t, 20)
	b2.grow(t, 20)
	if rep := mustPass(t, t1); rep.Shipped != 1 {
		t.Fatalf("the first broker, alone in the partition, shipped %d", rep.Shipped)
	}
	if rep := mustPass(t, t2); rep.Shipped != 1 { // mapped onto broker 1's upload
		t.Fatalf("broker 2 mapped %d", rep.Shipped)
	}
	if t2.Counters().ShippedSegments.Load() != 0 {
		t.Fatal("broker 2 uploaded what broker 1 had shipped")
	}
	// Batches 20..29 roll on broker 2 only. They are an hour old: past
	// ship-after (10 minutes), not past ship-after + grace + stagger
	// (70 to 130 minutes).
	b2.grow(t, 40)
	rep := mustPass(t, t2)
	if t2.Counters().ShippedSegments.Load() != 0 {
		t.Fatalf("broker 2 uploaded in a shared partition at once: %+v", rep)
	}
	if why := t2.LastErrors()["orders-0"].Kept; !strings.Contains(why, "other brokers ship this partition too") {
		t.Fatalf("why kept: %q", why)
	}
	now = now.Add(2 * time.Hour)
	mustPass(t, t2)
	if t2.Counters().ShippedSegments.Load() == 0 {
		t.Fatal("broker 2 never uploaded once the grace was over")
	}
}

// TestIndexChangedWhileReadIsNoError: a store index that another broker
// changes between a follower's HEAD and GET of it is read again; one
// that keeps changing leaves the segment waiting for the next pass, not
// a partition's error.
func TestIndexChangedWhileReadIsNoError(t *testing.T) {
	s := store.NewMem(nil)
	stream, offs, _ := fourRecordBatches(30, 0, 3000)
	b1 := newReplica(t, "1", stream, offs, 10)
	b2 := newReplica(t, "2", stream, offs, 10)
	b1.grow(t, 30)
	b2.grow(t, 30)
	mustPass(t, shareTierer(t, b1, s, RoleLeader))
	t2 := shareTierer(t, b2, s, RoleFollower)
	changed := fmt.Errorf("the index changed: %w", store.ErrPrecondition)
	s.Inject(store.Fault{Op: store.OpGet, KeyPrefix: "orders-0/" + idx.FileName, Times: maxIndexTries, Err: changed})
	rep := mustPass(t, t2)
	if rep.Shipped != 0 {
		t.Fatalf("mapped %d with the index changing at every read", rep.Shipped)
	}
	if why := t2.LastErrors()["orders-0"]; why.Err != "" || !strings.Contains(why.Kept, "kept changing") {
		t.Fatalf("partition's last error and reason: %+v", why)
	}
	s.ClearFaults()
	s.Inject(store.Fault{Op: store.OpGet, KeyPrefix: "orders-0/" + idx.FileName, Times: maxIndexTries - 1, Err: changed})
	if rep := mustPass(t, t2); rep.Shipped != 2 {
		t.Fatalf("mapped %d once the index was read on the last try", rep.Shipped)
	}
}
